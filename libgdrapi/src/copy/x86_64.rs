//! x86-64 variants. SSE2 is the baseline; wider ones are enabled per function with
//! `#[target_feature]` (AVX-512 and MOVDIR64B accesses are inline assembly) and only ever
//! called after run-time detection said the CPU has them.
//!
//! Stores to the device are non-temporal (`movntdq`, `vmovntdq`, `movdir64b`): on a WC mapping
//! they fill whole write-combining lines, so PCIe sees full 64-byte writes. Loads use streaming
//! loads (`movntdqa`) where available, which fetch a WC line once instead of once per access.

use std::arch::x86_64::*;

use super::{from_device, load_fence, store_fence, to_device, Engine, Variant};

/// Preferred first: the first supported entry is the default.
pub static VARIANTS: &[Variant] = &[
    Variant {
        name: "avx512",
        to_device: avx512_to_device,
        from_device: avx512_from_device,
        store_width: 64,
        load_width: 64,
        supported: has_avx512,
    },
    Variant {
        name: "movdir64b",
        to_device: movdir64b_to_device,
        from_device: movdir64b_from_device,
        store_width: 64,
        load_width: 16,
        supported: has_movdir64b,
    },
    Variant {
        name: "avx2",
        to_device: avx2_to_device,
        from_device: avx2_from_device,
        store_width: 32,
        load_width: 32,
        supported: has_avx2,
    },
    Variant {
        name: "avx",
        to_device: avx_to_device,
        from_device: avx_from_device,
        store_width: 32,
        load_width: 16,
        supported: has_avx,
    },
    Variant {
        name: "sse4.1",
        to_device: sse41_to_device,
        from_device: sse41_from_device,
        store_width: 16,
        load_width: 16,
        supported: has_sse41,
    },
    Variant {
        name: "sse2",
        to_device: sse2_to_device,
        from_device: sse2_from_device,
        store_width: 16,
        load_width: 16,
        supported: has_sse2,
    },
    super::GENERIC,
];

// std's detection checks both CPUID and that the OS saves the wider register state (XCR0).
fn has_sse2() -> bool {
    true
}
fn has_sse41() -> bool {
    is_x86_feature_detected!("sse4.1")
}
fn has_avx() -> bool {
    has_sse41() && is_x86_feature_detected!("avx")
}
fn has_avx2() -> bool {
    has_avx() && is_x86_feature_detected!("avx2")
}
fn has_avx512() -> bool {
    has_avx2() && is_x86_feature_detected!("avx512f")
}
fn has_movdir64b() -> bool {
    // CPUID.(EAX=7,ECX=0):ECX bit 28. MOVDIR64B needs no OS-saved state.
    // `__cpuid_count` is still an unsafe fn in Rust 1.85 (Debian's, the oldest this builds
    // with) and safe in newer ones: the block is needed there and unused here.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read-only and has no preconditions.
    let leaf7 = unsafe { __cpuid_count(7, 0) };
    has_sse41() && leaf7.ecx & (1 << 28) != 0
}

/// 16-byte non-temporal stores and plain aligned loads: the x86-64 baseline.
struct Sse2;
/// Adds streaming 16-byte loads.
struct Sse41;
/// Adds 32-byte non-temporal stores.
struct Avx;
/// Adds 32-byte streaming loads.
struct Avx2;
/// Adds 64-byte non-temporal stores and streaming loads.
struct Avx512;
/// 64-byte direct stores (one posted 64-byte write each) on top of SSE4.1.
struct Movdir64b;

#[inline(always)]
unsafe fn sse2_store16(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: `dst + i` is 16-aligned and in range; `src + i` may be unaligned.
        unsafe {
            let v = _mm_loadu_si128(src.add(i).cast());
            _mm_stream_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

#[inline(always)]
unsafe fn sse2_load16(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: `src + i` is 16-aligned and in range; `dst + i` may be unaligned.
        unsafe {
            let v = _mm_load_si128(src.add(i).cast());
            _mm_storeu_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

#[target_feature(enable = "sse4.1")]
#[inline]
unsafe fn sse41_load16(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: `src + i` is 16-aligned and in range; `dst + i` may be unaligned.
        unsafe {
            let v = _mm_stream_load_si128(src.add(i).cast());
            _mm_storeu_si128(dst.add(i).cast(), v);
        }
        i += 16;
    }
}

#[target_feature(enable = "avx")]
#[inline]
unsafe fn avx_store32(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: `dst + i` is 32-aligned and in range; `src + i` may be unaligned.
        unsafe {
            let v = _mm256_loadu_si256(src.add(i).cast());
            _mm256_stream_si256(dst.add(i).cast(), v);
        }
        i += 32;
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_load32(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: `src + i` is 32-aligned and in range; `dst + i` may be unaligned.
        unsafe {
            let v = _mm256_stream_load_si256(src.add(i).cast());
            _mm256_storeu_si256(dst.add(i).cast(), v);
        }
        i += 32;
    }
}

// The AVX-512 accesses are inline assembly, not `_mm512_*` intrinsics: those and
// `#[target_feature(enable = "avx512f")]` are stable only from Rust 1.89, and the library builds
// with Debian's rustc 1.85. The assembler takes the instructions whatever the enclosing
// function's features (as `movdir64b` below); the variant runs only where `avx512f` was
// detected. `zmm0` is declared clobbered; the entry point also uses ymm registers (the 32-byte
// steps), so the compiler ends it with `vzeroupper`, which clears the upper state this dirties.

#[inline(always)]
unsafe fn avx512_store64(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: the CPU has AVX-512F (checked before this variant is used); `dst + i` is
        // 64-aligned and 64 bytes are in range at both pointers; `src + i` may be unaligned
        // (`vmovdqu64`). Only zmm0 is written, and it is declared.
        unsafe {
            std::arch::asm!(
                "vmovdqu64 zmm0, [{src}]",
                "vmovntdq [{dst}], zmm0",
                src = in(reg) src.add(i),
                dst = in(reg) dst.add(i),
                out("zmm0") _,
                options(nostack, preserves_flags),
            );
        }
        i += 64;
    }
}

#[inline(always)]
unsafe fn avx512_load64(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: as `avx512_store64`, with `src + i` the 64-aligned side (`vmovntdqa` requires
        // it) and `dst + i` possibly unaligned (`vmovdqu64`).
        unsafe {
            std::arch::asm!(
                "vmovntdqa zmm0, [{src}]",
                "vmovdqu64 [{dst}], zmm0",
                src = in(reg) src.add(i),
                dst = in(reg) dst.add(i),
                out("zmm0") _,
                options(nostack, preserves_flags),
            );
        }
        i += 64;
    }
}

#[inline(always)]
unsafe fn movdir64b_store64(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i < n {
        // SAFETY: the CPU has MOVDIR64B (checked before this variant is used); `dst + i` is
        // 64-aligned as the instruction requires and 64 bytes at `src + i` are readable. The
        // instruction is emitted as bytes (`movdir64b rax, [rdx]`) so that no assembler support
        // for it is required.
        unsafe {
            std::arch::asm!(
                ".byte 0x66, 0x0f, 0x38, 0xf8, 0x02",
                in("rax") dst.add(i),
                in("rdx") src.add(i),
                options(nostack, preserves_flags),
            );
        }
        i += 64;
    }
}

/// Declares an engine from its access functions; unused widths are never called because the
/// engine's `*_MAX` constants exclude them.
macro_rules! engine {
    ($ty:ty, store_max = $smax:expr, load_max = $lmax:expr,
     store16 = $s16:path, store32 = $s32:path, store64 = $s64:path,
     load16 = $l16:path, load32 = $l32:path, load64 = $l64:path) => {
        impl Engine for $ty {
            const STORE_MAX: usize = $smax;
            const LOAD_MAX: usize = $lmax;
            #[inline(always)]
            unsafe fn store16(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: forwarded engine contract; the feature was detected.
                unsafe { $s16(dst, src, n) }
            }
            #[inline(always)]
            unsafe fn store32(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: as above.
                unsafe { $s32(dst, src, n) }
            }
            #[inline(always)]
            unsafe fn store64(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: as above.
                unsafe { $s64(dst, src, n) }
            }
            #[inline(always)]
            unsafe fn load16(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: as above.
                unsafe { $l16(dst, src, n) }
            }
            #[inline(always)]
            unsafe fn load32(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: as above.
                unsafe { $l32(dst, src, n) }
            }
            #[inline(always)]
            unsafe fn load64(dst: *mut u8, src: *const u8, n: usize) {
                // SAFETY: as above.
                unsafe { $l64(dst, src, n) }
            }
        }
    };
}

engine!(
    Sse2,
    store_max = 16,
    load_max = 16,
    store16 = sse2_store16,
    store32 = sse2_store16,
    store64 = sse2_store16,
    load16 = sse2_load16,
    load32 = sse2_load16,
    load64 = sse2_load16
);
engine!(
    Sse41,
    store_max = 16,
    load_max = 16,
    store16 = sse2_store16,
    store32 = sse2_store16,
    store64 = sse2_store16,
    load16 = sse41_load16,
    load32 = sse41_load16,
    load64 = sse41_load16
);
engine!(
    Avx,
    store_max = 32,
    load_max = 16,
    store16 = sse2_store16,
    store32 = avx_store32,
    store64 = avx_store32,
    load16 = sse41_load16,
    load32 = sse41_load16,
    load64 = sse41_load16
);
engine!(
    Avx2,
    store_max = 32,
    load_max = 32,
    store16 = sse2_store16,
    store32 = avx_store32,
    store64 = avx_store32,
    load16 = sse41_load16,
    load32 = avx2_load32,
    load64 = avx2_load32
);
engine!(
    Avx512,
    store_max = 64,
    load_max = 64,
    store16 = sse2_store16,
    store32 = avx_store32,
    store64 = avx512_store64,
    load16 = sse41_load16,
    load32 = avx2_load32,
    load64 = avx512_load64
);
engine!(
    Movdir64b,
    store_max = 64,
    load_max = 16,
    store16 = sse2_store16,
    store32 = sse2_store16,
    store64 = movdir64b_store64,
    load16 = sse41_load16,
    load32 = sse41_load16,
    load64 = sse41_load16
);

/// Entry points: each enables its variant's features so the engine's accesses inline into one
/// straight-line routine, then fences.
macro_rules! entry_points {
    ($engine:ty, $features:literal, $to:ident, $from:ident) => {
        #[target_feature(enable = $features)]
        unsafe fn $to(dst: *mut u8, src: *const u8, n: usize) {
            // SAFETY: forwarded caller guarantee; the variant is used only on CPUs with
            // `$features`.
            unsafe { to_device::<$engine>(dst, src, n) };
            store_fence();
        }
        #[target_feature(enable = $features)]
        unsafe fn $from(dst: *mut u8, src: *const u8, n: usize) {
            // SAFETY: as above.
            unsafe { from_device::<$engine>(dst, src, n) };
            load_fence();
        }
    };
}

entry_points!(Sse2, "sse2", sse2_to_device, sse2_from_device);
entry_points!(Sse41, "sse4.1", sse41_to_device, sse41_from_device);
entry_points!(Avx, "avx,sse4.1", avx_to_device, avx_from_device);
entry_points!(Avx2, "avx2,avx,sse4.1", avx2_to_device, avx2_from_device);
// No "avx512f" here (stable in `target_feature` only from Rust 1.89): the 64-byte accesses are
// assembly, the rest of the engine is AVX2's.
entry_points!(
    Avx512,
    "avx2,avx,sse4.1",
    avx512_to_device,
    avx512_from_device
);
entry_points!(
    Movdir64b,
    "sse4.1",
    movdir64b_to_device,
    movdir64b_from_device
);
