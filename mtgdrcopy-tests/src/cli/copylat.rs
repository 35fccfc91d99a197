//! mtgdrcopy_copylat's command line.

use crate::bench::cli::{parse_iterations, parse_size, Common};

/// Copy latency through a GDRCopy mapping of GPU memory.
///
/// For every size 1, 2, 4, … bytes up to the buffer size, times `-w` copies into the mapping
/// (gdr_copy_to_mapping) and `-r` copies out of it (gdr_copy_from_mapping), and with -c the
/// MUSA runtime's muMemcpyHtoD/DtoH. The copies of one size are split into up to 100 buckets,
/// each timed as a whole; P50 is the median and P0 the minimum of the buckets' mean time per
/// copy, in microseconds. Only the CPU side is timed: a copy to the mapping may still be on
/// its way to the GPU when it returns. Every copy is checked against the data read back
/// through the driver. Sizes are in bytes; K, M and G suffixes (64K = 65536) are accepted.
#[derive(clap::Parser, Debug)]
#[command(name = "mtgdrcopy_copylat", disable_version_flag = true)]
pub struct Args {
    /// Also time the runtime's memcpy (muMemcpyHtoD and muMemcpyDtoH) for comparison.
    #[arg(short = 'c', long = "memcpy")]
    pub memcpy: bool,

    /// Device buffer size in bytes, rounded up to the 64 KiB GPU page; the largest copy.
    #[arg(short = 's', long = "size", value_name = "BYTES", default_value = "16777216",
          value_parser = parse_size)]
    pub size: u64,

    /// Timed copies to the device per size. Above 100 it is raised to a multiple of 100 (the
    /// bucket count), with a warning.
    #[arg(short = 'w', long = "write-iters", value_name = "N", default_value = "10000",
          value_parser = parse_iterations)]
    pub write_iters: u64,

    /// Timed copies from the device per size; rounded like -w.
    #[arg(short = 'r', long = "read-iters", value_name = "N", default_value = "100",
          value_parser = parse_iterations)]
    pub read_iters: u64,

    /// Cold cache: before every copy, muMemsetD8 the range (and fence) so that no CPU cache
    /// holds it; the memset's cost, timed separately, is subtracted. Only meaningful for a
    /// CACHING mapping, which mtgpu never gives (BAR mappings are write-combined), so here it
    /// ends in an error that says so.
    #[arg(short = 'C', long = "cold-cache")]
    pub cold_cache: bool,

    #[command(flatten)]
    pub common: Common,
}
