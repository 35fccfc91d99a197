//! `cargo xtask copy-counts`: what one `gdr_copy_to_mapping`/`gdr_copy_from_mapping` call costs,
//! measured as an application makes it: the C harness (`testing/copy-harness/`) dlopens the built
//! `libgdrapi.so`, opens, pins and maps through a stand-in device node, and calls the public
//! entry points with the mapping handle; the tracer ([`trace`]) steps each call.
//!
//! Two results, both deterministic on any x86-64 host, for every copy variant (those this CPU
//! lacks on a virtual CPU):
//! - instructions per call, printed as a table and checked against the committed ceilings
//!   (`libgdrapi/copy-ceilings.txt`), which in turn must stay within the goals written there;
//! - the device accesses of every size 1–136 at every device misalignment 0–63, and larger sizes
//!   at chosen ones: each naturally aligned, of the direction's kind, inside the copy, no byte
//!   touched twice and none missed; and, through a DEVICE (uncached) mapping with each variant
//!   selected, the same with no access wider than 8 bytes.

mod ceilings;
mod trace;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

pub use ceilings::Ceilings;
use trace::{Case, Measured, Virtual};
use xtask_base::paths;

/// The sizes of the table.
pub const SIZES: [usize; 9] = [1, 2, 4, 8, 16, 64, 256, 4096, 65536];

/// A routine whose widest access is W bytes walks a ladder: a head of small, 16- and 32-byte
/// steps up to W alignment (h < W bytes, set by the misalignment), W-byte accesses, then a tail
/// narrowing down (less than W bytes). At every device misalignment, every size from
/// `gdrapi::copy::inline_below()` to h + 2W covers each head cut short, no or one W-byte access with every tail,
/// and two: every path through the ladder (the tail's code does not depend on the number of
/// W-byte accesses before it). Sizes below `gdrapi::copy::inline_below()`, which no routine sees,
/// are checked once, at every misalignment too.
///
/// A larger size at misalignments that start each rung, for the four-at-a-time bulk loops
/// (64 KiB is checked aligned, with the table).
const LARGE_SIZE: usize = 4095;
const LARGE_MISALIGNMENTS: [usize; 11] = [0, 1, 7, 8, 15, 16, 31, 32, 33, 48, 63];

#[derive(Debug)]
pub struct Row {
    pub variant: String,
    pub to_device: bool,
    pub size: usize,
    pub instructions: u64,
    /// Instructions the tracer carried out because this CPU lacks them.
    pub emulated: u64,
}

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Only these variants (repeatable); the ceilings of the others are not checked.
    #[arg(long = "variant", value_name = "NAME")]
    variants: Vec<String>,
    /// Only the table's sizes, without the access check over every misalignment.
    #[arg(long)]
    table_only: bool,
    /// Print `ceiling` lines for the measured figures (rounded up a little), to paste into
    /// libgdrapi/copy-ceilings.txt after making the copies faster.
    #[arg(long)]
    print_ceilings: bool,
    /// Count another gdrapi library's calls instead (e.g. upstream GDRCopy's libgdrapi.so.2,
    /// which opens /dev/gdrdrv): the table only, with the copy routine it chooses itself.
    #[arg(long, value_name = "LIB", conflicts_with_all = ["variants", "print_ceilings"])]
    library: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let mut tools = build(&sh)?;
    if let Some(library) = &args.library {
        tools.library =
            std::fs::canonicalize(library).with_context(|| format!("{}", library.display()))?;
        let measured = trace::run(&tools, "", Virtual::default(), false, &table_cases(), 0)?.1;
        let rows: Vec<Row> = measured
            .iter()
            .map(|m| Row {
                variant: "(its own)".into(),
                to_device: m.case.to_device,
                size: m.case.size,
                instructions: m.instructions,
                emulated: m.emulated,
            })
            .collect();
        println!("{}", library.display());
        print!("{}", render(&rows));
        return Ok(());
    }
    let ceilings = Ceilings::load(&paths::root().join(ceilings::PATH))?;
    let (rows, access_failures) = measure(&tools, &args)?;
    let table = render(&rows);
    print!("{table}");
    let out = paths::build_dir().join("bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("copy-counts.txt"), &table)?;
    if args.print_ceilings {
        print!("{}", ceilings::suggest(&rows));
    }
    let mut failures = access_failures;
    failures.extend(ceilings.check(&rows));
    if let Err(e) = ceilings.check_goals() {
        failures.push(format!("{e:#}"));
    }
    if !failures.is_empty() {
        bail!("copy calls miss their goals:\n{}", failures.join("\n"));
    }
    println!(
        "copy-counts: every variant within {} and every device access checked{}",
        ceilings::PATH,
        if args.table_only {
            ""
        } else {
            " (through DEVICE mappings: none wider than 8 bytes)"
        }
    );
    Ok(())
}

/// The harness, the device-node double and the library under test.
pub struct Tools {
    pub harness: PathBuf,
    pub preload: PathBuf,
    pub library: PathBuf,
}

/// Builds the release library (as packaged: the same profile) and the two C programs.
pub fn build(sh: &Shell) -> Result<Tools> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --lib").run()?;
    let src = paths::root().join("testing/copy-harness");
    let out = paths::build_dir().join("copy-harness");
    std::fs::create_dir_all(&out)?;
    let include = paths::root().join("mtgdrdrv/kmod");
    let (harness, preload) = (out.join("harness"), out.join("devnode_double.so"));
    let warnings = ["-Wall", "-Wextra", "-Werror", "-O2"];
    cmd!(
        sh,
        "cc {warnings...} -std=gnu11 -o {harness} {src}/harness.c -ldl"
    )
    .run()?;
    cmd!(
        sh,
        "cc {warnings...} -std=gnu11 -shared -fPIC -I{include} -o {preload} {src}/devnode_double.c -ldl"
    )
    .run()?;
    Ok(Tools {
        harness,
        preload,
        library: paths::release_dir().join("libgdrapi.so"),
    })
}

fn table_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for to_device in [true, false] {
        for size in SIZES {
            cases.push(case(to_device, size, 0));
        }
    }
    cases
}

/// The calls that reach only the entry points' inline code.
fn inline_cases(to_device: bool) -> Vec<Case> {
    (1..gdrapi::copy::inline_below())
        .flat_map(|size| (0..64).map(move |m| case(to_device, size, m)))
        .collect()
}

/// The calls that check a routine whose widest access is `width` bytes.
fn routine_cases(to_device: bool, width: usize) -> Vec<Case> {
    let mut cases: Vec<Case> = (0..64)
        .flat_map(|m| {
            let head = (width - m % width) % width;
            (gdrapi::copy::inline_below()..=head + 2 * width)
                .map(move |size| case(to_device, size, m))
        })
        .collect();
    cases.extend(
        LARGE_MISALIGNMENTS
            .iter()
            .map(|&m| case(to_device, LARGE_SIZE, m)),
    );
    cases
}

fn case(to_device: bool, size: usize, device_misalignment: usize) -> Case {
    Case {
        to_device,
        size,
        device_misalignment,
        // The table's host buffers are 64-byte aligned (as upstream's figures); the access
        // cases vary the host side too, which must not change the device side.
        host_misalignment: if device_misalignment == 0 {
            0
        } else {
            (size * 7 + device_misalignment * 3) % 64
        },
    }
}

/// The CPU the tracer plays for `variant`: this one, or this one plus the features the variant
/// needs that it lacks. `None` when even that cannot run it.
fn cpu_for(variant: &gdrapi::copy::Variant) -> Option<Virtual> {
    if variant.is_supported() {
        return Some(Virtual::default());
    }
    // The emulated variants build on AVX2 (AVX-512) or SSE4.1 (MOVDIR64B) instructions that
    // must be real.
    std::arch::is_x86_feature_detected!("avx2").then_some(Virtual {
        avx512f: true,
        movdir64b: true,
    })
}

/// One harness run: a variant, the CPU the tracer plays, the mapping's type, and the calls to
/// make.
struct Job {
    variant: &'static gdrapi::copy::Variant,
    cpu: Virtual,
    /// Through a DEVICE mapping: accesses only, no table row.
    device_mapping: bool,
    cases: Vec<Case>,
}

/// Widest device access a DEVICE (uncached) mapping may get, whatever the variant.
const DEVICE_MAPPING_MAX_ACCESS: u64 = 8;

/// The calls through a DEVICE mapping: every path through the small-access ladder (the
/// routine every variant must use there) at every misalignment, and the table's sizes.
fn device_mapping_cases() -> Vec<Case> {
    let mut cases = table_cases();
    for to_device in [true, false] {
        cases.extend(routine_cases(to_device, 8));
    }
    cases
}

/// The jobs: every variant's table, and the access cases of each routine once. Variants share
/// routines (`movdir64b` reads with `avx2`'s), and copies below `gdrapi::copy::inline_below()` bytes never reach
/// a routine (the entry points make them inline, the same code whatever the variant).
fn jobs(args: &Args) -> Result<Vec<Job>> {
    for name in &args.variants {
        ensure!(
            gdrapi::copy::variants().iter().any(|v| v.name == name),
            "unknown variant {name}"
        );
    }
    let mut seen: Vec<usize> = Vec::new();
    let mut inline_checked = false;
    let mut jobs = Vec::new();
    for v in gdrapi::copy::variants()
        .iter()
        .filter(|v| args.variants.is_empty() || args.variants.iter().any(|n| n == v.name))
    {
        let Some(cpu) = cpu_for(v) else {
            eprintln!(
                "copy-counts: this CPU cannot run variant {} even traced",
                v.name
            );
            continue;
        };
        let mut cases = table_cases();
        if !args.table_only {
            for to_device in [true, false] {
                if !inline_checked {
                    cases.extend(inline_cases(to_device));
                }
                let (routine, width) = if to_device {
                    (v.to_device as usize, v.store_width)
                } else {
                    (v.from_device as usize, v.load_width)
                };
                if !seen.contains(&routine) {
                    seen.push(routine);
                    cases.extend(routine_cases(to_device, width));
                }
            }
            inline_checked = true;
        }
        jobs.push(Job {
            variant: v,
            cpu,
            device_mapping: false,
            cases,
        });
        if !args.table_only {
            jobs.push(Job {
                variant: v,
                cpu,
                device_mapping: true,
                cases: device_mapping_cases(),
            });
        }
    }
    Ok(jobs)
}

/// Runs every job (one per CPU at a time: they are independent processes) and returns the
/// table's rows and the access-check failures.
pub fn measure(tools: &Tools, args: &Args) -> Result<(Vec<Row>, Vec<String>)> {
    let jobs = jobs(args)?;
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<(Vec<Row>, Vec<String>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (jobs, next) = (&jobs, &next);
                s.spawn(move || -> Result<(Vec<Row>, Vec<String>)> {
                    yield_to_other_work();
                    let mut rows = Vec::new();
                    let mut failures = Vec::new();
                    // Largest jobs first would balance better; the list is short either way.
                    while let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let name = job.variant.name;
                        let measured = measure_variant(tools, job, worker)?;
                        let (label, max_access) = if job.device_mapping {
                            (format!("{name}, DEVICE mapping"), DEVICE_MAPPING_MAX_ACCESS)
                        } else {
                            (name.to_string(), 64)
                        };
                        for m in &measured {
                            if let Err(e) = check_accesses(m, max_access) {
                                failures.push(format!("{label}: {e}"));
                            }
                        }
                        if job.device_mapping {
                            continue;
                        }
                        rows.extend(measured.iter().take(table_len()).map(|m| Row {
                            variant: name.to_string(),
                            to_device: m.case.to_device,
                            size: m.case.size,
                            instructions: m.instructions,
                            emulated: m.emulated,
                        }));
                    }
                    Ok((rows, failures))
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
    let mut failures = Vec::new();
    for r in results {
        let (r, f) = r?;
        rows.extend(r);
        failures.extend(f);
    }
    // Variants in the library's order, as the table reads best.
    rows.sort_by_key(|r| {
        gdrapi::copy::variants()
            .iter()
            .position(|v| v.name == r.variant)
    });
    Ok((rows, failures))
}

/// Puts the calling thread, and the harnesses it starts, in `SCHED_IDLE`: they run only on a
/// CPU nothing else wants. The counts do not depend on speed, and the two tracers keep both
/// CPUs busy: at normal priority, work beside them gets only its fair share (a loop of gcc runs
/// took 1.8 times as long; beside tracers in `SCHED_IDLE`, no longer than alone). In `cargo
/// xtask test` that work is the host lane's package tests.
fn yield_to_other_work() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param for the call's duration; pid 0 is this thread.
    // Best effort: if refused, only the neighbours' speed differs.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}

fn table_len() -> usize {
    2 * SIZES.len()
}

fn measure_variant(tools: &Tools, job: &Job, worker: usize) -> Result<Vec<Measured>> {
    let variant = job.variant.name;
    let (chosen, measured) = trace::run(
        tools,
        variant,
        job.cpu,
        job.device_mapping,
        &job.cases,
        worker,
    )
    .with_context(|| {
        format!(
            "measuring variant {variant}{}",
            if job.device_mapping {
                " through a DEVICE mapping"
            } else {
                ""
            }
        )
    })?;
    ensure!(
        chosen == variant,
        "the library chose variant {chosen:?} where {variant} was asked for"
    );
    Ok(measured)
}

/// The device side of one call: naturally aligned accesses of the direction's kind, none wider
/// than `max_access` bytes, exactly covering the copied range once.
fn check_accesses(m: &Measured, max_access: u64) -> Result<()> {
    let c = m.case;
    let what = format!(
        "{} {} B at device+{} host+{}",
        if c.to_device { "to" } else { "from" },
        c.size,
        c.device_misalignment,
        c.host_misalignment
    );
    let (lo, hi) = (m.device, m.device + c.size as u64);
    let mut touched = vec![false; c.size];
    for a in &m.accesses {
        ensure!(
            a.write == c.to_device,
            "{what}: a {} of {} bytes at device+{} (only {} belong on this path)",
            if a.write { "store" } else { "load" },
            a.width,
            a.addr as i64 - lo as i64,
            if c.to_device { "stores" } else { "loads" }
        );
        ensure!(
            a.addr >= lo && a.addr + a.width <= hi,
            "{what}: {} bytes at device+{} reach outside the copy",
            a.width,
            a.addr as i64 - lo as i64
        );
        ensure!(
            a.width.is_power_of_two() && a.width <= 64 && a.addr % a.width == 0,
            "{what}: {} bytes at device+{} are not naturally aligned",
            a.width,
            a.addr - lo
        );
        ensure!(
            a.width <= max_access,
            "{what}: {} bytes at device+{} (at most {max_access} on this mapping)",
            a.width,
            a.addr - lo
        );
        for b in &mut touched[(a.addr - lo) as usize..(a.addr + a.width - lo) as usize] {
            ensure!(!*b, "{what}: device+{} accessed twice", a.addr - lo);
            *b = true;
        }
    }
    if let Some(missed) = touched.iter().position(|t| !t) {
        bail!("{what}: device+{missed} never accessed");
    }
    Ok(())
}

pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "instructions per gdr_copy_{{to,from}}_mapping call (public C entry point, real mapping \
         handle; device side 4 KiB aligned, host side 64-byte aligned)"
    );
    let _ = writeln!(out, "CPU: {}", crate::cpu::cpu_name());
    let _ = write!(out, "{:<28} {:<5}", "variant", "dir");
    for size in SIZES {
        let _ = write!(out, " {:>7}", size_label(size));
    }
    let _ = writeln!(out);
    let mut keys: Vec<(&str, bool)> = Vec::new();
    for r in rows {
        if !keys.contains(&(&r.variant, r.to_device)) {
            keys.push((&r.variant, r.to_device));
        }
    }
    for (variant, to_device) in keys {
        let cells: Vec<&Row> = rows
            .iter()
            .filter(|r| r.variant == variant && r.to_device == to_device)
            .collect();
        let emulated = cells.iter().any(|r| r.emulated > 0);
        let _ = write!(
            out,
            "{:<28} {:<5}",
            if emulated {
                format!("{variant} (emulated)")
            } else {
                variant.to_string()
            },
            if to_device { "to" } else { "from" }
        );
        for size in SIZES {
            match cells.iter().find(|r| r.size == size) {
                Some(r) => {
                    let _ = write!(out, " {:>7}", r.instructions);
                }
                None => {
                    let _ = write!(out, " {:>7}", "-");
                }
            }
        }
        let _ = writeln!(out);
    }
    out
}

pub fn size_label(size: usize) -> String {
    match size {
        s if s >= 1024 && s % 1024 == 0 => format!("{}K", s / 1024),
        s => format!("{s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace::Access;

    fn measured(size: usize, to_device: bool, accesses: &[(u64, u64, bool)]) -> Measured {
        Measured {
            case: case(to_device, size, 0),
            instructions: 10,
            emulated: 0,
            device: 0x1000,
            accesses: accesses
                .iter()
                .map(|&(addr, width, write)| Access {
                    addr: 0x1000 + addr,
                    width,
                    write,
                })
                .collect(),
        }
    }

    #[test]
    fn the_access_check_catches_each_fault() {
        assert!(check_accesses(&measured(12, true, &[(0, 8, true), (8, 4, true)]), 64).is_ok());
        let err = |m: Measured| check_accesses(&m, 64).unwrap_err().to_string();
        assert!(err(measured(12, true, &[(0, 8, true), (8, 2, true)])).contains("never accessed"));
        assert!(err(measured(
            12,
            true,
            &[(0, 8, true), (6, 4, true), (10, 2, true)]
        ))
        .contains("naturally aligned"));
        assert!(err(measured(8, true, &[(0, 8, true), (4, 4, true)])).contains("twice"));
        assert!(err(measured(8, true, &[(0, 8, true), (8, 8, true)])).contains("outside"));
        assert!(err(measured(8, true, &[(0, 8, false)])).contains("only stores"));
        assert!(err(measured(8, false, &[(0, 8, true)])).contains("only loads"));
        // A DEVICE mapping: 16 bytes in one access are refused, in two 8-byte ones accepted.
        let wide = measured(16, true, &[(0, 16, true)]);
        assert!(check_accesses(&wide, DEVICE_MAPPING_MAX_ACCESS)
            .unwrap_err()
            .to_string()
            .contains("at most 8"));
        assert!(check_accesses(&wide, 64).is_ok());
        let narrow = measured(16, false, &[(0, 8, false), (8, 8, false)]);
        assert!(check_accesses(&narrow, DEVICE_MAPPING_MAX_ACCESS).is_ok());
    }

    #[test]
    fn every_ladder_path_is_checked_at_every_misalignment() {
        for width in [8, 16, 32, 64] {
            let cases = routine_cases(true, width);
            for misalignment in 0..64 {
                // The head to W alignment, then up to two W-byte accesses.
                let head = (width - misalignment % width) % width;
                for size in gdrapi::copy::inline_below()..=head + 2 * width {
                    assert!(
                        cases.contains(&case(true, size, misalignment)),
                        "{size} {misalignment}"
                    );
                }
            }
        }
        assert_eq!(inline_cases(false).len(), 15 * 64);
    }

    #[test]
    fn sizes_render_as_in_the_readme() {
        assert_eq!(size_label(65536), "64K");
        assert_eq!(size_label(256), "256");
    }
}
