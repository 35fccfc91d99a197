//! arm64 variants. NEON (Advanced SIMD) is part of the arm64 baseline; the device side is
//! written with 16-byte `st1` and 64-byte `st1 {v0-v3}` accesses, which on a Normal-NC (write
//! combining) mapping merge into full bursts.
//!
//! Where the CPU has FEAT_LS64, the 64-byte accesses are instead `st64b` and `ld64b`: one
//! single-copy-atomic 64-byte store or load each, which reaches the device as one 64-byte access
//! where the platform carries them, never split or merged (as MOVDIR64B on x86). As upstream
//! GDRCopy 2.6 does, they copy the mapping's 64-byte-aligned 64-byte blocks, in both
//! directions; the alignment head and the tail stay NEON and small accesses. They are meant for
//! Device and Normal Non-cacheable memory (a write-combining mapping is the latter on arm64) and
//! may fault on other memory: DEVICE mappings never get them (uncached.rs), and the module
//! refuses cacheable ones. A platform whose path to the GPU refuses them can set `GDRCOPY_COPY_VARIANT=neon`.

use std::arch::aarch64::*;
use std::arch::asm;

use super::{ladder_from, ladder_to, load_fence, store_fence, Engine, Variant};

/// Preferred first; the default is the first supported entry (none is kept for requests).
pub static VARIANTS: &[Variant] = &[
    Variant {
        name: "ls64",
        to_device: ls64_to_device,
        from_device: ls64_from_device,
        store_width: 64,
        load_width: 64,
        on_request: false,
        needs: "FEAT_LS64 (HWCAP3_LS64 in AT_HWCAP3) and NEON",
        supported: has_ls64,
    },
    Variant {
        name: "neon",
        to_device: neon_to_device,
        from_device: neon_from_device,
        store_width: 64,
        load_width: 64,
        on_request: false,
        needs: "NEON (asimd in AT_HWCAP)",
        supported: has_neon,
    },
    super::GENERIC,
];

fn has_neon() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

/// `HWCAP3_LS64`: FEAT_LS64 (`ID_AA64ISAR1_EL1.LS64`) in the auxiliary vector's
/// `AT_HWCAP3` entry (Linux's arch/arm64/include/uapi/asm/hwcap.h). std's feature detection
/// does not know it. Kernels older than the entry give 0 for `AT_HWCAP3`: no LS64.
const HWCAP3_LS64: u64 = 1 << 3;

fn has_ls64() -> bool {
    has_neon() && hwcap3() & HWCAP3_LS64 != 0
}

/// The auxiliary vector's `AT_HWCAP3`; in this crate's tests, what the test set for the thread.
fn hwcap3() -> u64 {
    #[cfg(test)]
    if let Some(fake) = fake_hwcap3::get() {
        return fake;
    }
    // SAFETY: getauxval has no preconditions; an absent entry reads as 0.
    unsafe { libc::getauxval(libc::AT_HWCAP3) }
}

/// A per-thread `AT_HWCAP3` for the selection tests (tests run in parallel threads).
#[cfg(test)]
pub(super) mod fake_hwcap3 {
    use std::cell::Cell;

    thread_local!(static FAKE: Cell<Option<u64>> = const { Cell::new(None) });

    pub fn get() -> Option<u64> {
        FAKE.with(Cell::get)
    }

    /// Makes `hwcap3()` return `value` on this thread (`None`: the real one).
    pub fn set(value: Option<u64>) {
        FAKE.with(|f| f.set(value));
    }
}

struct Neon;

impl Engine for Neon {
    const STORE_MAX: usize = 64;
    const LOAD_MAX: usize = 64;

    #[inline(always)]
    unsafe fn store16(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: `dst + i` is 16-aligned and in range; NEON loads accept any alignment.
            unsafe { vst1q_u8(dst.add(i), vld1q_u8(src.add(i))) };
            i += 16;
        }
    }

    #[inline(always)]
    unsafe fn store32(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract; two 16-byte stores per 32 bytes.
        unsafe { Self::store16(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn store64(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: `dst + i` is 64-aligned and 64 bytes are in range at both pointers.
            unsafe { vst1q_u8_x4(dst.add(i), vld1q_u8_x4(src.add(i))) };
            i += 64;
        }
    }

    #[inline(always)]
    unsafe fn load16(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: `src + i` is 16-aligned and in range.
            unsafe { vst1q_u8(dst.add(i), vld1q_u8(src.add(i))) };
            i += 16;
        }
    }

    #[inline(always)]
    unsafe fn load32(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { Self::load16(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn load64(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: `src + i` is 64-aligned and 64 bytes are in range at both pointers.
            unsafe { vst1q_u8_x4(dst.add(i), vld1q_u8_x4(src.add(i))) };
            i += 64;
        }
    }
}

#[target_feature(enable = "neon")]
unsafe fn neon_to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee; NEON was detected.
    unsafe { ladder_to::<Neon>(dst, src, n) };
    store_fence();
}

#[target_feature(enable = "neon")]
unsafe fn neon_from_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee; NEON was detected.
    unsafe { ladder_from::<Neon>(dst, src, n) };
    load_fence();
}

/// NEON's 16- and 32-byte accesses, and `st64b`/`ld64b` for the 64-byte-aligned blocks.
struct Ls64;

impl Engine for Ls64 {
    const STORE_MAX: usize = 64;
    const LOAD_MAX: usize = 64;

    #[inline(always)]
    unsafe fn store16(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { Neon::store16(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn store32(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { Neon::store32(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn store64(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: `dst + i` is 64-aligned and 64 bytes are in range at both pointers; the
            // variant is used only where the CPU has FEAT_LS64.
            unsafe { st64b(dst.add(i), src.add(i)) };
            i += 64;
        }
    }

    #[inline(always)]
    unsafe fn load16(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { Neon::load16(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn load32(dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded contract.
        unsafe { Neon::load32(dst, src, n) }
    }

    #[inline(always)]
    unsafe fn load64(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: as in `store64`, with the device side being `src`.
            unsafe { ld64b(dst.add(i), src.add(i)) };
            i += 64;
        }
    }
}

// Rust has no `ls64` target feature (rustc rejects `#[target_feature(enable = "ls64")]`), so
// the assembler is told per statement with `.arch_extension ls64`, which LLVM's assembler knows
// (as GNU as does); the mnemonics stay readable, unlike `.inst` encodings, and the address
// register stays the compiler's choice. The eight data registers must be consecutive from an
// even one: explicit operands x0–x7.

/// One `st64b`: the 64 bytes at `src` (any alignment) to `dst` as one single-copy-atomic store.
///
/// # Safety
/// `dst` is 64-aligned with 64 writable bytes, `src` has 64 readable bytes, the CPU has
/// FEAT_LS64.
#[inline(always)]
unsafe fn st64b(dst: *mut u8, src: *const u8) {
    // SAFETY: the caller's range holds 64 bytes at `src`; any alignment.
    let w = unsafe { src.cast::<[u64; 8]>().read_unaligned() };
    // SAFETY: the caller guarantees the alignment, the range and the feature; the statement
    // writes only those 64 bytes and no register besides its inputs' (none is changed).
    unsafe {
        asm!(
            ".arch_extension ls64",
            "st64b x0, [{dst}]",
            dst = in(reg) dst,
            in("x0") w[0], in("x1") w[1], in("x2") w[2], in("x3") w[3],
            in("x4") w[4], in("x5") w[5], in("x6") w[6], in("x7") w[7],
            options(nostack, preserves_flags),
        )
    };
}

/// One `ld64b`: the 64 bytes at `src` as one single-copy-atomic load, stored to `dst` (any
/// alignment).
///
/// # Safety
/// `src` is 64-aligned with 64 readable bytes, `dst` has 64 writable bytes, the CPU has
/// FEAT_LS64.
#[inline(always)]
unsafe fn ld64b(dst: *mut u8, src: *const u8) {
    let (w0, w1, w2, w3, w4, w5, w6, w7): (u64, u64, u64, u64, u64, u64, u64, u64);
    // SAFETY: the caller guarantees the alignment, the range and the feature; the statement
    // reads only those 64 bytes and writes only x0–x7, its outputs.
    unsafe {
        asm!(
            ".arch_extension ls64",
            "ld64b x0, [{src}]",
            src = in(reg) src,
            out("x0") w0, out("x1") w1, out("x2") w2, out("x3") w3,
            out("x4") w4, out("x5") w5, out("x6") w6, out("x7") w7,
            options(nostack, preserves_flags),
        )
    };
    let w = [w0, w1, w2, w3, w4, w5, w6, w7];
    // SAFETY: the caller's range holds 64 writable bytes at `dst`; any alignment.
    unsafe { dst.cast::<[u64; 8]>().write_unaligned(w) };
}

#[target_feature(enable = "neon")]
unsafe fn ls64_to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee; LS64 (and NEON) were detected.
    unsafe { ladder_to::<Ls64>(dst, src, n) };
    store_fence();
}

#[target_feature(enable = "neon")]
unsafe fn ls64_from_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee; LS64 (and NEON) were detected.
    unsafe { ladder_from::<Ls64>(dst, src, n) };
    load_fence();
}

#[cfg(test)]
pub(super) mod ls64_tests;
