//! `cargo xtask test`: every test the project has, each step timed, then a table of step times
//! and a summary line (`N passed, N failed`). Steps after a failure still run, so one report
//! shows everything. The steps run in two lanes side by side (lanes.rs) unless `--serial`.
//! The test bench's other modules give most steps; formatting, codegen freshness (`cargo xtask
//! codegen --check`, run as a child), the version check, clippy and the unit tests are here.

mod beside;
mod lanes;
mod usage;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::step::Step;
use xtask_base::paths;

#[derive(clap::Args, Default)]
pub struct Args {
    /// Skip the steps that boot QEMU (the kernel module tests).
    #[arg(long)]
    pub no_vm: bool,
    /// Skip the kernel matrix (`cargo xtask kmod-matrix`: chroots of four Debian suites).
    #[arg(long)]
    pub no_matrix: bool,
    /// Skip the arm64 cross build and its tests under qemu-user (cross.rs).
    #[arg(long)]
    pub no_cross: bool,
    /// Run only the steps whose name contains TEXT (case-insensitive; repeatable), e.g.
    /// `--only qemu` for the VM tests: for a developer between changes, not for CI.
    #[arg(long, value_name = "TEXT")]
    pub only: Vec<String>,
    /// Only the steps a developer runs between changes (a few minutes with warm caches):
    /// formatting, generated files, versions, clippy, the unit and integration tests. CI runs
    /// the full set.
    #[arg(long, conflicts_with_all = ["no_vm", "no_matrix", "no_cross", "only"])]
    pub quick: bool,
    /// Run the steps one after another in this process, instead of the guest lane (the VM
    /// tests, benchmarks, kernel matrix and copy counts) beside the host lane.
    #[arg(long)]
    pub serial: bool,
    /// Run only this lane's steps (the guest lane is started this way by the host lane).
    #[arg(long, value_enum, hide = true)]
    pub lane: Option<Lane>,
}

/// Where a step runs when the lanes run side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lane {
    /// Lints, builds, unit tests, fuzzers, packages: this process.
    Host,
    /// The VM tests, the VM benchmarks, the kernel matrix and the copy counts: a child xtask.
    Guests,
}

/// How one step went.
pub struct Outcome {
    pub name: String,
    pub secs: f64,
    /// Its CPU time, where it could be told apart (`run_steps`, beside.rs).
    pub cpu: Option<f64>,
    pub ok: bool,
}

impl Outcome {
    /// The CPU time as the table and the guest lane's results file give it: `-` if unknown.
    fn cpu_text(&self) -> String {
        self.cpu
            .map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"))
    }
}

pub fn run(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let started = Instant::now();
    let (host, guests) = steps(&args)?;
    let outcomes = match args.lane {
        Some(Lane::Guests) => {
            build_debug_kernel_early(&guests);
            let outcomes = beside::run_steps_beside_copy_counts(&sh, guests);
            lanes::write_results(&outcomes, usage::cpu_secs())?;
            outcomes
        }
        Some(Lane::Host) => run_steps(&sh, &host),
        None if args.serial || host.is_empty() || guests.is_empty() => {
            build_debug_kernel_early(&guests);
            let mut outcomes = run_steps(&sh, &host);
            outcomes.extend(run_steps(&sh, &guests));
            outcomes
        }
        None => {
            let child = lanes::spawn_guests(&args)?;
            eprintln!("xtask: the guest lane (VM tests, benchmarks, kernel matrix, copy counts) runs alongside; its log follows the host lane's");
            let mut outcomes = run_steps(&sh, &host);
            outcomes.extend(lanes::wait_guests(child)?);
            outcomes
        }
    };
    report(
        &outcomes,
        started.elapsed().as_secs_f64(),
        usage::cpu_secs(),
    )
}

/// When the debug kernel's step is among `steps`, starts building that kernel (once, then
/// cached) while the steps before it run: its build keeps both cores busy for long, and the
/// guest lane's first VM step leaves one of them mostly idle.
fn build_debug_kernel_early(steps: &[Step]) {
    if steps
        .iter()
        .any(|(name, _)| *name == crate::vmtest::DEBUG_KERNEL_STEP)
    {
        crate::debugkernel::build_in_background();
    }
}

/// The steps of `--quick`.
const QUICK: [&str; 5] = [
    FMT_STEP,
    CODEGEN_STEP,
    VERSIONS_STEP,
    CLIPPY_STEP,
    UNIT_STEP,
];
const FMT_STEP: &str = "cargo fmt --check";
const CODEGEN_STEP: &str = "codegen freshness";
const VERSIONS_STEP: &str =
    "versions agree (crates released together, dkms.conf, pins, changelogs)";
const CLIPPY_STEP: &str = "clippy -D warnings";
const UNIT_STEP: &str = "unit and integration tests";

/// The benchmarks' step: `cargo xtask bench --quick` (xtask-benchmarks, which runs in this
/// crate's VM), checking that each tool writes a valid report and that the plots render.
const BENCH_STEP: &str = "benchmarks in QEMU, quick (copybw, copylat, apiperf --json)";
const COPY_COUNT_STEP: &str =
    "copy calls: instructions per call within the ceilings, every device access checked";

fn quick_benchmarks(sh: &Shell) -> Result<()> {
    let xtask = std::env::current_exe().context("finding xtask itself")?;
    let out = paths::build_dir().join("bench-quick");
    cmd!(sh, "{xtask} bench --quick --out {out}")
        .run()
        .context("cargo xtask bench --quick")
}

/// Every step selected by `args`, by lane.
fn steps(args: &Args) -> Result<(Vec<Step<'static>>, Vec<Step<'static>>)> {
    let mut host: Vec<Step> = vec![
        (FMT_STEP, Box::new(fmt)),
        (CODEGEN_STEP, Box::new(codegen_check)),
        (
            VERSIONS_STEP,
            Box::new(|_: &Shell| {
                xtask_pack::versions::check(&xtask_base::workspace::Workspace::load()?)
            }),
        ),
        (
            "workflows: actionlint and ShellCheck",
            Box::new(crate::workflows::test_step),
        ),
        (
            "man pages: groff -ww -z and man --warnings print nothing",
            Box::new(crate::manpages::test_step),
        ),
        (CLIPPY_STEP, Box::new(clippy)),
        (UNIT_STEP, Box::new(unit_tests)),
        (
            "libgdrapi.a: only gdr_* global, no bitcode, links beside another Rust staticlib",
            Box::new(crate::staticlib::test_step),
        ),
        (
            "libFuzzer targets of libgdrapi (cargo-fuzz)",
            Box::new(crate::fuzz::libfuzzer_step),
        ),
    ];
    let mut guests: Vec<Step> = Vec::new();
    if args.quick {
        host.retain(|(name, _)| QUICK.contains(name));
        return Ok((host, guests));
    }
    if !args.no_cross {
        host.extend(crate::crosstest::test_steps());
    }
    if !args.no_vm {
        guests.extend(crate::vmtest::test_steps());
        guests.push(crate::upstreamcli::test_step());
        guests.push((BENCH_STEP, Box::new(quick_benchmarks)));
    }
    if !args.no_matrix {
        guests.push(crate::matrix::test_step(!args.no_vm));
    }
    // The .debs and lintian on them; with the VM, their install and upgrade tests, here in the
    // host lane: they use the .debs this lane has built.
    host.extend(crate::pkgtest::test_steps(!args.no_vm));
    let vm = !args.no_vm;
    host.push((
        crate::autopkgtest::STEP,
        Box::new(move |sh: &Shell| crate::autopkgtest::test_step(sh, vm)),
    ));
    host.push((crate::piuparts::STEP, Box::new(crate::piuparts::test_step)));
    // The copy counts need nothing of the other steps; in the guest lane they run beside its
    // other steps (`run_steps_beside_copy_counts`).
    let copy_counts = copy_count_step();
    if guests.is_empty() {
        host.push(copy_counts);
    } else {
        guests.push(copy_counts);
    }

    if !args.only.is_empty() {
        let wanted = |name: &str| {
            let name = name.to_lowercase();
            args.only.iter().any(|t| name.contains(&t.to_lowercase()))
        };
        host.retain(|(name, _)| wanted(name));
        guests.retain(|(name, _)| wanted(name));
        anyhow::ensure!(
            !host.is_empty() || !guests.is_empty(),
            "--only {:?} matches no step",
            args.only
        );
    }
    Ok((host, guests))
}

fn copy_count_step() -> Step<'static> {
    (
        COPY_COUNT_STEP,
        Box::new(|_: &Shell| crate::copycount::run(crate::copycount::Args::default())),
    )
}

fn failed_outcome(name: &str, e: &anyhow::Error) -> Outcome {
    eprintln!("    FAILED: {name}: {e:#}");
    Outcome {
        name: name.to_owned(),
        secs: 0.0,
        cpu: None,
        ok: false,
    }
}

/// Runs `steps` in order, timing each, and measuring its CPU time unless the debug kernel is
/// building beside it (nothing else runs in this process meanwhile: the copy counts are a
/// child reaped after the steps, beside.rs).
fn run_steps(sh: &Shell, steps: &[Step]) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for (name, step) in steps {
        eprintln!("==> {name}");
        let measured = !crate::debugkernel::building_in_background();
        let (start, cpu_start) = (Instant::now(), usage::cpu_secs());
        let result = step(sh);
        let secs = start.elapsed().as_secs_f64();
        let cpu = (measured && !crate::debugkernel::building_in_background())
            .then(|| usage::cpu_secs() - cpu_start);
        match &result {
            Ok(()) => eprintln!("    ok: {name} ({secs:.1} s)"),
            Err(e) => eprintln!("    FAILED: {name} ({secs:.1} s): {e:#}"),
        }
        outcomes.push(Outcome {
            name: (*name).to_owned(),
            secs,
            cpu,
            ok: result.is_ok(),
        });
    }
    outcomes
}

/// The table of step times (wall and CPU), the wall time (less than their sum when the lanes
/// overlap), the run's CPU time and the summary line; fails if a step did.
fn report(outcomes: &[Outcome], wall: f64, cpu: f64) -> Result<()> {
    eprintln!("\nstep times (wall, CPU: user + system of every process the step waited for):");
    for o in outcomes {
        let verdict = if o.ok { "ok" } else { "FAILED" };
        eprintln!(
            "  {:>7.1} s  {:>7} s  {verdict:<6}  {}",
            o.secs,
            o.cpu_text(),
            o.name
        );
    }
    let total: f64 = outcomes.iter().map(|o| o.secs).sum();
    eprintln!("  {total:>7.1} s  sum of the steps");
    eprintln!("  {wall:>7.1} s  wall time");
    let cores = usage::cores();
    eprintln!(
        "  {cpu:>7.1} s  CPU time of the run, all lanes: at least {:.1} s of wall on {cores} cores",
        cpu / cores as f64
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok)
        .map(|o| o.name.as_str())
        .collect();
    println!(
        "xtask: {} passed, {} failed",
        outcomes.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!("failed steps: {}", failed.join(", "));
    }
    Ok(())
}

fn fmt(sh: &Shell) -> Result<()> {
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    Ok(())
}

/// The codegen lives in the xtask binary, which runs this bench: ask it.
fn codegen_check(sh: &Shell) -> Result<()> {
    let xtask = std::env::current_exe()?;
    cmd!(sh, "{xtask} codegen --check").run()?;
    Ok(())
}

fn clippy(sh: &Shell) -> Result<()> {
    cmd!(
        sh,
        "cargo clippy --quiet --workspace --all-targets -- -D warnings"
    )
    .run()?;
    // The tools' emulator-only code, which the workspace build leaves out (the VM's build).
    cmd!(
        sh,
        "cargo clippy --quiet -p mtgdrcopy-tests --features emulator --all-targets -- -D warnings"
    )
    .run()?;
    Ok(())
}

fn unit_tests(sh: &Shell) -> Result<()> {
    cmd!(sh, "cargo test --quiet --workspace").run()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(steps: &[Step]) -> Vec<&'static str> {
        steps.iter().map(|(name, _)| *name).collect()
    }

    #[test]
    fn quick_is_the_five_developer_steps_in_the_host_lane() {
        let (host, guests) = steps(&Args {
            quick: true,
            ..Args::default()
        })
        .unwrap();
        assert_eq!(names(&host), QUICK);
        assert!(guests.is_empty());
    }

    #[test]
    fn the_guest_lane_is_the_vm_tests_benchmarks_and_matrix() {
        let (host, guests) = steps(&Args::default()).unwrap();
        let guests = names(&guests);
        assert_eq!(guests.last(), Some(&COPY_COUNT_STEP));
        assert!(guests.iter().any(|n| n.contains("QEMU (Debian 6.1)")));
        assert!(guests.contains(&crate::vmtest::DEBUG_KERNEL_STEP));
        assert!(guests.iter().any(|n| n.starts_with("benchmarks in QEMU")));
        assert!(guests.iter().any(|n| n.starts_with("kernel matrix")));
        let host = names(&host);
        assert!(host.iter().any(|n| n.starts_with("packages: install")));
        assert!(host
            .iter()
            .all(|n| !n.contains("QEMU (Debian") && !n.starts_with("kernel matrix")));
        let (host, guests) = steps(&Args {
            no_vm: true,
            no_matrix: true,
            ..Args::default()
        })
        .unwrap();
        assert!(guests.is_empty(), "{:?}", names(&guests));
        assert!(names(&host).contains(&CLIPPY_STEP));
        assert!(names(&host).contains(&COPY_COUNT_STEP));
    }
}
