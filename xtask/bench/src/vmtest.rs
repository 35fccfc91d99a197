//! The kernel module tests of `cargo xtask test`: build mtgdrdrv and the emulated provider
//! against the test kernel's headers, boot that kernel in QEMU with both modules and the in-VM
//! test binary, load, test, unload, and judge the run by the tests' exit code, the kernel log
//! and the leak counters.

mod debug;
mod doctor;
mod from_source;
mod judge;
mod script;
pub mod shell;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::step::{timed, Step};
use xtask_base::{host, paths};

use crate::kernel::{self, Builder, Kernel};
use crate::vm;
pub use debug::STEP as DEBUG_KERNEL_STEP;
pub use judge::print_guest_steps;
use judge::{check_tool_statuses, judge};
pub(crate) use script::load_only;
use script::{ENVIRONMENT, SCRIPT};

/// Debian packages the VM steps need on the host.
pub const HOST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "make", "gcc"];

/// Builds `mtgdrdrv.ko` and `mtgpu_emu.ko` for `kernel` in a copy of the sources, so the source
/// tree stays clean and kernels do not share objects: in build/kmod/<release> on the host, or, for
/// a kernel built in a chroot, in the chroot (the .ko files are then copied to
/// build/kmod/<release>). mtgdrdrv takes the provider's symbol CRCs from its co-built stub, as on
/// hosts without mtgpu's Module.symvers: loading it against the emulator then proves the CRCs
/// match. The build is incremental; [`clean_modules`] first makes every file compile again.
///
/// W=1, and warnings are errors for our files: a compiler warning located in our sources or
/// headers, or any modpost/objtool warning about our modules, fails the build (see
/// [`Warnings`]); warnings located in the kernel's own headers are counted, not failed.
pub fn build_modules(sh: &Shell, kernel: &Kernel) -> Result<(PathBuf, PathBuf)> {
    let out = paths::build_dir().join("kmod").join(&kernel.release);
    let work = work_dir(kernel);
    let work_host = kernel.builder.host_path(&work);
    // The repository's layout, which the emulator's Kbuild relies on (it uses mtgdrdrv's probes).
    let (kmod, emu) = ("mtgdrdrv/kmod", "testing/mtgpu-emu");
    for dir in [kmod, emu] {
        copy_sources(&paths::root().join(dir), &work_host.join(dir))?;
    }
    make_module(
        sh,
        kernel,
        &work.join(kmod),
        &["MTGPU_SYMVERS=", "MTGDRDRV_TEST_HOOKS=y"],
        "mtgdrdrv",
    )?;
    make_module(sh, kernel, &work.join(emu), &[], "mtgpu_emu")?;
    let mut built = [
        work_host.join(kmod).join("mtgdrdrv.ko"),
        work_host.join(emu).join("mtgpu_emu.ko"),
    ];
    if kernel.builder != Builder::Host {
        // A chroot's work directory is reused by the next kernel: keep the modules outside it.
        for (ko, to) in built
            .iter_mut()
            .zip(["kmod/mtgdrdrv.ko", "emu/mtgpu_emu.ko"])
        {
            let to = out.join(to);
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::copy(&*ko, &to)
                .with_context(|| format!("copying {} to {}", ko.display(), to.display()))?;
            *ko = to;
        }
    }
    let [kmod, emu] = built;
    Ok((kmod, emu))
}

/// Forgets the objects of earlier builds of `kernel`'s modules, so that the next
/// [`build_modules`] compiles every file and so reports every warning.
pub fn clean_modules(kernel: &Kernel) -> Result<()> {
    let work = kernel.builder.host_path(&work_dir(kernel));
    match std::fs::remove_dir_all(&work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", work.display()))
        }
        _ => Ok(()),
    }
}

/// Where `kernel`'s modules are built, as its builder sees the path. A chroot holds one kernel.
fn work_dir(kernel: &Kernel) -> PathBuf {
    match kernel.builder {
        Builder::Host => paths::build_dir().join("kmod").join(&kernel.release),
        Builder::Chroot(_) => PathBuf::from("/root/mtgdrcopy-kmod"),
    }
}

/// `make` of one module directory (`dir` as the builder sees it), judged by [`Warnings`].
fn make_module(sh: &Shell, kernel: &Kernel, dir: &Path, args: &[&str], name: &str) -> Result<()> {
    let jobs = format!(
        "-j{}",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let kdir = format!("KDIR={}", kernel.headers.display());
    let out = kernel
        .builder
        .cmd(sh, None, "make")
        .args(["-s", &jobs, "-C"])
        .arg(dir)
        .arg(kdir)
        .args(args)
        .arg("W=1")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running make for {name}"))?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        eprint!("{log}");
        bail!(
            "building {name} for {} failed ({})",
            kernel.release,
            out.status
        );
    }
    let warnings = Warnings::find(&log, dir);
    if !warnings.ours.is_empty() {
        eprint!("{log}");
        // Kbuild would not compile these objects again: remove them so that the warnings come
        // back on the next build instead of passing silently, as -Werror would.
        let host_dir = kernel.builder.host_path(dir);
        for entry in std::fs::read_dir(&host_dir)
            .with_context(|| format!("reading {}", host_dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "o" || e == "ko") {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        bail!(
            "{name} for {}: warnings in our files (W=1; they are errors):\n  {}",
            kernel.release,
            warnings.ours.join("\n  ")
        );
    }
    if warnings.others > 0 {
        eprintln!(
            "    {name} for {}: {} warning(s) located in the kernel's headers, not ours:",
            kernel.release, warnings.others
        );
        eprint!("{log}");
    }
    Ok(())
}

/// The warnings of a kbuild log, split into ours and the kernel's. Kbuild compiles an external
/// module with the kernel tree as working directory before 6.13 (our files then appear under
/// the module's absolute directory) and with the module's directory since (bare file names);
/// the kernel's headers always appear under the kernel tree. A warning in a kernel header that
/// our code triggers through a macro is reported at our line too ("in expansion of macro").
#[derive(Debug, Default, PartialEq)]
pub struct Warnings {
    /// Compiler warnings located in `dir`, and every modpost or objtool warning (they are about
    /// our modules: modpost only checks the modules being built).
    pub ours: Vec<String>,
    /// Other warning lines: the kernel's headers, compiler notes without a location.
    pub others: usize,
}

impl Warnings {
    /// The warnings of `log`, a kbuild run for the module in `dir` (as the compiler saw it).
    pub fn find(log: &str, dir: &Path) -> Warnings {
        let mut found = Warnings::default();
        for line in log.lines() {
            let line = line.trim_end();
            if line.starts_with("WARNING:") {
                found.ours.push(line.to_owned());
                continue;
            }
            let Some(at) = line.find(": warning: ") else {
                continue;
            };
            match location(&line[..at]) {
                Some(path) if is_ours(path, dir) => found.ours.push(line.to_owned()),
                _ => found.others += 1,
            }
        }
        found
    }
}

/// The file of a `path:line[:column]` compiler location, or of an objtool `object.o` one.
fn location(loc: &str) -> Option<&str> {
    let mut path = loc;
    let mut numbers = 0;
    while numbers < 2 {
        match path.rsplit_once(':') {
            Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => {
                path = head;
                numbers += 1;
            }
            _ => break,
        }
    }
    // "cc1: warning: …" has no file.
    (numbers > 0 || path.ends_with(".o")).then_some(path)
}

fn is_ours(path: &str, dir: &Path) -> bool {
    let path = path.strip_prefix("./").unwrap_or(path);
    // The emulator includes mtgdrdrv's compat.h as "../../mtgdrdrv/kmod/compat.h": relative
    // since 6.13, below its own directory (through "..") before.
    !path.contains('/')
        || Path::new(path).starts_with(dir)
        || path.starts_with("../../mtgdrdrv/kmod/")
}

/// Copies the regular files of `from` (sources, Kbuild, Makefile, probes) into `to`, leaving
/// build products behind.
fn copy_sources(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&name))?;
            continue;
        }
        let built = [
            ".o", ".ko", ".mod", ".mod.c", ".cmd", ".symvers", ".order", ".d",
        ]
        .iter()
        .any(|ext| name_str.ends_with(ext))
            || name_str.starts_with('.')
            || name_str == "conftest.h";
        // Unchanged files keep their timestamps, so kbuild does not rebuild for nothing.
        let target = to.join(&name);
        if !built && std::fs::read(&path)? != std::fs::read(&target).unwrap_or_default() {
            std::fs::copy(&path, &target)?;
        }
    }
    Ok(())
}

/// Builds the in-VM test binary (release, debug info stripped to keep the initramfs small).
fn build_test_binary(sh: &Shell) -> Result<PathBuf> {
    let json = cmd!(
        sh,
        "cargo test --release --quiet -p mtgdrcopy-tests --features vm --test vm_module --no-run --message-format=json"
    )
    .read()?;
    let exe = json
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"name\":\"vm_module\"")
        })
        .find_map(|l| {
            let key = "\"executable\":\"";
            let start = l.find(key)? + key.len();
            let end = start + l[start..].find('"')?;
            Some(PathBuf::from(&l[start..end]))
        })
        .context("cargo did not report the vm_module test executable")?;
    let stripped = paths::build_dir().join("vm").join("vm_module");
    std::fs::create_dir_all(paths::build_dir().join("vm"))?;
    cmd!(sh, "strip --strip-debug -o {stripped} {exe}").run()?;
    Ok(stripped)
}

/// The programs of the mtgdrcopy-tests package (with the emulator-only checks, feature
/// `emulator`), libgdrapi.so.1 and the emulated libmusa.so.1, built in release mode and
/// stripped, with their guest paths (programs in /usr/bin).
fn tool_files(sh: &Shell) -> Result<Vec<(PathBuf, String)>> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --lib").run()?;
    cmd!(
        sh,
        "cargo build --quiet --release -p mtgdrcopy-tests -p mtgdrdrv-fuzz --bins --features mtgdrcopy-tests/emulator"
    )
    .run()?;
    let release = paths::release_dir();
    let staged = paths::build_dir().join("vm/bin");
    std::fs::create_dir_all(&staged)?;
    let mut files = Vec::new();
    let mut stage = |from: PathBuf, name: &str, guest: String| -> Result<()> {
        let to = staged.join(name);
        cmd!(sh, "strip --strip-debug -o {to} {from}").run()?;
        files.push((to, guest));
        Ok(())
    };
    // The tools, and the adversarial suite's fuzzer (test-only, not in any package).
    for (path, name) in programs(&release, |name| name == "mtgdrdrv_fuzz")? {
        stage(path, &name, format!("/usr/bin/{name}"))?;
    }
    let soname = xtask_base::library::soname();
    stage(
        release.join("libgdrapi.so"),
        &soname,
        format!("/usr/lib/mtgdrcopy/{soname}"),
    )?;
    stage(
        xtask_base::build::emulated_musa(sh)?,
        "libmusa.so.1",
        "/usr/lib/mtgdrcopy/emu/libmusa.so.1".into(),
    )?;
    Ok(files)
}

/// The console lines the guest marked with `prefix` (e.g. `MTGDRCOPY-EXIT `), without it.
pub fn marked<'a>(console: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    console
        .lines()
        .filter_map(move |l| l.trim_end_matches('\r').strip_prefix(prefix))
}

/// The programs cargo built in `dir` (files without an extension): the mtgdrcopy tools and those
/// `also` names, with their names.
pub fn programs(dir: &Path, also: impl Fn(&str) -> bool) -> Result<Vec<(PathBuf, String)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if (name.starts_with("mtgdrcopy_") || also(&name)) && path.is_file() && !name.contains('.')
        {
            found.push((path, name));
        }
    }
    Ok(found)
}

/// A VM of `kernel` holding both modules (under /lib/mtgdrcopy) and the in-VM test binary
/// (/opt/mtgdrcopy/vm_module), with no script yet.
fn module_vm(sh: &Shell, kernel: &Kernel) -> Result<vm::VmSpec> {
    let t = Instant::now();
    let (mtgdrdrv_ko, emu_ko) = build_modules(sh, kernel)?;
    timed("modules built", t);
    let t = Instant::now();
    let test_exe = build_test_binary(sh)?;
    timed("test binary built", t);

    let t = Instant::now();
    let tools = tool_files(sh)?;
    timed("tools and libraries built", t);

    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = vec![
        (mtgdrdrv_ko, "/lib/mtgdrcopy/mtgdrdrv.ko".into()),
        (emu_ko, "/lib/mtgdrcopy/mtgpu_emu.ko".into()),
        (test_exe, "/opt/mtgdrcopy/vm_module".into()),
    ];
    spec.files.extend(tools);
    spec.files.extend(doctor::files());
    spec.ivshmem_mb = 256;
    spec.memory_mb = 1024;
    // Guest time is ~4 min on an idle host and 13 min at load average 8 (10,000-cycle stress and
    // the 100,000-operation fuzzer); the limit only catches a hung guest.
    spec.timeout = Duration::from_secs(1800);
    Ok(spec)
}

/// The test VM with both modules loaded, the tools in /usr/bin and LD_LIBRARY_PATH set, then
/// running `script` (a shell script); for subcommands that judge the console themselves
/// (`cargo xtask bench`).
pub fn tools_vm(sh: &Shell, kernel: &Kernel, script: &str) -> Result<vm::VmSpec> {
    let mut spec = module_vm(sh, kernel)?;
    spec.script = format!("{}\n{script}\n", load_only());
    Ok(spec)
}

/// What a run of the module tests adds or leaves out for a kind of kernel.
pub(crate) struct Variant {
    /// The README's from-source lines (built with this machine's compiler) and the second boot
    /// with x86 PAT off: for Debian's 6.1 kernel.
    pub full: bool,
    /// The fuzzer's kernel-level operations unless MTGDRCOPY_FUZZ_OPS says.
    pub fuzz_ops: u64,
    /// Appended to the guest kernel's command line.
    pub cmdline: String,
    /// Script lines run first (e.g. `export` of the tests' knobs).
    pub head: String,
    /// Script lines run last, before the script exits with the tests' status (`rc`).
    pub tail: String,
    /// Names the console log: build/vm/module-tests-<log_name>.log.
    pub log_name: String,
}

impl Variant {
    /// Debian's kernels: the full run on 6.1 (built here), the rest on the matrix's kernels.
    fn stock(kernel: &Kernel) -> Variant {
        Variant {
            full: kernel.builder == Builder::Host,
            fuzz_ops: 100_000,
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
    // Kernel-level operations of the fuzzer (MTGDRCOPY_FUZZ_OPS, default 100,000 on Debian's
    // kernels, the floor per CI run: about 4 to 5 minutes under TCG).
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
            .replace("@DOCTOR_FUNCTION@\n", doctor::FUNCTION)
            .replace("@ENVIRONMENT@", ENVIRONMENT)
            .replace("@DOCTOR_LOADED@\n", &doctor::loaded_states())
            .replace("@FUZZ_SEED@", &seed)
            .replace("@FUZZ_OPS@", &ops)
            .replace("@FROM_SOURCE@\n", &format!("{from_source}{}", variant.tail));
    let expected_exits = doctor::exit_checks(&spec.script);
    let log = paths::build_dir()
        .join("vm")
        .join(format!("module-tests-{}.log", variant.log_name));
    let t = Instant::now();
    let outcome = vm::run(&spec, &log)?;
    timed("VM run", t);
    print_guest_steps(&outcome.console);
    judge(&outcome, &log)?;
    check_tool_statuses(&outcome.console, expected_exits, &log)?;
    let states = [doctor::LOADED_STATES.as_slice(), &doctor::OTHER_STATES].concat();
    doctor::check(&outcome.console, &states, &log)?;
    if !from_source.is_empty() {
        from_source::check(&outcome.console, &log)?;
    }
    if let Some((spec, log)) = nopat {
        let t = Instant::now();
        let outcome = vm::run(&spec, &log)?;
        outcome.ensure_passed("the mapping tests with x86 PAT off", &log)?;
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
        "{}\n{}\
         dmesg | grep -q 'PAT support disabled' || {{ echo 'PAT is still on'; exit 1; }}\n\
         rc=0\n\
         {}\n\
         /opt/mtgdrcopy/vm_module --test-threads=1 basics:: lifetimes:: || rc=1\n\
         exit $rc\n",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_the_tools_and_what_is_asked_for() {
        let dir = std::env::temp_dir().join(format!("xtask-programs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mtgdrcopy_dir")).unwrap();
        for name in [
            "mtgdrcopy_copybw",
            "mtgdrcopy_copybw.d",
            "mtgdrdrv_fuzz",
            "other",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let names = |also: fn(&str) -> bool| {
            let mut n: Vec<String> = programs(&dir, also)
                .unwrap()
                .into_iter()
                .map(|p| p.1)
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(|_| false), ["mtgdrcopy_copybw"]);
        assert_eq!(
            names(|n| n == "mtgdrdrv_fuzz"),
            ["mtgdrcopy_copybw", "mtgdrdrv_fuzz"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn warnings_before_6_13_are_absolute() {
        let dir = Path::new("/root/mtgdrcopy-kmod/kmod");
        let log = "/root/mtgdrcopy-kmod/kmod/mtgdrdrv_main.c: In function 'f':\n\
                   /root/mtgdrcopy-kmod/kmod/mtgdrdrv_main.c:45:36: warning: unused variable 'x' [-Wunused-variable]\n\
                   /usr/src/linux-headers-5.10.0-32-common/include/linux/mm.h:12:1: warning: something\n\
                   ./include/generated/autoconf.h:3:9: warning: generated\n\
                   cc1: warning: command-line option\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 1);
        assert!(found.ours[0].contains("mtgdrdrv_main.c:45:36"));
        assert_eq!(found.others, 3);
    }

    #[test]
    fn warnings_since_6_13_are_relative() {
        let dir = Path::new("/root/mtgdrcopy-kmod/kmod");
        let log = "compat.h:40:5: warning: unused\n\
                   mtgdrdrv_pin.c:7: warning: no column\n\
                   mtgdrdrv.o: warning: objtool: f() falls through to next function g()\n\
                   WARNING: modpost: missing MODULE_DESCRIPTION() in mtgdrdrv.o\n\
                   /usr/src/linux-headers-7.2.13+deb14-common/include/linux/compat.h:1:1: warning: theirs\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 4, "{found:?}");
        assert_eq!(found.others, 1);
    }

    #[test]
    fn the_emulators_warnings_in_mtgdrdrvs_compat_header_are_ours() {
        let dir = Path::new("/root/mtgdrcopy-kmod/testing/mtgpu-emu");
        let log = "../../mtgdrdrv/kmod/compat.h:40:5: warning: since 6.13\n\
                   /root/mtgdrcopy-kmod/testing/mtgpu-emu/../../mtgdrdrv/kmod/compat.h:40:5: warning: before\n\
                   ../linux-headers-6.1.0-57-common/include/linux/mm.h:1:1: warning: theirs\n";
        let found = Warnings::find(log, dir);
        assert_eq!(found.ours.len(), 2, "{found:?}");
        assert_eq!(found.others, 1);
    }
}
