//! The gdrapi C API driven by libFuzzer against a fake /dev/mtgdrdrv.
//!
//! The library is the real, unmodified one (the design forbids a fake device inside it); the
//! fake lives here, in the fuzz binary: it interposes open/open64/ioctl/mmap/munmap/close and
//! answers for "/dev/mtgdrdrv" as the module would (ioctl ABI, per-file handles, one mapping
//! per pin, the same refusals), on ordinary shared memory; every other file goes to the kernel.
//! Oracles: no crash and no AddressSanitizer report; a copy succeeds only inside a mapping that
//! the harness saw gdr_map return and not unmap since; once every gdr_t is closed, the fake holds
//! no file, pin or mapping (nothing leaked on any path, failing calls included).
#![no_main]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use std::sync::Mutex;

use gdrapi::capi::*;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use mtgdrdrv::*;

// ---------------------------------------------------------------------------------------------
// The fake device

/// "GPU memory" the fake pins: [BASE, BASE + SIZE).
const BASE: u64 = 0x1000_0000_0000;
const SIZE: u64 = 64 << 20;
const PAGE: u64 = 4096;

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
struct File {
    pins: HashMap<u64, Pin>,
    next: u64,
}

#[derive(Default)]
struct Fake {
    files: HashMap<c_int, File>,
    /// address -> (fd, handle, length)
    maps: HashMap<usize, (c_int, u64, usize)>,
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

fn with_fake<R>(f: impl FnOnce(&mut Fake) -> R) -> R {
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

// ---------------------------------------------------------------------------------------------
// The harness

#[derive(Arbitrary, Debug)]
enum Op {
    Open,
    Close(u8),
    /// At 64 KiB unit `unit` (+ `misalign` bytes when odd), `n` units long (or raw values).
    Pin {
        g: u8,
        unit: u16,
        n: u8,
        misalign: u16,
        flags: u8,
        v1: bool,
        null_out: bool,
        wild: Option<(u64, u64)>,
    },
    Unpin {
        g: u8,
        h: u8,
    },
    /// `pages` 4 KiB pages, or `raw` bytes when `pages` is 0.
    Map {
        g: u8,
        h: u8,
        pages: u8,
        raw: u32,
        flags: i8,
        null_out: bool,
    },
    Unmap {
        g: u8,
        h: u8,
        delta: i16,
        wrong_va: bool,
    },
    Info {
        g: u8,
        h: u8,
        which: u8,
        null_out: bool,
    },
    Copy {
        h: u8,
        to: bool,
        off: u16,
        before: bool,
        len: u16,
    },
    Misc {
        g: u8,
        v: i32,
    },
}

struct Harness {
    gs: Vec<gdr_t>,
    /// Every handle returned so far (live or not).
    handles: Vec<gdr_mh_t>,
    /// Live mappings the library returned: handle -> (address, length, owner).
    maps: HashMap<c_ulong, (usize, usize, gdr_t)>,
}

impl Harness {
    fn g(&self, i: u8) -> gdr_t {
        if i == 255 || self.gs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.gs[i as usize % self.gs.len()]
        }
    }
    fn h(&self, i: u8) -> gdr_mh_t {
        if self.handles.is_empty() || i >= 250 {
            gdr_mh_t {
                h: c_ulong::from(i) << 33 | 7,
            }
        } else {
            self.handles[i as usize % self.handles.len()]
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut hs = Harness {
        gs: Vec::new(),
        handles: Vec::new(),
        maps: HashMap::new(),
    };
    for op in ops.into_iter().take(64) {
        // SAFETY: every pointer passed is NULL or valid; gdr_t's are live or NULL.
        unsafe { step(&mut hs, op) };
    }
    for g in std::mem::take(&mut hs.gs) {
        // SAFETY: live gdr_t's, closed once.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    }
    with_fake(|f| {
        assert!(f.files.is_empty(), "a device file was left open");
        assert!(f.maps.is_empty(), "a mapping was left behind");
    });
});

unsafe fn step(hs: &mut Harness, op: Op) {
    // SAFETY (whole body): as in the fuzz target.
    unsafe {
        match op {
            Op::Open => {
                if hs.gs.len() < 3 {
                    let g = gdr_open();
                    assert!(!g.is_null(), "gdr_open against the fake device");
                    hs.gs.push(g);
                }
            }
            Op::Close(i) => {
                if !hs.gs.is_empty() {
                    let g = hs.gs.remove(i as usize % hs.gs.len());
                    assert_eq!(gdr_close(g), 0);
                    // Its handles are gone, and their mappings with them.
                    hs.maps.retain(|_, m| m.2 != g);
                }
            }
            Op::Pin {
                g,
                unit,
                n,
                misalign,
                flags,
                v1,
                null_out,
                wild,
            } => {
                let addr = BASE
                    + u64::from(unit) % (SIZE >> 16) * 0x10000
                    + if misalign & 1 == 1 {
                        u64::from(misalign)
                    } else {
                        0
                    };
                let (addr, size) = wild.unwrap_or((addr, (u64::from(n) % 32 + 1) * 0x10000));
                let mut mh = gdr_mh_t::default();
                let out = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut mh as *mut _
                };
                let rc = if v1 {
                    gdr_pin_buffer(hs.g(g), addr as _, size as usize, u64::from(flags), 0, out)
                } else {
                    gdr_pin_buffer_v2(hs.g(g), addr as _, size as usize, u32::from(flags), out)
                };
                if rc == 0 {
                    assert!(mh.h != 0 && !null_out);
                    hs.handles.push(mh);
                }
            }
            Op::Unpin { g, h } => {
                let mh = hs.h(h);
                if gdr_unpin_buffer(hs.g(g), mh) == 0 {
                    hs.maps.remove(&mh.h);
                }
            }
            Op::Map {
                g,
                h,
                pages,
                raw,
                flags,
                null_out,
            } => {
                let mh = hs.h(h);
                let mut va: *mut c_void = std::ptr::null_mut();
                let out = if null_out {
                    std::ptr::null_mut()
                } else {
                    &mut va as *mut _
                };
                let size = if pages == 0 {
                    raw as usize
                } else {
                    usize::from(pages) * 4096
                };
                let gp = hs.g(g);
                let rc = gdr_map_v2(gp, mh, out, size, c_int::from(flags));
                if rc == 0 {
                    assert!(!va.is_null());
                    assert!(
                        hs.maps.insert(mh.h, (va as usize, size, gp)).is_none(),
                        "mapped twice"
                    );
                }
            }
            Op::Unmap {
                g,
                h,
                delta,
                wrong_va,
            } => {
                let mh = hs.h(h);
                let (va, len, _) = hs.maps.get(&mh.h).copied().unwrap_or((
                    0x5000_0000,
                    4096,
                    std::ptr::null_mut(),
                ));
                let va = if wrong_va { va + 4096 } else { va };
                let size = len.saturating_add_signed(isize::from(delta));
                if gdr_unmap(hs.g(g), mh, va as *mut c_void, size) == 0 {
                    assert!(
                        hs.maps.remove(&mh.h).is_some(),
                        "gdr_unmap of something not mapped"
                    );
                }
            }
            Op::Info {
                g,
                h,
                which,
                null_out,
            } => {
                let mh = hs.h(h);
                match which % 3 {
                    0 => {
                        let mut i = gdr_info_v2::default();
                        let out = if null_out {
                            std::ptr::null_mut()
                        } else {
                            &mut i as *mut _
                        };
                        gdr_get_info_v2(hs.g(g), mh, out);
                    }
                    1 => {
                        let mut i = gdr_info_v1::default();
                        let out = if null_out {
                            std::ptr::null_mut()
                        } else {
                            &mut i as *mut _
                        };
                        gdr_get_info_v1(hs.g(g), mh, out);
                    }
                    _ => {
                        let mut f = 0;
                        let out = if null_out {
                            std::ptr::null_mut()
                        } else {
                            &mut f as *mut _
                        };
                        gdr_get_callback_flag(hs.g(g), mh, out);
                    }
                }
            }
            Op::Copy {
                h,
                to,
                off,
                before,
                len,
            } => {
                let off = if before {
                    -i32::from(off)
                } else {
                    i32::from(off)
                };
                let mh = hs.h(h);
                let (base, mlen, _) = hs.maps.get(&mh.h).copied().unwrap_or((
                    0x6000_0000,
                    65536,
                    std::ptr::null_mut(),
                ));
                let dev = base.wrapping_add_signed(off as isize);
                let mut host = vec![0x5au8; len as usize];
                let rc = if to {
                    gdr_copy_to_mapping(mh, dev as *mut c_void, host.as_ptr().cast(), host.len())
                } else {
                    gdr_copy_from_mapping(
                        mh,
                        host.as_mut_ptr().cast(),
                        dev as *const c_void,
                        host.len(),
                    )
                };
                if rc == 0 && len > 0 {
                    let inside = hs.maps.contains_key(&mh.h)
                        && off >= 0
                        && (off as usize)
                            .checked_add(len as usize)
                            .is_some_and(|e| e <= mlen.div_ceil(PAGE as usize) * PAGE as usize);
                    assert!(inside, "a copy outside any live mapping succeeded");
                }
            }
            Op::Misc { g, v } => {
                let mut out = 0;
                gdr_get_attribute(hs.g(g), v, &mut out);
                let mut s: *const c_char = std::ptr::null();
                gdr_get_mapping_type_string(v, &mut s);
                let (mut a, mut b) = (0, 0);
                gdr_driver_get_version(hs.g(g), &mut a, &mut b);
            }
        }
    }
}
