//! The other Rust staticlib of `cargo xtask test`'s libgdrapi.a check
//! (xtask/testbench/src/staticlib.rs), linked into one C program with it. It has what makes two Rust
//! staticlibs clash: its own global allocator (its allocator shim defines __rust_alloc too) and
//! its own unwinding (rust_eh_personality, DW.ref.rust_eh_personality); built by another rustc,
//! all of std.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: System's, plus a counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// 42 if this library's allocator served its Vec and its unwinding caught its panic;
/// negative otherwise.
#[no_mangle]
pub extern "C" fn other_rust_answer() -> i32 {
    // resume_unwind: unwinds without the panic hook's message on stderr.
    let caught = std::panic::catch_unwind(|| std::panic::resume_unwind(Box::new(7))).is_err();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let numbers: Vec<i32> = std::hint::black_box(1..=6).collect();
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) > before;
    let answer = numbers.iter().sum::<i32>() * 2;
    match (caught, allocated) {
        (true, true) => answer,
        (false, _) => -1,
        (true, false) => -2,
    }
}
