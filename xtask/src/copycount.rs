//! `cargo xtask copy-counts`: deterministic figures of the copy routines, measured with
//! valgrind on ordinary memory: instructions executed per copy, and the number and width of the
//! accesses that reach the "device" side, for every copy variant this CPU (and valgrind) can run.
//! Counts, unlike timings, are the same on any x86-64 host, so CI prints them and checks the
//! structural goals: a copy of ≤ 8 bytes to an aligned destination is one store, and the bulk of
//! a large aligned copy is made of the variant's widest accesses.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::paths;

pub const SIZES: [usize; 9] = [1, 2, 4, 8, 16, 64, 256, 4096, 65536];
/// Extra copies in the second run; instructions per copy = difference / REPEAT.
const REPEAT: usize = 100;

#[derive(Debug)]
pub struct Row {
    pub variant: String,
    pub to_device: bool,
    pub size: usize,
    pub instructions: u64,
    /// Width in bytes → number of device-side accesses of that width.
    pub accesses: BTreeMap<usize, u64>,
}

impl Row {
    fn total(&self) -> u64 {
        self.accesses.values().sum()
    }
}

pub fn run() -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let rows = measure(&sh)?;
    let table = render(&rows);
    print!("{table}");
    let out = paths::build_dir().join("bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("copy-counts.txt"), &table)?;
    check_goals(&rows)
}

/// Builds the probe, then measures every (variant, direction, size).
pub fn measure(sh: &Shell) -> Result<Vec<Row>> {
    crate::kernel::ensure_host_packages(&["valgrind"])?;
    cmd!(
        sh,
        "cargo build --quiet --release -p libgdrapi --example copy_probe"
    )
    .run()?;
    let probe = paths::root().join("target/release/examples/copy_probe");
    let mut cells = Vec::new();
    for variant in runnable_variants(&probe)? {
        for to_device in [true, false] {
            for size in SIZES {
                cells.push((variant.clone(), to_device, size));
            }
        }
    }
    // valgrind runs are independent and mostly start-up time: one worker per core.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = cells.len().div_ceil(workers).max(1);
    let results: Vec<Result<Vec<Row>>> = std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .chunks(chunk)
            .map(|part| {
                let probe = &probe;
                s.spawn(move || {
                    part.iter()
                        .map(|(v, to, size)| measure_one(probe, v, *to, *size))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a measuring thread panicked")))
            })
            .collect()
    });
    let mut rows = Vec::new();
    for part in results {
        rows.extend(part?);
    }
    Ok(rows)
}

/// The variants that this CPU supports and valgrind can execute (valgrind has no AVX-512).
fn runnable_variants(probe: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for v in gdrapi::copy::variants() {
        if !v.is_supported() {
            continue;
        }
        let status = std::process::Command::new("valgrind")
            .args(["--tool=none", "-q"])
            .arg(probe)
            .args([v.name, "to", "256", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .context("running valgrind")?;
        if status.success() {
            names.push(v.name.to_string());
        } else {
            eprintln!(
                "copy-counts: valgrind cannot run variant {}; skipped",
                v.name
            );
        }
    }
    Ok(names)
}

fn measure_one(probe: &Path, variant: &str, to_device: bool, size: usize) -> Result<Row> {
    let direction = if to_device { "to" } else { "from" };
    let log = std::env::temp_dir().join(format!(
        "mtgdrcopy-lackey-{}-{variant}-{direction}-{size}.log",
        std::process::id()
    ));
    let traced = lackey(
        probe,
        &log,
        true,
        &[variant, direction, &size.to_string(), "1"],
    )?;
    let device = printed_address(&traced.stdout, "device")?;
    let marker = printed_address(&traced.stdout, "marker")?;
    let trace =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let once = guest_instructions(&trace)?;
    let accesses = device_accesses(&trace, marker, device, size, to_device);
    let repeated = lackey(
        probe,
        &log,
        false,
        &[
            variant,
            direction,
            &size.to_string(),
            &(REPEAT + 1).to_string(),
        ],
    )?;
    let many = guest_instructions(&std::fs::read_to_string(&log)?)?;
    let _ = std::fs::remove_file(&log);
    drop(repeated);
    Ok(Row {
        variant: variant.into(),
        to_device,
        size,
        instructions: many.saturating_sub(once) / REPEAT as u64,
        accesses,
    })
}

struct Output {
    stdout: String,
}

fn lackey(probe: &Path, log: &Path, trace: bool, args: &[&str]) -> Result<Output> {
    let mut command = std::process::Command::new("valgrind");
    command
        .arg("--tool=lackey")
        .arg(format!("--log-file={}", log.display()));
    if trace {
        command.arg("--trace-mem=yes");
    }
    let out = command
        .arg(probe)
        .args(args)
        .output()
        .context("running valgrind")?;
    ensure!(
        out.status.success(),
        "valgrind {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    })
}

/// A `key=0x...` address the probe printed.
fn printed_address(stdout: &str, key: &str) -> Result<usize> {
    let prefix = format!("{key}=0x");
    let text = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .with_context(|| format!("the probe did not print its {key} address"))?;
    Ok(usize::from_str_radix(text, 16)?)
}

fn guest_instructions(log: &str) -> Result<u64> {
    let line = log
        .lines()
        .find(|l| l.contains("guest instrs:"))
        .context("valgrind reported no instruction count")?;
    let digits: String = line
        .rsplit(':')
        .next()
        .unwrap_or("")
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    Ok(digits.parse()?)
}

/// Accesses inside `[device, device + size)` after the store to `marker`: stores (`S`, and `M`
/// read-modify-write) for a copy to the device, loads (`L`) for a copy from it.
fn device_accesses(
    trace: &str,
    marker: usize,
    device: usize,
    size: usize,
    to_device: bool,
) -> BTreeMap<usize, u64> {
    let mut widths = BTreeMap::new();
    let marker_store = format!("{marker:08x},");
    let mut lines = trace.lines();
    for line in lines.by_ref() {
        let l = line.trim_start();
        if (l.starts_with("S ") || l.starts_with("M "))
            && l[2..].trim_start().starts_with(&marker_store)
        {
            break;
        }
    }
    for line in lines {
        let Some((kind, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let wanted = if to_device {
            kind == "S" || kind == "M"
        } else {
            kind == "L"
        };
        if !wanted {
            continue;
        }
        let Some((addr, width)) = rest.trim().split_once(',') else {
            continue;
        };
        let (Ok(addr), Ok(width)) = (usize::from_str_radix(addr, 16), width.parse::<usize>())
        else {
            continue;
        };
        if addr >= device && addr < device + size {
            *widths.entry(width).or_insert(0) += 1;
        }
    }
    widths
}

pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "copy routines on ordinary memory, counted with valgrind (device side 4 KiB aligned)"
    );
    let _ = writeln!(
        out,
        "{:<9} {:<5} {:>7} {:>12} {:>9}  widths (bytes x count)",
        "variant", "dir", "size", "instr/copy", "accesses"
    );
    for r in rows {
        let widths: Vec<String> = r
            .accesses
            .iter()
            .rev()
            .map(|(w, n)| format!("{w}x{n}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<9} {:<5} {:>7} {:>12} {:>9}  {}",
            r.variant,
            if r.to_device { "to" } else { "from" },
            r.size,
            r.instructions,
            r.total(),
            widths.join(" ")
        );
    }
    out
}

/// The structural goals, which hold for any correct build on any x86-64 host.
pub fn check_goals(rows: &[Row]) -> Result<()> {
    let mut failures = Vec::new();
    for r in rows {
        let widest = gdrapi::copy::variants()
            .iter()
            .find(|v| v.name == r.variant)
            .map(|v| {
                if r.to_device {
                    v.store_width
                } else {
                    v.load_width
                }
            })
            .unwrap_or(8);
        // Aligned destination: ≤ 8 bytes is one access of exactly that size.
        if r.size <= 8 && (r.total() != 1 || r.accesses.get(&r.size) != Some(&1)) {
            failures.push(format!(
                "{} {} {} B: {:?}, expected one {}-byte access",
                r.variant,
                dir(r),
                r.size,
                r.accesses,
                r.size
            ));
        }
        // Aligned and a multiple of the widest access: nothing but widest accesses.
        if r.size >= widest && r.size % widest == 0 && r.size >= 64 {
            let expected = (r.size / widest) as u64;
            if r.accesses.get(&widest) != Some(&expected) || r.total() != expected {
                failures.push(format!(
                    "{} {} {} B: {:?}, expected {expected} accesses of {widest} bytes",
                    r.variant,
                    dir(r),
                    r.size,
                    r.accesses
                ));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "copy routines miss their access-pattern goals:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

fn dir(r: &Row) -> &'static str {
    if r.to_device {
        "to"
    } else {
        "from"
    }
}
