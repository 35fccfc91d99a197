//! mtgdrcopy_doctor's command line.

use crate::tool::VersionFlag;

#[derive(clap::Parser, Debug)]
#[command(
    name = "mtgdrcopy_doctor",
    disable_version_flag = true,
    about = "Check this host or container for what GDRCopy on Moore Threads GPUs needs, one line \
             per check (OK, WARN or FAIL with the fix)"
)]
pub struct Args {
    /// Check only GPU N (MUSA ordinal); default: every GPU visible.
    #[arg(short = 'd', long = "device", value_name = "N")]
    pub device: Option<i32>,
    /// Print only the WARN and FAIL lines.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    #[command(flatten)]
    pub version: VersionFlag,
}
