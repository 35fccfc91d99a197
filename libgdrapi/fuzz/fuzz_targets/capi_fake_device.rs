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
use std::ffi::{c_char, c_int, c_ulong, c_void};

use gdrapi::capi::*;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

mod fake_device;
use fake_device::{with_fake, BASE, PAGE, SIZE};

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
