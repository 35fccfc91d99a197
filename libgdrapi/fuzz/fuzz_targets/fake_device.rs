//! The fake /dev/mtgdrdrv of the capi_fake_device fuzz target: open/open64/ioctl/mmap/munmap/close
//! interposed, answering for "/dev/mtgdrdrv" as the module would (ioctl ABI, per-file handles, one
//! mapping per pin, the same refusals) on ordinary shared memory; every other file goes to the
//! kernel.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use std::sync::Mutex;

use mtgdrdrv::*;

/// "GPU memory" the fake pins: [BASE, BASE + SIZE).
pub(crate) const BASE: u64 = 0x1000_0000_0000;
pub(crate) const SIZE: u64 = 64 << 20;
pub(crate) const PAGE: u64 = 4096;

struct Pin {
    va: u64,
    size: u64,
    offset: u64,
    req: u32,
    map_type: u32,
    mapped: bool,
    unpinned: bool,
}

#[derive(Default)]
pub(crate) struct File {
    pins: HashMap<u64, Pin>,
    next: u64,
}

#[derive(Default)]
pub(crate) struct Fake {
    pub(crate) files: HashMap<c_int, File>,
    /// address -> (fd, handle, length)
    pub(crate) maps: HashMap<usize, (c_int, u64, usize)>,
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

pub(crate) fn with_fake<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
    let mut g = FAKE.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Fake::default))
}

fn set_errno(e: c_int) {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

unsafe fn real_open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path, flags, mode) as c_int }
}

/// Interposes open64(2).
///
/// # Safety
/// As open(2): `path` is a C string.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: `path` is a C string (caller's contract of open).
    if !path.is_null() && unsafe { CStr::from_ptr(path) }.to_bytes() == b"/dev/mtgdrdrv" {
        // SAFETY: a plain open of /dev/null stands for the device's file.
        let fd = unsafe { real_open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd >= 0 {
            with_fake(|f| f.files.insert(fd, File::default()));
        }
        return fd;
    }
    // SAFETY: forwarded.
    unsafe { real_open(path, flags, mode) }
}

/// Interposes open(2).
///
/// # Safety
/// As open(2).
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: same contract.
    unsafe { open64(path, flags, mode) }
}

/// Interposes close(2).
///
/// # Safety
/// As close(2).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    with_fake(|f| {
        // The module keeps a file while mappings of it live; the library unmaps first.
        f.files.remove(&fd);
    });
    // SAFETY: forwarded.
    unsafe { libc::syscall(libc::SYS_close, fd) as c_int }
}

fn pin_range(addr: u64, size: u64) -> Option<(u64, u64)> {
    if addr == 0 || size == 0 || size > 1 << 40 {
        return None;
    }
    let end = addr.checked_add(size)?;
    if addr < BASE || end > BASE + SIZE {
        return None;
    }
    let start = addr & !0xffff;
    let end = end.div_ceil(0x10000) * 0x10000;
    Some((start, end - start))
}

unsafe fn fake_ioctl(file: &mut File, cmd: u32, arg: *mut c_void) -> c_int {
    macro_rules! rd {
        ($t:ty) => {
            // SAFETY: the library passes its live params struct of this type.
            unsafe { std::ptr::read_unaligned(arg as *const $t) }
        };
    }
    macro_rules! wr {
        ($v:expr) => {{
            // SAFETY: as above.
            unsafe { std::ptr::write_unaligned(arg as *mut _, $v) };
            0
        }};
    }
    let live = |file: &File, h: u64| file.pins.get(&h).is_some_and(|p| !p.unpinned);
    match cmd {
        GDRDRV_IOC_GET_VERSION => wr!(GDRDRV_IOC_GET_VERSION_PARAMS {
            gdrdrv_version: MTGDRDRV_VERSION,
            minimum_gdr_api_version: MINIMUM_GDR_API_VERSION,
        }),
        GDRDRV_IOC_PIN_BUFFER | GDRDRV_IOC_PIN_BUFFER_V2 => {
            let (addr, size, bad) = if cmd == GDRDRV_IOC_PIN_BUFFER {
                let p = rd!(GDRDRV_IOC_PIN_BUFFER_PARAMS);
                (p.addr, p.size, p.p2p_token != 0 || p.va_space != 0)
            } else {
                let p = rd!(GDRDRV_IOC_PIN_BUFFER_V2_PARAMS);
                (p.addr, p.size, p.flags != 0)
            };
            let Some((va, size)) = pin_range(addr, size).filter(|_| !bad) else {
                return fail(libc::EINVAL);
            };
            let h = file.next;
            file.next += (size / PAGE).max(1);
            file.pins.insert(
                h,
                Pin {
                    va,
                    size,
                    offset: addr - va,
                    req: 0,
                    map_type: 0,
                    mapped: false,
                    unpinned: false,
                },
            );
            if cmd == GDRDRV_IOC_PIN_BUFFER {
                let mut p = rd!(GDRDRV_IOC_PIN_BUFFER_PARAMS);
                p.handle = h;
                wr!(p)
            } else {
                let mut p = rd!(GDRDRV_IOC_PIN_BUFFER_V2_PARAMS);
                p.handle = h;
                wr!(p)
            }
        }
        GDRDRV_IOC_UNPIN_BUFFER => {
            let h = rd!(GDRDRV_IOC_UNPIN_BUFFER_PARAMS).handle;
            if !live(file, h) {
                return fail(libc::EINVAL);
            }
            let mapped = file.pins.get(&h).is_some_and(|p| p.mapped);
            if mapped {
                // Zapped; the pin goes with its mapping.
                if let Some(p) = file.pins.get_mut(&h) {
                    p.unpinned = true;
                }
            } else {
                file.pins.remove(&h);
            }
            0
        }
        GDRDRV_IOC_GET_CB_FLAG => {
            let mut p = rd!(GDRDRV_IOC_GET_CB_FLAG_PARAMS);
            if !live(file, p.handle) {
                return fail(libc::EINVAL);
            }
            p.flag = 0;
            wr!(p)
        }
        GDRDRV_IOC_GET_INFO | GDRDRV_IOC_GET_INFO_V2 => {
            let h = rd!(GDRDRV_IOC_UNPIN_BUFFER_PARAMS).handle;
            let Some(pin) = file.pins.get(&h).filter(|p| !p.unpinned) else {
                return fail(libc::EINVAL);
            };
            let t = if pin.mapped { pin.map_type } else { 0 };
            if cmd == GDRDRV_IOC_GET_INFO {
                wr!(GDRDRV_IOC_GET_INFO_PARAMS {
                    handle: h,
                    va: pin.va,
                    mapped_size: pin.size,
                    page_size: 65536,
                    mapped: u32::from(t != 0),
                    wc_mapping: u32::from(t == 1),
                    ..Default::default()
                })
            } else {
                wr!(GDRDRV_IOC_GET_INFO_V2_PARAMS {
                    handle: h,
                    va: pin.va,
                    mapped_size: pin.size,
                    page_size: 65536,
                    mapping_type: t,
                    ..Default::default()
                })
            }
        }
        GDRDRV_IOC_GET_ATTR => {
            let mut p = rd!(GDRDRV_IOC_GET_ATTR_PARAMS);
            p.val = match p.attr {
                1 => 1,
                2 => 0,
                _ => return fail(libc::EINVAL),
            };
            wr!(p)
        }
        GDRDRV_IOC_REQ_MAPPING_TYPE => {
            let p = rd!(GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS);
            if p.mapping_type > 3 {
                return fail(libc::EINVAL);
            }
            let Some(pin) = file.pins.get_mut(&p.handle).filter(|p| !p.unpinned) else {
                return fail(libc::EINVAL);
            };
            if pin.mapped {
                return fail(libc::EBUSY);
            }
            if p.mapping_type == 2 {
                return fail(libc::EOPNOTSUPP);
            }
            pin.req = p.mapping_type;
            0
        }
        c if (c >> 8) & 0xff != GDRDRV_IOCTL => fail(libc::EINVAL),
        _ => fail(libc::ENOTTY),
    }
}

/// Interposes ioctl(2).
///
/// # Safety
/// As ioctl(2): `arg` is what the command expects.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let r = with_fake(|f| {
        f.files
            .get_mut(&fd)
            // SAFETY: the library's own argument.
            .map(|file| unsafe { fake_ioctl(file, request as u32, arg) })
    });
    // SAFETY: forwarded.
    r.unwrap_or_else(|| unsafe { libc::syscall(libc::SYS_ioctl, fd, request, arg) as c_int })
}

unsafe fn real_mmap(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { libc::syscall(libc::SYS_mmap, a, len, prot, flags, fd, off) as *mut c_void }
}

/// Interposes mmap(2).
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    a: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    let fake = with_fake(|f| f.files.contains_key(&fd));
    if !fake {
        // SAFETY: forwarded.
        return unsafe { real_mmap(a, len, prot, flags, fd, off) };
    }
    let h = off as u64 / PAGE;
    let ok = with_fake(|f| {
        let Some(pin) = f.files.get_mut(&fd).and_then(|file| file.pins.get_mut(&h)) else {
            return Err(libc::EINVAL);
        };
        if flags & 3 != libc::MAP_SHARED
            || !(off as u64).is_multiple_of(PAGE)
            || pin.unpinned
            || pin.offset != 0
        {
            return Err(libc::EINVAL);
        }
        if pin.mapped {
            return Err(libc::EBUSY);
        }
        if len == 0 || len as u64 > pin.size {
            return Err(libc::EINVAL);
        }
        Ok(if pin.req == 3 { 3 } else { 1 })
    });
    let t = match ok {
        Ok(t) => t,
        Err(e) => {
            set_errno(e);
            return libc::MAP_FAILED;
        }
    };
    // SAFETY: a fresh anonymous shared mapping stands for the BAR pages.
    let p = unsafe { real_mmap(a, len, prot, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
    if p as isize >= 0 {
        with_fake(|f| {
            if let Some(pin) = f.files.get_mut(&fd).and_then(|file| file.pins.get_mut(&h)) {
                pin.mapped = true;
                pin.map_type = t;
            }
            f.maps.insert(p as usize, (fd, h, len));
        });
        p
    } else {
        set_errno(-(p as isize) as c_int);
        libc::MAP_FAILED
    }
}

/// Interposes munmap(2).
///
/// # Safety
/// As munmap(2).
#[no_mangle]
pub unsafe extern "C" fn munmap(a: *mut c_void, len: usize) -> c_int {
    with_fake(|f| {
        if let Some((fd, h, mlen)) = f.maps.remove(&(a as usize)) {
            assert_eq!(
                mlen.div_ceil(PAGE as usize),
                len.div_ceil(PAGE as usize),
                "partial munmap"
            );
            if let Some(file) = f.files.get_mut(&fd) {
                let gone = file.pins.get_mut(&h).map(|p| {
                    p.mapped = false;
                    p.unpinned
                });
                if gone == Some(true) {
                    file.pins.remove(&h);
                }
            }
        }
    });
    // SAFETY: forwarded.
    unsafe { libc::syscall(libc::SYS_munmap, a, len) as c_int }
}
