//! mtgdrcopy_apiperf's command line.

use crate::bench::cli::{parse_count, parse_iterations, parse_size, Common};

/// Latency of the gdrapi calls that bracket a copy.
///
/// For pin sizes 64 KiB, 128 KiB, … doubling up to the maximum, runs `-w` untimed cycles of
/// gdr_pin_buffer, gdr_map_v2, gdr_get_info_v2, gdr_unmap and gdr_unpin_buffer, then `-n`
/// cycles timing each call on its own. Prints the mean, minimum, median (P50) and maximum per
/// call in microseconds, and a 10-bin histogram of gdr_pin_buffer's latency per size. Sizes
/// are in bytes; K, M and G suffixes (64K = 65536) are accepted.
#[derive(clap::Parser, Debug)]
#[command(name = "mtgdrcopy_apiperf", disable_version_flag = true)]
pub struct Args {
    /// Largest pin size in bytes, rounded up to the 64 KiB GPU page.
    #[arg(short = 's', long = "max-size", value_name = "BYTES", default_value = "16777216",
          value_parser = parse_size)]
    pub max_size: u64,

    /// Timed cycles per size.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value = "100",
          value_parser = parse_iterations)]
    pub iters: u64,

    /// Untimed warm-up cycles per size (0 for none).
    #[arg(short = 'w', long = "warmup", value_name = "N", default_value = "10",
          value_parser = parse_count)]
    pub warmup: u64,

    #[command(flatten)]
    pub common: Common,
}
