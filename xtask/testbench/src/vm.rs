//! Boot a Debian kernel in QEMU (TCG) with our files in an initramfs: the harness of the VM tests
//! and of `cargo xtask vm` (vmtest/shell.rs).
//!
//! The host cannot load kernel modules; a guest can. [`run`] is the harness `cargo xtask test`
//! uses: it packs the files and a script into an initramfs whose /init mounts the usual file
//! systems, runs the script as root, prints its exit status and powers off. The serial console
//! is the only channel back: it carries the status and the kernel's own problem reports.
//! An `ivshmem-plain` PCI device (1af4:1110) gives the guest a real PCI BAR to stand in for GPU
//! memory.

mod console;
mod initramfs;
mod pvh;

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use xtask_base::{host, paths};

use crate::kernel::Kernel;

/// Host packages the harness needs: QEMU and the static busybox that becomes the guest userland.
/// (No `cpio`: initramfs.rs writes the archive itself.)
pub const HOST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static"];

/// One guest boot.
#[derive(Clone, Debug)]
pub struct VmSpec {
    pub kernel: Kernel,
    /// Host file → absolute guest path; permission bits are kept. The shared libraries that ELF
    /// executables and libraries among them need are added automatically.
    pub files: Vec<(PathBuf, String)>,
    /// A `sh` script /init runs as root (cwd /root); its exit status is the VM's.
    pub script: String,
    pub memory_mb: u32,
    pub cpus: u32,
    /// Size of the ivshmem BAR (the stand-in for GPU memory); 0 leaves the device out.
    pub ivshmem_mb: u32,
    /// Whole run, boot to power-off. Ignored when interactive.
    pub timeout: Duration,
    /// Appended to the kernel command line.
    pub extra_cmdline: String,
    /// Attach QEMU to the terminal and give a shell after the script.
    pub interactive: bool,
    /// Run every vCPU on one TCG thread (`-accel tcg,thread=single`) instead of one thread
    /// each; see [`VmSpec::new`].
    pub single_tcg_thread: bool,
}

impl VmSpec {
    /// Sizes that fit the tests: 1 GiB and 2 CPUs (the machines have 2 cores), a 64 MiB BAR.
    pub fn new(kernel: Kernel) -> VmSpec {
        VmSpec {
            files: Vec::new(),
            script: String::new(),
            memory_mb: 1024,
            cpus: 2,
            ivshmem_mb: 64,
            timeout: Duration::from_secs(300),
            extra_cmdline: String::new(),
            interactive: false,
            single_tcg_thread: needs_single_tcg_thread(&kernel.release),
            kernel,
        }
    }
}

/// Debian's 7.2 kernel under QEMU's multi-threaded TCG dies of `Oops: int3`: a vCPU executes
/// a breakpoint that the kernel's text patching has already taken out again (seen at 1.4 s
/// into boot, and at 102 s in `process_one_work` with nothing of ours on the stack; 6.1 never
/// did it). One TCG thread for all vCPUs keeps code changes coherent between them; the guest
/// still has its 2 CPUs, interleaved.
fn needs_single_tcg_thread(release: &str) -> bool {
    release
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

#[derive(Clone, Debug)]
pub struct VmOutcome {
    /// The script's exit status; `None` if the guest died before /init printed it (panic,
    /// killed init). Always `None` in interactive mode.
    pub exit_code: Option<i32>,
    /// The serial console, `\r\n` as the guest wrote it. Empty in interactive mode.
    pub console: String,
    /// Kernel problem reports (WARNING, BUG, Oops, KFENCE, list corruption, panic, …), one line
    /// each, timestamp included.
    pub kernel_problems: Vec<String>,
    /// Wall time from QEMU's start to its exit.
    pub duration: Duration,
}

impl VmOutcome {
    /// Fails, listing them and naming `log`, when the kernel reported problems.
    pub fn ensure_no_kernel_problems(&self, log: &Path) -> Result<()> {
        ensure!(
            self.kernel_problems.is_empty(),
            "kernel reported problems:\n{}\nfull log: {}",
            self.kernel_problems.join("\n"),
            log.display()
        );
        Ok(())
    }

    /// Fails when the kernel reported problems or the guest did not exit 0, saying that `what`
    /// failed, with the console's last lines and `log`.
    pub fn ensure_passed(&self, what: &str, log: &Path) -> Result<()> {
        self.ensure_no_kernel_problems(log)?;
        ensure!(
            self.exit_code == Some(0),
            "{what} failed (exit {:?}); last lines:\n{}\nfull log: {}",
            self.exit_code,
            tail(&self.console, 60),
            log.display()
        );
        Ok(())
    }
}

/// Boots `spec` and waits for the guest to power off. The console goes to `log_path` (and to the
/// terminal when MTGDRCOPY_VM_VERBOSE=1). A timeout kills QEMU and is an error carrying the
/// end of the console; a missing exit status is not an error, the caller judges the outcome.
/// Interactive runs use the terminal as the console and log nothing.
pub fn run(spec: &VmSpec, log_path: &Path) -> Result<VmOutcome> {
    host::ensure_host_packages(HOST_PACKAGES)?;
    let work = WorkDir::new()?;
    let initrd = work.path.join("initrd.cpio");
    build_initramfs(spec, &initrd)?;
    let mut qemu = qemu_command(spec, &initrd);
    if spec.interactive {
        let start = Instant::now();
        let status = qemu
            .status()
            .context("starting qemu-system-x86_64 (package qemu-system-x86)")?;
        ensure!(status.success(), "QEMU failed: {status}");
        return Ok(VmOutcome {
            exit_code: None,
            console: String::new(),
            kernel_problems: Vec::new(),
            duration: start.elapsed(),
        });
    }
    let verbose = std::env::var_os("MTGDRCOPY_VM_VERBOSE").is_some_and(|v| v == "1");
    let mut captured = run_captured(qemu, spec.timeout, log_path, verbose)?;
    if qemu_crashed(captured.status) {
        // QEMU 7.2's TCG crashed once in CI so far (SIGSEGV in the 6.1 VM's tests, 250 s
        // in, nothing wrong on the guest's console). A crash of the emulator says nothing about
        // the guest, so it gets one more boot; a second crash fails. The first log is kept.
        let kept = log_path.with_extension("qemu-crash.log");
        fs::rename(log_path, &kept).with_context(|| format!("keeping {}", kept.display()))?;
        eprintln!(
            "    QEMU itself died ({}): booting once more; first console in {}",
            captured.status,
            kept.display()
        );
        captured = run_captured(qemu_command(spec, &initrd), spec.timeout, log_path, verbose)?;
    }
    let console = String::from_utf8_lossy(&captured.console).into_owned();
    if !captured.status.success() {
        bail!(
            "QEMU failed ({}): {}\nlast console lines (all in {}):\n{}",
            captured.status,
            String::from_utf8_lossy(&captured.stderr).trim(),
            log_path.display(),
            tail(&console, 30)
        );
    }
    Ok(VmOutcome {
        exit_code: console::exit_code(&console),
        kernel_problems: console::kernel_problems(&console),
        console,
        duration: captured.duration,
    })
}

/// QEMU killed by a fault signal of its own (not by our timeout's SIGKILL, not a guest exit).
fn qemu_crashed(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    const FAULTS: [i32; 5] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGABRT,
        libc::SIGFPE,
    ];
    status
        .signal()
        .is_some_and(|signal| FAULTS.contains(&signal))
}

/// The guest's /init. It lets even debug-level kernel messages through to the console, so that
/// a module's dynamic debug output lands in the log next to the test's.
fn init_script(interactive: bool) -> String {
    let marker = console::EXIT_MARKER;
    let (stdin, tail) = if interactive {
        // cttyhack gives the shell ttyS0 as controlling terminal, so Ctrl-C works.
        (
            "",
            "echo \"script exited with $rc; poweroff -f to leave (or Ctrl-A x)\"\n\
             setsid cttyhack sh\n",
        )
    } else {
        // QEMU's stdin is /dev/null but the guest console never reports end of file: a test
        // that reads stdin would hang until the timeout.
        (" </dev/null", "")
    };
    format!(
        "#!/bin/sh\n\
         # Written by cargo xtask vm.\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n\
         mkdir -p /dev/pts /dev/shm\n\
         mount -t devpts devpts /dev/pts\n\
         mount -t tmpfs tmpfs /dev/shm\n\
         mount -t tmpfs tmpfs /tmp\n\
         mount -t debugfs debugfs /sys/kernel/debug\n\
         echo 8 >/proc/sys/kernel/printk\n\
         cd /root\n\
         sh {SCRIPT}{stdin}\n\
         rc=$?\n\
         echo \"{marker}$rc\"\n\
         {tail}\
         poweroff -f\n"
    )
}

const SCRIPT: &str = "/etc/mtgdrcopy/script.sh";

fn build_initramfs(spec: &VmSpec, path: &Path) -> Result<()> {
    let mut tree = initramfs::Tree::base()?;
    for (host, guest) in &spec.files {
        tree.add_file(host, guest)
            .with_context(|| format!("adding {} to the guest", host.display()))?;
    }
    let hosts: Vec<&Path> = spec.files.iter().map(|(h, _)| h.as_path()).collect();
    tree.add_libraries(&hosts)?;
    tree.add_text("/init", init_script(spec.interactive), 0o755)?;
    tree.add_text(SCRIPT, spec.script.clone(), 0o755)?;
    tree.write(path)
}

/// An initramfs of busybox, `files` (host path, guest path) and `init` as /init, written to
/// `path`: for a VM that boots a system of its own (the autopkgtest testbed's disk) rather than
/// the test scripts' /init.
pub fn write_initramfs(files: &[(PathBuf, String)], init: &str, path: &Path) -> Result<()> {
    let mut tree = initramfs::Tree::base()?;
    for (host, guest) in files {
        tree.add_file(host, guest)
            .with_context(|| format!("adding {} to the initramfs", host.display()))?;
    }
    tree.add_text("/init", init.to_owned(), 0o755)?;
    tree.write(path)
}

/// What QEMU's `-kernel` boots for `kernel`: the PVH ELF where it can be had (faster).
pub fn boot_image(kernel: &Kernel) -> PathBuf {
    pvh::boot_image(&kernel.vmlinuz)
}

/// Why each QEMU option:
/// - `-cpu max`: the guest sees the host-like features (PAT, SSE/AVX for the copy variants);
///   under TCG it is QEMU's full emulated feature set.
/// - `-no-reboot` with `panic=-1`: a panic exits QEMU at once instead of waiting for a timeout.
/// - oopses stay non-fatal (Debian's default) so that the report reaches the console and the
///   script goes on to print its status.
/// - `kfence.sample_interval=10`: KFENCE samples allocations every 10 ms instead of 100.
/// - `-accel tcg,thread=single` for kernels from 7 on (`needs_single_tcg_thread`).
fn qemu_command(spec: &VmSpec, initrd: &Path) -> Command {
    // No `quiet`: the whole boot log costs no measurable time and shows the PAT setup and the
    // ivshmem BAR when something goes wrong.
    let mut append = String::from("console=ttyS0 printk.time=1 panic=-1 kfence.sample_interval=10");
    if !spec.extra_cmdline.trim().is_empty() {
        append.push(' ');
        append.push_str(spec.extra_cmdline.trim());
    }
    let mut qemu = Command::new("qemu-system-x86_64");
    if spec.single_tcg_thread {
        qemu.args(["-accel", "tcg,thread=single"]);
    }
    qemu.args(["-cpu", "max", "-nographic", "-no-reboot", "-net", "none"])
        .arg("-m")
        .arg(spec.memory_mb.to_string())
        .arg("-smp")
        .arg(spec.cpus.to_string())
        .arg("-kernel")
        .arg(pvh::boot_image(&spec.kernel.vmlinuz))
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(append);
    if spec.ivshmem_mb > 0 {
        qemu.arg("-object")
            .arg(format!(
                "memory-backend-ram,id=hostmem,size={}M",
                spec.ivshmem_mb
            ))
            .args(["-device", "ivshmem-plain,memdev=hostmem"]);
    }
    if !spec.interactive {
        qemu.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    qemu
}

struct Captured {
    status: ExitStatus,
    console: Vec<u8>,
    stderr: Vec<u8>,
    duration: Duration,
}

fn run_captured(
    mut qemu: Command,
    timeout: Duration,
    log_path: &Path,
    verbose: bool,
) -> Result<Captured> {
    if let Some(dir) = log_path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let start = Instant::now();
    let mut child = qemu
        .spawn()
        .context("starting qemu-system-x86_64 (package qemu-system-x86)")?;
    let stdout = child.stdout.take().context("QEMU's stdout was not piped")?;
    let stderr = child.stderr.take().context("QEMU's stderr was not piped")?;
    // Readers on threads: the console must be drained while we wait, or QEMU blocks on a full
    // pipe. The channel says when the console closed, i.e. QEMU is exiting.
    let (done_tx, done_rx) = mpsc::channel();
    let console_reader = thread::spawn(move || {
        let result = copy_console(stdout, log, verbose);
        let _ = done_tx.send(());
        result
    });
    let stderr_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let mut stderr = stderr;
        stderr.read_to_end(&mut buf).map(|_| buf)
    });

    let waited = done_rx.recv_timeout(timeout);
    let timed_out = matches!(waited, Err(mpsc::RecvTimeoutError::Timeout));
    let status = if timed_out {
        kill(&mut child)?
    } else {
        // The console closed, so QEMU is on its way out; give it a moment to be reaped.
        wait_until(&mut child, Instant::now() + Duration::from_secs(10))?
    };
    let duration = start.elapsed();
    let console = join(console_reader).context("reading QEMU's console")?;
    let stderr = join(stderr_reader).context("reading QEMU's stderr")?;
    if timed_out {
        let text = String::from_utf8_lossy(&console);
        let problems = console::kernel_problems(&text);
        bail!(
            "the VM did not power off within {timeout:?}; killed QEMU.\n\
             kernel problems: {}\nlast console lines (all in {}):\n{}",
            if problems.is_empty() {
                "none".into()
            } else {
                problems.join("\n  ")
            },
            log_path.display(),
            tail(&text, 40)
        );
    }
    Ok(Captured {
        status,
        console,
        stderr,
        duration,
    })
}

/// Copies the console to the log (and the terminal if `verbose`), returning all of it.
fn copy_console(mut from: impl Read, log: File, verbose: bool) -> io::Result<Vec<u8>> {
    let mut log = io::BufWriter::new(log);
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        log.write_all(&buf[..n])?;
        if verbose {
            let mut term = io::stdout().lock();
            term.write_all(&buf[..n])?;
            term.flush()?;
        }
        all.extend_from_slice(&buf[..n]);
    }
    log.flush()?;
    Ok(all)
}

fn join<T>(handle: thread::JoinHandle<io::Result<T>>) -> Result<T> {
    match handle.join() {
        Ok(result) => Ok(result?),
        Err(_) => bail!("reader thread panicked"),
    }
}

fn kill(child: &mut Child) -> Result<ExitStatus> {
    // The child may have exited right at the deadline; killing it then fails harmlessly.
    let _ = child.kill();
    child.wait().context("waiting for QEMU")
}

fn wait_until(child: &mut Child, deadline: Instant) -> Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().context("waiting for QEMU")? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return kill(child);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The last `n` lines of the console, without the serial port's carriage returns.
pub fn tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| l.trim_end_matches('\r'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A scratch directory under build/vm, unique per run so that parallel runs do not collide, and
/// removed when the run ends.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn new() -> Result<WorkDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = paths::build_dir()
            .join("vm")
            .join(format!("run-{}-{n}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Best effort: a leftover initramfs only wastes space under build/.
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_from_7_on_get_one_tcg_thread() {
        assert!(needs_single_tcg_thread("7.2.13+deb14-amd64"));
        assert!(needs_single_tcg_thread("10.0.0"));
        assert!(!needs_single_tcg_thread("6.1.0-57-amd64"));
        assert!(!needs_single_tcg_thread("6.12.118+deb13-amd64"));
        assert!(!needs_single_tcg_thread("5.10.0-46-amd64"));
    }

    #[test]
    fn only_a_fault_signal_of_qemu_counts_as_its_crash() {
        use std::os::unix::process::ExitStatusExt;
        // Raw wait statuses: a signal in the low 7 bits, an exit code in the next byte.
        assert!(qemu_crashed(ExitStatus::from_raw(libc::SIGSEGV)));
        assert!(qemu_crashed(ExitStatus::from_raw(libc::SIGABRT | 0x80)));
        assert!(!qemu_crashed(ExitStatus::from_raw(libc::SIGKILL)));
        assert!(!qemu_crashed(ExitStatus::from_raw(0)));
        assert!(!qemu_crashed(ExitStatus::from_raw(1 << 8)));
    }
}
