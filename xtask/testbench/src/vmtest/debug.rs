//! The module tests on the debug kernel (debugkernel.rs: KASAN, lockdep, DEBUG_VM, KFENCE,
//! DEBUG_ATOMIC_SLEEP). First a short boot shows that this kernel's checkers are on and that a
//! real KASAN report, provoked with LKDTM, is one the harness fails on; then the module tests'
//! run (in-VM tests, sanity suites, tools, the fuzzer) under the same oracle as on Debian's
//! kernel, where every splat of those checkers is a kernel problem (vm/console.rs), and lockdep
//! must still be on at the end (it turns itself off after its first report, or when the kernel
//! is tainted by one).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use xshell::Shell;

use super::{checks, run_module_tests_as, Variant, HOST_PACKAGES};
use crate::debugkernel;
use crate::kernel::Kernel;
use crate::step::{timed, Step};
use crate::vm;
use xtask_base::{host, paths};

pub const STEP: &str =
    "kernel module tests in QEMU on the debug kernel (KASAN, lockdep, DEBUG_VM, KFENCE)";

/// The fuzzer's operations on the debug kernel: KASAN and lockdep make every kernel entry
/// several times slower under TCG, so fewer than the 100,000 of Debian's kernel fit the step's
/// budget (docs/testing.md, "The debug kernel").
const FUZZ_OPS: u64 = 15_000;

/// The fuzzer's calls of the gdrapi C API on the debug kernel, in the same proportion to Debian's
/// kernel's 20,000 as the kernel-level operations: after every call the phase reads the module's
/// state back, and at 20,000 calls it took 75 to 110 s of this step, half its fuzzer run or more.
/// The library's side of the API is the same on every kernel; libFuzzer and Debian's kernels run
/// it at full length.
const FUZZ_API_OPS: u64 = 3_000;

/// Prepended to the module tests' script: the 8-thread stress test runs 500 cycles instead of
/// 10,000. Lockdep learns each lock order the first time it is taken, and at 10,000 cycles that
/// one test took more than 8 minutes of this step on a loaded 2-core machine.
const FEWER_CYCLES: &str = "export MTGDRCOPY_STRESS_CYCLES=500\n";

/// Appended to the module tests' script: lockdep is still on after everything ran. It turns
/// itself off after its first report (which the console then shows) but also, silently, when
/// something taints the kernel; then nothing after was checked.
const LOCKDEP_STILL_ON: &str = r#"step lockdep
checks_begin lockdep
grep -q '^ *debug_locks: *1$' /proc/lockdep_stats; point lockdep is still on after the run
checks_end
"#;

pub fn test_step() -> Step<'static> {
    (STEP, Box::new(run))
}

fn run(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(HOST_PACKAGES)?;
    let t = Instant::now();
    let kernel = debugkernel::debug_kernel()?;
    timed(&format!("debug kernel {} ready", kernel.release), t);
    let t = Instant::now();
    checkers_report(&kernel)?;
    timed("checkers on, a provoked KASAN report caught", t);
    let variant = Variant {
        full: false,
        fuzz_ops: FUZZ_OPS,
        fuzz_api_ops: FUZZ_API_OPS,
        // The soft-lockup watchdog at 120 s instead of 20: KASAN's vmalloc shadow makes every
        // ioremap of the emulator slow, and a vCPU that an overloaded host does not run for
        // 20 s looked stuck to it (once even in the idle loop).
        cmdline: "watchdog_thresh=60".into(),
        head: FEWER_CYCLES.into(),
        tail: LOCKDEP_STILL_ON.into(),
        log_name: format!("debug-{}", kernel.release),
    };
    run_module_tests_as(sh, &kernel, &variant)
}

/// Boots the debug kernel once without our modules: its checkers say they are on, and a
/// use-after-free provoked through LKDTM comes back as a kernel problem that names KASAN. A
/// kernel whose KASAN reports went unnoticed would pass every run. KFENCE is switched off (sample
/// interval 0) before the provocation: when it sampled LKDTM's allocation, KFENCE, not KASAN,
/// reported the use-after-free, and the check failed at random.
fn checkers_report(kernel: &Kernel) -> Result<()> {
    let spec = vm::VmSpec {
        script: format!("rc=0\n{}{CHECKERS_ON}", checks::FUNCTIONS),
        timeout: Duration::from_secs(300),
        ..vm::VmSpec::new(kernel.clone())
    };
    let log = paths::build_dir()
        .join("vm")
        .join(format!("debug-checkers-{}.log", kernel.release));
    let outcome = vm::run(&spec, &log)?;
    judge_checkers(&outcome, &spec.script, &log)
}

/// The checkers' boot: each says it is on, then LKDTM's use-after-free.
const CHECKERS_ON: &str = r#"checks_begin checkers
grep -q '^ *debug_locks: *1$' /proc/lockdep_stats; point lockdep is on
dmesg | grep -q 'KernelAddressSanitizer initialized'; point KASAN is on
dmesg | grep -q 'kfence: initialized'; point KFENCE is on
checks_end
echo 0 >/sys/module/kfence/parameters/sample_interval
echo READ_AFTER_FREE >/sys/kernel/debug/provoke-crash/DIRECT
exit 0
"#;

fn judge_checkers(outcome: &vm::VmOutcome, script: &str, log: &Path) -> Result<()> {
    checks::check(&outcome.console, script, log)?;
    ensure!(
        outcome.exit_code == Some(0),
        "the LKDTM boot exited {:?}; full log: {}",
        outcome.exit_code,
        log.display()
    );
    ensure!(
        outcome
            .kernel_problems
            .iter()
            .any(|p| p.contains("BUG: KASAN: ") && p.contains("lkdtm_READ_AFTER_FREE")),
        "LKDTM's use-after-free was not reported as a kernel problem naming KASAN (problems: \
         {:?}); the debug step's oracle would miss such reports; full log: {}",
        outcome.kernel_problems,
        log.display()
    );
    Ok(())
}
