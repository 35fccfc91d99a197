//! Operations on the device's files: open (read-write, read-only, write-only), close, dup, and
//! the file system calls the module does not implement.

use super::{Expect, File, Finding, Step, Worker};
use crate::sys::{self, ename};

const DEV: &str = "/dev/mtgdrdrv";
const MAX_FILES: usize = 4;

impl Worker {
    pub(super) fn op_open_dev(&mut self) -> Step {
        if self.usable_files().len() >= MAX_FILES {
            return Ok(());
        }
        let (mode, readable, writable) = match self.rng.weighted(&[85, 10, 5]) {
            0 => (libc::O_RDWR, true, true),
            1 => (libc::O_RDONLY, true, false),
            _ => (libc::O_WRONLY, false, true),
        };
        self.note(format!("open {DEV} mode {mode}"));
        match sys::open(DEV, mode | libc::O_CLOEXEC) {
            Ok(fd) => {
                self.files.push(File {
                    fds: vec![fd],
                    readable,
                    writable,
                    dead: false,
                    next_handle: 0,
                    next_exact: true,
                });
                Ok(())
            }
            Err(e) => finding!("open {DEV}: {}", ename(e)),
        }
    }

    pub(super) fn op_close_fd(&mut self) -> Step {
        let Some((f, fd)) = self.pick_fd() else {
            return Ok(());
        };
        self.note(format!(
            "close fd {fd} (file {f}, {} vmas)",
            self.vmas.len()
        ));
        sys::close(fd);
        self.files[f].fds.retain(|&x| x != fd);
        self.settle();
        Ok(())
    }

    pub(super) fn op_dup(&mut self) -> Step {
        let Some((f, fd)) = self.pick_fd() else {
            return Ok(());
        };
        if self.files[f].fds.len() >= 3 {
            return Ok(());
        }
        self.note(format!("dup fd {fd}"));
        match sys::dup(fd) {
            Ok(n) => {
                self.files[f].fds.push(n);
                Ok(())
            }
            Err(e) => finding!("dup: {}", ename(e)),
        }
    }

    /// File system calls the module does not implement, through the VFS paths that see its
    /// private address space (read, write, seek, fsync, fadvise, fallocate, readahead, poll):
    /// any clean error, never a kernel problem.
    pub(super) fn op_fd_misc(&mut self) -> Step {
        let Some((_, fd)) = self.pick_fd() else {
            return Ok(());
        };
        let buf = self.scratch.good();
        let which = self.rng.below(10);
        let len = self.rng.below(2 * self.page as u64) as usize;
        let off = self.rng.edge_u64() as i64 & i64::MAX;
        self.note(format!("fd misc {which} fd {fd} len {len:#x} off {off:#x}"));
        // SAFETY: each call reads or writes at most `len` bytes of the scratch pages (2 pages
        // writable from `buf`), or none; the rest only take numbers.
        let r = unsafe {
            match which {
                0 => libc::read(fd, buf as *mut libc::c_void, len.min(self.page)) as i64,
                1 => libc::write(fd, buf as *const libc::c_void, len.min(self.page)) as i64,
                2 => libc::lseek(fd, off, (self.rng.below(5)) as i32),
                3 => i64::from(libc::fsync(fd)),
                4 => i64::from(libc::fdatasync(fd)),
                5 => {
                    let e = libc::posix_fadvise(fd, off, len as i64, self.rng.below(6) as i32);
                    if e != 0 {
                        *libc::__errno_location() = e;
                        -1
                    } else {
                        0
                    }
                }
                6 => i64::from(libc::fallocate(
                    fd,
                    self.rng.below(4) as i32,
                    off,
                    len as i64 + 1,
                )),
                7 => libc::syscall(libc::SYS_readahead, fd, off, len),
                8 => {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN | libc::POLLOUT,
                        revents: 0,
                    };
                    i64::from(libc::poll(&mut p, 1, 0))
                }
                _ => i64::from(libc::ftruncate(fd, off)),
            }
        };
        let r = if r < 0 { Err(sys::errno()) } else { Ok(()) };
        let exp = Expect::ok()
            .also(libc::EINVAL)
            .also(libc::ESPIPE)
            .also(libc::EBADF)
            .also(libc::ENODEV)
            .also(libc::EOPNOTSUPP)
            .also(libc::EROFS)
            .also(libc::EPERM)
            .also(libc::EACCES)
            .also(libc::EFBIG);
        self.check("fd syscall", &exp, r)
    }
}
