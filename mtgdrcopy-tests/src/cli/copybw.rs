//! mtgdrcopy_copybw's command line.

use crate::bench::cli::{parse_iterations, parse_size, Common};

/// Copy bandwidth through a GDRCopy mapping of GPU memory.
///
/// Allocates a device buffer, pins and maps it, then times `-w` copies into the mapping and
/// `-r` copies out of it, each series after one untimed copy. Bandwidth is in MiB/s:
/// bytes / seconds / 2^20 (upstream prints the same number as "MB/s"). Every copy is checked:
/// the data read back through the MUSA driver's memcpy must equal what was written. Sizes are
/// in bytes; K, M and G suffixes (binary: 64K = 65536) are accepted.
#[derive(clap::Parser, Debug)]
#[command(name = "mtgdrcopy_copybw", disable_version_flag = true)]
pub struct Args {
    /// Device buffer size in bytes; rounded up to the 64 KiB GPU page.
    #[arg(short = 's', long = "size", value_name = "BYTES", default_value = "131072",
          value_parser = parse_size)]
    pub size: u64,

    /// Bytes per copy (default: the buffer size). With --sweep, the largest size.
    #[arg(short = 'c', long = "copy-size", value_name = "BYTES", value_parser = parse_size)]
    pub copy_size: Option<u64>,

    /// Offset of every copy into the mapping, in bytes: a multiple of 4, and the copy must
    /// still fit the buffer.
    #[arg(short = 'o', long = "offset", value_name = "BYTES", default_value = "0",
          value_parser = parse_size)]
    pub offset: u64,

    /// Sweep the copy size: 1, 2, 4, … bytes up to the largest power of two not above the copy
    /// size (upstream stops one step below that).
    #[arg(short = 'l', long = "sweep")]
    pub sweep: bool,

    /// Timed copies to the mapping (write) per size.
    #[arg(short = 'w', long = "write-iters", value_name = "N", default_value = "10000",
          value_parser = parse_iterations)]
    pub write_iters: u64,

    /// Timed copies from the mapping (read) per size.
    #[arg(short = 'r', long = "read-iters", value_name = "N", default_value = "100",
          value_parser = parse_iterations)]
    pub read_iters: u64,

    #[command(flatten)]
    pub common: Common,
}
