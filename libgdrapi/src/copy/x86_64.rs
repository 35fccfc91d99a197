//! x86-64 variants. SSE2 is the baseline; wider ones are enabled per function with
//! `#[target_feature]` (AVX-512 and MOVDIR64B accesses are inline assembly) and only ever
//! called after run-time detection said the CPU has them.
//!
//! Stores to the device are non-temporal (`movntdq`, `vmovntdq`, `movdir64b`): on a WC mapping
//! they fill whole write-combining lines, so PCIe sees full 64-byte writes. Loads use streaming
//! loads (`movntdqa`) where available, which fetch a WC line once instead of once per access.

use std::arch::x86_64::*;

use super::{ladder_from, ladder_to, load_fence, store_fence, Engine, Variant};

/// Preferred first. The default is the first supported entry not marked `on_request`:
/// - stores: MOVDIR64B where the CPU has it (each store is one 64-byte posted write, never split
///   or merged, whatever the write-combining buffers do), else AVX2/AVX 32-byte, else SSE
///   16-byte non-temporal stores; loads: AVX2 32-byte streaming loads, else SSE4.1 16-byte ones.
///   Stores and loads are chosen independently, as upstream GDRCopy does (MOVDIR64B has no load).
/// - AVX-512 only when `GDRCOPY_COPY_VARIANT=avx512` asks for it, on every vendor. A
///   write-combining line is 64 bytes either way, so 64-byte accesses put the same transactions
///   on PCIe as two 32-byte ones; they only save instructions. Against that: Zen 4 runs 512-bit
///   operations on its 256-bit data paths (AMD's Software Optimization Guide for Family 19h,
///   pub. 57647, "Floating-Point Unit" and "Load-Store Unit": 256-bit paths, one vector store
///   per cycle), Skylake-SP to Cooper Lake lower the core clock while 512-bit instructions run
///   (Intel's Optimization Reference Manual, "Skylake Server Power Management"), and upstream
///   GDRCopy disabled its AVX-512 path after finding SSE4.1 faster on many Intel CPUs.
pub static VARIANTS: &[Variant] = &[
    Variant {
        name: "avx512",
        to_device: avx512_to_device,
        from_device: avx512_from_device,
        store_width: 64,
        load_width: 64,
        on_request: true,
        needs: "AVX-512F and AVX2",
        supported: has_avx512,
    },
    Variant {
        name: "movdir64b",
        to_device: movdir64b_to_device,
        from_device: avx2_from_device,
        store_width: 64,
        load_width: 32,
        on_request: false,
        needs: "MOVDIR64B and AVX2",
        supported: has_movdir64b_avx2,
    },
    Variant {
        // MOVDIR64B without AVX (Tremont/Snow Ridge).
        name: "movdir64b-sse4.1",
        to_device: movdir64b_to_device,
        from_device: sse41_from_device,
        store_width: 64,
        load_width: 16,
        on_request: false,
        needs: "MOVDIR64B and SSE4.1",
        supported: has_movdir64b,
    },
    Variant {
        name: "avx2",
        to_device: avx2_to_device,
        from_device: avx2_from_device,
        store_width: 32,
        load_width: 32,
        on_request: false,
        needs: "AVX2",
        supported: has_avx2,
    },
    Variant {
        name: "avx",
        to_device: avx_to_device,
        from_device: avx_from_device,
        store_width: 32,
        load_width: 16,
        on_request: false,
        needs: "AVX and SSE4.1",
        supported: has_avx,
    },
    Variant {
        name: "sse4.1",
        to_device: sse41_to_device,
        from_device: sse41_from_device,
        store_width: 16,
        load_width: 16,
        on_request: false,
        needs: "SSE4.1",
        supported: has_sse41,
    },
    Variant {
        name: "sse2",
        to_device: sse2_to_device,
        from_device: sse2_from_device,
        store_width: 16,
        load_width: 16,
        on_request: false,
        needs: "SSE2",
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
fn has_movdir64b_avx2() -> bool {
    has_movdir64b() && has_avx2()
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
/// 64-byte direct stores (one posted 64-byte write each) on top of SSE2's 16-byte ones; the
/// loads are never used (see `movdir64b_to_device`).
struct Movdir64b;

/// Declares a bulk routine: `n` (a multiple of the width) bytes from `src` to `dst`, each
/// access one `$load` into a vector register and one `$store` from it (named as xmm, ymm or zmm
/// by the `reg` modifier: the operands are allocated as xmm registers, whose wider forms they
/// write; the compiler treats a written xmm register's wider forms as clobbered too). Four accesses per loop
/// iteration while four remain, then one at a time. Assembly rather than intrinsics: the compiler
/// unrolls these loops poorly (an address computation per non-temporal store); here each access
/// costs its two instructions, and a loop iteration `add` + `jnz` on an index that counts up
/// from minus the length to 0. Callers guarantee the device side is aligned to the width, the
/// ranges are valid, and the CPU has the instructions (the variant was detected).
macro_rules! bulk {
    ($(#[$attr:meta])* $name:ident, $load:literal, $store:literal, width = $w:literal,
     offsets = [$o1:literal, $o2:literal, $o3:literal], block = $block:literal,
     reg = $m:literal) => {
        $(#[$attr])*
        #[inline(always)]
        unsafe fn $name(dst: *mut u8, src: *const u8, n: usize) {
            let blocks = n & !($block - 1);
            if blocks != 0 {
                // SAFETY: `blocks` bytes are in range at both pointers, addressed as end + i for
                // i from -blocks to 0 in steps of the width; see the macro's contract.
                unsafe {
                    std::arch::asm!(
                        "2:",
                        concat!($load, " {v0:", $m, "}, [{s} + {i}]"),
                        concat!($load, " {v1:", $m, "}, [{s} + {i} + ", $o1, "]"),
                        concat!($load, " {v2:", $m, "}, [{s} + {i} + ", $o2, "]"),
                        concat!($load, " {v3:", $m, "}, [{s} + {i} + ", $o3, "]"),
                        concat!($store, " [{d} + {i}], {v0:", $m, "}"),
                        concat!($store, " [{d} + {i} + ", $o1, "], {v1:", $m, "}"),
                        concat!($store, " [{d} + {i} + ", $o2, "], {v2:", $m, "}"),
                        concat!($store, " [{d} + {i} + ", $o3, "], {v3:", $m, "}"),
                        concat!("add {i}, ", $block),
                        "jnz 2b",
                        s = in(reg) src.add(blocks),
                        d = in(reg) dst.add(blocks),
                        i = inout(reg) blocks.wrapping_neg() => _,
                        v0 = out(xmm_reg) _,
                        v1 = out(xmm_reg) _,
                        v2 = out(xmm_reg) _,
                        v3 = out(xmm_reg) _,
                        options(nostack),
                    );
                }
            }
            let rest = n - blocks;
            if rest != 0 {
                // SAFETY: as above, for the last `rest` bytes.
                unsafe {
                    std::arch::asm!(
                        "2:",
                        concat!($load, " {v0:", $m, "}, [{s} + {i}]"),
                        concat!($store, " [{d} + {i}], {v0:", $m, "}"),
                        concat!("add {i}, ", $w),
                        "jnz 2b",
                        s = in(reg) src.add(n),
                        d = in(reg) dst.add(n),
                        i = inout(reg) rest.wrapping_neg() => _,
                        v0 = out(xmm_reg) _,
                        options(nostack),
                    );
                }
            }
        }
    };
}

// Legacy SSE encodings for the SSE variants; VEX ones where AVX is enabled, so that no
// SSE/AVX transition occurs inside a copy.
bulk!(
    /// 16-byte non-temporal stores: the x86-64 baseline.
    sse2_store16, "movdqu", "movntdq", width = 16, offsets = [16, 32, 48], block = 64,
    reg = "x"
);
bulk!(
    /// 16-byte aligned loads: SSE2 has no streaming load.
    sse2_load16, "movdqa", "movdqu", width = 16, offsets = [16, 32, 48], block = 64,
    reg = "x"
);
bulk!(
    /// 16-byte streaming loads (SSE4.1 `movntdqa`), which fetch a WC line once.
    sse41_load16, "movntdqa", "movdqu", width = 16, offsets = [16, 32, 48], block = 64,
    reg = "x"
);
bulk!(
    /// 16-byte non-temporal stores, VEX-encoded.
    vex_store16,
    "vmovdqu",
    "vmovntdq",
    width = 16,
    offsets = [16, 32, 48],
    block = 64,
    reg = "x"
);
bulk!(
    /// 16-byte streaming loads, VEX-encoded.
    vex_load16,
    "vmovntdqa",
    "vmovdqu",
    width = 16,
    offsets = [16, 32, 48],
    block = 64,
    reg = "x"
);
bulk!(
    /// 32-byte non-temporal stores (AVX).
    avx_store32, "vmovdqu", "vmovntdq", width = 32, offsets = [32, 64, 96], block = 128,
    reg = "y"
);
bulk!(
    /// 32-byte streaming loads (AVX2 `vmovntdqa`).
    avx2_load32, "vmovntdqa", "vmovdqu", width = 32, offsets = [32, 64, 96], block = 128,
    reg = "y"
);
// The AVX-512 accesses are assembly like the rest (`_mm512_*` intrinsics and
// `#[target_feature(enable = "avx512f")]` are stable only from Rust 1.89, and the library builds
// with Debian's rustc 1.85); the entry point ends with `vzeroupper` (`zero_upper`).
bulk!(
    /// 64-byte non-temporal stores (AVX-512F).
    avx512_store64, "vmovdqu64", "vmovntdq", width = 64, offsets = [64, 128, 192], block = 256,
    reg = "z"
);
bulk!(
    /// 64-byte streaming loads (AVX-512F).
    avx512_load64, "vmovntdqa", "vmovdqu64", width = 64, offsets = [64, 128, 192], block = 256,
    reg = "z"
);

#[inline(always)]
unsafe fn movdir64b_store64(dst: *mut u8, src: *const u8, n: usize) {
    // MOVDIR64B takes its destination address in a register and its source as a memory operand:
    // with `delta = src - dst`, the source of the line at `d` is `[d + delta]`.
    let delta = (src as usize).wrapping_sub(dst as usize);
    let four_lines = n & !255;
    if four_lines != 0 {
        // SAFETY: the CPU has MOVDIR64B (checked before this variant is used); every destination
        // `dst + k` (k < four_lines, a multiple of 64) is 64-aligned as the instruction requires,
        // and 64 bytes at the matching source are readable.
        unsafe {
            std::arch::asm!(
                "2:",
                "movdir64b {d}, zmmword ptr [{d} + {delta}]",
                "lea {t}, [{d} + 64]",
                "movdir64b {t}, zmmword ptr [{t} + {delta}]",
                "lea {t}, [{d} + 128]",
                "movdir64b {t}, zmmword ptr [{t} + {delta}]",
                "lea {t}, [{d} + 192]",
                "movdir64b {t}, zmmword ptr [{t} + {delta}]",
                "add {d}, 256",
                "cmp {d}, {end}",
                "jb 2b",
                d = inout(reg) dst => _,
                t = out(reg) _,
                delta = in(reg) delta,
                end = in(reg) dst.add(four_lines),
                options(nostack),
            );
        }
    }
    let mut i = four_lines;
    while i < n {
        // SAFETY: as above, one line at `dst + i`.
        unsafe {
            std::arch::asm!(
                "movdir64b {d}, zmmword ptr [{s}]",
                d = in(reg) dst.add(i),
                s = in(reg) src.add(i),
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
    store16 = vex_store16,
    store32 = avx_store32,
    store64 = avx_store32,
    load16 = vex_load16,
    load32 = vex_load16,
    load64 = vex_load16
);
engine!(
    Avx2,
    store_max = 32,
    load_max = 32,
    store16 = vex_store16,
    store32 = avx_store32,
    store64 = avx_store32,
    load16 = vex_load16,
    load32 = avx2_load32,
    load64 = avx2_load32
);
engine!(
    Avx512,
    store_max = 64,
    load_max = 64,
    store16 = vex_store16,
    store32 = avx_store32,
    store64 = avx512_store64,
    load16 = vex_load16,
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
    ($engine:ty, $features:literal, $to:ident, $from:ident, vex = $vex:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $to(dst: *mut u8, src: *const u8, n: usize) {
            // SAFETY: forwarded caller guarantee; the variant is used only on CPUs with
            // `$features`.
            unsafe { ladder_to::<$engine>(dst, src, n) };
            if $vex {
                zero_upper();
            }
            store_fence();
        }
        #[target_feature(enable = $features)]
        unsafe fn $from(dst: *mut u8, src: *const u8, n: usize) {
            // SAFETY: as above.
            unsafe { ladder_from::<$engine>(dst, src, n) };
            if $vex {
                zero_upper();
            }
            load_fence();
        }
    };
}

/// `vzeroupper` after a copy that used ymm/zmm registers in assembly, which the compiler does
/// not see: without it the caller's next SSE instructions would pay for the dirty upper state.
#[inline(always)]
fn zero_upper() {
    // SAFETY: clears the upper halves of ymm/zmm registers, none of which holds a live value
    // here (the copy's registers were declared clobbered, and the ABI preserves none).
    unsafe { std::arch::asm!("vzeroupper", options(nostack, preserves_flags, nomem)) };
}

entry_points!(Sse2, "sse2", sse2_to_device, sse2_from_device, vex = false);
entry_points!(
    Sse41,
    "sse4.1",
    sse41_to_device,
    sse41_from_device,
    vex = false
);
entry_points!(
    Avx,
    "avx,sse4.1",
    avx_to_device,
    avx_from_device,
    vex = true
);
entry_points!(
    Avx2,
    "avx2,avx,sse4.1",
    avx2_to_device,
    avx2_from_device,
    vex = true
);
// No "avx512f" here (stable in `target_feature` only from Rust 1.89): the 64-byte accesses are
// assembly, the rest of the engine is AVX2's.
entry_points!(
    Avx512,
    "avx2,avx,sse4.1",
    avx512_to_device,
    avx512_from_device,
    vex = true
);
// MOVDIR64B writes only; its variants read with AVX2's or SSE4.1's routines.
#[target_feature(enable = "sse4.1")]
unsafe fn movdir64b_to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee; the variant is used only on CPUs with MOVDIR64B and
    // SSE4.1.
    unsafe { ladder_to::<Movdir64b>(dst, src, n) };
    store_fence();
}
