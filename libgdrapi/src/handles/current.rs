//! This thread's hazard, for the copy path, where one thread-local load must do.
//!
//! A thread without a hazard of its own on the fast path points at `IDLE`, a hazard that is
//! always busy: the copy path's one test of its hazard's announcement ("busy?") then also
//! sends such a thread to the cold path, with no test for null.

use super::hazard::{Hazard, IDLE};

/// This thread's hazard on the fast path, if it has one. Cold paths only.
pub fn get() -> Option<&'static Hazard> {
    let hazard = imp::get();
    (!std::ptr::eq(hazard, &IDLE)).then_some(hazard)
}

/// Installs (or, with None, removes) this thread's hazard for the fast path.
pub fn set(hazard: Option<&'static Hazard>) {
    imp::set(hazard.unwrap_or(&IDLE));
}

pub use imp::fast;

/// On x86-64 the hazard pointer is a thread-local variable declared in assembly. Rust's
/// `thread_local!` in a shared library uses the general-dynamic model: a call to
/// `__tls_get_addr` on every copy, and the registers saved around it. The initial-exec model
/// (one load) is cheaper, but a single initial-exec access flags the library DF_STATIC_TLS, and
/// then its whole TLS segment (128 bytes with std's own thread-locals) must come from the static
/// TLS surplus glibc reserves for libraries loaded with dlopen
/// (`glibc.rtld.optional_static_tls`, 512 bytes by default): once other libraries have used
/// that up, dlopen fails with "cannot allocate memory in static TLS block".
///
/// So the variable is reached through a TLS descriptor (`@TLSDESC`/`@TLSCALL`), which glibc
/// resolves to a static offset when the surplus has room and to dynamic TLS when it has not;
/// and the copy path does not even make the descriptor's call. When the variable is in static
/// TLS, its offset from the thread pointer is the same in every thread: [`fast`] reads it from
/// `STATIC_OFFSET` (learnt at a thread's first copy), which is the initial-exec model's one
/// load. Otherwise the offset stays 0, and `fs:[0]` is the thread pointer itself (the x86-64 TLS
/// ABI keeps the TCB's own address in its first word), a "hazard" whose announcement is never
/// 0: busy, so every copy takes the cold path, which finds the hazard through `thread_local!`.
#[cfg(target_arch = "x86_64")]
mod imp {
    use std::sync::atomic::{AtomicIsize, Ordering};

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

    /// The slot's offset from the thread pointer when it is in static TLS, else 0.
    static STATIC_OFFSET: AtomicIsize = AtomicIsize::new(0);

    /// Runs `$access` with rax holding this thread's slot as an offset from the thread pointer
    /// (`fs:0`), found by the TLS descriptor call. The call clobbers only rax and the flags as
    /// far as the ABI goes; it pushes a return address, so the asm may not be `nostack` (the red
    /// zone below rsp is not its to use). glibc before 2.40 does not preserve the vector
    /// registers when the call takes its slow path (a thread's first access of dynamic TLS
    /// allocates the block: malloc, memset; glibc bug 31372), so they are declared clobbered.
    /// Between `lea` and `call`, `$between` may copy rax (the descriptor's address; when the
    /// linker relaxed the sequence in an executable, the offset itself).
    macro_rules! with_slot_offset {
        ($between:literal, $access:literal, $($operand:tt)*) => {
            std::arch::asm!(
                "lea rax, [rip + gdrapi_current_hazard@TLSDESC]",
                $between,
                "call qword ptr [rax + gdrapi_current_hazard@TLSCALL]",
                $access,
                $($operand)*
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            )
        };
    }

    /// The copy path's view of this thread's hazard: the hazard, `IDLE`, or (no static offset)
    /// the thread's TCB. Its first word is 0 only for a hazard of this thread that is free.
    #[inline(always)]
    pub fn fast() -> *const Hazard {
        let offset = STATIC_OFFSET.load(Ordering::Relaxed);
        let hazard: *const Hazard;
        // SAFETY: `fs:[offset]` is this thread's slot (static TLS, the same offset in every
        // thread) or, for offset 0, the TCB's pointer to itself; both are mapped and readable.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr fs:[{p}]",
                p = inout(reg) offset => hazard,
                options(nostack, preserves_flags, readonly, pure),
            );
        }
        hazard
    }

    pub fn get() -> &'static Hazard {
        let hazard: *const Hazard;
        // SAFETY: the descriptor call returns the offset of this thread's 8-byte slot from the
        // thread pointer (glibc has the block allocated for the calling thread when the call
        // returns); the slot holds `IDLE`'s address or a hazard that lives forever, written by
        // `set` only.
        unsafe {
            with_slot_offset!("", "mov rax, qword ptr fs:[rax]", lateout("rax") hazard,);
            &*hazard
        }
    }

    pub fn set(hazard: &'static Hazard) {
        learn_static_offset();
        let p = hazard as *const Hazard;
        // SAFETY: writes this thread's own slot, found as in `get`.
        unsafe {
            with_slot_offset!("", "mov qword ptr fs:[rax], {p}", p = in(reg) p, out("rax") _,);
        }
    }

    /// Sets `STATIC_OFFSET` if the slot is in static TLS: when the descriptor resolved to glibc's
    /// static-TLS function (which returns the descriptor's argument, the offset), or when the
    /// linker relaxed the sequence in an executable (`lea` then yields the offset itself).
    fn learn_static_offset() {
        if STATIC_OFFSET.load(Ordering::Relaxed) != 0 {
            return;
        }
        let (descriptor, offset): (isize, isize);
        // SAFETY: as in `get`; rax is copied out between the `lea` and the call.
        unsafe {
            with_slot_offset!(
                "mov {d}, rax",
                "",
                d = out(reg) descriptor,
                lateout("rax") offset,
            );
        }
        let is_static = descriptor == offset || {
            // SAFETY: not relaxed, so `descriptor` is the address of the two-word descriptor in
            // the GOT (function, argument), resolved by the call above.
            let argument = unsafe { (descriptor as *const isize).add(1).read_volatile() };
            argument == offset
        };
        if is_static && offset != 0 {
            STATIC_OFFSET.store(offset, Ordering::Relaxed);
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
    pub fn fast() -> *const Hazard {
        CURRENT.with(Cell::get)
    }

    pub fn get() -> &'static Hazard {
        CURRENT.with(Cell::get)
    }

    pub fn set(hazard: &'static Hazard) {
        CURRENT.with(|c| c.set(hazard));
    }
}
