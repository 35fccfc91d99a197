//! The C API's lifetimes against the real module (issue 30): a closed `gdr_t` is refused, not
//! used after free, and a fork while other threads pin, map and unpin leaves the child a
//! library it can use.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

/// A `gdr_t` for the tests, which fail if the module cannot be opened.
fn open() -> gdr_t {
    let g = gdr_open();
    assert!(!g.is_null(), "gdr_open: {}", Errno::last());
    g
}

/// Item 9: a second `gdr_close`, and every call on a closed `gdr_t`, return EINVAL; a pin that
/// races the close is undone rather than kept.
#[test]
fn a_closed_gdr_t_is_refused_with_einval() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(1 << 20, 0, 65536, false).expect("alloc");
    let g = open();
    let mut mh = gdr_mh_t::default();
    // SAFETY: `g` came from gdr_open; every pointer is valid.
    unsafe {
        assert_eq!(gdr_pin_buffer_v2(g, va as _, 65536, 0, &mut mh), 0);
        assert_eq!(gdr_close(g), 0);
        assert_eq!(gdr_close(g), libc::EINVAL, "a second gdr_close");
        let mut again = gdr_mh_t::default();
        assert_eq!(
            gdr_pin_buffer_v2(g, va as _, 65536, 0, &mut again),
            libc::EINVAL,
            "a pin on a closed gdr_t"
        );
        assert_eq!(gdr_unpin_buffer(g, mh), libc::EINVAL);
        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, 65536), libc::EINVAL);
    }
    assert_no_pins(&emu);

    // Calls racing the close: each returns 0 or EINVAL, and nothing stays pinned.
    for round in 0..50u64 {
        let g = open();
        let g_addr = g as usize;
        let stop = AtomicBool::new(false);
        let results = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (stop, results) = (&stop, &results);
                s.spawn(move || {
                    let g = g_addr as gdr_t;
                    let base = va + (t * 65536 * 4);
                    while !stop.load(Ordering::Relaxed) {
                        let mut mh = gdr_mh_t::default();
                        // SAFETY: `g` came from gdr_open; a closed one must give EINVAL.
                        let r = unsafe { gdr_pin_buffer_v2(g, base as _, 65536, 0, &mut mh) };
                        match r {
                            0 => {
                                // SAFETY: as above.
                                let u = unsafe { gdr_unpin_buffer(g, mh) };
                                assert!(u == 0 || u == libc::EINVAL, "unpin racing close: {u}");
                            }
                            libc::EINVAL => {
                                results.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            other => panic!("pin racing close: {other}"),
                        }
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(1 + round % 5));
            // SAFETY: `g` came from gdr_open.
            assert_eq!(unsafe { gdr_close(g) }, 0);
            stop.store(true, Ordering::Relaxed);
        });
        assert_no_pins(&emu);
    }
    emu.free(va).expect("free");
}

/// Item 4: forks while three threads pin, map, copy, unmap and unpin on one `gdr_t`; every child
/// closes the inherited `gdr_t`, opens its own, pins, maps, copies and closes within its alarm.
/// Exit codes: 2 close, 3 open, 4 close of its own, 5/6 emulator, 7 free, 101 a failed
/// assertion, 128 + signal (142: the alarm, a lock inherited held).
#[test]
fn a_fork_while_threads_pin_and_unpin_leaves_the_child_a_usable_library() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(1 << 20, 0, 65536, false).expect("alloc");
    let g = open();
    let g_addr = g as usize;
    let stop = AtomicBool::new(false);
    let mut failures = Vec::new();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let stop = &stop;
            s.spawn(move || {
                let mut word = t;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: `g` stays open until the threads stopped.
                    unsafe { concurrency_cycle(g_addr as gdr_t, va + t * 65536, word) };
                    word += 3;
                }
            });
        }
        for round in 0..40u64 {
            let code = forked(move || {
                // SAFETY: a 10 s alarm ends a child that inherited a lock held.
                unsafe { libc::alarm(10) };
                // SAFETY: the inherited gdr_t: closing it in the child is allowed.
                if unsafe { gdr_close(g_addr as gdr_t) } != 0 {
                    return 2;
                }
                let own = gdr_open();
                if own.is_null() {
                    return 3;
                }
                // Device memory of the child's own: the emulator, as MUSA, gives a child none
                // of its parent's allocations.
                let Ok(emu) = Emu::open() else { return 5 };
                let Ok(child_va) = emu.alloc(65536, 0, 65536, false) else {
                    return 6;
                };
                // SAFETY: `own` is this child's gdr_t.
                unsafe { concurrency_cycle(own, child_va, round) };
                // SAFETY: as above.
                if unsafe { gdr_close(own) } != 0 {
                    return 4;
                }
                i32::from(emu.free(child_va).is_err()) * 7
            });
            if code != 0 {
                failures.push((round, code));
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        failures.is_empty(),
        "children that failed (round, code): {failures:?}"
    );
    // SAFETY: `g` came from gdr_open.
    assert_eq!(unsafe { gdr_close(g) }, 0);
    assert_no_pins(&emu);
    emu.free(va).expect("free");
}

/// Runs `child` in a forked process: its exit code, or 128 + the signal that ended it (the
/// alarm of a child that hung). Unlike `in_child` it never panics, so the threads above are
/// always stopped.
fn forked(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `child` (library calls and system calls) and leaves with _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => code,
            Ok(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i32,
            other => panic!("waitpid: {other:?}"),
        },
        Err(e) => panic!("fork: {e}"),
    }
}

/// One pin/map/copy/unmap/unpin cycle, as the concurrency tests run it.
///
/// # Safety
/// `g` is a live gdr_t.
unsafe fn concurrency_cycle(g: gdr_t, base: u64, word: u64) {
    // SAFETY: forwarded.
    unsafe { concurrency::c_api_cycle(g, base, word) }
}
