//! Options the three benchmarks share, and the parsers of their values.

use std::ffi::c_int;

use clap::ValueEnum;
use gdrapi::MapRequest;

/// `-d`, `-a`, `-M`, `--json`: the same letters and meaning in copybw, copylat and apiperf.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// GPU device ordinal (0-based, as the MUSA driver numbers devices).
    #[arg(short = 'd', long = "device", value_name = "GPU", default_value_t = 0,
          value_parser = parse_device)]
    pub device: i32,

    /// Function that allocates the device buffer: muMemAlloc, or muMemCreate (the VMM API:
    /// created GPUDirect-RDMA capable, reserved, mapped, read-write, as upstream's cuMemCreate).
    /// Upstream's names cuMemAlloc and cuMemCreate are accepted as synonyms.
    #[arg(short = 'a', long = "alloc-fn", value_name = "FN", default_value = "muMemAlloc",
          value_parser = parse_alloc_fn)]
    pub alloc_fn: AllocFn,

    /// Mapping type to request from gdr_map_v2. "default" lets the driver choose; mtgpu BAR
    /// mappings are write-combined (WC). A type the driver cannot give is an error.
    #[arg(short = 'M', long = "mapping", value_name = "TYPE", value_enum,
          default_value_t = MapType::Default)]
    pub mapping: MapType,

    /// Also write the results as JSON to FILE ("-" for standard output, which moves the
    /// human-readable report to standard error). The JSON goes to a temporary file in FILE's
    /// directory, created before anything is measured, and is renamed to FILE only when the run
    /// succeeds: a failed run leaves FILE as it was. The schema: one object per measured operation and size, units in the field
    /// names (_us microseconds, _bytes, _mib_s).
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,

    #[command(flatten)]
    pub version: crate::tool::VersionFlag,
}

/// The allocation functions (`-a`).
pub use crate::gpu::AllocFn;

/// Parses `-a`.
pub fn parse_alloc_fn(s: &str) -> Result<AllocFn, String> {
    match s {
        "muMemAlloc" | "cuMemAlloc" => Ok(AllocFn::MuMemAlloc),
        "muMemCreate" | "cuMemCreate" => Ok(AllocFn::MuMemCreate),
        _ => Err(format!(
            "unknown allocation function {s:?}; use muMemAlloc or muMemCreate (or upstream's \
             cuMemAlloc, cuMemCreate)"
        )),
    }
}

/// `-M`: what `gdr_map_v2` is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MapType {
    /// GDR_MAP_FLAG_DEFAULT: whatever the driver gives (WC on mtgpu).
    Default,
    /// GDR_MAP_FLAG_REQ_WC_MAPPING: write-combined.
    Wc,
    /// GDR_MAP_FLAG_REQ_CACHE_MAPPING: cached (only on cache-coherent platforms).
    Cache,
    /// GDR_MAP_FLAG_REQ_DEVICE_MAPPING: uncached device memory.
    Device,
}

impl MapType {
    pub fn name(self) -> &'static str {
        match self {
            MapType::Default => "default",
            MapType::Wc => "wc",
            MapType::Cache => "cache",
            MapType::Device => "device",
        }
    }

    /// The `gdr_map_flags_t` value.
    pub fn flag(self) -> c_int {
        (match self {
            MapType::Default => MapRequest::Default,
            MapType::Wc => MapRequest::WriteCombining,
            MapType::Cache => MapRequest::Caching,
            MapType::Device => MapRequest::Device,
        }) as c_int
    }
}

/// Splits a number written as upstream's tools read theirs (`strtol(arg, NULL, 0)`): `0x` or
/// `0X` then hexadecimal digits, a leading `0` then octal digits, else decimal digits. Returns
/// None when there are no digits, else the value (None when it overflows u64) and what follows
/// the digits.
fn c_number(t: &str) -> Option<(Option<u64>, &str)> {
    let (radix, body) = match t.get(..2) {
        Some("0x" | "0X") => (16, &t[2..]),
        _ if t.len() > 1 && t.starts_with('0') => (8, &t[1..]),
        _ => (10, t),
    };
    let end = body
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(body.len());
    let (digits, rest) = body.split_at(end);
    match (radix, digits) {
        (8, "") => Some((Some(0), rest)),
        (_, "") => None,
        _ => Some((u64::from_str_radix(digits, radix).ok(), rest)),
    }
}

/// A size in bytes: a number as upstream reads it (decimal, `0x` hexadecimal or `0` octal),
/// optionally followed by a binary K, M or G suffix.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let Some((value, suffix)) = c_number(t) else {
        return Err(format!(
            "{s:?} is not a size: expected bytes, optionally with a K, M or G suffix (64K)"
        ));
    };
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(format!(
                "unknown size suffix {suffix:?} in {s:?}: use K, M or G (binary: 1K = 1024 bytes)"
            ))
        }
    };
    let n = value.ok_or_else(|| format!("{s:?} is too large a size"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large a size"))
}

/// A whole number with nothing after it, read as upstream reads its numeric options.
fn parse_c_number(s: &str) -> Option<u64> {
    match c_number(s.trim()) {
        Some((Some(n), "")) => Some(n),
        _ => None,
    }
}

/// A GPU ordinal (`-d`), read as upstream reads it: 0, 1, … (also `0x1`).
pub fn parse_device(s: &str) -> Result<i32, String> {
    parse_c_number(s)
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is not a GPU ordinal (0, 1, …)"))
}

/// An iteration count: at least 1.
pub fn parse_iterations(s: &str) -> Result<u64, String> {
    match parse_c_number(s) {
        Some(0) => Err("the iteration count must be at least 1".into()),
        Some(n) => Ok(n),
        None => Err(format!("{s:?} is not an iteration count")),
    }
}

/// A count that may be 0 (apiperf's warm-up cycles `-w`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    parse_c_number(s).ok_or_else(|| format!("{s:?} is not a count (0, 1, …)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("131072"), Ok(131072));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64kib"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("12b"), Ok(12));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("4T").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err());
    }

    #[test]
    fn numbers_are_read_as_upstreams_strtol_base_0() {
        assert_eq!(parse_size("0x10000"), Ok(65536));
        assert_eq!(parse_size("0X1B"), Ok(27));
        assert_eq!(parse_size("0x40K"), Ok(65536));
        assert_eq!(parse_size("010"), Ok(8));
        assert_eq!(parse_size("00"), Ok(0));
        assert!(parse_size("0x").is_err());
        assert!(parse_size("09").is_err());
        assert_eq!(parse_iterations("0x64"), Ok(100));
        assert!(parse_iterations("0x0").is_err());
        assert!(parse_iterations("10x").is_err());
        assert_eq!(parse_count("0"), Ok(0));
        assert_eq!(parse_count("0x1"), Ok(1));
        assert_eq!(parse_count("010"), Ok(8));
        assert!(parse_count("-1").is_err());
        assert_eq!(parse_device("0"), Ok(0));
        assert_eq!(parse_device("0x1"), Ok(1));
        assert_eq!(parse_device("012"), Ok(10));
        assert!(parse_device("-1").is_err());
        assert!(parse_device("2147483648").is_err());
        assert!(parse_device("one").is_err());
    }

    #[test]
    fn alloc_fn_names() {
        assert_eq!(parse_alloc_fn("muMemAlloc"), Ok(AllocFn::MuMemAlloc));
        assert_eq!(parse_alloc_fn("cuMemAlloc"), Ok(AllocFn::MuMemAlloc));
        assert_eq!(parse_alloc_fn("muMemCreate"), Ok(AllocFn::MuMemCreate));
        assert_eq!(parse_alloc_fn("cuMemCreate"), Ok(AllocFn::MuMemCreate));
        let e = parse_alloc_fn("malloc").unwrap_err();
        assert!(e.contains("muMemCreate"), "{e}");
    }

    #[test]
    fn iterations_are_positive() {
        assert_eq!(parse_iterations("10"), Ok(10));
        assert!(parse_iterations("0").is_err());
        assert!(parse_iterations("x").is_err());
    }
}
