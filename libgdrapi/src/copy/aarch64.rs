//! arm64 variants. NEON (Advanced SIMD) is part of the arm64 baseline; the device side is
//! written with 16-byte `st1` and 64-byte `st1 {v0-v3}` accesses, which on a Normal-NC (write
//! combining) mapping merge into full bursts.

use std::arch::aarch64::*;

use super::{ladder_from, ladder_to, load_fence, store_fence, Engine, Variant};

pub static VARIANTS: &[Variant] = &[
    Variant {
        name: "neon",
        to_device: neon_to_device,
        from_device: neon_from_device,
        store_width: 64,
        load_width: 64,
        on_request: false,
        supported: has_neon,
    },
    super::GENERIC,
];

fn has_neon() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
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
