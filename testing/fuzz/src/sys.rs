//! Thin, raw system-call edges of the fuzzer. Everything here passes arbitrary (hostile) values
//! to the kernel on purpose and returns the raw errno; the `unsafe` blocks only promise that the
//! calls cannot corrupt this process's own memory.

use std::ffi::CString;

pub type Errno = i32;

pub fn errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Symbolic name of an errno (for messages).
pub fn ename(e: Errno) -> &'static str {
    match e {
        0 => "OK",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EPROTO => "EPROTO",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENXIO => "ENXIO",
        _ => "E?",
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

pub fn open(path: &str, flags: i32) -> Result<i32, Errno> {
    let c = CString::new(path).map_err(|_| libc::EINVAL)?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned by the caller.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// Appends `line` and a newline to `fd` (no-op for a negative fd).
pub fn append(fd: i32, line: &str) {
    if fd < 0 {
        return;
    }
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    // SAFETY: writes from a live buffer of its length.
    unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
}

pub fn close(fd: i32) {
    // SAFETY: closes a descriptor this process owns (the fuzzer tracks which).
    unsafe { libc::close(fd) };
}

pub fn dup(fd: i32) -> Result<i32, Errno> {
    // SAFETY: duplicates a descriptor; no memory is touched.
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// `ioctl(fd, cmd, arg)` with an arbitrary argument address.
pub fn ioctl(fd: i32, cmd: u32, arg: usize) -> Result<(), Errno> {
    // SAFETY: the kernel validates `arg` (copy_{from,to}_user); whatever it writes lands in
    // memory the caller pointed at on purpose (scratch pages or its own device mappings).
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn mmap(
    addr: usize,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: u64,
) -> Result<usize, Errno> {
    // SAFETY: without MAP_FIXED the kernel picks a free range; with MAP_FIXED the caller only
    // targets ranges it mapped itself (reservations or device mappings it tracks), never
    // memory Rust owns.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            flags,
            fd,
            off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(p as usize)
    }
}

pub fn munmap(addr: usize, len: usize) -> Result<(), Errno> {
    // SAFETY: the caller only unmaps ranges it mapped itself (tracked device mappings,
    // reservations, scratch pages).
    let r = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn mprotect(addr: usize, len: usize, prot: i32) -> Result<(), Errno> {
    // SAFETY: as munmap: only the fuzzer's own mappings.
    let r = unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn madvise(addr: usize, len: usize, advice: i32) -> Result<(), Errno> {
    // SAFETY: as munmap: only the fuzzer's own device mappings, never Rust-owned memory.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

pub fn mremap(
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new: usize,
) -> Result<usize, Errno> {
    // SAFETY: moves or shrinks only the fuzzer's own device mappings, onto its own reservations.
    let p = unsafe {
        libc::mremap(
            old as *mut libc::c_void,
            old_len,
            new_len,
            flags,
            new as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(p as usize)
    }
}

/// A fresh anonymous mapping of `len` bytes with `prot`.
pub fn anon(len: usize, prot: i32) -> Result<usize, Errno> {
    mmap(
        0,
        len,
        prot,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    )
}

/// Volatile byte-wise copy into device memory, naturally aligned 8-byte stores in the middle,
/// then a full fence so the write-combining buffers drain before anyone looks.
///
/// # Safety
/// `dst .. dst + src.len()` is mapped writable in this process.
pub unsafe fn store(dst: usize, src: &[u8]) {
    let mut i = 0;
    while i < src.len() {
        let a = dst + i;
        if a.is_multiple_of(8) && src.len() - i >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[i..i + 8]);
            // SAFETY: aligned, inside the range the caller vouches for.
            unsafe { std::ptr::write_volatile(a as *mut u64, u64::from_ne_bytes(w)) };
            i += 8;
        } else {
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(a as *mut u8, src[i]) };
            i += 1;
        }
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Volatile copy out of device memory.
///
/// # Safety
/// `src .. src + dst.len()` is mapped readable in this process.
pub unsafe fn load(dst: &mut [u8], src: usize) {
    let mut i = 0;
    while i < dst.len() {
        let a = src + i;
        if a.is_multiple_of(8) && dst.len() - i >= 8 {
            // SAFETY: aligned, inside the range the caller vouches for.
            let w = unsafe { std::ptr::read_volatile(a as *const u64) };
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: as above.
            dst[i] = unsafe { std::ptr::read_volatile(a as *const u8) };
            i += 1;
        }
    }
}

/// Whether the kernel can read `len` bytes at `addr` of this process, found without touching
/// them from user space: `write(2)` them into a pipe (the kernel's copy_from_user returns
/// EFAULT on an unmapped, PROT_NONE or zapped page instead of signalling). The bytes read are
/// returned.
pub struct Prober {
    rd: i32,
    wr: i32,
}

impl Prober {
    pub fn new() -> Result<Prober, Errno> {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a writable array of two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(errno());
        }
        Ok(Prober {
            rd: fds[0],
            wr: fds[1],
        })
    }

    pub fn probe(&self, addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
        let len = len.min(4096);
        // SAFETY: the kernel reads `addr` with copy_from_user and fails cleanly on a bad range.
        let n = unsafe { libc::write(self.wr, addr as *const libc::c_void, len) };
        if n < 0 {
            return Err(errno());
        }
        let mut out = vec![0u8; n as usize];
        // SAFETY: `out` is writable for its length.
        let r = unsafe { libc::read(self.rd, out.as_mut_ptr().cast(), out.len()) };
        if r != n {
            return Err(libc::EIO);
        }
        Ok(out)
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        close(self.rd);
        close(self.wr);
    }
}

/// `/proc/driver/mtgdrdrv/counters`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleCounters {
    pub pins_outstanding: i64,
    pub bytes_pinned: i64,
    pub mappings: i64,
    pub get_pages_calls: i64,
    pub put_pages_calls: i64,
}

pub fn module_counters() -> anyhow::Result<ModuleCounters> {
    use mtgdrdrv::procfs::{counter, COUNTERS_PATH};
    let text = std::fs::read_to_string(COUNTERS_PATH)?;
    // A counter missing or unreadable is a finding, never a silent 0.
    let get = |name: &str| {
        counter(&text, name).ok_or_else(|| anyhow::anyhow!("{COUNTERS_PATH} has no {name} line"))
    };
    Ok(ModuleCounters {
        pins_outstanding: get("pins_outstanding")?,
        bytes_pinned: get("bytes_pinned")?,
        mappings: get("mappings")?,
        get_pages_calls: get("get_pages_calls")?,
        put_pages_calls: get("put_pages_calls")?,
    })
}

/// [`module_counters`] once at most `max_pins` pins are outstanding, or after 2 s. The module
/// puts a pin whose last mapping went (unpinned while mapped) from a work item, after munmap has
/// returned; a check that runs right after such a munmap waits for that put here.
pub fn module_counters_settled(max_pins: i64) -> anyhow::Result<ModuleCounters> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let c = module_counters()?;
        if c.pins_outstanding <= max_pins || std::time::Instant::now() >= deadline {
            return Ok(c);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The mtgdrdrv mappings of this process according to /proc/self/maps: (start, end, perms,
/// page offset).
pub fn device_vmas() -> Vec<(usize, usize, String, u64)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.ends_with("/dev/mtgdrdrv"))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?.to_string();
            let off = u64::from_str_radix(f.next()?, 16).ok()?;
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
                perms,
                off / page_size() as u64,
            ))
        })
        .collect()
}

/// Whether `file` becomes readable (data or end of file) within `timeout`.
pub fn poll_readable(file: &impl std::os::fd::AsRawFd, timeout: std::time::Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one pollfd, valid for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 || errno() != libc::EINTR {
            return n > 0;
        }
    }
}
