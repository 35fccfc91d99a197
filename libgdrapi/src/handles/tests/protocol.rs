//! The hazard protocol's hard cases: membarrier failing after start-up, copies nested in signal
//! handlers, slot reuse, a thousand copying threads, and fork while other threads hold locks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::super::hazard::{all_hazards, owned_hazard, FENCED};
use super::super::*;
use super::{in_child, release, with_mapping, within_limit};

fn index_of(handle: u64) -> u64 {
    handle & 0xffff_ffff
}

/// Item 3: a retired handle's slot is not handed out again before `free`, so a copy stalled
/// between its check and its loads of base and length never pairs them with a new mapping's.
#[test]
fn a_retired_slot_is_reused_only_after_free() {
    init();
    let a = allocate().expect("slot");
    set_mapped(a, 0x80_0000, 0x1000);
    retire(a);
    let others: Vec<u64> = (0..64).map(|_| allocate().expect("slot")).collect();
    assert!(
        others.iter().all(|&b| index_of(b) != index_of(a)),
        "the slot of a retired, not yet quiesced handle was handed out again"
    );
    quiesce(&[a]).expect("quiesced");
    free(&[a]);
    // A second free of the same handle must not put the slot on the free list twice.
    free(&[a]);
    let again: Vec<u64> = (0..2).map(|_| allocate().expect("slot")).collect();
    assert!(
        index_of(again[0]) != index_of(again[1]),
        "one slot handed out twice"
    );
    for h in others.into_iter().chain(again) {
        release(h);
    }
}

/// The announcement the copying thread holds for `handle`, if any hazard shows it.
fn announced(handle: u64) -> bool {
    all_hazards().any(|h| h.handle.load(Ordering::SeqCst) == handle)
}

static INNER_HANDLE: AtomicU64 = AtomicU64::new(0);
static INNER_RAN: AtomicBool = AtomicBool::new(false);

extern "C" fn copy_in_handler(_: libc::c_int) {
    let inner = INNER_HANDLE.load(Ordering::SeqCst);
    let ran = with_mapping(inner, 0x90_0000, 8, || ());
    INNER_RAN.store(ran, Ordering::SeqCst);
}

/// Item 2: a copy from a signal handler that interrupted a copy of the same thread leaves the
/// interrupted copy announced, during the inner copy and after it.
#[test]
fn a_copy_in_a_signal_handler_keeps_the_outer_copy_announced() {
    init();
    let outer = allocate().expect("slot");
    let inner = allocate().expect("slot");
    in_child(|| {
        set_mapped(outer, 0xa0_0000, 0x1000);
        set_mapped(inner, 0x90_0000, 0x1000);
        INNER_HANDLE.store(inner, Ordering::SeqCst);
        // SAFETY: installs a handler for SIGUSR1 in this single-threaded child; the handler
        // only runs a copy check.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = copy_in_handler as *const () as libc::sighandler_t;
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
        }
        // The thread's first copy takes its hazard; the second runs on the fast path.
        let first = with_mapping(outer, 0xa0_0000, 8, || ());
        let mut kept_during = false;
        let second = with_mapping(outer, 0xa0_0000, 8, || {
            // SAFETY: raise delivers SIGUSR1 to this thread before it returns.
            unsafe { libc::raise(libc::SIGUSR1) };
            kept_during = announced(outer);
        });
        first
            && second
            && INNER_RAN.load(Ordering::SeqCst)
            && kept_during
            && !announced(outer)
            && !announced(inner)
    });
    release(outer);
    release(inner);
}

/// Item 5: a thousand threads copying through one handle each get a hazard of their own, and an
/// unmap of another handle does not wait for them.
#[test]
fn a_thousand_copying_threads_do_not_hold_up_an_unmap_of_another_handle() {
    // Starting 1000 threads takes long on a loaded machine.
    within_limit(60, a_thousand_copying_threads);
}

fn a_thousand_copying_threads() {
    const THREADS: usize = 1000;
    init();
    let busy = allocate().expect("slot");
    let target = allocate().expect("slot");
    set_mapped(busy, 0xb0_0000, 0x1000);
    set_mapped(target, 0xc0_0000, 0x1000);
    let stop = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    let without_hazard = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn_scoped(s, || {
                    let mut first = true;
                    while !stop.load(Ordering::Relaxed) {
                        with_mapping(busy, 0xb0_0000, 8, || {
                            for _ in 0..200 {
                                std::hint::spin_loop();
                            }
                        });
                        if first {
                            first = false;
                            if owned_hazard().is_none() {
                                without_hazard.fetch_add(1, Ordering::SeqCst);
                            }
                            started.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                    }
                })
                .expect("spawn");
        }
        while started.load(Ordering::SeqCst) < THREADS {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (done, waited) = mpsc::channel();
        s.spawn(move || {
            set_unmapped(target);
            let _ = done.send(quiesce(&[target]).is_ok());
        });
        let quiesced = waited.recv_timeout(Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(
            quiesced,
            Ok(true),
            "the unmap of an idle handle waited for copies of another one"
        );
    });
    assert_eq!(
        without_hazard.load(Ordering::SeqCst),
        0,
        "threads left without a hazard"
    );
    release(busy);
    release(target);
}

/// A filter that makes membarrier(2) fail with EPERM in the calling thread, as a sandbox's
/// seccomp policy installed after start-up does.
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

/// Item 1: membarrier stops working while a thread copies on the fast path. The unmap cannot
/// reach that thread, so it must not report the mapping free (the caller then keeps it mapped);
/// new threads take the fenced path, and once the fast thread is gone unmaps work again.
#[test]
fn an_unmap_after_membarrier_broke_keeps_the_mapping() {
    init();
    let h = allocate().expect("slot");
    let later = allocate().expect("slot");
    in_child(|| {
        let page = 4096;
        // SAFETY: a fresh anonymous mapping that only this test uses.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED || FENCED.load(Ordering::SeqCst) {
            return false;
        }
        let base = base as usize;
        set_mapped(h, base, page);
        let stop = AtomicBool::new(false);
        let copied = AtomicUsize::new(0);
        let fast = AtomicBool::new(false);
        let refused = AtomicUsize::new(0);
        let (quiesced, fenced_after, refused_after) = std::thread::scope(|s| {
            let copier = s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let ran = with_mapping(h, base + 8, 8, || {
                        // SAFETY: inside the mapping, which the test never unmaps while
                        // the handle may pass a check.
                        unsafe { std::ptr::write_volatile((base + 8) as *mut u64, 1) };
                    });
                    if ran {
                        fast.store(current::get().is_some(), Ordering::SeqCst);
                        copied.fetch_add(1, Ordering::SeqCst);
                    } else {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            while copied.load(Ordering::SeqCst) < 100 {
                std::thread::yield_now();
            }
            if !fail_membarrier() {
                stop.store(true, Ordering::Relaxed);
                return (true, false, false);
            }
            set_unmapped(h);
            let quiesced = quiesce(&[h]).is_ok();
            let fenced_after = FENCED.load(Ordering::SeqCst);
            // Until the copier has tried once more (a loaded machine may not run it for a
            // while; a fixed sleep made this flaky), or for 5 s.
            let start = std::time::Instant::now();
            while refused.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            stop.store(true, Ordering::Relaxed);
            let joined = copier.join().is_ok();
            (
                quiesced,
                fenced_after,
                joined && refused.load(Ordering::SeqCst) > 0,
            )
        });
        // The fast thread is gone: a new thread copies on the fenced path, and an unmap of its
        // handle is proven with a fence of its own.
        set_mapped(later, base, page);
        let newcomer = std::thread::spawn(move || {
            let ran = with_mapping(later, base, 8, || ());
            (ran, current::get().is_none())
        })
        .join();
        set_unmapped(later);
        let later_quiesced = quiesce(&[later]).is_ok();
        fast.load(Ordering::SeqCst)
            && !quiesced
            && fenced_after
            && refused_after
            && newcomer.is_ok_and(|(ran, fenced)| ran && fenced)
            && later_quiesced
    });
    release(h);
    release(later);
}

/// Item 4: a fork while other threads allocate and free handles leaves no lock held in the
/// child, which allocates and frees within a second.
#[test]
fn a_fork_while_threads_allocate_leaves_the_child_able_to() {
    within_limit(60, forks_while_threads_allocate);
}

fn forks_while_threads_allocate() {
    init();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(h) = allocate() {
                        retire(h);
                        free(&[h]);
                    }
                }
            });
        }
        for _ in 0..200 {
            // SAFETY: the child allocates, frees and leaves with _exit; alarm ends it if a
            // lock it needs was inherited held.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: as above.
                unsafe { libc::alarm(2) };
                let ok = allocate().is_some_and(|h| {
                    retire(h);
                    free(&[h]);
                    true
                });
                // SAFETY: leaving the forked child at once.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if status != 0 {
                stop.store(true, Ordering::Relaxed);
                panic!("a forked child could not allocate a handle (wait status {status:#x})");
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
}
