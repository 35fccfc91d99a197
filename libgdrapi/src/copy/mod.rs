//! Copies between host memory and a device mapping.
//!
//! Device memory is touched only with naturally aligned accesses of 1, 2, 4, 8, 16, 32 or 64
//! bytes; libc memcpy is never used on it, because BAR writes of odd sizes or alignments can be
//! split or refused by the PCIe path, and reads have side effects on some devices. One engine
//! (`ladder_to`/`ladder_from`) walks the alignment ladder; each CPU variant plugs in the widest
//! stores and loads it has. Copies of fewer than 16 bytes never need them: [`to_device`] and
//! [`from_device`] do those inline (the same accesses every variant would make) and hand larger
//! ones to the selected variant through a function pointer that resolves itself on first use.
//!
//! The variant is chosen once, from CPU feature flags only (never the vendor string: Hygon CPUs
//! report `HygonGenuine`); `GDRCOPY_COPY_VARIANT` can force one. Stores and loads are chosen
//! independently: the default is the first supported entry of the architecture's list that is not
//! marked `on_request` (see x86_64.rs for the rule there; on arm64, aarch64.rs: LS64 where
//! `AT_HWCAP3` advertises it, else NEON). DEVICE (uncached) mappings are copied
//! with the generic variant's small accesses whatever the variant (see uncached.rs).
//!
//! Every copy ends with a fence: write-combined stores and loads from WC memory are weakly
//! ordered, and the caller expects the data to be on its way (or in hand) when the call returns.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod select;
mod uncached;
#[cfg(target_arch = "x86_64")]
mod x86_64;

/// Copies `n` bytes; the device side is the mapping. Callers guarantee both ranges are valid.
pub type CopyFn = unsafe fn(dst: *mut u8, src: *const u8, n: usize);

/// One way of copying, available on CPUs that have the features it needs.
pub struct Variant {
    /// The name `GDRCOPY_COPY_VARIANT` selects it by.
    pub name: &'static str,
    /// Host → device, followed by a store fence.
    pub to_device: CopyFn,
    /// Device → host, followed by a fence that orders the loads.
    pub from_device: CopyFn,
    /// Widest device-side store and load, in bytes.
    pub store_width: usize,
    pub load_width: usize,
    /// Used only when `GDRCOPY_COPY_VARIANT` names it, never by default.
    pub on_request: bool,
    /// What the CPU must offer, for people (the doctor names it when the CPU lacks it).
    pub needs: &'static str,
    supported: fn() -> bool,
}

impl Variant {
    pub fn is_supported(&self) -> bool {
        (self.supported)()
    }
}

pub(crate) use uncached::{register as register_uncached, Registration as UncachedRegistration};

/// Environment variable that forces a variant by name (for benchmarks and tests).
pub const VARIANT_ENV: &str = "GDRCOPY_COPY_VARIANT";

/// Every variant compiled for this architecture, preferred first.
pub fn variants() -> &'static [Variant] {
    #[cfg(target_arch = "x86_64")]
    {
        x86_64::VARIANTS
    }
    #[cfg(target_arch = "aarch64")]
    {
        aarch64::VARIANTS
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        &[GENERIC]
    }
}

/// The portable variant: 1–8 byte volatile accesses and a full fence. Always supported.
pub const GENERIC: Variant = Variant {
    name: "generic",
    to_device: generic_to_device,
    from_device: generic_from_device,
    store_width: 8,
    load_width: 8,
    on_request: false,
    needs: "nothing",
    supported: always,
};

fn always() -> bool {
    true
}

pub use select::default_variant;
use select::select;

static SELECTED: OnceLock<&'static Variant> = OnceLock::new();

/// The variant in use by this process, chosen on first call.
pub fn selected() -> &'static Variant {
    SELECTED.get_or_init(select)
}

/// The selected variant's routines, or until the first copy the resolvers that select it. A
/// copy costs one load and an indirect call, with no "initialised?" test.
static TO_DEVICE: AtomicPtr<()> = AtomicPtr::new(resolve_to_device as *mut ());
static FROM_DEVICE: AtomicPtr<()> = AtomicPtr::new(resolve_from_device as *mut ());

// A resolver replaces only itself: the routines that check for DEVICE mappings, once installed
// (`uncached`), stay.
unsafe fn resolve_to_device(dst: *mut u8, src: *const u8, n: usize) {
    let f = selected().to_device;
    let _ = TO_DEVICE.compare_exchange(
        resolve_to_device as *mut (),
        f as *mut (),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    // SAFETY: forwarded caller guarantee.
    unsafe { f(dst, src, n) }
}

unsafe fn resolve_from_device(dst: *mut u8, src: *const u8, n: usize) {
    let f = selected().from_device;
    let _ = FROM_DEVICE.compare_exchange(
        resolve_from_device as *mut (),
        f as *mut (),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    // SAFETY: forwarded caller guarantee.
    unsafe { f(dst, src, n) }
}

/// The routine a dispatch pointer holds.
#[inline(always)]
fn routine(slot: &AtomicPtr<()>) -> CopyFn {
    // A relaxed load suffices: the pointer is either a resolver or a routine, both valid, and a
    // routine depends on nothing the resolver wrote besides the pointer itself.
    let f = slot.load(Ordering::Relaxed);
    // SAFETY: the slot only ever holds `CopyFn`s (its initial resolver or a variant's routine),
    // stored as data pointers of the same size.
    unsafe { std::mem::transmute::<*mut (), CopyFn>(f) }
}

/// Copies shorter than this are made inline, without SIMD registers or an indirect call.
pub(crate) const INLINE_BELOW: usize = 16;

/// [`INLINE_BELOW`], for the tools that measure the copies (a function, so that the C header
/// generator, which exports public constants, leaves it out of gdrapi.h).
pub fn inline_below() -> usize {
    INLINE_BELOW
}

/// Copies `n` bytes from host memory at `src` to the device mapping at `dst`, then fences.
///
/// # Safety
/// `dst` is valid for `n` bytes inside a live device mapping, `src` readable for `n` bytes.
#[inline(always)]
pub unsafe fn to_device(dst: *mut u8, src: *const u8, n: usize) {
    if n < INLINE_BELOW {
        // SAFETY: forwarded caller guarantee.
        unsafe { small_to_device(dst, src, n) };
        store_fence();
    } else {
        // SAFETY: forwarded caller guarantee; the routine fences.
        unsafe { routine(&TO_DEVICE)(dst, src, n) }
    }
}

/// Copies `n` bytes from the device mapping at `src` to host memory at `dst`, then fences.
///
/// # Safety
/// `src` is valid for `n` bytes inside a live device mapping, `dst` writable for `n` bytes.
#[inline(always)]
pub unsafe fn from_device(dst: *mut u8, src: *const u8, n: usize) {
    if n < INLINE_BELOW {
        // SAFETY: forwarded caller guarantee.
        unsafe { small_from_device(dst, src, n) };
        load_fence();
    } else {
        // SAFETY: forwarded caller guarantee; the routine fences.
        unsafe { routine(&FROM_DEVICE)(dst, src, n) }
    }
}

/// What a CPU variant contributes: its wide accesses. `dst`/`src` of the device side are aligned
/// to the width and `n` is a non-zero multiple of it.
pub(crate) trait Engine {
    /// Widest device-side access (16, 32 or 64); 8 means only the small accesses exist.
    const STORE_MAX: usize;
    const LOAD_MAX: usize;
    unsafe fn store16(dst: *mut u8, src: *const u8, n: usize);
    unsafe fn store32(dst: *mut u8, src: *const u8, n: usize);
    unsafe fn store64(dst: *mut u8, src: *const u8, n: usize);
    unsafe fn load16(dst: *mut u8, src: *const u8, n: usize);
    unsafe fn load32(dst: *mut u8, src: *const u8, n: usize);
    unsafe fn load64(dst: *mut u8, src: *const u8, n: usize);
}

/// Width of the widest naturally aligned access (≤ 8) at `addr` that fits in `n` (> 0) bytes.
#[inline(always)]
fn small_width(addr: usize, n: usize) -> usize {
    let align = 1usize << addr.trailing_zeros().min(3);
    let fit = 1usize << (usize::BITS - 1 - n.leading_zeros()).min(3);
    align.min(fit)
}

/// Walks fewer than 16 bytes at device address `device` in naturally aligned steps: 1, 2 and 4
/// bytes up to 8-byte alignment, one 8-byte step, then 4, 2 and 1 for what is left. `access`
/// gets (offset, width). Cheaper than `small_width`'s loop for the sizes where every
/// instruction counts (an aligned 1–8 byte copy is one access after three tests).
#[inline(always)]
fn small_ladder(device: usize, n: usize, mut access: impl FnMut(usize, usize)) {
    let (mut off, mut left) = (0, n);
    for width in [1, 2, 4] {
        if (device + off) & width != 0 && left >= width {
            access(off, width);
            (off, left) = (off + width, left - width);
        }
    }
    // Now the address is 8-aligned, or fewer bytes are left than the next step needs.
    if left >= 8 {
        access(off, 8);
        (off, left) = (off + 8, left - 8);
    }
    for width in [4, 2, 1] {
        if left & width != 0 {
            access(off, width);
            off += width;
        }
    }
}

/// Whether `n` (< 16) bytes at `device` (not null) are one naturally aligned access: n is 1, 2,
/// 4 or 8 and `device` a multiple of it. (Powers of two below 16 are at most 8.)
#[inline(always)]
fn is_one_access(device: usize, n: usize) -> bool {
    // n = 0 fails unless `device` is 0: n - 1 wraps to all ones.
    (n | device) & n.wrapping_sub(1) == 0
}

/// A copy of fewer than 16 bytes to the device, without the fence. The commonest, one naturally
/// aligned access of 1, 2, 4 or 8 bytes, goes straight to it.
#[inline(always)]
unsafe fn small_to_device(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(n < 16);
    if is_one_access(dst as usize, n) {
        // SAFETY: the caller's ranges hold `n` bytes; `dst` is aligned to `n`.
        return unsafe {
            match n {
                2 => store_small(dst, src, 2),
                4 => store_small(dst, src, 4),
                8 => store_small(dst, src, 8),
                _ => store_small(dst, src, 1),
            }
        };
    }
    small_ladder(dst as usize, n, |off, width| {
        // SAFETY: `off + width <= n`, so both ranges are the caller's; `dst + off` is aligned
        // to `width` by the ladder.
        unsafe { store_small(dst.add(off), src.add(off), width) }
    });
}

/// A copy of fewer than 16 bytes from the device, without the fence.
#[inline(always)]
unsafe fn small_from_device(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!(n < 16);
    if is_one_access(src as usize, n) {
        // SAFETY: as in `small_to_device`, with the device side being `src`.
        return unsafe { load_small(dst, src, n) };
    }
    small_ladder(src as usize, n, |off, width| {
        // SAFETY: as in `small_to_device`, with the device side being `src`.
        unsafe { load_small(dst.add(off), src.add(off), width) }
    });
}

/// One aligned store of `width` bytes to the device.
#[inline(always)]
unsafe fn store_small(dst: *mut u8, src: *const u8, width: usize) {
    // SAFETY: the caller guarantees `width` bytes are valid at both pointers and that `dst` is
    // aligned to `width`; the host side may be unaligned.
    unsafe {
        match width {
            8 => ptr::write_volatile(dst.cast::<u64>(), ptr::read_unaligned(src.cast::<u64>())),
            4 => ptr::write_volatile(dst.cast::<u32>(), ptr::read_unaligned(src.cast::<u32>())),
            2 => ptr::write_volatile(dst.cast::<u16>(), ptr::read_unaligned(src.cast::<u16>())),
            _ => ptr::write_volatile(dst, *src),
        }
    }
}

/// One aligned load of `width` bytes from the device.
#[inline(always)]
unsafe fn load_small(dst: *mut u8, src: *const u8, width: usize) {
    // SAFETY: as `store_small`, with the device side being `src`.
    unsafe {
        match width {
            8 => ptr::write_unaligned(dst.cast::<u64>(), ptr::read_volatile(src.cast::<u64>())),
            4 => ptr::write_unaligned(dst.cast::<u32>(), ptr::read_volatile(src.cast::<u32>())),
            2 => ptr::write_unaligned(dst.cast::<u16>(), ptr::read_volatile(src.cast::<u16>())),
            _ => *dst = ptr::read_volatile(src),
        }
    }
}

/// Stores up to `align` (a power of two ≤ 16) alignment of `dst`, or all of `n` if that comes
/// first, in naturally aligned steps; returns the pointers and length after them. One test when
/// `dst` is already aligned (the common case).
#[inline(always)]
unsafe fn store_head(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    align: usize,
) -> (*mut u8, *const u8, usize) {
    let head = (dst as usize).wrapping_neg() & (align - 1);
    if head == 0 {
        return (dst, src, n);
    }
    let h = head.min(n);
    small_ladder(dst as usize, h, |off, width| {
        // SAFETY: `off + width <= h <= n`, inside the caller's ranges; the ladder aligns
        // `dst + off` to `width`.
        unsafe { store_small(dst.add(off), src.add(off), width) }
    });
    // SAFETY: `h <= n` bytes were valid at both pointers.
    unsafe { (dst.add(h), src.add(h), n - h) }
}

/// [`store_head`] for loads: `src` is the device side.
#[inline(always)]
unsafe fn load_head(
    dst: *mut u8,
    src: *const u8,
    n: usize,
    align: usize,
) -> (*mut u8, *const u8, usize) {
    let head = (src as usize).wrapping_neg() & (align - 1);
    if head == 0 {
        return (dst, src, n);
    }
    let h = head.min(n);
    small_ladder(src as usize, h, |off, width| {
        // SAFETY: as in `store_head`, with the device side being `src`.
        unsafe { load_small(dst.add(off), src.add(off), width) }
    });
    // SAFETY: as in `store_head`.
    unsafe { (dst.add(h), src.add(h), n - h) }
}

/// Host → device: small accesses up to 16-byte alignment, single 16/32-byte steps up to the
/// widest alignment, the bulk at the widest width, then the remainder narrowing down.
#[inline(always)]
pub(crate) unsafe fn ladder_to<E: Engine>(mut dst: *mut u8, mut src: *const u8, mut n: usize) {
    // SAFETY (whole body): the caller guarantees `n` bytes are valid at both pointers; every
    // step below advances both pointers by exactly the bytes it copied, so the accesses stay
    // inside those ranges, and each wide access is made at a device address aligned to its width.
    unsafe {
        if E::STORE_MAX >= 16 {
            (dst, src, n) = store_head(dst, src, n, 16);
            while E::STORE_MAX > 16 && n >= 16 && (dst as usize) % E::STORE_MAX != 0 {
                let w = if E::STORE_MAX >= 32 && n >= 32 && (dst as usize) % 32 == 0 {
                    32
                } else {
                    16
                };
                if w == 32 {
                    E::store32(dst, src, 32);
                } else {
                    E::store16(dst, src, 16);
                }
                (dst, src, n) = (dst.add(w), src.add(w), n - w);
            }
            if E::STORE_MAX >= 64 && n >= 64 {
                let k = n & !63;
                E::store64(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
            if E::STORE_MAX >= 32 && n >= 32 {
                let k = n & !31;
                E::store32(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
            // Where 16 bytes is the widest access this is the bulk, whose loops test for
            // nothing to do themselves.
            if E::STORE_MAX == 16 || n >= 16 {
                let k = n & !15;
                E::store16(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
        } else {
            // Small accesses only (the generic variant, and DEVICE mappings): up to 8-byte
            // alignment, then 8 bytes at a time, without asking `small_width` each time.
            (dst, src, n) = store_head(dst, src, n, 8);
            while n >= 8 {
                store_small(dst, src, 8);
                (dst, src, n) = (dst.add(8), src.add(8), n - 8);
            }
        }
        while n > 0 {
            let w = small_width(dst as usize, n);
            store_small(dst, src, w);
            (dst, src, n) = (dst.add(w), src.add(w), n - w);
        }
    }
}

/// Device → host, the mirror of [`ladder_to`] with the device side being `src`.
#[inline(always)]
pub(crate) unsafe fn ladder_from<E: Engine>(mut dst: *mut u8, mut src: *const u8, mut n: usize) {
    // SAFETY (whole body): as `ladder_to`, with alignment taken on the device side `src`.
    unsafe {
        if E::LOAD_MAX >= 16 {
            (dst, src, n) = load_head(dst, src, n, 16);
            while E::LOAD_MAX > 16 && n >= 16 && (src as usize) % E::LOAD_MAX != 0 {
                let w = if E::LOAD_MAX >= 32 && n >= 32 && (src as usize) % 32 == 0 {
                    32
                } else {
                    16
                };
                if w == 32 {
                    E::load32(dst, src, 32);
                } else {
                    E::load16(dst, src, 16);
                }
                (dst, src, n) = (dst.add(w), src.add(w), n - w);
            }
            if E::LOAD_MAX >= 64 && n >= 64 {
                let k = n & !63;
                E::load64(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
            if E::LOAD_MAX >= 32 && n >= 32 {
                let k = n & !31;
                E::load32(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
            // Where 16 bytes is the widest access this is the bulk, whose loops test for
            // nothing to do themselves.
            if E::LOAD_MAX == 16 || n >= 16 {
                let k = n & !15;
                E::load16(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
        } else {
            // Small accesses only (the generic variant, and DEVICE mappings): up to 8-byte
            // alignment, then 8 bytes at a time, without asking `small_width` each time.
            (dst, src, n) = load_head(dst, src, n, 8);
            while n >= 8 {
                load_small(dst, src, 8);
                (dst, src, n) = (dst.add(8), src.add(8), n - 8);
            }
        }
        while n > 0 {
            let w = small_width(src as usize, n);
            load_small(dst, src, w);
            (dst, src, n) = (dst.add(w), src.add(w), n - w);
        }
    }
}

/// Orders the preceding device stores before later stores (x86: `sfence` makes the
/// write-combining buffers' contents globally visible before any later store, SDM Vol. 2B,
/// SFENCE; APM Vol. 2 §7.4.2; arm64: `dmb oshst` covers the outer-shareable device).
#[inline(always)]
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions; SSE is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction with no operands.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders the preceding device loads before everything after the copy. Loads from WC memory,
/// plain or streaming (`movntdqa`), are weakly ordered (Intel SDM Vol. 3A, "Methods of Caching
/// Available": WC is "weak ordering" with speculative reads; AMD APM Vol. 2 §7.4, Table 7-2). On
/// x86 `lfence` is the cheapest fence that suffices: it does not complete until every earlier
/// load has its data, and no later instruction starts before it completes (SDM Vol. 2A, LFENCE;
/// APM Vol. 2 §7.4.2, Table 7-4: LFENCE between a WC load and a later load keeps their order).
/// `sfence`, which upstream GDRCopy uses here, orders stores only (SDM Vol. 2B, SFENCE). `mfence`
/// would also hold later loads behind *earlier stores*, which no fence placed after the copy's
/// loads can make about the copy itself (the SDM's streaming-load section asks for it around
/// the loads when they must be ordered against other agents' writes: a caller that writes a
/// doorbell and then reads needs its own `mfence` in between, as with upstream).
/// arm64: `dmb oshld` orders earlier loads before later loads and stores.
#[inline(always)]
pub(crate) fn load_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: lfence has no preconditions; SSE2 is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction with no operands.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// The engine of the portable variant: no wide accesses.
struct Small;

impl Engine for Small {
    const STORE_MAX: usize = 8;
    const LOAD_MAX: usize = 8;
    unsafe fn store16(_: *mut u8, _: *const u8, _: usize) {}
    unsafe fn store32(_: *mut u8, _: *const u8, _: usize) {}
    unsafe fn store64(_: *mut u8, _: *const u8, _: usize) {}
    unsafe fn load16(_: *mut u8, _: *const u8, _: usize) {}
    unsafe fn load32(_: *mut u8, _: *const u8, _: usize) {}
    unsafe fn load64(_: *mut u8, _: *const u8, _: usize) {}
}

unsafe fn generic_to_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee.
    unsafe { ladder_to::<Small>(dst, src, n) };
    store_fence();
}

unsafe fn generic_from_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee.
    unsafe { ladder_from::<Small>(dst, src, n) };
    load_fence();
}

#[cfg(test)]
mod tests;
