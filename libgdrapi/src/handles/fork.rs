//! fork(2) and the library's state.
//!
//! Mappings are not inherited (the module maps them VM_DONTCOPY), but the handle table is: the
//! child handler marks every handle unmapped in the child, so a copy there fails with EINVAL
//! instead of storing to whatever the child has at that address. [`fork_generation`] lets the
//! safe API's mappings and the backends notice the same.
//!
//! Locks. A fork while another thread holds one of the library's locks (inside a pin, an
//! unpin, a close) would leave it held for good in the child, whose only thread is the one
//! that forked. The prepare handler therefore takes every lock the child may need, in the
//! documented order (see `Held`), and both the parent and the child handler let
//! them go. The locks are futex-based `std::sync::Mutex`es: unlocking one in the child, where
//! no other thread waits, is a plain store (and a wake of nobody).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use super::hazard::{
    all_hazards, membarrier, owned_hazard, release_hazard, FENCED, GROWING,
    MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
};
use super::{current, slot, ALLOCATOR, MAX_LIVE_HANDLES};

static FORKS: AtomicU64 = AtomicU64::new(0);

/// How many forks separate this process from the one the library started in: a mapping made
/// at another generation is not mapped here.
pub fn fork_generation() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// Guards held by the forking thread between prepare and parent/child, in the order taken.
/// Lock order: the C API's locks (see `capi::open`), then `GROWING`, then `ALLOCATOR`; nothing
/// takes them in another order.
type Held = Vec<Box<dyn std::any::Any>>;

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Callbacks the C API registers to take (and drop) its own locks around a fork, before the
/// handle table's. Set once, at the first `gdr_open`.
static OUTER: std::sync::OnceLock<fn() -> Held> = std::sync::OnceLock::new();

/// Registers the C API's lock taker (its registry and every open `gdr_t`'s lock), run first
/// by the prepare handler.
pub fn register_outer_locks(take: fn() -> Held) {
    let _ = OUTER.set(take);
}

extern "C" fn prepare() {
    let mut outer = OUTER.get().map_or_else(Vec::new, |take| take());
    outer.push(Box::new(
        GROWING.lock().unwrap_or_else(PoisonError::into_inner),
    ));
    outer.push(Box::new(
        ALLOCATOR.lock().unwrap_or_else(PoisonError::into_inner),
    ));
    HELD.with(|held| *held.borrow_mut() = Some(outer));
}

fn release_held() {
    // Dropped in reverse order of taking.
    if let Some(mut held) = HELD.with(|held| held.borrow_mut().take()) {
        while held.pop().is_some() {}
    }
}

extern "C" fn in_parent() {
    release_held();
}

/// The child handler: nothing of the parent's is mapped here, and the parent's other threads
/// (their copies in flight, their hazards) do not exist.
extern "C" fn in_child() {
    release_held();
    FORKS.fetch_add(1, Ordering::Relaxed);
    for index in 0..MAX_LIVE_HANDLES as u32 {
        // Segments are allocated in order: the first missing one ends the table.
        let Some(slot) = slot(index) else { break };
        slot.copy_key.store(0, Ordering::Relaxed);
        slot.slow_copies.store(0, Ordering::Relaxed);
    }
    let mine = owned_hazard();
    for h in all_hazards() {
        if !mine.is_some_and(|m| std::ptr::eq(m, h)) {
            release_hazard(h);
        }
    }
    if let Some(own) = mine {
        own.handle.store(0, Ordering::Relaxed);
    }
    // Registration is per address space: the child's is new.
    if !FENCED.load(Ordering::Relaxed) && !membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
        FENCED.store(true, Ordering::Relaxed);
        if let Some(own) = mine {
            own.fast.store(false, Ordering::Relaxed);
        }
        // This thread's copies must now take the fenced path.
        current::set(None);
    }
}

/// Registers the fork handlers, once per process (from `init`).
pub(super) fn register() {
    // SAFETY: the handlers take and drop this library's locks, touch its atomics and
    // thread-locals and make a system call, all allowed around fork.
    unsafe { libc::pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
}
