//! Memory handles of the C API (`gdr_mh_t.h`).
//!
//! A handle is `generation << 32 | (slot + 1)`: never 0, and a stale handle (unpinned, or from
//! another `gdr_t` whose table does not hold it) is recognised instead of being dereferenced as
//! upstream's raw pointers are. Slots live in segments that are allocated once and never freed,
//! so the copy path can check a handle with plain atomic loads: no lock, no system call.
//!
//! Copies racing an unmap. A copy announces the handle it copies through (its thread's
//! *hazard*, see `hazard`), then checks the handle; an unmap (or unpin, or close) first retires
//! the mapping in the table, then waits until no copy announces the handle ([`quiesce`]), and
//! only then calls munmap and frees the slot ([`free`]). So a copy racing an unmap either
//! completes before the memory goes or fails with EINVAL: it never faults, never stores to the
//! address once the unmap returned (when a new mapping may live there), and never pairs its
//! handle's base with another mapping's length (the slot is reused only after the wait).
//!
//! Fork: see `fork`.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, PoisonError};

mod current;
mod fork;
mod hazard;

pub use fork::{fork_generation, register_outer_locks};
pub use hazard::{enter, enter_cold, quiesce, Copying, Entry};

const SEGMENT_SHIFT: u32 = 12;
const SEGMENT_LEN: usize = 1 << SEGMENT_SHIFT;
const SEGMENTS: usize = 256;
/// At most this many handles exist at once, process-wide. The table's last slot is never
/// handed out: `copy_slot` sends a zero-initialised handle there, and a slot that was never
/// used keeps key 0 with length 0, so handle 0 passes no copy check (the copy path skips
/// size 0 before it looks). A used slot would keep its old base and length after its unmap.
pub(crate) const MAX_LIVE_HANDLES: usize = SEGMENT_LEN * SEGMENTS - 1;

const LIVE: u64 = 1;
/// The slot is on the free list (freed once only, however often `free` is called).
const ON_FREE_LIST: u64 = 2;

/// One handle, a cache line. The copy path reads the first three words only.
#[repr(C, align(64))]
struct Slot {
    /// The handle while it is live and mapped, else 0: a copy checks generation, liveness and
    /// mapping with one comparison.
    copy_key: AtomicU64,
    map_base: AtomicUsize,
    map_len: AtomicUsize,
    /// generation << 32 | LIVE.
    state: AtomicU64,
    /// Copies in flight through this slot without a hazard of their own (see `hazard`).
    slow_copies: AtomicU64,
}

impl Slot {
    const fn unused() -> Slot {
        Slot {
            copy_key: AtomicU64::new(0),
            map_base: AtomicUsize::new(0),
            map_len: AtomicUsize::new(0),
            state: AtomicU64::new(0),
            slow_copies: AtomicU64::new(0),
        }
    }
}

struct Allocator {
    free: Vec<u32>,
    next: u32,
}

/// Where a segment not yet allocated points: slots never handed out (key 0, length 0), in
/// which no copy check passes, so the copy path tests no pointer for null.
static UNALLOCATED: [Slot; SEGMENT_LEN] = [const { Slot::unused() }; SEGMENT_LEN];

/// Segments of `SEGMENT_LEN` slots, allocated under `ALLOCATOR` when first needed and never
/// freed: a copy finds a slot with two loads and no "initialised?" state to check.
static TABLE: [AtomicPtr<Slot>; SEGMENTS] = {
    let unallocated = (&raw const UNALLOCATED).cast::<Slot>().cast_mut();
    let mut table = [const { AtomicPtr::new(std::ptr::null_mut()) }; SEGMENTS];
    let mut i = 0;
    while i < SEGMENTS {
        table[i] = AtomicPtr::new(unallocated);
        i += 1;
    }
    table
};

fn is_allocated(segment: *const Slot) -> bool {
    !std::ptr::eq(segment, UNALLOCATED.as_ptr())
}
static ALLOCATOR: Mutex<Allocator> = Mutex::new(Allocator {
    free: Vec::new(),
    next: 0,
});

/// Slot `index` (modulo the segment) of segment `segment` (< SEGMENTS): a slot of
/// `UNALLOCATED` if that segment does not exist yet.
#[inline(always)]
fn slot_at(segment: usize, index: usize) -> &'static Slot {
    let segment = TABLE[segment].load(Ordering::Acquire);
    // SAFETY: every entry points to `SEGMENT_LEN` slots that live forever (`UNALLOCATED`, or
    // a segment leaked at allocation and published with Release after it was initialised).
    unsafe { &*segment.add(index & (SEGMENT_LEN - 1)) }
}

/// Slot `index`, if its segment exists.
#[inline(always)]
fn slot(index: u32) -> Option<&'static Slot> {
    let index = index as usize;
    let segment = index >> SEGMENT_SHIFT;
    (segment < SEGMENTS && is_allocated(TABLE[segment].load(Ordering::Acquire)))
        .then(|| slot_at(segment, index))
}

/// The slot a copy through `handle` checks: the handle's own if it names one, else any slot,
/// whose `copy_key` then differs from the handle. Index bits beyond the table are masked
/// instead of tested, which the copy path saves.
#[inline(always)]
fn copy_slot(handle: u64) -> &'static Slot {
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
            if !is_allocated(segment.load(Ordering::Relaxed)) {
                let slots: Box<[Slot]> = (0..SEGMENT_LEN).map(|_| Slot::unused()).collect();
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

/// Retires a handle: later uses of it fail. Its slot is reused only after [`free`], which the
/// caller calls once [`quiesce`] proved that no copy through the handle is in flight.
pub fn retire(handle: u64) {
    if let Some(slot) = live_slot(handle) {
        slot.copy_key.store(0, Ordering::SeqCst);
        let state = slot.state.load(Ordering::Relaxed);
        slot.state.store(state & !LIVE, Ordering::SeqCst);
    }
}

/// Gives the slots of retired, quiesced handles back for reuse.
pub fn free(handles: &[u64]) {
    let mut alloc = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    for &handle in handles {
        let Some((generation, index)) = split(handle) else {
            continue;
        };
        let Some(slot) = slot(index) else { continue };
        let state = slot.state.load(Ordering::Acquire);
        if (state >> 32) as u32 == generation && state & (LIVE | ON_FREE_LIST) == 0 {
            slot.state.store(state | ON_FREE_LIST, Ordering::Release);
            alloc.free.push(index);
        }
    }
}

/// The slot `handle` names (live or not).
fn slot_of_handle(handle: u64) -> Option<&'static Slot> {
    split(handle).and_then(|(_, index)| slot(index))
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

/// Registers the fork handlers and membarrier, once per process; before any mapping exists.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !hazard::membarrier(hazard::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
            hazard::FENCED.store(true, Ordering::Relaxed);
        }
        fork::register();
    });
}

/// Whether `[ptr, ptr + len)` lies inside the live mapping of `handle`. Lock-free.
#[inline(always)]
fn mapping_contains(handle: u64, ptr: usize, len: usize) -> bool {
    let slot = copy_slot(handle);
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
