//! Memory handles of the C API (`gdr_mh_t.h`).
//!
//! A handle is `generation << 32 | (slot + 1)`: never 0, and a stale handle (unpinned, or from
//! another `gdr_t` whose table does not hold it) is recognised instead of being dereferenced as
//! upstream's raw pointers are. Slots live in segments that are allocated once and never freed,
//! so the copy path can check a handle with plain atomic loads: no lock, no system call.
//!
//! Copies racing an unmap. A copy announces the handle it copies through in its thread's
//! *hazard* slot, then checks the handle; an unmap (or unpin, or close) first retires the
//! mapping in the table, then waits until no thread announces the handle, and only then calls
//! munmap. So a copy racing an unmap either completes before the memory goes or fails with
//! EINVAL: it never faults, and never stores to the address once the unmap returned (when a new
//! mapping may live there). The announcement costs the copy two plain stores: the ordering the
//! check needs is bought on the unmap's side with membarrier(2) (MEMBARRIER_CMD_PRIVATE_EXPEDITED),
//! or, where that is unavailable, with a full fence on both sides.
//!
//! Fork. Mappings are not inherited (the module maps them VM_DONTCOPY), but this table is: a
//! child handler registered with pthread_atfork marks every handle unmapped in the child, so a
//! copy there fails with EINVAL instead of storing to whatever the child has at that address.
//! [`fork_generation`] lets the safe API's mappings notice the same.

use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Mutex, Once, PoisonError};

const SEGMENT_SHIFT: u32 = 12;
const SEGMENT_LEN: usize = 1 << SEGMENT_SHIFT;
const SEGMENTS: usize = 256;
/// At most this many handles exist at once, process-wide. The table's last slot is never
/// handed out: `copy_slot` sends a zero-initialised handle there, and a slot that was never
/// used keeps key 0 with length 0, so handle 0 passes no copy check (the copy path skips
/// size 0 before it looks). A used slot would keep its old base and length after its unmap.
pub(crate) const MAX_LIVE_HANDLES: usize = SEGMENT_LEN * SEGMENTS - 1;

const LIVE: u64 = 1;

/// One handle. The copy path reads the first three words only, from one cache line.
#[derive(Default)]
#[repr(C, align(32))]
struct Slot {
    /// The handle while it is live and mapped, else 0: a copy checks generation, liveness and
    /// mapping with one comparison.
    copy_key: AtomicU64,
    map_base: AtomicUsize,
    map_len: AtomicUsize,
    /// generation << 32 | LIVE.
    state: AtomicU64,
}

struct Allocator {
    free: Vec<u32>,
    next: u32,
}

/// Segments of `SEGMENT_LEN` slots, allocated under `ALLOCATOR` when first needed and never
/// freed: a copy finds a slot with two loads and no "initialised?" state to check.
static TABLE: [AtomicPtr<Slot>; SEGMENTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; SEGMENTS];
static ALLOCATOR: Mutex<Allocator> = Mutex::new(Allocator {
    free: Vec::new(),
    next: 0,
});

/// Slot `index` (modulo the segment) of segment `segment` (< SEGMENTS), if that segment exists.
#[inline(always)]
fn slot_at(segment: usize, index: usize) -> Option<&'static Slot> {
    let segment = TABLE[segment].load(Ordering::Acquire);
    // SAFETY: a non-null segment points to `SEGMENT_LEN` slots that live forever (leaked at
    // allocation), published with Release after they were initialised.
    unsafe {
        segment
            .as_ref()
            .map(|_| &*segment.add(index & (SEGMENT_LEN - 1)))
    }
}

#[inline(always)]
fn slot(index: u32) -> Option<&'static Slot> {
    let index = index as usize;
    let segment = index >> SEGMENT_SHIFT;
    (segment < SEGMENTS)
        .then(|| slot_at(segment, index))
        .flatten()
}

/// The slot a copy through `handle` checks: the handle's own if it names one, else any slot,
/// whose `copy_key` then differs from the handle. Index bits beyond the table are masked
/// instead of tested, which the copy path saves.
#[inline(always)]
fn copy_slot(handle: u64) -> Option<&'static Slot> {
    let index = (handle as u32).wrapping_sub(1) as usize;
    slot_at((index >> SEGMENT_SHIFT) % SEGMENTS, index)
}

fn split(handle: u64) -> Option<(u32, u32)> {
    let index = (handle & 0xffff_ffff).checked_sub(1)?;
    Some(((handle >> 32) as u32, index as u32))
}

/// The slot of a live handle.
fn live_slot(handle: u64) -> Option<&'static Slot> {
    let (generation, index) = split(handle)?;
    let slot = slot(index)?;
    let state = slot.state.load(Ordering::Acquire);
    ((state >> 32) as u32 == generation && state & LIVE != 0).then_some(slot)
}

/// A new handle, or `None` when `MAX_LIVE_HANDLES` are live.
pub fn allocate() -> Option<u64> {
    init();
    let mut alloc = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let index = match alloc.free.pop() {
        Some(index) => index,
        None => {
            let index = alloc.next;
            if index as usize >= MAX_LIVE_HANDLES {
                return None;
            }
            let segment = &TABLE[index as usize >> SEGMENT_SHIFT];
            if segment.load(Ordering::Relaxed).is_null() {
                let slots: Box<[Slot]> = (0..SEGMENT_LEN).map(|_| Slot::default()).collect();
                segment.store(Box::leak(slots).as_mut_ptr(), Ordering::Release);
            }
            alloc.next += 1;
            index
        }
    };
    let slot = slot(index)?;
    // Generations start at 1 and skip 0 on wrap-around, so no handle is ever 0.
    let generation = match ((slot.state.load(Ordering::Relaxed) >> 32) as u32).wrapping_add(1) {
        0 => 1,
        g => g,
    };
    slot.state
        .store(u64::from(generation) << 32 | LIVE, Ordering::Release);
    Some(u64::from(generation) << 32 | (u64::from(index) + 1))
}

/// Retires a handle; later uses of it fail.
pub fn release(handle: u64) {
    if let Some((_, index)) = split(handle) {
        if let Some(slot) = live_slot(handle) {
            slot.copy_key.store(0, Ordering::SeqCst);
            let state = slot.state.load(Ordering::Relaxed);
            slot.state.store(state & !LIVE, Ordering::SeqCst);
            ALLOCATOR
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .free
                .push(index);
        }
    }
}

/// Copies through `handle` may now reach `[base, base + len)`.
pub fn set_mapped(handle: u64, base: usize, len: usize) {
    if let Some(slot) = live_slot(handle) {
        slot.map_base.store(base, Ordering::Relaxed);
        slot.map_len.store(len, Ordering::Relaxed);
        slot.copy_key.store(handle, Ordering::Release);
    }
}

pub fn set_unmapped(handle: u64) {
    if let Some(slot) = live_slot(handle) {
        slot.copy_key.store(0, Ordering::SeqCst);
    }
}

/// What [`enter`] found.
pub enum Entry {
    /// The range lies inside the live mapping; the copy may run while this lives.
    Inside(Copying),
    /// It does not (or the handle is stale, foreign or unmapped): nothing may be copied.
    Outside,
    /// This thread has no hazard yet: call [`enter_cold`].
    NoHazard,
}

/// A copy in flight, announced so that an unmap of its handle waits for it ([`quiesce`]);
/// dropping it ends the announcement.
#[repr(transparent)]
pub struct Copying(Option<&'static Hazard>);

impl Drop for Copying {
    #[inline(always)]
    fn drop(&mut self) {
        match self.0 {
            Some(hazard) => hazard.handle.store(0, Ordering::Release),
            None => {
                SLOW_COPIES.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// Announces a copy of `[ptr, ptr + len)` through `handle` and checks that the range lies
/// inside the handle's live mapping. Lock-free and without a system call: the copy path.
#[inline(always)]
pub fn enter(handle: u64, ptr: usize, len: usize) -> Entry {
    let Some(hazard) = current::get() else {
        return Entry::NoHazard;
    };
    hazard.handle.store(handle, Ordering::Relaxed);
    // The unmap side's membarrier makes every thread execute a full barrier between this
    // announcement and the check (a thread's hazard is installed for this path only when
    // membarrier works; see `enter_cold`).
    compiler_fence(Ordering::SeqCst);
    let copying = Copying(Some(hazard));
    if mapping_contains(handle, ptr, len) {
        Entry::Inside(copying)
    } else {
        Entry::Outside
    }
}

/// [`enter`] for a thread without a hazard: takes one (then later copies take the fast path),
/// or, when none can be had (all taken, or the thread's storage is being torn down: a copy from
/// a TLS destructor), counts the copy globally instead.
#[cold]
#[inline(never)]
pub fn enter_cold(handle: u64, ptr: usize, len: usize) -> Option<Copying> {
    let copying = match OWNED.try_with(|h| h.0) {
        Ok(Some(hazard)) => {
            hazard.handle.store(handle, Ordering::Relaxed);
            if FENCED.load(Ordering::Relaxed) {
                // Without membarrier every copy comes here and pays a full fence of its own.
                fence(Ordering::SeqCst);
            } else {
                // As in `enter`, which this thread's later copies take.
                compiler_fence(Ordering::SeqCst);
            }
            Copying(Some(hazard))
        }
        _ => {
            SLOW_COPIES.fetch_add(1, Ordering::SeqCst);
            Copying(None)
        }
    };
    mapping_contains(handle, ptr, len).then_some(copying)
}

/// Waits until no copy through any of `handles` is in flight. The caller has retired them
/// ([`release`] or [`set_unmapped`]) first, so copies starting now fail; after this returns the
/// mappings can go.
pub fn quiesce(handles: &[u64]) {
    // Only threads holding a hazard can have a copy in flight; this thread is not copying.
    // A thread that takes its hazard after this look sees the retirement (see `take`), so a
    // process where no other thread ever copied skips the barrier.
    fence(Ordering::SeqCst);
    let mine = current::get();
    let others = HAZARDS
        .iter()
        .any(|h| !mine.is_some_and(|m| std::ptr::eq(m, h)) && h.taken.load(Ordering::SeqCst));
    if others {
        writer_barrier();
        for h in HAZARDS.iter() {
            let mut spins = 0u32;
            while handles.contains(&h.handle.load(Ordering::Acquire)) {
                backoff(&mut spins);
            }
        }
    }
    let mut spins = 0u32;
    while SLOW_COPIES.load(Ordering::SeqCst) != 0 {
        backoff(&mut spins);
    }
}

fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// One thread's announcement of the handle it copies through (0: none).
struct Hazard {
    handle: AtomicU64,
    taken: AtomicBool,
}

/// The hazards, one per thread that copies; a thread's is free again once the thread exits.
/// Threads beyond these (hundreds copying at once) are counted in `SLOW_COPIES` instead.
static HAZARDS: [Hazard; 256] = [const {
    Hazard {
        handle: AtomicU64::new(0),
        taken: AtomicBool::new(false),
    }
}; 256];
/// Copies in flight without a hazard of their own.
static SLOW_COPIES: AtomicU64 = AtomicU64::new(0);

/// This thread's hazard (None: all taken), given back when the thread exits.
struct ThreadHazard(Option<&'static Hazard>);

impl ThreadHazard {
    fn take() -> ThreadHazard {
        // FENCED must be settled before the hazard is installed for the fence-less path.
        init();
        let mine = HAZARDS.iter().find(|h| {
            h.taken
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        });
        // Pairs with the fence in `quiesce`: either that unmap sees this hazard taken, or this
        // thread's first check sees the handle retired.
        fence(Ordering::SeqCst);
        if !FENCED.load(Ordering::Relaxed) {
            current::set(mine);
        }
        ThreadHazard(mine)
    }
}

impl Drop for ThreadHazard {
    fn drop(&mut self) {
        current::set(None);
        if let Some(h) = self.0 {
            h.handle.store(0, Ordering::Release);
            h.taken.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    /// Owns this thread's hazard: taken on its first copy, given back at thread exit.
    static OWNED: ThreadHazard = ThreadHazard::take();
}

mod current;

/// Set when membarrier(2) cannot be used: copies and unmaps then both use full fences.
static FENCED: AtomicBool = AtomicBool::new(false);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Orders an unmap's retirement of handles before its look at the announcements.
fn writer_barrier() {
    if FENCED.load(Ordering::Relaxed) || !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        fence(Ordering::SeqCst);
    }
}

static FORKS: AtomicU64 = AtomicU64::new(0);

/// How many forks separate this process from the one the library started in: a mapping made
/// at another generation is not mapped here.
pub fn fork_generation() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// The pthread_atfork child handler: nothing of the parent's is mapped here, and the parent's
/// other threads (and their copies in flight) do not exist.
extern "C" fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    for index in 0..MAX_LIVE_HANDLES as u32 {
        // Segments are allocated in order: the first missing one ends the table.
        let Some(slot) = slot(index) else { break };
        slot.copy_key.store(0, Ordering::Relaxed);
    }
    for h in HAZARDS.iter() {
        h.handle.store(0, Ordering::Relaxed);
    }
    SLOW_COPIES.store(0, Ordering::Relaxed);
    if !FENCED.load(Ordering::Relaxed) && !membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
        FENCED.store(true, Ordering::Relaxed);
        // This thread's copies must now take the fenced path.
        current::set(None);
    }
}

/// Registers the fork handler and membarrier, once per process; before any mapping exists.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
            FENCED.store(true, Ordering::Relaxed);
        }
        // SAFETY: registers a handler that only touches this module's atomics and makes a
        // system call, which is allowed in a fork child.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// Whether `[ptr, ptr + len)` lies inside the live mapping of `handle`. Lock-free.
#[inline(always)]
fn mapping_contains(handle: u64, ptr: usize, len: usize) -> bool {
    let Some(slot) = copy_slot(handle) else {
        return false;
    };
    // The handle itself (never 0) while it is live and mapped: generation, slot, liveness and
    // mapping in one comparison.
    if slot.copy_key.load(Ordering::Acquire) != handle {
        return false;
    }
    let base = slot.map_base.load(Ordering::Relaxed);
    let map_len = slot.map_len.load(Ordering::Relaxed);
    // Below `base` the offset wraps past any length.
    let offset = ptr.wrapping_sub(base);
    len <= map_len && offset <= map_len - len
}

#[cfg(test)]
pub fn is_live(handle: u64) -> bool {
    live_slot(handle).is_some()
}

#[cfg(test)]
mod tests;
