//! Host microbenchmarks of the copy routines on ordinary memory (`cargo xtask bench`): every
//! variant the CPU supports, both directions, 1 B – 16 MiB, run by
//! `libgdrapi/examples/copy_bench.rs` (median of 31 calibrated samples with a 95% interval).
//! Writes `build/bench/host-copy.json` and one SVG per direction. These figures show the CPU side
//! of the copy path only: on a write-combined BAR the PCIe transactions set the pace.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use xshell::{cmd, Shell};

use xtask_base::paths;

use crate::plot::{line_chart, Series, COLORS};
use xtask_testbench::copycount;
use xtask_testbench::cpu::cpu_name;

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
    let exe = paths::release_dir().join("examples/copy_bench");
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

/// Sizes of the public-call timings.
const CALL_SIZES: [usize; 7] = [1, 8, 64, 256, 4096, 65536, 1 << 20];

/// One public-call timing: ns per `gdr_copy_*_mapping` call, median of 31 interleaved rounds.
#[derive(Serialize)]
struct CallTime {
    library: String,
    /// `to` (host → "device") or `from`.
    direction: String,
    size_bytes: u64,
    median_ns: f64,
    min_ns: f64,
}

#[derive(Serialize)]
struct CallReport {
    /// Always "ordinary memory": the device node is a test double, the "BAR" anonymous memory.
    memory: &'static str,
    cpu: String,
    /// The copy variant our library chose (its default on this CPU).
    variant: String,
    results: Vec<CallTime>,
}

/// Times the public copy calls as an application makes them (the copy harness, through a
/// mapping handle), for our library with its default variant and, when given, another gdrapi
/// library interleaved with it. Prints a table; writes `host-calls.json`.
pub fn public_calls(sh: &Shell, out: &Path, compare_with: Option<&Path>) -> Result<Vec<PathBuf>> {
    let tools = copycount::build(sh)?;
    let mut libraries = vec![tools.library.clone()];
    if let Some(other) = compare_with {
        ensure!(other.is_file(), "{} does not exist", other.display());
        libraries.push(other.to_path_buf());
    }
    let input: String = ["to", "from"]
        .iter()
        .flat_map(|dir| CALL_SIZES.iter().map(move |s| format!("{dir} {s} 0 0\n")))
        .collect();
    let harness = &tools.harness;
    let preload = &tools.preload;
    let args = libraries.clone();
    let text = cmd!(sh, "{harness} time {args...}")
        .env("LD_PRELOAD", preload)
        .env_remove(gdrapi::copy::VARIANT_ENV)
        .stdin(input)
        .read()
        .context("running the copy harness")?;
    let names: Vec<String> = libraries
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                "libgdrapi (this tree)".to_string()
            } else {
                l.display().to_string()
            }
        })
        .collect();
    let mut results = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [lib, dir, size, _, _, median, min] = f.as_slice() else {
            bail!("unexpected harness line: {line}");
        };
        let lib: usize = lib.parse()?;
        results.push(CallTime {
            library: names
                .get(lib)
                .context("harness named an unknown library")?
                .clone(),
            direction: dir.to_string(),
            size_bytes: size.parse()?,
            median_ns: median.parse()?,
            min_ns: min.parse()?,
        });
    }
    let report = CallReport {
        memory: "ordinary memory",
        cpu: cpu_name(),
        variant: gdrapi::copy::default_variant().name.to_string(),
        results,
    };
    print!("{}", render_calls(&report, &names));
    let path = out.join("host-calls.json");
    std::fs::create_dir_all(out)?;
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    let mut series = Vec::new();
    for (i, name) in names.iter().enumerate() {
        for (dir, dashed) in [("to", false), ("from", true)] {
            let short = if i == 0 {
                "this tree".to_string()
            } else {
                libraries[i]
                    .file_name()
                    .map_or_else(|| name.clone(), |f| f.to_string_lossy().into_owned())
            };
            series.push(Series {
                label: format!("{short} {dir}"),
                points: report
                    .results
                    .iter()
                    .filter(|r| &r.library == name && r.direction == dir)
                    .map(|r| {
                        (
                            (r.size_bytes as f64).log2(),
                            r.size_bytes as f64 / r.median_ns / 1.073_741_824,
                        )
                    })
                    .collect(),
                // One colour per library; reads dashed.
                color: COLORS[i % COLORS.len()],
                dashed,
            });
        }
    }
    let svg = out.join("host-calls.svg");
    line_chart(
        &svg,
        &format!(
            "gdr_copy_{{to,from}}_mapping calls on ordinary memory, {}",
            report.cpu
        ),
        "GiB/s (size / median time per call)",
        &series,
    )?;
    Ok(vec![path, svg])
}

fn render_calls(report: &CallReport, names: &[String]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "public copy calls, median ns per call (ordinary memory; {}; our variant {}):",
        report.cpu, report.variant
    );
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(out, "  [{i}] {name}");
    }
    let _ = write!(out, "{:>8} {:>5}", "size", "dir");
    for i in 0..names.len() {
        let _ = write!(out, " {:>10}", format!("[{i}] ns"));
    }
    if names.len() == 2 {
        let _ = write!(out, " {:>7}", "[0]/[1]");
    }
    let _ = writeln!(out);
    for dir in ["to", "from"] {
        for size in CALL_SIZES {
            let cells: Vec<f64> = names
                .iter()
                .filter_map(|n| {
                    report
                        .results
                        .iter()
                        .find(|r| {
                            &r.library == n && r.direction == dir && r.size_bytes == size as u64
                        })
                        .map(|r| r.median_ns)
                })
                .collect();
            let _ = write!(out, "{:>8} {:>5}", copycount::size_label(size), dir);
            for c in &cells {
                let _ = write!(out, " {c:>10.1}");
            }
            if let [ours, theirs] = cells.as_slice() {
                let _ = write!(out, " {:>7.2}", ours / theirs);
            }
            let _ = writeln!(out);
        }
    }
    out
}
