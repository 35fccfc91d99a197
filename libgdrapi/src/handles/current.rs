//! This thread's hazard, for the copy path, where one thread-local load must do.
//!
//! A thread without a hazard of its own on the fast path points at `IDLE`, a hazard that is
//! always busy: the copy path's one test of its hazard's announcement ("busy?") then also
//! sends such a thread to the cold path, with no test for null.

use super::hazard::{Hazard, IDLE};

/// This thread's hazard on the fast path, if it has one.
#[inline(always)]
pub fn get() -> Option<&'static Hazard> {
    let hazard = get_or_idle();
    (!std::ptr::eq(hazard, &IDLE)).then_some(hazard)
}

/// Installs (or, with None, removes) this thread's hazard for the fast path.
pub fn set(hazard: Option<&'static Hazard>) {
    imp::set(hazard.unwrap_or(&IDLE));
}

pub use imp::get as get_or_idle;

/// On x86-64 the hazard pointer is a thread-local variable of the initial-exec model, declared in assembly
/// (Rust's `thread_local!` in a shared library uses the general-dynamic model: a call to
/// `__tls_get_addr` on every copy, and the registers saved around it). Initial-exec TLS in a
/// library loaded with dlopen takes its 8 bytes from the static TLS surplus glibc reserves for
/// such libraries (the `glibc.rtld.optional_static_tls` tunable, 512 bytes by default).
#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::hazard::{Hazard, IDLE};

    // Initialised to IDLE's address: the loader relocates the TLS image before any thread
    // gets a copy of it.
    std::arch::global_asm!(
        ".pushsection .tdata,\"awT\",@progbits",
        ".p2align 3",
        ".globl gdrapi_current_hazard",
        ".hidden gdrapi_current_hazard",
        ".type gdrapi_current_hazard, @tls_object",
        ".size gdrapi_current_hazard, 8",
        "gdrapi_current_hazard:",
        ".quad {idle}",
        ".popsection",
        idle = sym IDLE,
    );

    #[inline(always)]
    pub fn get() -> &'static Hazard {
        let hazard: *const Hazard;
        // SAFETY: reads this thread's 8-byte slot (the TLS block is mapped for every thread);
        // it holds `IDLE`'s address or a hazard that lives forever, written by `set` only.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr [rip + gdrapi_current_hazard@GOTTPOFF]",
                "mov {p}, qword ptr fs:[{p}]",
                p = out(reg) hazard,
                options(nostack, preserves_flags, readonly, pure),
            );
            &*hazard
        }
    }

    pub fn set(hazard: &'static Hazard) {
        let p = hazard as *const Hazard;
        // SAFETY: writes this thread's own slot.
        unsafe {
            std::arch::asm!(
                "mov {off}, qword ptr [rip + gdrapi_current_hazard@GOTTPOFF]",
                "mov qword ptr fs:[{off}], {p}",
                off = out(reg) _,
                p = in(reg) p,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// Elsewhere a constant-initialised cell without a destructor: one thread-local access, with
/// no lazy-initialisation state to test.
#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::super::hazard::{Hazard, IDLE};
    use std::cell::Cell;

    thread_local! {
        static CURRENT: Cell<&'static Hazard> = const { Cell::new(&IDLE) };
    }

    #[inline(always)]
    pub fn get() -> &'static Hazard {
        CURRENT.with(Cell::get)
    }

    pub fn set(hazard: &'static Hazard) {
        CURRENT.with(|c| c.set(hazard));
    }
}
