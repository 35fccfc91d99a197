//! Helper processes: forked children of a case, how they ended, pipes between them and the case
//! process, and the device descriptor a process holds.

use std::ffi::c_int;
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// Exit status of a helper process whose body returned an error (printed on its stderr).
pub const EXIT_HELPER_ERROR: i32 = 99;

/// How a helper process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(Signal),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exited(EXIT_HELPER_ERROR) => {
                write!(f, "failed (its error is printed above)")
            }
            End::Exited(code) => write!(f, "exited with status {code}"),
            End::Signaled(s) => write!(f, "was killed by {s:?}"),
        }
    }
}

impl End {
    /// Fails unless the helper exited 0.
    pub fn expect_success(self, who: &str) -> Result<()> {
        ensure!(self == End::Exited(0), "{who} {self}");
        Ok(())
    }

    pub fn is_fault(self) -> bool {
        matches!(self, End::Signaled(Signal::SIGSEGV | Signal::SIGBUS))
    }
}

/// A forked helper process (in the case's process group, so the harness's kill reaches it).
pub struct Helper {
    pid: Pid,
}

impl Helper {
    /// Forks; the child runs `body` and exits with the status it returns, or
    /// [`EXIT_HELPER_ERROR`] after printing its error. The case process must be single-
    /// threaded here.
    pub fn spawn(name: &str, body: impl FnOnce() -> Result<i32>) -> Result<Helper> {
        let _ = std::io::stdout().flush();
        // SAFETY: the case process is single-threaded when it forks; the child runs `body` and
        // leaves with `_exit`.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                let code = match catch_unwind(AssertUnwindSafe(body)) {
                    Ok(Ok(code)) => code,
                    Ok(Err(e)) => {
                        eprintln!("  {name}: {e:#}");
                        EXIT_HELPER_ERROR
                    }
                    Err(_) => EXIT_HELPER_ERROR,
                };
                // SAFETY: leaves the helper without the parent's destructors (a Gdr or DevBuf
                // it inherited belongs to the parent).
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => Ok(Helper { pid: child }),
        }
    }

    pub fn wait(self) -> Result<End> {
        loop {
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(End::Exited(code)),
                Ok(WaitStatus::Signaled(_, s, _)) => return Ok(End::Signaled(s)),
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => return Err(e).context("waitpid"),
            }
        }
    }
}

/// Runs `body` in a helper process and waits for it.
pub fn in_helper(name: &str, body: impl FnOnce() -> Result<i32>) -> Result<End> {
    Helper::spawn(name, body)?.wait()
}

/// Turns off core dumps of this process (a helper expected to die by SIGSEGV/SIGBUS).
pub fn no_core_dump() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct we pass.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

/// How long a process waits for a message from the other before giving up.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(20);

/// One direction of a pipe between the case process and a helper: 8-byte messages.
pub struct Channel {
    rx: File,
    tx: File,
}

impl Channel {
    pub fn new() -> Result<Channel> {
        let (r, w) = nix::unistd::pipe().context("pipe")?;
        Ok(Channel {
            rx: File::from(r),
            tx: File::from(w),
        })
    }

    pub fn send(&self, v: u64) -> Result<()> {
        (&self.tx)
            .write_all(&v.to_le_bytes())
            .context("writing to a pipe")
    }

    /// Waits up to 20 s for the next message.
    pub fn recv(&self) -> Result<u64> {
        wait_readable(self.rx.as_raw_fd(), MESSAGE_TIMEOUT)?;
        let mut b = [0u8; 8];
        (&self.rx)
            .read_exact(&mut b)
            .context("reading from a pipe (the other process ended?)")?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Waits until `fd` is readable (or closed), at most `timeout`.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as c_int) };
        match n {
            0 => bail!("no message from the other process within {timeout:?}"),
            n if n > 0 => return Ok(()),
            _ if Errno::last() == Errno::EINTR => continue,
            _ => return Err(Errno::last()).context("poll"),
        }
    }
}

/// The descriptor of `/dev/mtgdrdrv` this process has open (the one `gdr_open` made).
pub fn device_fd() -> Result<RawFd> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target == std::path::Path::new(gdrapi::DEVICE_PATH) {
            if let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
                found.push(fd);
            }
        }
    }
    match found.as_slice() {
        [fd] => Ok(*fd),
        [] => bail!("no open descriptor of {}", gdrapi::DEVICE_PATH),
        _ => bail!(
            "several open descriptors of {}: {found:?}",
            gdrapi::DEVICE_PATH
        ),
    }
}
