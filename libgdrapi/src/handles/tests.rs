use std::io::Write;

use super::hazard::{all_hazards, FENCED};
use super::*;

mod protocol;

/// How long a forked test child may run before SIGALRM ends it (and fails its test).
pub(super) const CHILD_LIMIT_S: u32 = 20;

/// Runs `body` on a thread of its own and fails if it has not finished within `seconds`: a test
/// that waits for copies to start or end must fail, not hang, when a check is broken. A body
/// still running cannot be stopped (its threads spin on), so the whole test binary is aborted.
pub(super) fn within_limit(seconds: u64, body: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(seconds)) {
        Ok(()) => runner.join().expect("test body"),
        // The body panicked: report its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = runner.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            // Not eprintln!, which the test harness captures and the abort would lose.
            let _ = writeln!(
                std::io::stderr(),
                "a test is still running after {seconds} s: aborting the test binary"
            );
            std::process::abort();
        }
    }
}

/// Retires, waits for copies in flight and frees: what an unpin does.
fn release(h: u64) {
    retire(h);
    quiesce(&[h]).expect("no membarrier failure in this test");
    free(&[h]);
}

/// Runs `copy` if `[ptr, ptr + len)` lies inside the live mapping of `handle` (see [`enter`]);
/// false, with nothing run, if not.
pub(super) fn with_mapping(handle: u64, ptr: usize, len: usize, copy: impl FnOnce()) -> bool {
    match enter(handle, ptr, len) {
        Entry::Inside(_copying) => {
            copy();
            true
        }
        Entry::Outside => false,
        Entry::NoHazard => match enter_cold(handle, ptr, len) {
            Some(_copying) => {
                copy();
                true
            }
            None => false,
        },
    }
}

#[test]
fn handles_are_never_zero_and_stale_ones_are_refused() {
    let a = allocate().expect("slot");
    assert_ne!(a, 0);
    assert!(is_live(a));
    set_mapped(a, 0x1000, 0x2000);
    assert!(mapping_contains(a, 0x1000, 0x2000));
    assert!(mapping_contains(a, 0x2fff, 1));
    assert!(!mapping_contains(a, 0x2fff, 2));
    assert!(!mapping_contains(a, 0xfff, 1));
    assert!(!mapping_contains(a, usize::MAX, 2));
    set_unmapped(a);
    assert!(!mapping_contains(a, 0x1000, 1));
    release(a);
    assert!(!is_live(a));
    let b = allocate().expect("slot");
    assert_ne!(a, b, "a reused slot gets a new generation");
    assert!(!is_live(a));
    release(b);
    assert!(!is_live(0));
    assert!(!is_live(u64::MAX));
    // An index just past the table (a forged handle) names no slot.
    assert!(!is_live(1 << 32 | (MAX_LIVE_HANDLES as u64 + 2)));
    assert!(slot(MAX_LIVE_HANDLES as u32 + 1).is_none());
}

/// Copies racing an unmap: none runs after `quiesce` returned, and each either ran or
/// was refused.
#[test]
fn no_copy_runs_after_the_unmap_quiesced() {
    within_limit(20, copies_racing_an_unmap);
}

fn copies_racing_an_unmap() {
    use std::sync::atomic::AtomicBool;
    init();
    for _ in 0..10 {
        let h = allocate().expect("slot");
        set_mapped(h, 0x10_0000, 0x1000);
        let gone = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let started = AtomicU64::new(0);
        let (ran, refused) = std::thread::scope(|s| {
            let copiers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let (mut ran, mut refused) = (0u64, 0u64);
                        while !stop.load(Ordering::Acquire) {
                            let copied = with_mapping(h, 0x10_0800, 16, || {
                                // A copy long enough to overlap the unmap.
                                for _ in 0..2000 {
                                    std::hint::spin_loop();
                                }
                                assert!(!gone.load(Ordering::SeqCst), "copy after unmap");
                            });
                            if copied {
                                if ran == 0 {
                                    started.fetch_add(1, Ordering::SeqCst);
                                }
                                ran += 1;
                            } else {
                                refused += 1;
                            }
                        }
                        (ran, refused)
                    })
                })
                .collect();
            while started.load(Ordering::SeqCst) < 4 {
                std::thread::yield_now();
            }
            set_unmapped(h);
            quiesce(&[h]).expect("membarrier works here");
            gone.store(true, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            stop.store(true, Ordering::Release);
            copiers
                .into_iter()
                .map(|c| c.join().expect("copier"))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        assert!(ran > 0 && refused > 0, "ran {ran}, refused {refused}");
        release(h);
    }
}

/// A zero-initialised handle reaches the table's last slot through `copy_slot` (index 0 - 1
/// wraps to it): once that slot has been mapped and unmapped its key is 0 again, equal to
/// the handle, and its old base and length must not make the copy check pass.
#[test]
fn handle_zero_never_matches_the_last_slot() {
    init();
    // The fork handlers leave the allocator unlocked in the child, which (its own copy of the
    // table) may then use every slot.
    // SAFETY: the child allocates (glibc's malloc is fork-safe), reads and writes atomics,
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: alarm only arms a timer (see `in_child`).
        unsafe { libc::alarm(CHILD_LIMIT_S) };
        let ok = std::panic::catch_unwind(|| {
            let all: Vec<u64> = std::iter::from_fn(allocate).collect();
            // Every segment exists now, the last one included.
            let last = copy_slot(0);
            if !is_allocated(TABLE[SEGMENTS - 1].load(Ordering::Acquire)) {
                return false;
            }
            for &h in &all {
                if std::ptr::eq(copy_slot(h), last) {
                    set_mapped(h, 0x50_0000, 0x1000);
                    set_unmapped(h);
                }
            }
            !mapping_contains(0, 0x50_0000, 1) && !with_mapping(0, 0x50_0000, 1, || ())
        })
        .unwrap_or(false);
        // SAFETY: leaving the forked child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(status, 0, "handle 0 matched an unmapped slot's stale range");
}

/// In a forked child no handle is mapped, whatever the parent's table says.
#[test]
fn a_forked_child_sees_no_mapping() {
    init();
    let h = allocate().expect("slot");
    set_mapped(h, 0x20_0000, 0x1000);
    let before = fork_generation();
    // SAFETY: the child only reads atomics and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: alarm only arms a timer (see `in_child`).
        unsafe { libc::alarm(CHILD_LIMIT_S) };
        let ok = !mapping_contains(h, 0x20_0000, 1)
            && !with_mapping(h, 0x20_0000, 1, || ())
            && fork_generation() == before + 1;
        // SAFETY: leaving the forked child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(status, 0, "the child saw the parent's mapping");
    assert!(mapping_contains(h, 0x20_0000, 1), "the parent still does");
    release(h);
}

/// Runs `body` in a forked child (single-threaded, its own copy of the statics) and
/// asserts it exits with 0.
pub(super) fn in_child(body: impl FnOnce() -> bool) {
    // SAFETY: the child only runs `body` (atomics, thread-locals, thread creation) and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // A broken check must fail the test, not hang it: SIGALRM ends a child that spins.
        // SAFETY: alarm only arms a timer.
        unsafe { libc::alarm(CHILD_LIMIT_S) };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(false);
        // SAFETY: leaving the forked child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(status, 0, "the child's checks failed");
}

/// Without membarrier a thread's hazard is never installed for the fence-less path: every
/// copy goes through `enter_cold`, which fences, and still sees mappings come and go.
#[test]
fn without_membarrier_copies_take_the_fenced_path() {
    init();
    let h = allocate().expect("slot");
    in_child(|| {
        // (The fork handler unmapped everything: map in the child.)
        set_mapped(h, 0x30_0000, 0x1000);
        FENCED.store(true, Ordering::Relaxed);
        current::set(None);
        let mut ran = 0;
        let inside = with_mapping(h, 0x30_0800, 8, || ran += 1);
        let installed = current::get().is_some();
        set_unmapped(h);
        let after = with_mapping(h, 0x30_0800, 8, || ran += 1);
        inside && !after && ran == 1 && !installed && current::get().is_none()
    });
    release(h);
}

/// A thread's hazard goes back when the thread exits, and the thread-local pointer with it.
#[test]
fn an_exiting_thread_gives_its_hazard_back() {
    init();
    let h = allocate().expect("slot");
    in_child(|| {
        set_mapped(h, 0x40_0000, 0x1000);
        let taken = || {
            all_hazards()
                .filter(|h| h.taken.load(Ordering::SeqCst))
                .count()
        };
        let before = taken();
        let during = std::thread::spawn(move || {
            let copied = with_mapping(h, 0x40_0000, 1, || ());
            (copied, current::get().is_some(), taken())
        })
        .join();
        let Ok((copied, installed, during)) = during else {
            return false;
        };
        copied && installed && during == before + 1 && taken() == before
    });
    release(h);
}

/// After a thread's first copy its later copies find its hazard on the fast path: through the
/// static TLS offset on x86-64 (the test binary's TLS is static), else the thread-local cell.
#[test]
fn after_the_first_copy_the_copy_path_finds_the_hazard() {
    init();
    let h = allocate().expect("slot");
    in_child(|| {
        set_mapped(h, 0x60_0000, 0x1000);
        if FENCED.load(Ordering::SeqCst) {
            return false;
        }
        // Before: IDLE, or the thread's TCB until a first copy in the process learnt the
        // static offset; either reads as busy.
        // SAFETY: `fast` returns a pointer whose first word is readable (see `current`).
        let before =
            current::get().is_none() && unsafe { current::fast().cast::<u64>().read() } != 0;
        let copied = with_mapping(h, 0x60_0000, 8, || ());
        let installed = current::get().is_some_and(|h| std::ptr::eq(current::fast(), h));
        let fast = matches!(enter(h, 0x60_0000, 8), Entry::Inside(_));
        before && copied && installed && fast
    });
    release(h);
}

/// A copy counted in its handle's slot (one without a hazard: a copy from a thread's TLS
/// destructor, or with every hazard taken) holds up the unmap of that handle until it ends.
#[test]
fn an_unmap_waits_for_a_copy_counted_in_the_slot() {
    within_limit(20, || {
        use std::sync::atomic::AtomicBool;
        init();
        let h = allocate().expect("slot");
        set_mapped(h, 0x70_0000, 0x1000);
        let slot = copy_slot(h);
        // What `hazard::counted` does for such a copy.
        slot.slow_copies.fetch_add(1, Ordering::SeqCst);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                set_unmapped(h);
                quiesce(&[h]).expect("no membarrier failure in this test");
                done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(
                !done.load(Ordering::SeqCst),
                "the unmap did not wait for the counted copy"
            );
            slot.slow_copies.fetch_sub(1, Ordering::SeqCst);
        });
        assert!(done.load(Ordering::SeqCst));
        release(h);
    });
}
