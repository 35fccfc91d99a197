//! Memory handles of the C API (`gdr_mh_t.h`).
//!
//! A handle is `generation << 32 | (slot + 1)`: never 0, and a stale handle (unpinned, or from
//! another `gdr_t` whose table does not hold it) is recognised instead of being dereferenced as
//! upstream's raw pointers are. Slots live in segments that are allocated once and never freed,
//! so the copy path can check a handle with plain atomic loads: no lock, no system call.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

const SEGMENT_LEN: usize = 4096;
const SEGMENTS: usize = 256;
/// At most this many handles exist at once, process-wide.
pub(crate) const MAX_LIVE_HANDLES: usize = SEGMENT_LEN * SEGMENTS;

const LIVE: u64 = 1 << 8;
const TYPE_MASK: u64 = 0xff;

#[derive(Default)]
struct Slot {
    /// generation << 32 | LIVE | mapping type (0 = not mapped).
    state: AtomicU64,
    map_base: AtomicUsize,
    map_len: AtomicUsize,
}

struct Allocator {
    free: Vec<u32>,
    next: u32,
}

static TABLE: [OnceLock<Box<[Slot]>>; SEGMENTS] = [const { OnceLock::new() }; SEGMENTS];
static ALLOCATOR: Mutex<Allocator> = Mutex::new(Allocator {
    free: Vec::new(),
    next: 0,
});

fn slot(index: u32) -> Option<&'static Slot> {
    let index = index as usize;
    TABLE
        .get(index / SEGMENT_LEN)?
        .get()?
        .get(index % SEGMENT_LEN)
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
    let mut alloc = ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    let index = match alloc.free.pop() {
        Some(index) => index,
        None => {
            let index = alloc.next;
            if index as usize >= MAX_LIVE_HANDLES {
                return None;
            }
            TABLE[index as usize / SEGMENT_LEN]
                .get_or_init(|| (0..SEGMENT_LEN).map(|_| Slot::default()).collect());
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
            let state = slot.state.load(Ordering::Relaxed);
            slot.state
                .store(state & !(LIVE | TYPE_MASK), Ordering::Release);
            ALLOCATOR
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .free
                .push(index);
        }
    }
}

pub fn set_mapped(handle: u64, base: usize, len: usize, mapping_type: u32) {
    if let Some(slot) = live_slot(handle) {
        slot.map_base.store(base, Ordering::Relaxed);
        slot.map_len.store(len, Ordering::Relaxed);
        let state = slot.state.load(Ordering::Relaxed) & !TYPE_MASK;
        slot.state.store(
            state | (u64::from(mapping_type) & TYPE_MASK),
            Ordering::Release,
        );
    }
}

pub fn set_unmapped(handle: u64) {
    if let Some(slot) = live_slot(handle) {
        let state = slot.state.load(Ordering::Relaxed);
        slot.state.store(state & !TYPE_MASK, Ordering::Release);
    }
}

/// Whether `[ptr, ptr + len)` lies inside the live mapping of `handle`. Lock-free.
#[inline]
pub fn mapping_contains(handle: u64, ptr: usize, len: usize) -> bool {
    let Some(slot) = live_slot(handle) else {
        return false;
    };
    if slot.state.load(Ordering::Acquire) & TYPE_MASK == 0 {
        return false;
    }
    let base = slot.map_base.load(Ordering::Relaxed);
    let map_len = slot.map_len.load(Ordering::Relaxed);
    match (ptr.checked_sub(base), ptr.checked_add(len)) {
        (Some(offset), Some(_)) => offset <= map_len && len <= map_len - offset,
        _ => false,
    }
}

#[cfg(test)]
pub fn is_live(handle: u64) -> bool {
    live_slot(handle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_never_zero_and_stale_ones_are_refused() {
        let a = allocate().expect("slot");
        assert_ne!(a, 0);
        assert!(is_live(a));
        set_mapped(a, 0x1000, 0x2000, 1);
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
    }
}
