//! Runs one case in its own forked process group, like upstream's harness: the child calls
//! `setpgid(0, 0)`, runs the case and exits 0 (passed), 2 (skipped) or 1 (failed), sending the
//! reason or the error through a pipe; the parent waits up to the timeout, then kills the
//! whole group (`killpg(SIGKILL)`), which also ends any process the case forked.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, setpgid, ForkResult, Pid};

use super::{Case, Ctx, Skip};

/// Exit status of a skipped case (upstream's `EXIT_WAIVED`).
pub const EXIT_SKIPPED: i32 = 2;
const EXIT_FAILED: i32 = 1;

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

/// Runs `case` in a forked child and waits for it at most `timeout`.
pub fn run_case(case: &Case, ctx: &Ctx, timeout: Duration) -> Result<Outcome> {
    run_isolated(|| (case.run)(ctx), timeout)
}

/// Runs `body` as a case would be run: in its own process group, with a timeout.
pub fn run_isolated(body: impl FnOnce() -> Result<()>, timeout: Duration) -> Result<Outcome> {
    let (read_end, write_end) = nix::unistd::pipe().context("pipe")?;
    let mut report = File::from(read_end);
    let message = File::from(write_end);
    // Whatever is buffered would otherwise be printed twice.
    let _ = std::io::stdout().flush();
    // SAFETY: the harness is single-threaded when it forks; the child only runs the case and
    // leaves with `_exit`.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(report);
            let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
            let code = child(body, message);
            // SAFETY: ends the child without running the parent's atexit handlers or
            // destructors of objects it shares with the parent.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(message);
            // Also from the parent, so that the group exists before any kill (no race).
            let _ = setpgid(child, child);
            let status = wait_with_timeout(child, timeout)?;
            // Processes the case forked and left behind go with it.
            kill_group(child);
            let text = read_report(&mut report);
            Ok(judge(status, text, timeout))
        }
    }
}

/// The case body in the child; returns the exit status and reports the reason or error.
fn child(body: impl FnOnce() -> Result<()>, mut message: File) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(body));
    let (code, text) = match result {
        Ok(Ok(())) => (0, String::new()),
        Ok(Err(e)) => match e.downcast_ref::<Skip>() {
            Some(skip) => (EXIT_SKIPPED, skip.0.clone()),
            None => (EXIT_FAILED, format!("{e:#}")),
        },
        Err(panic) => (
            EXIT_FAILED,
            format!("panicked: {}", panic_text(panic.as_ref())),
        ),
    };
    let _ = message.write_all(text.as_bytes());
    code
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

enum Ended {
    Status(WaitStatus),
    TimedOut,
}

fn wait_with_timeout(child: Pid, timeout: Duration) -> Result<Ended> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(status) => return Ok(Ended::Status(status)),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e).context("waitpid"),
        }
        if start.elapsed() >= timeout {
            kill_group(child);
            loop {
                match waitpid(child, None) {
                    Err(Errno::EINTR) => continue,
                    _ => return Ok(Ended::TimedOut),
                }
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// SIGKILL to the process group `pgid` (the case and whatever it forked).
fn kill_group(pgid: Pid) {
    // SAFETY: killpg only sends a signal.
    unsafe { libc::killpg(pgid.as_raw(), libc::SIGKILL) };
}

/// What the child wrote before it exited. Grandchildren may still hold the pipe open, so this
/// reads without blocking.
fn read_report(report: &mut File) -> String {
    // SAFETY: F_SETFL on a descriptor we own; no memory is involved.
    unsafe {
        let fd = report.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = report.read(&mut chunk) {
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&bytes).trim().to_string()
}

fn judge(ended: Ended, text: String, timeout: Duration) -> Outcome {
    let or = |text: String, default: &str| {
        if text.is_empty() {
            default.to_string()
        } else {
            text
        }
    };
    match ended {
        Ended::TimedOut => Outcome::Failed(format!(
            "timed out after {} s (raise it with --timeout)",
            timeout.as_secs()
        )),
        Ended::Status(WaitStatus::Exited(_, 0)) => Outcome::Passed,
        Ended::Status(WaitStatus::Exited(_, EXIT_SKIPPED)) => {
            Outcome::Skipped(or(text, "no reason given"))
        }
        Ended::Status(WaitStatus::Exited(_, code)) => {
            Outcome::Failed(or(text, &format!("exited with status {code}")))
        }
        Ended::Status(WaitStatus::Signaled(_, signal, _)) => {
            let killed = format!("killed by {signal:?}");
            Outcome::Failed(if text.is_empty() {
                killed
            } else {
                format!("{text} ({killed})")
            })
        }
        Ended::Status(other) => Outcome::Failed(format!("ended unexpectedly: {other:?}")),
    }
}
