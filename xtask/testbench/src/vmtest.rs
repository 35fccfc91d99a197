//! The kernel module tests of `cargo xtask test`: boot the test kernel in QEMU with both
//! modules (built by [`crate::kbuild`]), the in-VM test binary and the tools ([`guest`]), run
//! the guest script ([`script`]): load, test, unload; and judge the run ([`judge`]) by the
//! tests' exit code, the kernel log and the leak counters.

mod checks;
mod debug;
mod doctor;
mod from_source;
mod guest;
mod judge;
mod script;
pub mod shell;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use xshell::Shell;

use crate::step::{timed, Step};
use xtask_base::{host, paths};

use crate::kernel::{self, Builder, Kernel};
use crate::vm;
pub use debug::STEP as DEBUG_KERNEL_STEP;
use guest::module_vm;
pub use guest::tools_vm;
use judge::judge;
pub use judge::{marked, print_guest_steps, subtests};
pub(crate) use script::load_only;
use script::{ENVIRONMENT, SANITY_FUNCTION, SCRIPT};

/// Debian packages the VM steps need on the host.
pub const HOST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "make", "gcc"];

/// What a run of the module tests adds or leaves out for a kind of kernel.
pub(crate) struct Variant {
    /// The README's from-source lines (built with this machine's compiler) and the second boot
    /// with x86 PAT off: for Debian's 6.1 kernel.
    pub full: bool,
    /// The fuzzer's kernel-level operations unless MTGDRCOPY_FUZZ_OPS says.
    pub fuzz_ops: u64,
    /// The fuzzer's calls of the gdrapi C API (its `api` phase).
    pub fuzz_api_ops: u64,
    /// Appended to the guest kernel's command line.
    pub cmdline: String,
    /// Script lines run first (e.g. `export` of the tests' knobs).
    pub head: String,
    /// Script lines run last, before the script exits with the tests' status (`rc`).
    pub tail: String,
    /// Names the console log: build/vm/module-tests-<log_name>.log.
    pub log_name: String,
}

/// The fuzzer's kernel-level operations on Debian's 6.1 kernel: the floor of 100,000 per run of
/// `cargo xtask test`, in the step that every run with VM tests has.
const FUZZ_OPS: u64 = 100_000;

/// The fuzzer's calls of the gdrapi C API on Debian's kernels (about 15 s under TCG).
const FUZZ_API_OPS: u64 = 20_000;

/// The fuzzer's kernel-level operations on the matrix's newest kernel (sid): as many as on the
/// debug kernel. The floor is met on 6.1 already; a second 100,000 there cost about 80 s of the
/// guest lane, which is the longer one of a warm rerun, for a run of the same fuzzer with new
/// seeds. These still reach every kind of operation on 7.x's mapping path (no VM_PAT).
const MATRIX_FUZZ_OPS: u64 = 15_000;

impl Variant {
    /// Debian's kernels: the full run on 6.1 (built here), the rest on the matrix's kernels.
    fn stock(kernel: &Kernel) -> Variant {
        let full = kernel.builder == Builder::Host;
        Variant {
            full,
            fuzz_ops: if full { FUZZ_OPS } else { MATRIX_FUZZ_OPS },
            fuzz_api_ops: FUZZ_API_OPS,
            cmdline: String::new(),
            head: String::new(),
            tail: String::new(),
            log_name: kernel.release.clone(),
        }
    }
}

/// One boot of `kernel` running the module tests, judged by exit code, kernel log and counters.
pub fn run_module_tests(sh: &Shell, kernel: &Kernel) -> Result<()> {
    run_module_tests_as(sh, kernel, &Variant::stock(kernel))
}

/// [`run_module_tests`] with what `variant` adds or leaves out.
pub(crate) fn run_module_tests_as(sh: &Shell, kernel: &Kernel, variant: &Variant) -> Result<()> {
    let mut spec = module_vm(sh, kernel)?;
    spec.extra_cmdline = variant.cmdline.clone();
    // The fuzzer's seed: MTGDRCOPY_FUZZ_SEED replays a run, else a new one each time (printed).
    let seed = std::env::var("MTGDRCOPY_FUZZ_SEED").unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        format!("{:#x}", t ^ u64::from(std::process::id()) << 32)
    });
    eprintln!("    mtgdrdrv_fuzz seed {seed} (MTGDRCOPY_FUZZ_SEED={seed} replays it)");
    // Kernel-level operations of the fuzzer: MTGDRCOPY_FUZZ_OPS, else the variant's (100,000 on
    // 6.1: about 2 minutes under TCG on an idle 2-core machine).
    let ops = std::env::var("MTGDRCOPY_FUZZ_OPS")
        .ok()
        .filter(|v| v.parse::<u64>().is_ok())
        .unwrap_or_else(|| variant.fuzz_ops.to_string());
    // mtgdrdrv maps differently with PAT off; only kernels with VM_PAT care (6.1, not 7.x).
    let nopat = variant.full.then(|| nopat_vm(&spec, kernel));
    // The README's from-source lines build the module with this machine's compiler, so only
    // for a kernel built here (the 6.1 run; the matrix's chroot kernels skip it).
    let from_source = if variant.full {
        let (files, step) = from_source::prepare(sh, kernel)?;
        spec.files.extend(files);
        step
    } else {
        String::new()
    };
    spec.script = variant.head.clone()
        + &SCRIPT
            .replace("@CHECKS_FUNCTIONS@\n", checks::FUNCTIONS)
            .replace("@DOCTOR_FUNCTION@\n", doctor::FUNCTION)
            .replace("@SANITY_FUNCTION@\n", SANITY_FUNCTION)
            .replace("@ENVIRONMENT@", ENVIRONMENT)
            .replace("@DOCTOR_LOADED@\n", &doctor::loaded_states())
            .replace("@FUZZ_SEED@", &seed)
            .replace("@FUZZ_OPS@", &ops)
            .replace("@FUZZ_API_OPS@", &variant.fuzz_api_ops.to_string())
            .replace("@FROM_SOURCE@\n", &format!("{from_source}{}", variant.tail));
    let log = paths::build_dir()
        .join("vm")
        .join(format!("module-tests-{}.log", variant.log_name));
    let t = Instant::now();
    let outcome = vm::run(&spec, &log)?;
    timed("VM run", t);
    print_guest_steps(&outcome.console);
    judge(&outcome, &spec.script, &log)?;
    checks::check(&outcome.console, &spec.script, &log)?;
    let states = [doctor::LOADED_STATES.as_slice(), &doctor::OTHER_STATES].concat();
    doctor::check(&outcome.console, &states, &log)?;
    if !from_source.is_empty() {
        from_source::check(&outcome.console, &log)?;
    }
    if let Some((spec, log)) = nopat {
        let t = Instant::now();
        let outcome = vm::run(&spec, &log)?;
        outcome.ensure_passed("the mapping tests with x86 PAT off", &log)?;
        checks::check(&outcome.console, &spec.script, &log)?;
        doctor::check(&outcome.console, &["nopat"], &log)?;
        timed("VM run with nopat", t);
    }
    Ok(())
}

/// A second, short boot of the module tests' VM with x86 PAT off (`nopat`): mtgdrdrv then
/// remaps each physical run in one call, a path that the PAT-on run never takes, and must
/// still leave no VMA VM_PAT (`lifetimes::mappings_are_never_vm_pat...`).
fn nopat_vm(spec: &vm::VmSpec, kernel: &Kernel) -> (vm::VmSpec, PathBuf) {
    let mut spec = spec.clone();
    spec.extra_cmdline = "nopat".into();
    spec.script = format!(
        "rc=0\n{}{}\n{}\
         dmesg | grep -q 'PAT support disabled' || fail 'PAT is still on'\n\
         checks_begin nopat\n\
         {}\n\
         /opt/mtgdrcopy/vm_module --test-threads=1 basics:: lifetimes::; point the mapping tests pass\n\
         checks_end\n\
         exit $rc\n",
        checks::FUNCTIONS,
        load_only(),
        doctor::FUNCTION,
        doctor::NOPAT_RUN
    );
    let log = paths::build_dir()
        .join("vm")
        .join(format!("module-tests-nopat-{}.log", kernel.release));
    (spec, log)
}

/// The outcome of the last 6.1 run of `cargo xtask test` in this process, for the kernel
/// matrix's table (which then does not boot 6.1 a second time).
static BOOKWORM_E2E: std::sync::Mutex<Option<Result<(), String>>> = std::sync::Mutex::new(None);

/// What [`test_steps`]' 6.1 run gave, if it ran.
pub fn bookworm_e2e_outcome() -> Option<Result<(), String>> {
    BOOKWORM_E2E.lock().ok().and_then(|o| o.clone())
}

/// The VM steps of `cargo xtask test`: Debian's 6.1 kernel, then the debug kernel.
pub fn test_steps() -> Vec<Step<'static>> {
    vec![
        (
            "kernel module tests in QEMU (Debian 6.1)",
            Box::new(|sh: &Shell| {
                host::ensure_host_packages(HOST_PACKAGES)?;
                let kernel = kernel::bookworm_kernel()?;
                let result = run_module_tests(sh, &kernel);
                if let Ok(mut slot) = BOOKWORM_E2E.lock() {
                    *slot = Some(result.as_ref().map(|_| ()).map_err(|e| format!("{e:#}")));
                }
                result
            }),
        ),
        debug::test_step(),
    ]
}
