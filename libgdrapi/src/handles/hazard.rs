//! Hazards: how a copy announces the handle it copies through, and how an unmap waits for it.
//!
//! A thread takes a hazard of its own on its first copy and keeps it until it exits. Its later
//! copies announce with two plain stores (the *fast path*): the ordering the unmap's check
//! needs is bought on the unmap's side with membarrier(2), which makes every thread of the
//! process execute a full barrier. Where membarrier is unavailable from the start, every copy
//! fences for itself instead (the *fenced path*).
//!
//! Three cases need more than that:
//! - **membarrier stops working** (a seccomp filter installed after the first copy, as sandboxed
//!   workers do). Threads already on the fast path cannot be reached by any other barrier, so an
//!   unmap that would need one refuses to free the memory ([`quiesce`] answers
//!   [`Unproven`]) and the caller leaks the mapping instead; new hazards take the fenced path.
//! - **a copy from a signal handler** that interrupted a copy of the same thread: the outer copy
//!   keeps its announcement, the inner one claims a spare hazard (lock-free) and fences.
//! - **more threads than hazards**, or a copy during thread teardown: the copy is counted in its
//!   handle's slot instead, so an unmap waits only for slow copies of its own handles.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{copy_slot, current, init, mapping_contains, slot_of_handle, Slot};

/// One thread's announcement of the handle it copies through (0: none). A cache line each, so
/// that threads copying side by side do not share one.
#[repr(C, align(64))]
pub(super) struct Hazard {
    pub(super) handle: AtomicU64,
    pub(super) taken: AtomicBool,
    /// Copies through it rely on the unmap side's membarrier (the fast path).
    pub(super) fast: AtomicBool,
}

impl Hazard {
    const fn new() -> Hazard {
        Hazard {
            handle: AtomicU64::new(0),
            taken: AtomicBool::new(false),
            fast: AtomicBool::new(false),
        }
    }
}

/// The thread-local hazard pointer of a thread without a hazard on the fast path: always busy
/// (no handle is ever `u64::MAX`), never taken, never scanned by an unmap.
pub(super) static IDLE: Hazard = Hazard {
    handle: AtomicU64::new(u64::MAX),
    taken: AtomicBool::new(true),
    fast: AtomicBool::new(false),
};

const HAZARDS_PER_SEGMENT: usize = 256;
/// Up to 16,384 threads copy with a hazard of their own; more fall back to the slot counters.
const HAZARD_SEGMENTS: usize = 64;

/// Segments of hazards, added when all are taken and never freed: scanning them needs no lock.
static HAZARD_TABLE: [AtomicPtr<Hazard>; HAZARD_SEGMENTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; HAZARD_SEGMENTS];
/// Serialises adding a segment (never taken on the copy path or in a signal handler).
pub(super) static GROWING: Mutex<()> = Mutex::new(());

/// Every hazard that exists.
pub(super) fn all_hazards() -> impl Iterator<Item = &'static Hazard> {
    HAZARD_TABLE
        .iter()
        .map_while(|segment| {
            let first = segment.load(Ordering::Acquire);
            // SAFETY: a non-null segment points to HAZARDS_PER_SEGMENT hazards that live
            // forever (leaked when added), published with Release after they were initialised.
            (!first.is_null())
                .then(|| unsafe { std::slice::from_raw_parts(first, HAZARDS_PER_SEGMENT) })
        })
        .flatten()
}

/// A free hazard among those that exist. Lock-free and allocation-free: also for signal handlers.
fn claim_existing() -> Option<&'static Hazard> {
    all_hazards().find(|h| {
        h.taken
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    })
}

/// A free hazard, adding a segment when all are taken.
fn claim_or_grow() -> Option<&'static Hazard> {
    if let Some(h) = claim_existing() {
        return Some(h);
    }
    let _growing = GROWING.lock().unwrap_or_else(PoisonError::into_inner);
    // Another thread may have added one while this one waited.
    if let Some(h) = claim_existing() {
        return Some(h);
    }
    let free = HAZARD_TABLE
        .iter()
        .find(|s| s.load(Ordering::Relaxed).is_null())?;
    let segment: Box<[Hazard]> = (0..HAZARDS_PER_SEGMENT).map(|_| Hazard::new()).collect();
    segment[0].taken.store(true, Ordering::Relaxed);
    let first = Box::leak(segment).as_mut_ptr();
    free.store(first, Ordering::Release);
    // SAFETY: just leaked, so it lives forever.
    Some(unsafe { &*first })
}

/// A copy in flight on the fast path, announced in this thread's own hazard so that an unmap of
/// its handle waits for it ([`quiesce`]); dropping it ends the announcement with one store.
#[repr(transparent)]
pub struct Copying(&'static Hazard);

impl Drop for Copying {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.handle.store(0, Ordering::Release);
    }
}

/// A copy in flight announced by [`enter_cold`]; dropping it ends the announcement.
// The fields are held for their Drop only.
#[allow(dead_code)]
pub struct ColdCopying(Cold);

#[allow(dead_code)]
enum Cold {
    /// In this thread's own hazard (its first copy, or the fenced path).
    Own(Copying),
    /// In a spare hazard: a copy nested in a signal handler.
    Spare(&'static Hazard),
    /// Counted in the handle's slot: no hazard to be had.
    Counted(&'static Slot),
}

impl Drop for Cold {
    fn drop(&mut self) {
        match self {
            Cold::Own(_) => {}
            Cold::Spare(hazard) => {
                hazard.handle.store(0, Ordering::Release);
                hazard.taken.store(false, Ordering::Release);
            }
            Cold::Counted(slot) => {
                slot.slow_copies.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// What [`enter`] found.
pub enum Entry {
    /// The range lies inside the live mapping; the copy may run while this lives.
    Inside(Copying),
    /// It does not (or the handle is stale, foreign or unmapped): nothing may be copied.
    Outside,
    /// This thread has no hazard on the fast path, or its hazard is busy (a signal handler
    /// interrupted one of its copies): call [`enter_cold`].
    NoHazard,
}

/// Announces a copy of `[ptr, ptr + len)` through `handle` and checks that the range lies
/// inside the handle's live mapping. Lock-free and without a system call: the copy path.
#[inline(always)]
pub fn enter(handle: u64, ptr: usize, len: usize) -> Entry {
    let hazard = current::fast();
    // Busy: the thread has no hazard on the fast path (`IDLE`, or its TCB when static TLS was
    // not to be had), or this copy runs in a signal handler that interrupted one of the
    // thread's copies, whose announcement must stay.
    // SAFETY: `fast` returns a pointer whose first word is readable (see `current`); for a
    // hazard that word is its announcement, which only this thread writes, so a plain read
    // (one `cmp` with memory) races with no write.
    if unsafe { hazard.cast::<u64>().read() } != 0 {
        return Entry::NoHazard;
    }
    // SAFETY: a first word of 0 is a hazard's free announcement (IDLE's and a TCB's are never
    // 0): this thread's own hazard, which lives forever.
    let hazard: &'static Hazard = unsafe { &*hazard };
    hazard.handle.store(handle, Ordering::Relaxed);
    // The unmap side's membarrier makes every thread execute a full barrier between this
    // announcement and the check (a hazard is installed for this path only while membarrier
    // works; see `ThreadHazard::take`).
    compiler_fence(Ordering::SeqCst);
    let copying = Copying(hazard);
    if mapping_contains(handle, ptr, len) {
        Entry::Inside(copying)
    } else {
        Entry::Outside
    }
}

/// [`enter`] for the other cases: a thread's first copy (it takes a hazard), the fenced path,
/// a copy nested in a signal handler (a spare hazard), and a copy with no hazard to be had
/// (counted in the handle's slot).
#[cold]
#[inline(never)]
pub fn enter_cold(handle: u64, ptr: usize, len: usize) -> Option<ColdCopying> {
    let own = match current::get() {
        Some(own) => Ok(Some(own)),
        None => OWNED.try_with(|h| h.0),
    };
    let copying = match own {
        Ok(Some(own)) if own.handle.load(Ordering::Relaxed) == 0 => {
            own.handle.store(handle, Ordering::Relaxed);
            if own.fast.load(Ordering::Relaxed) {
                // As in `enter`, which this thread's later copies take.
                compiler_fence(Ordering::SeqCst);
            } else {
                fence(Ordering::SeqCst);
            }
            ColdCopying(Cold::Own(Copying(own)))
        }
        // Busy: a copy in a signal handler that interrupted one of this thread's copies.
        Ok(Some(_busy)) => nested(handle)?,
        // All hazards taken, or the thread's storage is being torn down (a copy from a
        // TLS destructor).
        _ => counted(handle)?,
    };
    mapping_contains(handle, ptr, len).then_some(copying)
}

/// A copy inside a signal handler that interrupted one of this thread's copies.
fn nested(handle: u64) -> Option<ColdCopying> {
    match claim_existing() {
        Some(spare) => {
            spare.handle.store(handle, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            Some(ColdCopying(Cold::Spare(spare)))
        }
        None => counted(handle),
    }
}

/// A copy without a hazard, counted in its handle's slot.
fn counted(handle: u64) -> Option<ColdCopying> {
    let slot = copy_slot(handle);
    slot.slow_copies.fetch_add(1, Ordering::SeqCst);
    // Pairs with the fence in `quiesce`: it sees the count, or this copy sees the retirement.
    fence(Ordering::SeqCst);
    Some(ColdCopying(Cold::Counted(slot)))
}

/// [`quiesce`] could not prove that no copy is in flight: membarrier(2) failed while threads
/// copy on the fast path. The mappings must be kept (leaked), not unmapped.
#[derive(Debug)]
pub struct Unproven;

/// Waits until no copy through any of `handles` is in flight. The caller has retired them
/// ([`super::retire`] or [`super::set_unmapped`]) first, so copies starting now fail; after
/// this returns `Ok` the mappings can go and the slots be freed ([`super::free`]).
#[must_use = "on Err the mappings must be kept"]
pub fn quiesce(handles: &[u64]) -> Result<(), Unproven> {
    // A thread that takes its hazard after this look sees the retirement (see `take`), so a
    // process where no other thread ever copied needs no barrier.
    fence(Ordering::SeqCst);
    let mine = current::get().map(|m| m as *const Hazard);
    let others = || {
        all_hazards()
            .filter(move |h| Some(*h as *const Hazard) != mine && h.taken.load(Ordering::SeqCst))
    };
    if others().next().is_some() {
        if others().any(|h| h.fast.load(Ordering::SeqCst)) {
            if !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
                membarrier_failed();
                return Err(Unproven);
            }
        } else {
            // Every other copier fences for itself.
            fence(Ordering::SeqCst);
        }
        for h in all_hazards() {
            let mut spins = 0u32;
            while handles.contains(&h.handle.load(Ordering::Acquire)) {
                backoff(&mut spins);
            }
        }
    }
    for slot in handles.iter().filter_map(|&h| slot_of_handle(h)) {
        let mut spins = 0u32;
        while slot.slow_copies.load(Ordering::SeqCst) != 0 {
            backoff(&mut spins);
        }
    }
    Ok(())
}

fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// This thread's hazard (None: none to be had), given back when the thread exits.
pub(super) struct ThreadHazard(pub(super) Option<&'static Hazard>);

impl ThreadHazard {
    fn take() -> ThreadHazard {
        // FENCED must be settled before a hazard is installed for the fast path.
        init();
        let mine = claim_or_grow();
        if let Some(h) = mine {
            // Marked fast before FENCED is read: an unmap that sets FENCED and then finds no
            // fast hazard knows that this thread will fence.
            h.fast.store(true, Ordering::SeqCst);
            // Pairs with the fence in `quiesce`: either that unmap sees this hazard taken, or
            // this thread's first check sees the handle retired.
            fence(Ordering::SeqCst);
            if FENCED.load(Ordering::SeqCst) {
                h.fast.store(false, Ordering::SeqCst);
            } else {
                current::set(Some(h));
            }
        }
        OWNED_HAZARD.with(|o| o.set(mine));
        ThreadHazard(mine)
    }
}

impl Drop for ThreadHazard {
    fn drop(&mut self) {
        current::set(None);
        let _ = OWNED_HAZARD.try_with(|o| o.set(None));
        if let Some(h) = self.0 {
            release_hazard(h);
        }
    }
}

pub(super) fn release_hazard(h: &Hazard) {
    h.handle.store(0, Ordering::Release);
    h.fast.store(false, Ordering::Release);
    h.taken.store(false, Ordering::Release);
}

thread_local! {
    /// Owns this thread's hazard: taken on its first copy, given back at thread exit.
    static OWNED: ThreadHazard = ThreadHazard::take();
    /// The hazard `OWNED` holds, readable without initialising `OWNED` (the fork handler).
    static OWNED_HAZARD: Cell<Option<&'static Hazard>> = const { Cell::new(None) };
}

/// This thread's hazard, if it has taken one (on the fast or the fenced path).
pub(super) fn owned_hazard() -> Option<&'static Hazard> {
    OWNED_HAZARD.try_with(Cell::get).ok().flatten()
}

/// Set when membarrier(2) cannot be used: new hazards take the fenced path.
pub(super) static FENCED: AtomicBool = AtomicBool::new(false);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
pub(super) const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

pub(super) fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// membarrier worked at start-up and fails now: say so once, and send new threads to the
/// fenced path. Threads already on the fast path stay there (nothing can reach them), so
/// unmaps leak while any of them lives.
fn membarrier_failed() {
    let errno = std::io::Error::last_os_error();
    FENCED.store(true, Ordering::SeqCst);
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::log::warn_always(format_args!(
            "membarrier(2) failed ({errno}; a seccomp filter installed after the first copy?): \
             mappings that other threads may still be copying through are kept mapped instead \
             of unmapped, until those threads exit"
        ));
    }
}
