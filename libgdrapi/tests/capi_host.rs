//! The gdrapi.h C API on the host, in seconds: every entry point called as a C program calls
//! it, against the copy harness's stand-in for /dev/mtgdrdrv (testing/copy-harness/
//! devnode_double.c, preloaded), so that `cargo test` alone catches a broken shim, handle
//! table or copy check (cargo-mutants on capi.rs and handles.rs, see docs/testing.md).
//!
//! Why the double and not an in-process fake of the backend: it answers the real ioctls and
//! mmap the library issues through libc, so the module backend runs unchanged and the shipped
//! code needs no test seam. Each test runs in a child of this binary (the double must be
//! preloaded at exec, and the library's handle table and fork handlers are per process) that is
//! killed after `LIMIT`: a broken check fails the test within seconds instead of hanging it.

use std::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gdrapi::capi::*;

mod devnode;

const CHILD_ENV: &str = "GDRAPI_CAPI_HOST_CHILD";
const LIMIT: Duration = Duration::from_secs(15);
const EINVAL: c_int = libc::EINVAL;
/// The double's pin granule (GPU pages): pins at multiples of it map from their first byte.
const GPU_PAGE: u64 = 64 * 1024;

/// The double, built once per test process.
fn devnode_double() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-host");
        std::fs::create_dir_all(&dir).expect("test directory");
        devnode::build(&dir)
    })
}

/// Runs `body` in a child of this binary with the double preloaded; fails if the child fails
/// or is still running after `LIMIT`. In the child itself, runs `body`.
fn in_child(test: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD_ENV).is_some() {
        body();
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("LD_PRELOAD", devnode_double())
        .env_remove("GDRCOPY_USE_DMABUF_MMAP")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running the child");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().expect("the child's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match status {
        Some(status) => assert!(status.success(), "{test} failed ({status}): {text}"),
        None => panic!("{test} still running after {LIMIT:?} (killed): {text}"),
    }
}

fn open() -> gdr_t {
    let g = gdr_open();
    assert!(!g.is_null(), "gdr_open under the double");
    g
}

fn pin(g: gdr_t, addr: u64, size: usize) -> gdr_mh_t {
    let mut mh = gdr_mh_t { h: 0 };
    // SAFETY: `g` is open; `mh` is writable.
    assert_eq!(unsafe { gdr_pin_buffer_v2(g, addr, size, 0, &mut mh) }, 0);
    assert_ne!(mh.h, 0, "a pin handed out handle 0");
    mh
}

fn map(g: gdr_t, mh: gdr_mh_t, size: usize) -> *mut u8 {
    let mut va = null_mut();
    // SAFETY: `g` is open; `va` is writable.
    assert_eq!(unsafe { gdr_map(g, mh, &mut va, size) }, 0);
    assert!(!va.is_null());
    va.cast()
}

fn info(g: gdr_t, mh: gdr_mh_t) -> Result<gdr_info_v2, c_int> {
    let mut info = gdr_info_v2::default();
    // SAFETY: `g` is NULL or from gdr_open; `info` is writable.
    match unsafe { gdr_get_info_v2(g, mh, &mut info) } {
        0 => Ok(info),
        e => Err(e),
    }
}

fn to_device(mh: gdr_mh_t, dst: *mut u8, src: &[u8]) -> c_int {
    // SAFETY: `src` is readable for its length; the library checks `dst`.
    unsafe { gdr_copy_to_mapping(mh, dst.cast(), src.as_ptr().cast(), src.len()) }
}

fn from_device(mh: gdr_mh_t, dst: &mut [u8], src: *const u8) -> c_int {
    // SAFETY: `dst` is writable for its length; the library checks `src`.
    unsafe { gdr_copy_from_mapping(mh, dst.as_mut_ptr().cast(), src.cast(), dst.len()) }
}

/// Whether the page at `va` is mapped in this process (msync fails with ENOMEM if not).
fn is_mapped(va: usize) -> bool {
    // SAFETY: msync only looks the range up; MS_ASYNC writes nothing back for anonymous memory.
    unsafe { libc::msync(va as *mut c_void, 4096, libc::MS_ASYNC) == 0 }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Pin, info, map, copies both ways at the mapping's edges, unmap, unpin, close: the values
/// the driver gave come back, the device side is the mapping, and each misuse is EINVAL.
#[test]
fn a_buffer_from_pin_to_close() {
    in_child("a_buffer_from_pin_to_close", || {
        let g = open();
        let size = GPU_PAGE as usize;
        let addr = 3 * GPU_PAGE;
        let mh = pin(g, addr, size);
        let before = info(g, mh).expect("info");
        assert_eq!(
            (before.va, before.mapped_size, before.page_size),
            (addr, GPU_PAGE, GPU_PAGE as u32)
        );
        let mut flag: c_int = 7;
        // SAFETY: open `g`, writable `flag`.
        assert_eq!(unsafe { gdr_get_callback_flag(g, mh, &mut flag) }, 0);
        assert_eq!(flag, 0);

        let va = map(g, mh, size);
        let after = info(g, mh).expect("info");
        assert_eq!(after.va, addr);
        assert_eq!(after.mapped_size, GPU_PAGE);
        assert_eq!(after.flags, 0b11, "mapped and write-combined");
        assert_eq!(after.mapping_type, 1, "GDR_MAPPING_TYPE_WC");
        let mut v1 = gdr_info_v1::default();
        // SAFETY: open `g`, writable `v1`.
        assert_eq!(unsafe { gdr_get_info_v1(g, mh, &mut v1) }, 0);
        assert_eq!(
            (v1.va, v1.mapped_size, v1.page_size, v1.flags),
            (addr, GPU_PAGE, GPU_PAGE as u32, 0b11)
        );
        // A second map of the same handle.
        let mut again = null_mut();
        // SAFETY: open `g`, writable `again`.
        assert_eq!(unsafe { gdr_map(g, mh, &mut again, size) }, libc::EAGAIN);

        // Copies: the whole mapping, its last bytes, and past either end.
        let data = pattern(size, 5);
        assert_eq!(to_device(mh, va, &data), 0);
        // SAFETY: the mapping is live and `size` bytes long (the double's anonymous memory).
        let seen = unsafe { std::slice::from_raw_parts(va, size) };
        assert_eq!(seen, &data[..], "the copy went to the mapping");
        let mut back = vec![0u8; size];
        assert_eq!(from_device(mh, &mut back, va), 0);
        assert_eq!(back, data);
        let tail = pattern(16, 9);
        // SAFETY: pointer arithmetic only; the library checks the range.
        let (last16, past) = unsafe { (va.add(size - 16), va.add(size - 15)) };
        assert_eq!(to_device(mh, last16, &tail), 0);
        assert_eq!(to_device(mh, past, &tail), EINVAL, "one byte past the end");
        assert_eq!(from_device(mh, &mut back[..16], past), EINVAL);
        let mut small = [0u8; 16];
        assert_eq!(from_device(mh, &mut small, last16), 0);
        assert_eq!(small.as_slice(), tail.as_slice());
        // SAFETY: pointer arithmetic only.
        let below = unsafe { va.sub(1) };
        assert_eq!(
            to_device(mh, below, &tail[..1]),
            EINVAL,
            "below the mapping"
        );
        assert_eq!(to_device(mh, va, &[]), 0, "size 0 copies nothing");
        // SAFETY: NULL host pointers are refused before anything is read or written.
        unsafe {
            assert_eq!(gdr_copy_to_mapping(mh, va.cast(), null(), 8), EINVAL);
            assert_eq!(gdr_copy_from_mapping(mh, null_mut(), va.cast(), 8), EINVAL);
        }
        // The host buffer given as the device side.
        assert_eq!(to_device(mh, back.as_mut_ptr(), &tail), EINVAL);
        // A handle that names no buffer.
        assert_eq!(to_device(gdr_mh_t { h: 0 }, va, &tail), EINVAL);
        assert_eq!(to_device(gdr_mh_t { h: mh.h + 1 }, va, &tail), EINVAL);

        // gdr_unmap wants the address and a size that rounds to the mapping's length.
        // SAFETY: open `g`; the wrong arguments are refused before anything is unmapped.
        unsafe {
            assert_eq!(gdr_unmap(g, mh, va.add(1).cast(), size), EINVAL);
            assert_eq!(gdr_unmap(g, mh, va.cast(), size + 4096), EINVAL);
            assert_eq!(gdr_unmap(g, mh, va.cast(), size - 1), 0);
            assert!(!is_mapped(va as usize), "gdr_unmap left the memory mapped");
            assert_eq!(gdr_unmap(g, mh, va.cast(), size), EINVAL, "twice");
        }
        assert_eq!(to_device(mh, va, &tail), EINVAL, "after the unmap");
        assert_eq!(info(g, mh).map(|i| i.va), Ok(addr));

        // SAFETY: open `g`.
        unsafe {
            assert_eq!(gdr_unpin_buffer(g, mh), 0);
            assert_eq!(gdr_unpin_buffer(g, mh), EINVAL, "twice");
        }
        assert_eq!(info(g, mh).map(|i| i.va), Err(EINVAL));
        // SAFETY: `g` from gdr_open, closed only here.
        unsafe {
            assert_eq!(gdr_close(g), 0);
            assert_eq!(gdr_close(g), EINVAL, "twice");
        }
        assert_eq!(info(g, mh).map(|i| i.va), Err(EINVAL), "closed gdr_t");
    });
}

/// gdrapi.h's GPU page constants, as upstream defines them.
#[test]
fn gpu_page_constants() {
    assert_eq!(GPU_PAGE_SHIFT, 16);
    assert_eq!(GPU_PAGE_SIZE, 1 << 16);
    assert_eq!(GPU_PAGE_OFFSET, 0xffff);
    assert_eq!(GPU_PAGE_MASK, !0xffff);
    assert_eq!(
        GDR_API_VERSION,
        GDR_API_MAJOR_VERSION << 16 | GDR_API_MINOR_VERSION
    );
    assert_eq!(MINIMUM_GDRDRV_VERSION, 1, "driver 0.1");
}

/// The outputs of the calls that only report: versions, attributes, names, and NULLs refused.
#[test]
fn versions_attributes_and_null_arguments() {
    in_child("versions_attributes_and_null_arguments", || {
        let g = open();
        let (mut major, mut minor) = (-1, -1);
        // SAFETY: writable outputs; `g` open.
        unsafe {
            gdr_runtime_get_version(&mut major, &mut minor);
            assert_eq!(
                (major, minor),
                (GDR_API_MAJOR_VERSION, GDR_API_MINOR_VERSION)
            );
            gdr_runtime_get_version(null_mut(), null_mut());
            assert_eq!(gdr_driver_get_version(g, &mut major, &mut minor), 0);
            assert_eq!((major, minor), (0, 1), "the double's MTGDRDRV_VERSION");
            assert_eq!(gdr_driver_get_version(g, null_mut(), &mut minor), EINVAL);
            assert_eq!(gdr_driver_get_version(g, &mut major, null_mut()), EINVAL);
        }
        let attribute = |attr: c_int| {
            let mut v: c_int = -1;
            // SAFETY: open `g`, writable `v`.
            let rc = unsafe { gdr_get_attribute(g, attr, &mut v) };
            (rc, v)
        };
        assert_eq!(attribute(1), (0, 1), "GDR_ATTR_USE_PERSISTENT_MAPPING");
        assert_eq!(attribute(2), (0, 0), "GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE");
        assert_eq!(attribute(3), (0, 0), "GDR_ATTR_USING_DMA_BUF_MMAP");
        assert_eq!(attribute(4), (EINVAL, 0), "an unknown attribute");
        // SAFETY: NULL output.
        assert_eq!(unsafe { gdr_get_attribute(g, 1, null_mut()) }, EINVAL);
        let name = |t: c_int| {
            let mut s = null();
            // SAFETY: writable `s`; the string it gets is static.
            match unsafe { gdr_get_mapping_type_string(t, &mut s) } {
                0 => Ok(unsafe { CStr::from_ptr(s) }.to_str().expect("ASCII")),
                e => Err(e),
            }
        };
        assert_eq!(name(0), Ok("None"));
        assert_eq!(name(1), Ok("Write Combining"));
        assert_eq!(name(2), Ok("Caching"));
        assert_eq!(name(3), Ok("Device"));
        assert_eq!(name(4), Err(EINVAL));
        assert_eq!(name(-1), Err(EINVAL));
        // SAFETY: NULL output.
        assert_eq!(
            unsafe { gdr_get_mapping_type_string(0, null_mut()) },
            EINVAL
        );

        let mh = pin(g, GPU_PAGE, GPU_PAGE as usize);
        // SAFETY: each call gets a NULL output or a NULL `gdr_t`, refused with EINVAL.
        unsafe {
            assert_eq!(gdr_pin_buffer_v2(g, 0, 4096, 0, null_mut()), EINVAL);
            assert_eq!(gdr_pin_buffer(g, 0, 4096, 0, 0, null_mut()), EINVAL);
            assert_eq!(gdr_get_info_v2(g, mh, null_mut()), EINVAL);
            assert_eq!(gdr_get_info_v1(g, mh, null_mut()), EINVAL);
            assert_eq!(gdr_get_callback_flag(g, mh, null_mut()), EINVAL);
            assert_eq!(gdr_map(g, mh, null_mut(), 4096), EINVAL);
            let mut out = gdr_mh_t { h: 0 };
            assert_eq!(gdr_pin_buffer_v2(null_mut(), 0, 4096, 0, &mut out), EINVAL);
            assert_eq!(out.h, 0);
            assert_eq!(gdr_close(null_mut()), EINVAL);
            let mut va = null_mut();
            assert_eq!(
                gdr_map_v2(g, mh, &mut va, 4096, 9),
                EINVAL,
                "unknown request"
            );
        }
        // The legacy pin's handle is as good as a v2 one.
        let mut legacy = gdr_mh_t { h: 0 };
        // SAFETY: open `g`, writable `legacy`.
        assert_eq!(
            unsafe { gdr_pin_buffer(g, 2 * GPU_PAGE, 4096, 0, 0, &mut legacy) },
            0
        );
        assert_ne!(legacy.h, 0);
        assert_ne!(legacy, mh);
        assert_eq!(info(g, legacy).map(|i| i.va), Ok(2 * GPU_PAGE));
        // SAFETY: `g` from gdr_open.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    });
}

/// A DEVICE mapping request: the info says DEVICE, not write-combined, and copies go through.
#[test]
fn a_device_mapping() {
    in_child("a_device_mapping", || {
        let g = open();
        let mh = pin(g, GPU_PAGE, GPU_PAGE as usize);
        let mut va = null_mut();
        // SAFETY: open `g`, writable `va`.
        assert_eq!(unsafe { gdr_map_v2(g, mh, &mut va, 4096, 3) }, 0);
        let got = info(g, mh).expect("info");
        assert_eq!((got.flags, got.mapping_type), (0b01, 3));
        let va: *mut u8 = va.cast();
        let data = pattern(64, 1);
        assert_eq!(to_device(mh, va, &data), 0);
        let mut back = [0u8; 64];
        assert_eq!(from_device(mh, &mut back, va), 0);
        assert_eq!(back.as_slice(), data.as_slice());
        // SAFETY: `g` from gdr_open; close unmaps and unpins what is left.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    });
}

/// More handles than one segment of the table holds: each is distinct and never 0, copies
/// through a handle of the second segment reach its own mapping only, a released slot comes
/// back with a new generation, and stale or foreign handles are refused.
#[test]
fn handles_across_segments_reuse_and_staleness() {
    in_child("handles_across_segments_reuse_and_staleness", || {
        let g = open();
        let other = open();
        let page = GPU_PAGE as usize;
        let mut all: Vec<gdr_mh_t> = (0..4200).map(|_| pin(g, GPU_PAGE, page)).collect();
        let mut keys: Vec<u64> = all.iter().map(|m| m.h).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), all.len(), "a handle handed out twice");
        // Each names its own buffer still (no slot shared by two live handles).
        assert!(all.iter().all(|&m| info(g, m).is_ok()));
        // The first handle's slot and the last's (in the second segment).
        let (first, last) = (all[0], all[all.len() - 1]);
        let (va_first, va_last) = (map(g, first, 4096), map(g, last, 4096));
        let a = pattern(32, 3);
        let b = pattern(32, 4);
        assert_eq!(to_device(first, va_first, &a), 0);
        assert_eq!(to_device(last, va_last, &b), 0);
        assert_eq!(
            to_device(first, va_last, &a),
            EINVAL,
            "another handle's mapping"
        );
        assert_eq!(
            to_device(last, va_first, &b),
            EINVAL,
            "another handle's mapping"
        );
        let mut back = [0u8; 32];
        assert_eq!(from_device(last, &mut back, va_last), 0);
        assert_eq!(back.as_slice(), b.as_slice());
        // A handle of this gdr_t is not one of `other`'s.
        assert_eq!(info(other, first).map(|i| i.va), Err(EINVAL));
        // SAFETY: open `other`.
        assert_eq!(unsafe { gdr_unpin_buffer(other, first) }, EINVAL);
        // Released, then reused: the slot's next handle differs, and the old one is refused.
        let released = all.remove(1);
        // SAFETY: open `g`.
        assert_eq!(unsafe { gdr_unpin_buffer(g, released) }, 0);
        let reused = pin(g, 2 * GPU_PAGE, page);
        assert_eq!(
            reused.h & 0xffff_ffff,
            released.h & 0xffff_ffff,
            "the freed slot is taken first"
        );
        assert_ne!(reused, released, "a new generation");
        assert_eq!(info(g, released).map(|i| i.va), Err(EINVAL), "stale");
        assert_eq!(info(g, reused).map(|i| i.va), Ok(2 * GPU_PAGE));
        let va_reused = map(g, reused, 4096);
        assert_eq!(to_device(released, va_reused, &a), EINVAL, "stale handle");
        assert_eq!(to_device(reused, va_reused, &a), 0);
        // Unpinning a mapped handle unmaps it: its copies fail, its slot is reused.
        // SAFETY: open `g`.
        assert_eq!(unsafe { gdr_unpin_buffer(g, last) }, 0);
        assert_eq!(to_device(last, va_first, &a), EINVAL);
        let next = pin(g, GPU_PAGE, page);
        assert_eq!(next.h & 0xffff_ffff, last.h & 0xffff_ffff);
        assert_eq!(
            to_device(first, va_first, &a),
            0,
            "the others are untouched"
        );
        // SAFETY: both from gdr_open.
        unsafe {
            assert_eq!(gdr_close(g), 0);
            assert_eq!(gdr_close(other), 0);
        }
        assert_eq!(to_device(first, va_first, &a), EINVAL, "after close");
        assert!(!is_mapped(va_first as usize), "gdr_close left a mapping");
        // After close every slot is free again, mapped or not: a new gdr_t reuses them all.
        let g = open();
        let highest = keys.iter().map(|k| k & 0xffff_ffff).max().unwrap_or(0);
        for _ in 0..keys.len() {
            let again = pin(g, GPU_PAGE, page);
            assert!(
                keys.binary_search(&again.h).is_err(),
                "an old handle came back"
            );
            assert!(
                again.h & 0xffff_ffff <= highest,
                "a closed gdr_t's slot was not reused"
            );
        }
        // SAFETY: from gdr_open.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    });
}

/// In a forked child no copy goes through (the mapping is not inherited), gdr_close there lets
/// go of the child's share only, and the parent copies on.
#[test]
fn after_fork() {
    in_child("after_fork", || {
        let g = open();
        let mh = pin(g, GPU_PAGE, GPU_PAGE as usize);
        let va = map(g, mh, 4096);
        let data = pattern(8, 7);
        assert_eq!(to_device(mh, va, &data), 0);
        // SAFETY: the child makes library calls (whose locks the fork handlers released) and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let ok = to_device(mh, va, &data) == EINVAL
                && info(g, mh).is_ok()
                // SAFETY: open `g` in the child; its pins belong to the parent.
                && unsafe { gdr_close(g) } == 0;
            // SAFETY: leaving the forked child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the forked child's checks failed");
        let other = pattern(8, 8);
        assert_eq!(
            to_device(mh, va, &other),
            0,
            "the parent's mapping survives"
        );
        let mut back = [0u8; 8];
        assert_eq!(from_device(mh, &mut back, va), 0);
        assert_eq!(back.as_slice(), other.as_slice());
        // SAFETY: from gdr_open.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    });
}

/// membarrier(2) fails (a seccomp filter) while another thread copies on the fast path: the
/// unmap cannot prove the copies over, so it keeps the mapping and the handle maps no more.
#[test]
fn an_unmap_after_membarrier_broke() {
    in_child("an_unmap_after_membarrier_broke", || {
        let g = open();
        let mh = pin(g, GPU_PAGE, GPU_PAGE as usize);
        let va = map(g, mh, 4096) as usize;
        // Left mapped for gdr_close, which must keep it too.
        let left = pin(g, GPU_PAGE, GPU_PAGE as usize);
        let va_left = map(g, left, 4096) as usize;
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (copied, done) = std::sync::mpsc::channel::<bool>();
        let copier = std::thread::spawn(move || {
            let data = [1u8; 8];
            // Two copies: the first takes the thread's hazard, the second runs on the fast path.
            let ok = (0..2).all(|_| to_device(mh, va as *mut u8, &data) == 0);
            let _ = copied.send(ok);
            // Stays alive (its hazard on the fast path) until gdr_close is done.
            let _ = wait.recv();
        });
        assert_eq!(done.recv(), Ok(true), "the copier's copies");
        assert!(fail_membarrier(), "installing the seccomp filter");
        // SAFETY: open `g`; the mapping is kept, not unmapped.
        assert_eq!(unsafe { gdr_unmap(g, mh, va as *mut c_void, 4096) }, 0);
        assert_eq!(to_device(mh, va as *mut u8, &[2u8; 8]), EINVAL);
        let mut again = null_mut();
        // SAFETY: open `g`, writable `again`.
        assert_eq!(
            unsafe { gdr_map(g, mh, &mut again, 4096) },
            libc::EBUSY,
            "the kept mapping's slot"
        );
        // The kept memory is still mapped: reading it does not fault.
        // SAFETY: kept mapped by the library (leaked on purpose).
        assert_eq!(unsafe { std::ptr::read_volatile(va as *const u8) }, 1);
        // SAFETY: open `g`.
        assert_eq!(unsafe { gdr_unpin_buffer(g, mh) }, 0);
        assert!(is_mapped(va), "the kept mapping went at the unpin");
        // The kept slot is never reused.
        let next = pin(g, GPU_PAGE, GPU_PAGE as usize);
        assert_ne!(next.h & 0xffff_ffff, mh.h & 0xffff_ffff);
        // SAFETY: from gdr_open; `left` is still mapped.
        assert_eq!(unsafe { gdr_close(g) }, 0);
        assert!(
            is_mapped(va_left),
            "gdr_close unmapped what it could not quiesce"
        );
        let _ = go.send(());
        copier.join().expect("copier");
        // Neither kept slot comes back; the unmapped one (`next`) does.
        let g = open();
        let kept = [mh.h & 0xffff_ffff, left.h & 0xffff_ffff];
        let again: Vec<u64> = (0..4)
            .map(|_| pin(g, GPU_PAGE, 4096).h & 0xffff_ffff)
            .collect();
        assert!(
            again.iter().all(|i| !kept.contains(i)),
            "a kept slot reused"
        );
        assert!(
            again.contains(&(next.h & 0xffff_ffff)),
            "a freed slot not reused"
        );
        // SAFETY: from gdr_open.
        assert_eq!(unsafe { gdr_close(g) }, 0);
    });
}

/// A filter that makes membarrier(2) fail with EPERM, as a sandbox's seccomp policy installed
/// after start-up does.
fn fail_membarrier() -> bool {
    use seccompiler::{SeccompAction, SeccompFilter, SeccompRule, TargetArch};
    let arch = if cfg!(target_arch = "x86_64") {
        TargetArch::x86_64
    } else {
        TargetArch::aarch64
    };
    let rules = [(libc::SYS_membarrier, Vec::<SeccompRule>::new())].into();
    let Ok(filter) = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    ) else {
        return false;
    };
    let Ok(program) = seccompiler::BpfProgram::try_from(filter) else {
        return false;
    };
    seccompiler::apply_filter(&program).is_ok()
}
