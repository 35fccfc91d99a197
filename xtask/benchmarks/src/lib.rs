//! `cargo xtask bench`: runs mtgdrcopy_copybw, _copylat and _apiperf in the test VM (both
//! modules loaded, the emulated GPU), brings their `--json` reports back over the serial
//! console, checks them against the schema and plots them as SVG.
//!
//! Outputs, in build/bench/: `{copybw,copylat,apiperf}.json` (the tools' reports), `.txt` (their
//! human-readable output) and `.svg` (the plots). The VM runs under TCG: the numbers show the
//! software path's overhead, not PCIe or GPU speed.
//!
//! The console is the only channel out of the guest, and the kernel may print on it at any
//! time, so every line of a file is sent with a `MTGDRCOPY-BENCH <file> ` prefix; lines
//! without it (kernel messages, the boot log) are skipped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use xshell::Shell;

use xtask_base::{host, paths};
use xtask_testbench::kernel::{self, Kernel};
use xtask_testbench::{vm, vmtest};

use plot::{line_chart, Series, COLORS};

mod host_copies;
mod plot;

use mtgdrcopy_tests::bench::result::{BenchResult, Operation, Report, Tool, SCHEMA_VERSION};

#[derive(clap::Args)]
pub struct Args {
    /// Short runs (small sizes, few iterations; about a minute), as CI uses.
    #[arg(long)]
    quick: bool,
    /// Do not run anything: redraw the SVGs from the JSON files already in build/bench/.
    #[arg(long, conflicts_with = "quick")]
    replot: bool,
    /// Only the host microbenchmarks of the copy routines (ordinary memory, no VM).
    #[arg(long, conflicts_with_all = ["quick", "replot"])]
    host_only: bool,
    /// Also time the public copy calls of another gdrapi library (e.g. upstream GDRCopy's
    /// libgdrapi.so.2, which opens /dev/gdrdrv), interleaved with ours in one process.
    #[arg(long, value_name = "LIB")]
    compare_with: Option<PathBuf>,
    /// Where the reports and plots go (default build/bench; `cargo xtask test` uses
    /// build/bench-quick).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// The three tools' arguments for one kind of run (`--json` is added).
struct Profile {
    name: &'static str,
    copybw: &'static str,
    copylat: &'static str,
    apiperf: &'static str,
    /// The whole VM run, boot included.
    timeout: Duration,
}

/// Two to three minutes under TCG: copy sizes to 16 MiB (copybw) and 4 MiB (copylat, whose
/// runtime memcpy is slow through the emulator), 16 MiB pins (apiperf, upstream's default).
const FULL: Profile = Profile {
    name: "full",
    copybw: "-s 16M -l -w 1000 -r 100",
    copylat: "-s 4M -w 1000 -r 100 -c",
    apiperf: "-s 16M -n 100 -w 10",
    timeout: Duration::from_secs(1800),
};

/// Seconds: the shape of every output, not meaningful numbers.
const QUICK: Profile = Profile {
    name: "quick",
    copybw: "-s 64K -l -w 100 -r 10",
    copylat: "-s 64K -w 100 -r 10 -c",
    apiperf: "-s 1M -n 10 -w 2",
    timeout: Duration::from_secs(600),
};

const TOOLS: [Tool; 3] = [Tool::Copybw, Tool::Copylat, Tool::Apiperf];

/// The prefix of every line of a file sent over the console.
const FILE_PREFIX: &str = "MTGDRCOPY-BENCH ";

/// `cargo xtask bench`.
pub fn run(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let profile = if args.quick { &QUICK } else { &FULL };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| paths::build_dir().join("bench"));
    if args.replot {
        let mut reports = Vec::new();
        for tool in TOOLS {
            let path = out.join(format!("{}.json", tool.name()));
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!("reading {} (run cargo xtask bench first)", path.display())
            })?;
            let report =
                parse_report(tool, &text).with_context(|| format!("{}", path.display()))?;
            reports.push((tool, report));
        }
        for svg in plot_all(&reports, &out)? {
            eprintln!("    {}", svg.display());
        }
        return Ok(());
    }
    if args.host_only {
        return host_bench(&sh, &out, args.compare_with.as_deref());
    }
    let t = Instant::now();
    let reports = run_in_vm(&sh, profile, &out)?;
    for (tool, _) in &reports {
        let txt = out.join(format!("{}.txt", tool.name()));
        println!("==> {} ({})", tool.name(), profile_args(profile, *tool));
        print!("{}", std::fs::read_to_string(&txt).unwrap_or_default());
        // Warnings the tool wrote to stderr (e.g. an iteration count raised to the buckets).
        let err = out.join(format!("{}.err", tool.name()));
        let err = std::fs::read_to_string(&err).unwrap_or_default();
        if !err.trim().is_empty() {
            eprint!("{err}");
        }
    }
    let svgs = plot_all(&reports, &out)?;
    eprintln!(
        "xtask: bench ({}) done in {:.0} s; under QEMU TCG the numbers show software overhead, \
         not PCIe speed",
        profile.name,
        t.elapsed().as_secs_f64()
    );
    for (tool, _) in &reports {
        eprintln!(
            "    {}",
            out.join(format!("{}.json", tool.name())).display()
        );
    }
    for svg in svgs {
        eprintln!("    {}", svg.display());
    }
    if !args.quick {
        host_bench(&sh, &out, args.compare_with.as_deref())?;
    }
    Ok(())
}

fn host_bench(sh: &Shell, out: &Path, compare_with: Option<&Path>) -> Result<()> {
    let t = Instant::now();
    let mut files = host_copies::run(sh, out)?;
    files.extend(host_copies::public_calls(sh, out, compare_with)?);
    eprintln!(
        "xtask: host copy microbenchmarks (ordinary memory, not a device mapping) done in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    for f in files {
        eprintln!("    {}", f.display());
    }
    Ok(())
}

fn profile_args(profile: &Profile, tool: Tool) -> &'static str {
    match tool {
        Tool::Copybw => profile.copybw,
        Tool::Copylat => profile.copylat,
        Tool::Apiperf => profile.apiperf,
    }
}

/// The guest script: each tool writes its JSON, its stdout and its stderr to files, which are
/// then sent over the console line by line; a failing tool ends the script after its output
/// was sent.
fn guest_script(profile: &Profile) -> String {
    let mut s = String::from(
        "B=/tmp/bench\n\
         mkdir -p $B\n\
         bench() {\n\
         \x20 name=$1; shift\n\
         \x20 echo \"MTGDRCOPY-STEP $name $(cut -d' ' -f1 /proc/uptime)\"\n\
         \x20 \"$@\" --json $B/$name.json >$B/$name.txt 2>$B/$name.err\n\
         \x20 rc=$?\n\
         \x20 for f in txt err json; do\n\
         \x20   [ -f $B/$name.$f ] && sed \"s/^/MTGDRCOPY-BENCH $name.$f /\" $B/$name.$f\n\
         \x20 done\n\
         \x20 [ $rc -eq 0 ] || { echo \"Bail out! $name exited with $rc\"; exit 1; }\n\
         }\n",
    );
    for tool in TOOLS {
        let name = tool.name();
        let _ = writeln!(
            s,
            "bench {name} mtgdrcopy_{name} {}",
            profile_args(profile, tool)
        );
    }
    s.push_str("echo \"MTGDRCOPY-STEP done $(cut -d' ' -f1 /proc/uptime)\"\n");
    s
}

/// Boots the VM, runs the tools, writes their files into `out` and returns the parsed,
/// checked reports.
fn run_in_vm(sh: &Shell, profile: &Profile, out: &Path) -> Result<Vec<(Tool, Report)>> {
    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    let kernel: Kernel = kernel::bookworm_kernel()?;
    let mut spec = vmtest::tools_vm(sh, &kernel, &guest_script(profile))?;
    spec.timeout = profile.timeout;
    let log = paths::build_dir().join("vm").join("bench.log");
    eprintln!(
        "xtask: bench ({}) in QEMU (TCG) on {}; console in {}",
        profile.name,
        kernel.release,
        log.display()
    );
    let t = Instant::now();
    let outcome = vm::run(&spec, &log)?;
    eprintln!("    VM run: {:.1} s", t.elapsed().as_secs_f64());
    let console = outcome.console.replace('\r', "");
    print_guest_steps(&console);
    let files = extract_files(&console);

    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (name, text) in &files {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    outcome.ensure_no_kernel_problems(&log)?;
    if outcome.exit_code != Some(0) {
        let failure = console
            .lines()
            .find_map(|l| l.split_once("Bail out! ").map(|(_, r)| r.to_string()))
            .unwrap_or_else(|| format!("the guest script exited with {:?}", outcome.exit_code));
        let stderr: String = files
            .iter()
            .filter(|(name, _)| name.ends_with(".err"))
            .map(|(_, text)| text.as_str())
            .collect();
        bail!(
            "{failure}\n{}\nfull log: {}",
            stderr.trim_end(),
            log.display()
        );
    }
    let mut reports = Vec::new();
    for tool in TOOLS {
        let name = format!("{}.json", tool.name());
        let text = files
            .get(&name)
            .with_context(|| format!("the guest sent no {name}; full log: {}", log.display()))?;
        let report = parse_report(tool, text)
            .with_context(|| format!("{} (saved as {})", name, out.join(&name).display()))?;
        reports.push((tool, report));
    }
    Ok(reports)
}

/// The guest's step markers, as durations.
fn print_guest_steps(console: &str) {
    let marks: Vec<(&str, f64)> = console
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("MTGDRCOPY-STEP ")?;
            let mut f = rest.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect();
    for pair in marks.windows(2) {
        eprintln!("      guest {}: {:.1} s", pair[0].0, pair[1].1 - pair[0].1);
    }
}

/// The files the guest sent: file name → text. A line's content is what follows
/// `MTGDRCOPY-BENCH <file> `; other lines are ignored.
fn extract_files(console: &str) -> BTreeMap<String, String> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for line in console.lines() {
        let Some((_, rest)) = line.split_once(FILE_PREFIX) else {
            continue;
        };
        let (name, content) = rest.split_once(' ').unwrap_or((rest, ""));
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-');
        if !name_ok {
            continue;
        }
        let text = files.entry(name.to_string()).or_default();
        text.push_str(content);
        text.push('\n');
    }
    files
}

/// Parses and checks one report: the schema version, the tool, and the operations it must
/// contain, with finite, non-negative times.
fn parse_report(tool: Tool, text: &str) -> Result<Report> {
    let report: Report = serde_json::from_str(text).context("not a valid report")?;
    ensure!(
        report.schema_version == SCHEMA_VERSION,
        "schema version {} (expected {SCHEMA_VERSION})",
        report.schema_version
    );
    ensure!(
        report.tool == tool,
        "written by {} (expected {})",
        report.tool.name(),
        tool.name()
    );
    let expected: &[Operation] = match tool {
        Tool::Copybw => &[Operation::CopyToMapping, Operation::CopyFromMapping],
        Tool::Copylat => &[
            Operation::CopyToMapping,
            Operation::CopyFromMapping,
            Operation::MemcpyHtod,
            Operation::MemcpyDtoh,
        ],
        Tool::Apiperf => &[
            Operation::Pin,
            Operation::Map,
            Operation::GetInfo,
            Operation::Unmap,
            Operation::Unpin,
        ],
    };
    for op in expected {
        ensure!(
            report.results.iter().any(|r| r.operation == *op),
            "no {} result",
            op.function()
        );
    }
    for r in &report.results {
        let times = [Some(r.mean_us), r.min_us, r.median_us, r.max_us];
        ensure!(
            times.iter().flatten().all(|t| t.is_finite() && *t >= 0.0),
            "{} of {} bytes: a time is negative or not finite",
            r.operation.function(),
            r.size_bytes
        );
        ensure!(
            r.setup.tool == tool && r.iterations > 0 && r.size_bytes > 0,
            "{} of {} bytes: inconsistent row",
            r.operation.function(),
            r.size_bytes
        );
    }
    if tool == Tool::Copybw {
        ensure!(
            report.results.iter().all(|r| r.bandwidth_mib_s.is_some()),
            "a copybw row has no bandwidth"
        );
    }
    if tool == Tool::Apiperf {
        let pins = report
            .results
            .iter()
            .filter(|r| r.operation == Operation::Pin);
        for r in pins {
            let bins = r.histogram.as_deref().unwrap_or_default();
            let total: u64 = bins.iter().map(|b| b.count).sum();
            ensure!(
                total == r.iterations,
                "the pin histogram of {} bytes holds {total} of {} calls",
                r.size_bytes,
                r.iterations
            );
        }
    }
    Ok(report)
}

// ---- plots ----

/// The rows of `op`, as (log2 size, value) points with positive values, by size.
fn points(
    report: &Report,
    op: Operation,
    value: impl Fn(&BenchResult) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = report
        .results
        .iter()
        .filter(|r| r.operation == op && r.size_bytes > 0)
        .filter_map(|r| Some(((r.size_bytes as f64).log2(), value(r)?)))
        .filter(|&(_, y)| y > 0.0 && y.is_finite())
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

/// Writes copybw.svg, copylat.svg and apiperf.svg into `out`; returns their paths.
fn plot_all(reports: &[(Tool, Report)], out: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (tool, report) in reports {
        let Some(first) = report.results.first() else {
            continue;
        };
        let device = format!(
            "{}, {} mapping",
            first.setup.device_name, first.setup.mapping_type
        );
        let (title, y_desc, series) = match tool {
            Tool::Copybw => (
                format!("copybw: copy bandwidth through the mapping ({device})"),
                "MiB/s (bytes/s / 2^20)",
                [
                    (Operation::CopyToMapping, "write (gdr_copy_to_mapping)"),
                    (Operation::CopyFromMapping, "read (gdr_copy_from_mapping)"),
                ]
                .iter()
                .zip(COLORS)
                .map(|(&(op, label), color)| Series {
                    label: label.into(),
                    points: points(report, op, |r| r.bandwidth_mib_s),
                    color,
                    dashed: false,
                })
                .collect::<Vec<_>>(),
            ),
            Tool::Copylat => {
                let mut v = Vec::new();
                let ops = [
                    Operation::CopyToMapping,
                    Operation::CopyFromMapping,
                    Operation::MemcpyHtod,
                    Operation::MemcpyDtoh,
                ];
                for (op, color) in ops.into_iter().zip(COLORS) {
                    v.push(Series {
                        label: format!("{} P50", op.function()),
                        points: points(report, op, |r| r.median_us),
                        color,
                        dashed: false,
                    });
                    v.push(Series {
                        label: format!("{} P0", op.function()),
                        points: points(report, op, |r| r.min_us),
                        color,
                        dashed: true,
                    });
                }
                (
                    format!("copylat: latency per copy, P50 solid, P0 dashed ({device})"),
                    "microseconds per copy",
                    v,
                )
            }
            Tool::Apiperf => {
                let ops = [
                    Operation::Pin,
                    Operation::Map,
                    Operation::GetInfo,
                    Operation::Unmap,
                    Operation::Unpin,
                ];
                let v = ops
                    .into_iter()
                    .zip(COLORS)
                    .map(|(op, color)| Series {
                        label: format!("{} P50", op.function()),
                        points: points(report, op, |r| r.median_us),
                        color,
                        dashed: false,
                    })
                    .collect();
                (
                    format!("apiperf: latency per call vs pinned size ({device})"),
                    "microseconds per call (P50)",
                    v,
                )
            }
        };
        let path = out.join(format!("{}.svg", tool.name()));
        line_chart(&path, &title, y_desc, &series)
            .with_context(|| format!("plotting {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_come_back_from_a_noisy_console() {
        let console = "\
[    5.1] booting\n\
MTGDRCOPY-STEP copybw 5.3\n\
MTGDRCOPY-BENCH copybw.txt # device 0: x\n\
MTGDRCOPY-BENCH copybw.txt \n\
[    5.4] mtgdrdrv: something\n\
MTGDRCOPY-BENCH copybw.json {\n\
MTGDRCOPY-BENCH copybw.json   \"a\": [1, 2]\n\
junk MTGDRCOPY-BENCH copybw.json }\n\
MTGDRCOPY-BENCH ../evil x\n";
        let files = extract_files(console);
        assert_eq!(files["copybw.txt"], "# device 0: x\n\n");
        assert_eq!(files["copybw.json"], "{\n  \"a\": [1, 2]\n}\n");
        assert!(!files.contains_key("../evil"));
        assert_eq!(files.len(), 2);
    }

    #[test]
    fn guest_script_runs_every_tool_with_json() {
        let s = guest_script(&QUICK);
        for tool in TOOLS {
            assert!(
                s.contains(&format!("bench {0} mtgdrcopy_{0} ", tool.name())),
                "{s}"
            );
        }
        assert!(s.contains("--json $B/$name.json"));
    }

    #[test]
    fn reports_are_checked() {
        let bad = r#"{"schema_version": 1, "tool": "copybw", "results": []}"#;
        let e = parse_report(Tool::Copybw, bad).unwrap_err();
        assert!(format!("{e:#}").contains("gdr_copy_to_mapping"), "{e:#}");
        let e = parse_report(Tool::Apiperf, bad).unwrap_err();
        assert!(format!("{e:#}").contains("written by copybw"), "{e:#}");
        assert!(parse_report(Tool::Copybw, "{").is_err());
    }
}
