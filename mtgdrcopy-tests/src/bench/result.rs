//! The one schema of the benchmarks' results: every value that `--json` exports, and every
//! value the human-readable tables print, comes from [`BenchResult`]. Units are in the field
//! names (`_us` microseconds, `_bytes`, `_mib_s` = bytes / second / 2^20).
//!
//! A `--json` file holds one [`Report`]: `{"schema_version": 1, "tool": "...", "results": [...]}`
//! with one flat object per measured (operation, size). Fields that do not apply to a row are
//! left out rather than written as null.
//!
//! `cargo xtask bench` reads the reports back through this module to plot them.

use serde::{Deserialize, Serialize};

/// Bumped when a field changes meaning or disappears (adding a field does not bump it).
pub const SCHEMA_VERSION: u32 = 1;

/// What one `--json` file holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    pub tool: Tool,
    pub results: Vec<BenchResult>,
}

/// The program that measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    Copybw,
    Copylat,
    Apiperf,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Copybw => "copybw",
            Tool::Copylat => "copylat",
            Tool::Apiperf => "apiperf",
        }
    }
}

/// The call that was timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `gdr_copy_to_mapping`: host memory → device memory, CPU stores through the mapping.
    CopyToMapping,
    /// `gdr_copy_from_mapping`: device memory → host memory, CPU loads through the mapping.
    CopyFromMapping,
    /// `muMemcpyHtoD`: the runtime's copy, for comparison.
    MemcpyHtod,
    /// `muMemcpyDtoH`: the runtime's copy, for comparison.
    MemcpyDtoh,
    /// `gdr_pin_buffer`.
    Pin,
    /// `gdr_map_v2`.
    Map,
    /// `gdr_get_info_v2`.
    GetInfo,
    /// `gdr_unmap`.
    Unmap,
    /// `gdr_unpin_buffer`.
    Unpin,
}

impl Operation {
    /// The calls of one apiperf cycle, in the order they are made and reported.
    pub const APIPERF_CYCLE: [Operation; 5] = [
        Operation::Pin,
        Operation::Map,
        Operation::GetInfo,
        Operation::Unmap,
        Operation::Unpin,
    ];

    /// The C function that was timed.
    pub fn function(self) -> &'static str {
        match self {
            Operation::CopyToMapping => "gdr_copy_to_mapping",
            Operation::CopyFromMapping => "gdr_copy_from_mapping",
            Operation::MemcpyHtod => "muMemcpyHtoD",
            Operation::MemcpyDtoh => "muMemcpyDtoH",
            Operation::Pin => "gdr_pin_buffer",
            Operation::Map => "gdr_map_v2",
            Operation::GetInfo => "gdr_get_info_v2",
            Operation::Unmap => "gdr_unmap",
            Operation::Unpin => "gdr_unpin_buffer",
        }
    }

    /// Short name for tables and plot legends.
    pub fn short(self) -> &'static str {
        match self {
            Operation::CopyToMapping => "to_mapping",
            Operation::CopyFromMapping => "from_mapping",
            Operation::MemcpyHtod => "memcpy_h2d",
            Operation::MemcpyDtoh => "memcpy_d2h",
            Operation::Pin => "pin",
            Operation::Map => "map",
            Operation::GetInfo => "get_info",
            Operation::Unmap => "unmap",
            Operation::Unpin => "unpin",
        }
    }

    /// Which way the data moved, for copies.
    pub fn direction(self) -> Option<Direction> {
        match self {
            Operation::CopyToMapping | Operation::MemcpyHtod => Some(Direction::HostToDevice),
            Operation::CopyFromMapping | Operation::MemcpyDtoh => Some(Direction::DeviceToHost),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// Host → device ("write" in copybw).
    #[serde(rename = "h2d")]
    HostToDevice,
    /// Device → host ("read" in copybw).
    #[serde(rename = "d2h")]
    DeviceToHost,
}

/// Where and how a tool ran: the same for every row of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    pub tool: Tool,
    /// The mtgdrcopy-tests package version.
    pub tool_version: String,
    /// Device ordinal (`-d`).
    pub device_index: i32,
    /// As the MUSA driver reports it.
    pub device_name: String,
    /// `DDDD:BB:DD.F`, when the driver tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// `muDriverGetVersion`, when the driver tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_driver_version: Option<i32>,
    /// `gdr_runtime_get_version` of the loaded libgdrapi, `major.minor`.
    pub gdrapi_version: String,
    /// `gdr_driver_get_version`: the mtgdrdrv kernel module, `major.minor`.
    pub mtgdrdrv_version: String,
    /// The copy routine libgdrapi uses on this CPU (`GDRCOPY_COPY_VARIANT` overrides).
    pub copy_variant: String,
    /// The allocation function of the device buffer (`-a`).
    pub alloc_fn: String,
    /// Mapping type asked of `gdr_map_v2` (`-M`): default, wc, cache or device.
    pub mapping_requested: String,
    /// Mapping type obtained, as `gdr_get_mapping_type_string` names it (e.g. `WC`).
    pub mapping_type: String,
    /// Device buffer allocated, bytes, after rounding up to the GPU page (apiperf: the largest
    /// pin size).
    pub buffer_size_bytes: u64,
    /// GPU page size of the mapping (`info.page_size`), bytes.
    pub gpu_page_size_bytes: u64,
}

/// One measured (operation, size): the schema. Times are per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    #[serde(flatten)]
    pub setup: Setup,
    pub operation: Operation,
    /// Which way the data moved; absent for the pin/map calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Bytes copied per call (copies) or pinned and mapped (apiperf).
    pub size_bytes: u64,
    /// Offset into the mapping of each copy, bytes (copybw `-o`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset_bytes: u64,
    /// Timed calls.
    pub iterations: u64,
    /// Untimed calls before them (apiperf `-w`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_iterations: Option<u64>,
    /// copylat: the timed calls were split into this many equal buckets, each timed as a whole;
    /// `min_us` and `median_us` are then over the buckets' mean per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u64>,
    /// Mean time per call, µs.
    pub mean_us: f64,
    /// P0: the shortest call (or bucket mean), µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_us: Option<f64>,
    /// P50: the median call (or bucket mean), µs; the sample at index n/2 of the sorted ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_us: Option<f64>,
    /// The longest call, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_us: Option<f64>,
    /// Copy bandwidth in MiB/s: bytes / seconds / 2^20 (what upstream prints as "MB/s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_mib_s: Option<f64>,
    /// copylat `-C`: every copy was preceded by a muMemsetD8 of its range, whose mean cost
    /// (`memset_us`, measured separately) was subtracted from the times.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cold_cache: bool,
    /// Mean cost of the memset subtracted per call, µs (cold cache only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memset_us: Option<f64>,
    /// apiperf: histogram of this call's latency (pin only), 10 equal bins over [min, max].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<Vec<HistogramBin>>,
}

impl BenchResult {
    /// A row of `setup` with the fields every row has; the optional ones are left out.
    pub fn new(
        setup: &Setup,
        operation: Operation,
        size_bytes: u64,
        iterations: u64,
        mean_us: f64,
    ) -> BenchResult {
        BenchResult {
            setup: setup.clone(),
            operation,
            direction: operation.direction(),
            size_bytes,
            offset_bytes: 0,
            iterations,
            warmup_iterations: None,
            buckets: None,
            mean_us,
            min_us: None,
            median_us: None,
            max_us: None,
            bandwidth_mib_s: None,
            cold_cache: false,
            memset_us: None,
            histogram: None,
        }
    }
}

/// One histogram bin: the samples with `low_us <= x < high_us`; the last bin also holds
/// `x == high_us` (the largest sample).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistogramBin {
    /// Lower edge, inclusive, µs.
    pub low_us: f64,
    /// Upper edge, µs: exclusive, except in the last bin.
    pub high_us: f64,
    /// Samples in the bin.
    pub count: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            tool: Tool::Copylat,
            tool_version: "1.0.0".into(),
            device_index: 0,
            device_name: "MTT S4000".into(),
            pci_bus_id: Some("0000:3b:00.0".into()),
            gpu_driver_version: None,
            gdrapi_version: "1.0".into(),
            mtgdrdrv_version: "0.1".into(),
            copy_variant: "avx2".into(),
            alloc_fn: "muMemAlloc".into(),
            mapping_requested: "default".into(),
            mapping_type: "WC".into(),
            buffer_size_bytes: 1 << 24,
            gpu_page_size_bytes: 65536,
        }
    }

    fn row(operation: Operation) -> BenchResult {
        BenchResult {
            buckets: Some(100),
            min_us: Some(0.41),
            median_us: Some(0.4366),
            ..BenchResult::new(&setup(), operation, 4096, 10_000, 0.4366)
        }
    }

    #[test]
    fn report_round_trips_through_json() {
        let mut pin = row(Operation::Pin);
        pin.histogram = Some(vec![
            HistogramBin {
                low_us: 1.5,
                high_us: 2.25,
                count: 98,
            },
            HistogramBin {
                low_us: 2.25,
                high_us: 3.0,
                count: 2,
            },
        ]);
        pin.warmup_iterations = Some(10);
        pin.max_us = Some(3.0);
        let mut bw = row(Operation::CopyFromMapping);
        bw.offset_bytes = 64;
        bw.bandwidth_mib_s = Some(530.135);
        bw.cold_cache = true;
        bw.memset_us = Some(1.25);
        bw.setup.pci_bus_id = None;
        let report = Report {
            schema_version: SCHEMA_VERSION,
            tool: Tool::Copylat,
            results: vec![row(Operation::CopyToMapping), pin, bw],
        };
        let text = serde_json::to_string_pretty(&report).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn rows_are_flat_with_units_in_the_names_and_absent_fields_left_out() {
        let v = serde_json::to_value(row(Operation::CopyToMapping)).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj["operation"], "copy_to_mapping");
        assert_eq!(obj["direction"], "h2d");
        assert_eq!(obj["tool"], "copylat");
        assert_eq!(obj["device_name"], "MTT S4000");
        assert_eq!(obj["mean_us"], 0.4366);
        assert_eq!(obj["size_bytes"], 4096);
        for absent in [
            "offset_bytes",
            "max_us",
            "bandwidth_mib_s",
            "cold_cache",
            "histogram",
            "gpu_driver_version",
            "setup",
        ] {
            assert!(!obj.contains_key(absent), "{absent} in {v}");
        }
        let v = serde_json::to_value(row(Operation::Unpin)).unwrap();
        assert!(v.get("direction").is_none());
        assert_eq!(v["operation"], "unpin");
    }
}
