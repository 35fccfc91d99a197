//! mtgdrcopy_musainfo's command line.

use crate::tool::VersionFlag;

#[derive(clap::Parser, Debug)]
#[command(
    name = "mtgdrcopy_musainfo",
    disable_version_flag = true,
    about = "Show the MUSA driver and devices the mtgdrcopy tools would use"
)]
pub struct Cli {
    /// Only this device (ordinal); default: every device.
    #[arg(short = 'd', long = "device", value_name = "N")]
    pub device: Option<i32>,
    /// Also check that device memory round-trips through the driver API (alloc, memcpy both
    /// ways, memset, managed memory, SYNC_MEMOPS) on the selected device(s).
    #[arg(long)]
    pub check: bool,
    /// Print the emulated provider's counters (`name: value` lines, from /dev/mtgpu_emu) and
    /// nothing else: the leak oracle of the test VM. Hidden: there is no emulator outside the
    /// tests, and only the test suite's build (feature `emulator`) has the option.
    #[cfg(feature = "emulator")]
    #[arg(long, hide = true)]
    pub emu_stats: bool,
    #[command(flatten)]
    pub version: VersionFlag,
}
