//! This thread's hazard, for the copy path, where one thread-local load must do.

/// On x86-64 the hazard pointer is a thread-local variable of the initial-exec model, declared in assembly
/// (Rust's `thread_local!` in a shared library uses the general-dynamic model: a call to
/// `__tls_get_addr` on every copy, and the registers saved around it). Initial-exec TLS in a
/// library loaded with dlopen takes its 8 bytes from the static TLS surplus glibc reserves for
/// such libraries (the `glibc.rtld.optional_static_tls` tunable, 512 bytes by default).
#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::Hazard;

    std::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 3",
        ".globl gdrapi_current_hazard",
        ".hidden gdrapi_current_hazard",
        ".type gdrapi_current_hazard, @tls_object",
        ".size gdrapi_current_hazard, 8",
        "gdrapi_current_hazard:",
        ".zero 8",
        ".popsection",
    );

    #[inline(always)]
    pub fn get() -> Option<&'static Hazard> {
        let hazard: *const Hazard;
        // SAFETY: reads this thread's 8-byte slot (the TLS block is mapped for every thread);
        // it holds null or a pointer into the static `HAZARDS`, written by `set` only.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr [rip + gdrapi_current_hazard@GOTTPOFF]",
                "mov {p}, qword ptr fs:[{p}]",
                p = out(reg) hazard,
                options(nostack, preserves_flags, readonly, pure),
            );
            hazard.as_ref()
        }
    }

    pub fn set(hazard: Option<&'static Hazard>) {
        let p = hazard.map_or(std::ptr::null(), |h| h as *const Hazard);
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
    use super::super::Hazard;
    use std::cell::Cell;

    thread_local! {
        static CURRENT: Cell<Option<&'static Hazard>> = const { Cell::new(None) };
    }

    #[inline(always)]
    pub fn get() -> Option<&'static Hazard> {
        CURRENT.with(Cell::get)
    }

    pub fn set(hazard: Option<&'static Hazard>) {
        CURRENT.with(|c| c.set(hazard));
    }
}

pub use imp::{get, set};
