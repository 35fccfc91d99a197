//! This thread's hazard, for the copy path, where one thread-local load must do.

/// On x86-64 the hazard pointer is a thread-local variable declared in assembly and reached
/// through a TLS descriptor (`@TLSDESC`/`@TLSCALL`). Rust's `thread_local!` in a shared library
/// uses the general-dynamic model: a call to `__tls_get_addr` on every copy, and the registers
/// saved around it. The initial-exec model (one load) is cheaper still, but a single initial-exec
/// access flags the library DF_STATIC_TLS, and then its whole TLS segment (128 bytes with std's
/// own thread-locals) must come from the static TLS surplus glibc reserves for libraries loaded
/// with dlopen (`glibc.rtld.optional_static_tls`, 512 bytes by default): once other libraries
/// have used that up, dlopen fails with "cannot allocate memory in static TLS block". glibc
/// resolves a descriptor to a static offset when the surplus has room (the call is then
/// `mov rax, [rax + 8]; ret`) and to dynamic TLS when it has not.
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

    /// Runs `$access` with rax holding this thread's slot as an offset from the thread pointer
    /// (`fs:0`), found by the TLS descriptor call. The call clobbers only rax and the flags as
    /// far as the ABI goes; it pushes a return address, so the asm may not be `nostack` (the red
    /// zone below rsp is not its to use). glibc before 2.40 does not preserve the vector
    /// registers when the call takes its slow path (a thread's first access of dynamic TLS
    /// allocates the block: malloc, memset; glibc bug 31372), so they are declared clobbered,
    /// which costs nothing where none is live (the copy entry points read the hazard before they
    /// load any data).
    macro_rules! with_slot_offset {
        ($access:literal, $($operand:tt)*) => {
            std::arch::asm!(
                "lea rax, [rip + gdrapi_current_hazard@TLSDESC]",
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

    #[inline(always)]
    pub fn get() -> Option<&'static Hazard> {
        let hazard: *const Hazard;
        // SAFETY: the descriptor call returns the offset of this thread's 8-byte slot from the
        // thread pointer (glibc has the block allocated for the calling thread when the call
        // returns); the slot holds null or a pointer into the static `HAZARDS`, written by
        // `set` only.
        unsafe {
            with_slot_offset!(
                "mov rax, qword ptr fs:[rax]",
                lateout("rax") hazard,
            );
            hazard.as_ref()
        }
    }

    pub fn set(hazard: Option<&'static Hazard>) {
        let p = hazard.map_or(std::ptr::null(), |h| h as *const Hazard);
        // SAFETY: writes this thread's own slot, found as in `get`.
        unsafe {
            with_slot_offset!(
                "mov qword ptr fs:[rax], {p}",
                p = in(reg) p,
                out("rax") _,
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

    /// glibc before 2.40 does not preserve the vector registers across the call when it takes
    /// its slow path (a thread's first access of dynamic TLS allocates it: malloc, memset; glibc
    /// bug 31372): declared clobbered, which costs nothing where none is live (the copy entry
    /// points read the hazard before they load any data).
    macro_rules! clobber_vector_registers {
        () => {
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _
        };
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
