//! The lines upstream GDRCopy's benchmarks print and scripts parse, rebuilt byte for byte from
//! our results: copybw's `write BW: 9638.54MB/s` / `read BW: ...`, copylat's table (`Test`,
//! `Size(B)`, `Median Time(us)`, `Min. Time(us)`) and apiperf's header line and row of means.
//! Each tool prints them after its own table, to wherever its human-readable report goes
//! (standard output, or standard error when `--json -` takes standard output), so that a
//! script written for upstream finds them and `--json` stays clean.
//!
//! Upstream's "MB/s" is bytes / seconds / 2^20, our `bandwidth_mib_s`. The rows of the runtime's
//! memcpy keep upstream's labels `cuMemcpy_H2D` / `cuMemcpy_D2H` although they time
//! `muMemcpyHtoD` / `muMemcpyDtoH`: the labels are what scripts match.

use std::fmt::Write as _;

use super::result::{BenchResult, Operation};

/// `value` as a C++ output stream writes a `double` by default (what upstream's copybw uses):
/// six significant digits, trailing zeros dropped, scientific notation for exponents below -4
/// or from 6 up, like printf's `%g`.
pub fn cxx_double(value: f64) -> String {
    const DIGITS: i32 = 6;
    if value.is_nan() {
        return if value.is_sign_negative() {
            "-nan"
        } else {
            "nan"
        }
        .into();
    }
    if value.is_infinite() {
        return if value < 0.0 { "-inf" } else { "inf" }.into();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to six digits decides the notation (999999.5 is "1e+06").
    let sci = format!("{:.*e}", (DIGITS - 1) as usize, value);
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..DIGITS).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!(
            "{}e{sign}{:02}",
            strip_fraction_zeros(mantissa),
            exponent.abs()
        )
    } else {
        let decimals = (DIGITS - 1 - exponent) as usize;
        strip_fraction_zeros(&format!("{value:.decimals$}")).to_string()
    }
}

fn strip_fraction_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// copybw: per copy size, `writing test, size=S offset=O num_iters=N`, `write BW: XMB/s`, then
/// the same for reading, in upstream's order (each size written, then read).
pub fn copybw(results: &[BenchResult]) -> String {
    let mut s = String::new();
    let writes = results
        .iter()
        .filter(|r| r.operation == Operation::CopyToMapping);
    for w in writes {
        let read = results
            .iter()
            .find(|r| r.operation == Operation::CopyFromMapping && r.size_bytes == w.size_bytes);
        for (row, test, bw) in [(Some(w), "writing", "write"), (read, "reading", "read")] {
            let Some(row) = row else { continue };
            let _ = writeln!(
                s,
                "{test} test, size={} offset={} num_iters={}\n{bw} BW: {}MB/s",
                row.size_bytes,
                row.offset_bytes,
                row.iterations,
                cxx_double(row.bandwidth_mib_s.unwrap_or(f64::INFINITY))
            );
        }
    }
    s
}

/// copylat: upstream's sections (the runtime's memcpy first, when measured, then the copies
/// to and from the mapping), each a blank line, `LABEL num iters for each size: N`, the header
/// and one row per size: `LABEL \t %8zu \t %11.4f \t %11.4f` (median, then minimum, in µs).
pub fn copylat(results: &[BenchResult]) -> String {
    let mut s = String::new();
    for (op, label, tabs) in [
        (Operation::MemcpyHtod, "cuMemcpy_H2D", "\t\t"),
        (Operation::MemcpyDtoh, "cuMemcpy_D2H", "\t\t"),
        (Operation::CopyToMapping, "gdr_copy_to_mapping", "\t\t\t"),
        (
            Operation::CopyFromMapping,
            "gdr_copy_from_mapping",
            "\t\t\t",
        ),
    ] {
        let rows: Vec<&BenchResult> = results.iter().filter(|r| r.operation == op).collect();
        let Some(first) = rows.first() else { continue };
        let _ = writeln!(
            s,
            "\n{label} num iters for each size: {}\n\
             Test {tabs} Size(B) \t Median Time(us) \t Min. Time(us)",
            first.iterations
        );
        for r in rows {
            let _ = writeln!(
                s,
                "{label} \t {:>8} \t {:>11.4} \t {:>11.4}",
                r.size_bytes,
                r.median_us.unwrap_or(r.mean_us),
                r.min_us.unwrap_or(r.mean_us)
            );
        }
    }
    s
}

/// apiperf: per pin size, upstream's header line and the row of mean times (µs, `%f`) of pin,
/// map, get_info, unmap and unpin.
pub fn apiperf(results: &[BenchResult]) -> String {
    let mut s = String::new();
    let mut sizes: Vec<u64> = Vec::new();
    for r in results {
        if !sizes.contains(&r.size_bytes) {
            sizes.push(r.size_bytes);
        }
    }
    for size in sizes {
        let _ = write!(
            s,
            "Size(B)\tpin.Time(us)\tmap.Time(us)\tget_info.Time(us)\tunmap.Time(us)\t\
             unpin.Time(us)\n{size}"
        );
        for op in Operation::APIPERF_CYCLE {
            let mean = results
                .iter()
                .find(|r| r.operation == op && r.size_bytes == size)
                .map_or(f64::NAN, |r| r.mean_us);
            let _ = write!(s, "\t{mean:.6}");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::{Setup, Tool};

    #[test]
    fn doubles_print_as_a_cxx_stream_prints_them() {
        for (v, text) in [
            (9638.5412, "9638.54"),
            (530.1349, "530.135"),
            (492.157, "492.157"),
            (100000.0, "100000"),
            (123456.7, "123457"),
            (999999.5, "1e+06"),
            (1234567.0, "1.23457e+06"),
            (12.5, "12.5"),
            (1.0, "1"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (0.0, "0"),
            (1e300, "1e+300"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(cxx_double(v), text, "{v}");
        }
    }

    fn setup() -> Setup {
        Setup {
            tool: Tool::Copybw,
            tool_version: "1.0.0".into(),
            device_index: 0,
            device_name: "emu".into(),
            pci_bus_id: None,
            gpu_driver_version: None,
            gdrapi_version: "1.0".into(),
            mtgdrdrv_version: "0.1".into(),
            copy_variant: "avx2".into(),
            alloc_fn: "muMemAlloc".into(),
            mapping_requested: "default".into(),
            mapping_type: "WC".into(),
            buffer_size_bytes: 65536,
            gpu_page_size_bytes: 65536,
        }
    }

    fn row(op: Operation, size: u64, iters: u64, mean: f64) -> BenchResult {
        BenchResult::new(&setup(), op, size, iters, mean)
    }

    #[test]
    fn copybw_lines_are_upstreams() {
        let mut rows = Vec::new();
        for (op, iters, bw) in [
            (Operation::CopyToMapping, 10000, 9638.5412),
            (Operation::CopyFromMapping, 100, 530.1349),
        ] {
            for size in [1, 2] {
                rows.push(BenchResult {
                    offset_bytes: 4,
                    bandwidth_mib_s: Some(bw * size as f64),
                    ..row(op, size, iters, 1.0)
                });
            }
        }
        assert_eq!(
            copybw(&rows),
            "writing test, size=1 offset=4 num_iters=10000\nwrite BW: 9638.54MB/s\n\
             reading test, size=1 offset=4 num_iters=100\nread BW: 530.135MB/s\n\
             writing test, size=2 offset=4 num_iters=10000\nwrite BW: 19277.1MB/s\n\
             reading test, size=2 offset=4 num_iters=100\nread BW: 1060.27MB/s\n"
        );
    }

    #[test]
    fn copylat_table_is_upstreams() {
        let lat = |op, size, iters, median, min| BenchResult {
            median_us: Some(median),
            min_us: Some(min),
            ..row(op, size, iters, 9.0)
        };
        let rows = [
            lat(Operation::CopyToMapping, 1, 10000, 0.0912, 0.08),
            lat(Operation::CopyToMapping, 65536, 10000, 12.34567, 11.0),
            lat(Operation::CopyFromMapping, 1, 100, 1.5, 1.25),
            lat(Operation::MemcpyHtod, 1, 10000, 5.0, 4.0),
            lat(Operation::MemcpyDtoh, 1, 100, 1234.5, 6.0),
        ];
        assert_eq!(
            copylat(&rows),
            "\ncuMemcpy_H2D num iters for each size: 10000\n\
             Test \t\t Size(B) \t Median Time(us) \t Min. Time(us)\n\
             cuMemcpy_H2D \t        1 \t      5.0000 \t      4.0000\n\
             \ncuMemcpy_D2H num iters for each size: 100\n\
             Test \t\t Size(B) \t Median Time(us) \t Min. Time(us)\n\
             cuMemcpy_D2H \t        1 \t   1234.5000 \t      6.0000\n\
             \ngdr_copy_to_mapping num iters for each size: 10000\n\
             Test \t\t\t Size(B) \t Median Time(us) \t Min. Time(us)\n\
             gdr_copy_to_mapping \t        1 \t      0.0912 \t      0.0800\n\
             gdr_copy_to_mapping \t    65536 \t     12.3457 \t     11.0000\n\
             \ngdr_copy_from_mapping num iters for each size: 100\n\
             Test \t\t\t Size(B) \t Median Time(us) \t Min. Time(us)\n\
             gdr_copy_from_mapping \t        1 \t      1.5000 \t      1.2500\n"
        );
        assert!(!copylat(&rows[..3]).contains("cuMemcpy"));
    }

    #[test]
    fn apiperf_header_and_rows_are_upstreams() {
        let mut rows = Vec::new();
        for size in [65536, 131072] {
            for (k, op) in [
                Operation::Pin,
                Operation::Map,
                Operation::GetInfo,
                Operation::Unmap,
                Operation::Unpin,
            ]
            .into_iter()
            .enumerate()
            {
                rows.push(row(
                    op,
                    size,
                    100,
                    1346.03406 + k as f64 + size as f64 / 65536.0,
                ));
            }
        }
        let header = "Size(B)\tpin.Time(us)\tmap.Time(us)\tget_info.Time(us)\tunmap.Time(us)\t\
                      unpin.Time(us)\n";
        assert_eq!(
            apiperf(&rows),
            format!(
                "{header}65536\t1347.034060\t1348.034060\t1349.034060\t1350.034060\t1351.034060\n\
                 {header}131072\t1348.034060\t1349.034060\t1350.034060\t1351.034060\t1352.034060\n"
            )
        );
    }
}
