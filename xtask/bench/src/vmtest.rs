//! The kernel module tests of `cargo xtask test`: build mtgdrdrv and the emulated provider
//! against the test kernel's headers, boot that kernel in QEMU with both modules and the in-VM
//! test binary, load, test, unload, and judge the run by the tests' exit code, the kernel log
//! and the leak counters.

mod doctor;
mod from_source;
pub mod shell;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::step::{timed, Step};
use xtask_base::{host, paths};

use crate::kernel::{self, Builder, Kernel};
use crate::vm;

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

/// The programs of the mtgdrcopy-tests package, libgdrapi.so.1 and the emulated libmusa.so.1,
/// built in release mode and stripped, with their guest paths (programs in /usr/bin).
fn tool_files(sh: &Shell) -> Result<Vec<(PathBuf, String)>> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --lib").run()?;
    cmd!(
        sh,
        "cargo build --quiet --release -p mtgdrcopy-tests -p mtgdrdrv-fuzz --bins"
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

const SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
fail() { echo "MTGDRCOPY-FAIL $*"; exit 1; }
@DOCTOR_FUNCTION@
step load
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
insmod /lib/mtgdrcopy/mtgdrdrv.ko || fail "insmod mtgdrdrv"
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done
[ -c /dev/mtgdrdrv ] || fail "/dev/mtgdrdrv did not appear"
[ -c /dev/mtgpu_emu ] || fail "/dev/mtgpu_emu did not appear"
cat /proc/driver/mtgdrdrv/params
step tests
/opt/mtgdrcopy/vm_module --test-threads=1
rc=$?
step sanity
@ENVIRONMENT@
for page in 4096 65536 2097152; do
    echo "MTGDRCOPY-SANITY-PAGE $page"
    MTGPU_EMU_PAGE_SIZE=$page mtgdrcopy_sanity -e || rc=1
done
step tool-status
# Exit statuses and --json with the environment present (without it: mtgdrcopy-tests/tests/tools.rs).
expect_exit() {
    want=$1
    shift
    "$@" >/tmp/tool.out 2>&1
    got=$?
    echo "MTGDRCOPY-EXIT want=$want got=$got $*"
    [ "$got" = "$want" ] || { sed 's/^/    /' /tmp/tool.out; rc=1; }
}
expect_exit 0 mtgdrcopy_copybw -s 64K -w 10 -r 10 --json /tmp/bw.json
grep -q '"tool": "copybw"' /tmp/bw.json || { echo "MTGDRCOPY-FAIL no copybw report in --json"; rc=1; }
echo previous >/tmp/old.json
expect_exit 1 mtgdrcopy_copybw -s 64K -w 10 -r 10 -M cache --json /tmp/old.json
[ "$(cat /tmp/old.json)" = previous ] || { echo "MTGDRCOPY-FAIL a failed run replaced its --json file"; rc=1; }
ls -a /tmp | grep -q '[.]tmp$' && { echo "MTGDRCOPY-FAIL a --json temporary file was left"; rc=1; }
expect_exit 2 mtgdrcopy_copybw -o 6
expect_exit 0 mtgdrcopy_sanity -t basic_mumemalloc -t fault_get_pages_enomem --format tap
n=$(grep -c '^ok [12] - ' /tmp/tool.out)
echo "MTGDRCOPY-TAP-OK $n"
[ "$n" = 2 ] && grep -q '^1[.][.]2$' /tmp/tool.out || { cat /tmp/tool.out; rc=1; }
mtgdrcopy_copybw --version | grep -q '^driver: *mtgdrdrv ' || { echo "MTGDRCOPY-FAIL --version names no mtgdrdrv"; rc=1; }
# The emulated libmusa is refused unless the test suite allows it, and named when it is in use.
expect_exit 77 env -u MTGDRCOPY_ALLOW_EMULATED_MUSA mtgdrcopy_musainfo
grep -q "libmusa.so.1 is the mtgdrcopy test suite's emulated libmusa" /tmp/tool.out || { echo "MTGDRCOPY-FAIL the emulated libmusa was not refused by name"; rc=1; }
mtgdrcopy_copybw --version | grep -qF 'MUSA driver: 30000 (emulated, /usr/lib/mtgdrcopy/emu/libmusa.so.1)' || { echo "MTGDRCOPY-FAIL --version does not say emulated"; rc=1; }
step doctor
@DOCTOR_LOADED@
step sanity-dmabuf
# The dma-buf backend, forced while the module is loaded.
echo "MTGDRCOPY-SANITY-PAGE dmabuf-forced"
GDRCOPY_USE_DMABUF_MMAP=1 mtgdrcopy_sanity || rc=1
step fuzz
mtgdrdrv_fuzz --seed @FUZZ_SEED@ --ops @FUZZ_OPS@ --api-ops 20000 || rc=1
step counters
sed 's/^/MTGDRCOPY-COUNTER /' /proc/driver/mtgdrdrv/counters
step unload
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
doctor no-module 1
step sanity-nomodule
# The dma-buf backend chosen because /dev/mtgdrdrv is gone.
echo "MTGDRCOPY-SANITY-PAGE dmabuf-nomodule"
mtgdrcopy_sanity || rc=1
# A refused mmap is reported in one log line.
n=$(MTGPU_EMU_DMABUF=no-mmap GDRCOPY_ENABLE_LOGGING=1 mtgdrcopy_sanity -t dmabuf_refused_mmap 2>&1 | grep -c 'mmap of the MUSA dma-buf was refused')
echo "MTGDRCOPY-REFUSED-MMAP-LINES $n"
[ "$n" = 1 ] || rc=1
# Neither backend: no module, and a device whose driver exports no dma-buf.
expect_exit 77 env MTGPU_EMU_DMABUF=off mtgdrcopy_copybw
grep -q 'mtgdrdrv is not loaded' /tmp/tool.out || { echo "MTGDRCOPY-FAIL the hint does not say mtgdrdrv is not loaded"; rc=1; }
mtgdrcopy_musainfo --emu-stats | sed 's/^/MTGDRCOPY-COUNTER /'
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (a dma-buf still holds it?)"
doctor nothing 77 env LD_LIBRARY_PATH=/usr/lib/mtgdrcopy
# No GPU at all: the emulated libmusa finds no device.
expect_exit 77 mtgdrcopy_copybw
expect_exit 77 mtgdrcopy_sanity --format tap
grep -q '^Bail out! ' /tmp/tool.out || { echo "MTGDRCOPY-FAIL no TAP bail-out"; rc=1; }
step disabled
# mtgpu as its vendor's DKMS post_install leaves it: loaded with disable_driver=1, symbols
# exported, PCI driver not registered. Pins fail with ENODEV and never reach the provider
# (a call WARNs in the emulator); the load and the refusals say what to do, rate-limited.
insmod /lib/mtgdrcopy/mtgpu_emu.ko disable_driver=1 || fail "insmod mtgpu_emu disable_driver=1"
insmod /lib/mtgdrcopy/mtgdrdrv.ko || fail "insmod mtgdrdrv over a disabled provider"
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && break; sleep 0.1; done
/opt/mtgdrcopy/vm_module --exact provider::disabled_provider_refuses_pins_without_calling_it --ignored --test-threads=1 || rc=1
n=$(dmesg | grep -c "reload mtgpu without disable_driver=1")
echo "MTGDRCOPY-DISABLED-LINES $n"
[ "$n" -ge 2 ] && [ "$n" -le 11 ] || rc=1
doctor disabled 1
rmmod mtgdrdrv || fail "rmmod mtgdrdrv (disabled provider)"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (disable_driver=1)"
@FROM_SOURCE@
step done
exit $rc
"#;

/// What the guest's tools run with: libgdrapi, and the emulated libmusa standing in for the MUSA
/// driver's, which the tools use only because the test suite allows it; the emulated provider
/// named for the doctor (as for mtgdrdrv-load and insmod.sh).
const ENVIRONMENT: &str = "export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy:/usr/lib/mtgdrcopy/emu
export MTGDRCOPY_ALLOW_EMULATED_MUSA=1
export MTGDRDRV_PROVIDER=mtgpu_emu";

/// [`LOAD_ONLY`] with its environment.
pub(crate) fn load_only() -> String {
    LOAD_ONLY.replace("@ENVIRONMENT@", ENVIRONMENT)
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

const LOAD_ONLY: &str = r#"
insmod /lib/mtgdrcopy/mtgpu_emu.ko && insmod /lib/mtgdrcopy/mtgdrdrv.ko || exit 1
for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done
@ENVIRONMENT@
echo "modules loaded; tools in /usr/bin/mtgdrcopy_*; tests: /opt/mtgdrcopy/vm_module --test-threads=1"
"#;

/// The test VM with both modules loaded, the tools in /usr/bin and LD_LIBRARY_PATH set, then
/// running `script` (a shell script); for subcommands that judge the console themselves
/// (`cargo xtask bench`).
pub fn tools_vm(sh: &Shell, kernel: &Kernel, script: &str) -> Result<vm::VmSpec> {
    let mut spec = module_vm(sh, kernel)?;
    spec.script = format!("{}\n{script}\n", load_only());
    Ok(spec)
}

/// One boot of `kernel` running the module tests, judged by exit code, kernel log and counters.
pub fn run_module_tests(sh: &Shell, kernel: &Kernel) -> Result<()> {
    let mut spec = module_vm(sh, kernel)?;
    // The fuzzer's seed: MTGDRCOPY_FUZZ_SEED replays a run, else a new one each time (printed).
    let seed = std::env::var("MTGDRCOPY_FUZZ_SEED").unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        format!("{:#x}", t ^ u64::from(std::process::id()) << 32)
    });
    eprintln!("    mtgdrdrv_fuzz seed {seed} (MTGDRCOPY_FUZZ_SEED={seed} replays it)");
    // Kernel-level operations of the fuzzer (MTGDRCOPY_FUZZ_OPS, default 100,000, the issue's
    // floor per CI run: about 4 to 5 minutes under TCG).
    let ops = std::env::var("MTGDRCOPY_FUZZ_OPS")
        .ok()
        .filter(|v| v.parse::<u64>().is_ok())
        .unwrap_or_else(|| "100000".into());
    // mtgdrdrv maps differently with PAT off; only kernels with VM_PAT care (6.1, not 7.x).
    let nopat = (kernel.builder == Builder::Host).then(|| nopat_vm(&spec, kernel));
    // The README's from-source lines build the module with this machine's compiler, so only
    // for a kernel built here (the 6.1 run; the matrix's chroot kernels skip it).
    let from_source = if kernel.builder == Builder::Host {
        let (files, step) = from_source::prepare(sh, kernel)?;
        spec.files.extend(files);
        step
    } else {
        String::new()
    };
    spec.script = SCRIPT
        .replace("@DOCTOR_FUNCTION@\n", doctor::FUNCTION)
        .replace("@ENVIRONMENT@", ENVIRONMENT)
        .replace("@DOCTOR_LOADED@\n", &doctor::loaded_states())
        .replace("@FUZZ_SEED@", &seed)
        .replace("@FUZZ_OPS@", &ops)
        .replace("@FROM_SOURCE@\n", &from_source);
    let expected_exits = doctor::exit_checks(&spec.script);
    let log = paths::build_dir()
        .join("vm")
        .join(format!("module-tests-{}.log", kernel.release));
    let t = Instant::now();
    let outcome = vm::run(&spec, &log)?;
    timed("VM run", t);
    print_guest_steps(&outcome.console);
    judge(&outcome, &log)?;
    check_tool_statuses(&outcome.console, expected_exits, &log)?;
    doctor::check(
        &outcome.console,
        &[
            "healthy",
            "no-libmusa",
            "no-group",
            "relogin",
            "no-module",
            "nothing",
            "disabled",
        ],
        &log,
    )?;
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
         doctor nopat 0\n\
         /opt/mtgdrcopy/vm_module --test-threads=1 basics:: lifetimes:: || rc=1\n\
         exit $rc\n",
        load_only(),
        doctor::FUNCTION
    );
    let log = paths::build_dir()
        .join("vm")
        .join(format!("module-tests-nopat-{}.log", kernel.release));
    (spec, log)
}

/// The `expect_exit` lines of [`SCRIPT`]: each tool ended with the status it should, and all
/// of them ran.
fn check_tool_statuses(console: &str, expected: usize, log: &Path) -> Result<()> {
    let exits: Vec<&str> = marked(console, "MTGDRCOPY-EXIT ").collect();
    for line in &exits {
        eprintln!("      guest exit status: {line}");
        let mut f = line.split_whitespace();
        let (want, got) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        ensure!(
            want.strip_prefix("want=") == got.strip_prefix("got="),
            "a tool's exit status: {line}; full log: {}",
            log.display()
        );
    }
    ensure!(
        exits.len() == expected,
        "{} tool exit statuses checked in the VM, expected {expected} (the script's \
         expect_exit and doctor calls); full log: {}",
        exits.len(),
        log.display()
    );
    Ok(())
}

/// The guest's step markers, as durations.
pub fn print_guest_steps(console: &str) {
    let marks: Vec<(&str, f64)> = console
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("MTGDRCOPY-STEP ")? + "MTGDRCOPY-STEP ".len()..];
            let mut f = rest.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect();
    for pair in marks.windows(2) {
        eprintln!("      guest {}: {:.1} s", pair[0].0, pair[1].1 - pair[0].1);
    }
}

fn judge(outcome: &vm::VmOutcome, log: &Path) -> Result<()> {
    let console = &outcome.console;
    // The in-VM test summary, repeated for whoever reads this run's output.
    for line in console.lines().filter(|l| {
        [
            "test result:",
            "MTGDRCOPY-REFUSED-MMAP-LINES",
            "MTGDRCOPY-DISABLED-LINES",
            "FAILED",
            "panicked",
            "mtgdrdrv_fuzz",
            "FINDING",
            "phase exact",
            "phase concurrent",
            "phase api",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) {
        eprintln!("      guest: {}", line.trim());
    }
    outcome.ensure_passed("the in-VM tests", log)?;
    check_sanity_summaries(console, log)?;
    let counters: Vec<&str> = console
        .lines()
        .filter_map(|l| Some(l[l.find("MTGDRCOPY-COUNTER ")? + 18..].trim()))
        .collect();
    ensure!(
        !counters.is_empty(),
        "no counters were printed; full log: {}",
        log.display()
    );
    for line in &counters {
        let mut f = line.split_whitespace();
        let (name, value) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        let name = name.trim_end_matches(':');
        let live = mtgdrdrv::procfs::LIVE_COUNTERS.contains(&name)
            || matches!(
                name,
                "emu_pins_outstanding"
                    | "emu_dmabufs_live"
                    | "emu_dmabuf_mappings"
                    | "emu_allocations"
            );
        ensure!(
            !live || value == "0",
            "leak after the tests: {line}; full log: {}",
            log.display()
        );
    }
    Ok(())
}

/// The sanity runs of [`SCRIPT`]: one per emulated page size on the module backend, then the
/// dma-buf backend forced with the module loaded, and chosen because it is not.
const SANITY_RUNS: [&str; 5] = [
    "4096",
    "65536",
    "2097152",
    "dmabuf-forced",
    "dmabuf-nomodule",
];

/// The sanity suite ran once per entry of [`SANITY_RUNS`] and each run's closing line says it
/// all passed (`N passed, 0 failed`, optionally `, N skipped`).
fn check_sanity_summaries(console: &str, log: &Path) -> Result<()> {
    let mut page = None;
    let mut seen = Vec::new();
    for line in console.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(p) = line.strip_prefix("MTGDRCOPY-SANITY-PAGE ") {
            page = Some(p.trim().to_string());
        } else if let Some((passed, rest)) = line.split_once(" passed, ") {
            let Some(page) = page.take() else { continue };
            let failed = rest.split(" failed").next().unwrap_or("");
            eprintln!("      guest sanity, {page}: {line}");
            ensure!(
                failed == "0" && passed.parse::<u32>().is_ok_and(|n| n > 0),
                "mtgdrcopy_sanity ({page}): {line}; full log: {}",
                log.display()
            );
            seen.push(page);
        }
    }
    ensure!(
        seen == SANITY_RUNS,
        "mtgdrcopy_sanity summaries found for {seen:?}, expected {SANITY_RUNS:?}; full log: {}",
        log.display()
    );
    Ok(())
}

/// The outcome of the last 6.1 run of `cargo xtask test` in this process, for the kernel
/// matrix's table (which then does not boot 6.1 a second time).
static BOOKWORM_E2E: std::sync::Mutex<Option<Result<(), String>>> = std::sync::Mutex::new(None);

/// What [`test_steps`]' 6.1 run gave, if it ran.
pub fn bookworm_e2e_outcome() -> Option<Result<(), String>> {
    BOOKWORM_E2E.lock().ok().and_then(|o| o.clone())
}

/// The VM steps of `cargo xtask test`.
pub fn test_steps() -> Vec<Step<'static>> {
    vec![(
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
    )]
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
