//! mtgdrcopy_sanity's command line.

use crate::tool::VersionFlag;

/// Sanity checks of GDRCopy for Moore Threads GPUs (libgdrapi, mtgdrdrv and MUSA memory).
#[derive(clap::Parser, Debug)]
#[command(name = "mtgdrcopy_sanity", disable_version_flag = true)]
pub struct Args {
    /// Run only this case (repeatable; regular and extended names). Upstream GDRCopy's names
    /// are accepted too (`basic_cumemalloc` for `basic_mumemalloc`), and the case is then
    /// reported under the name given.
    #[arg(short = 't', long = "test", value_name = "NAME")]
    pub tests: Vec<String>,
    /// List the cases, each with upstream GDRCopy's name where it differs, and exit.
    #[arg(short = 'l', long)]
    pub list: bool,
    /// Print upstream's banners per case on standard error (&&&& RUNNING|PASSED|FAILED|WAIVED
    /// name; WAIVED is a skipped case) and the cases' progress messages.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Don't print the summary (in text format: the `Total:` line, ours and the lists; TAP and
    /// JSON lines keep theirs).
    #[arg(short = 's', long = "no-summary")]
    pub no_summary: bool,
    /// MUSA device ordinal (also `0x1`, as upstream reads it).
    #[arg(short = 'd', long, value_name = "N", default_value_t = 0,
          value_parser = crate::bench::cli::parse_device)]
    pub device: i32,
    /// Also run the extended cases.
    #[arg(short = 'e', long)]
    pub extended: bool,
    /// Per-case timeout; the case's whole process group is killed after it.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// How the results are written to standard output: `text` (upstream's `Total:` line, our
    /// summary and the lists of failed and skipped cases), `tap` (TAP version 14, one test point per case) or
    /// `json-lines` (one JSON object per case, then one for the summary). Messages stay on
    /// standard error.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = Format::Text)]
    pub format: Format,
    #[command(flatten)]
    pub version: VersionFlag,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Tap,
    JsonLines,
}
