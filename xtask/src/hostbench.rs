//! Host microbenchmarks of the copy routines on ordinary memory (`cargo xtask bench`): every
//! variant the CPU supports, both directions, 1 B – 16 MiB, run by
//! `libgdrapi/examples/copy_bench.rs` (median of 31 calibrated samples with a 95% interval).
//! Writes `build/bench/host-copy.json` and one SVG per direction. These figures show the CPU side
//! of the copy path only: on a write-combined BAR the PCIe transactions set the pace.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::bench::{line_chart, Series, COLORS};
use crate::paths;

/// One measured case; times in nanoseconds per copy.
#[derive(Serialize)]
struct HostCopy {
    variant: String,
    /// `to` (host → "device") or `from`.
    direction: String,
    size_bytes: u64,
    median_ns: f64,
    ci95_low_ns: f64,
    ci95_high_ns: f64,
    min_ns: f64,
    samples: u32,
    iterations_per_sample: u64,
    /// size / median, in GiB/s.
    throughput_gib_s: f64,
}

#[derive(Serialize)]
struct HostReport {
    /// Always "ordinary memory": no device mapping is involved.
    memory: &'static str,
    cpu: String,
    results: Vec<HostCopy>,
}

pub fn run(sh: &Shell, out: &Path) -> Result<Vec<PathBuf>> {
    cmd!(
        sh,
        "cargo build --quiet --release -p libgdrapi --example copy_bench"
    )
    .run()?;
    let exe = paths::root().join("target/release/examples/copy_bench");
    let text = cmd!(sh, "{exe}").read().context("running copy_bench")?;
    let results = parse(&text)?;
    let report = HostReport {
        memory: "ordinary memory",
        cpu: cpu_name(),
        results,
    };
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("host-copy.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut written = vec![out.join("host-copy.json")];
    for (direction, what) in [
        ("to", "gdr_copy_to_mapping routine"),
        ("from", "gdr_copy_from_mapping routine"),
    ] {
        let series: Vec<Series> = variants(&report.results)
            .iter()
            .zip(COLORS.iter().cycle())
            .map(|(variant, &color)| Series {
                label: variant.clone(),
                points: report
                    .results
                    .iter()
                    .filter(|r| &r.variant == variant && r.direction == direction)
                    .map(|r| ((r.size_bytes as f64).log2(), r.throughput_gib_s))
                    .filter(|&(_, y)| y > 0.0 && y.is_finite())
                    .collect(),
                color,
                dashed: false,
            })
            .collect();
        let path = out.join(format!("host-copy-{direction}.svg"));
        line_chart(
            &path,
            &format!("{what} on ordinary memory, {}", report.cpu),
            "GiB/s (size / median time)",
            &series,
        )?;
        written.push(path);
    }
    Ok(written)
}

fn variants(results: &[HostCopy]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in results {
        if !names.contains(&r.variant) {
            names.push(r.variant.clone());
        }
    }
    names
}

fn parse(text: &str) -> Result<Vec<HostCopy>> {
    let mut rows = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        let [variant, direction, size, median, low, high, min, samples, iterations] = f.as_slice()
        else {
            bail!("unexpected copy_bench line: {line}");
        };
        let size_bytes: u64 = size.parse()?;
        let median_ns: f64 = median.parse()?;
        rows.push(HostCopy {
            variant: variant.to_string(),
            direction: direction.to_string(),
            size_bytes,
            median_ns,
            ci95_low_ns: low.parse()?,
            ci95_high_ns: high.parse()?,
            min_ns: min.parse()?,
            samples: samples.parse()?,
            iterations_per_sample: iterations.parse()?,
            throughput_gib_s: size_bytes as f64 / median_ns / 1.073_741_824,
        });
    }
    if rows.is_empty() {
        bail!("copy_bench printed no results");
    }
    Ok(rows)
}

/// The CPU model, for the report and the plots' titles.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
