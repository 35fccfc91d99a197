//! Copies between host memory and a device mapping.
//!
//! Device memory is touched only with naturally aligned accesses of 1, 2, 4, 8, 16, 32 or 64
//! bytes; libc memcpy is never used on it, because BAR writes of odd sizes or alignments can be
//! split or refused by the PCIe path, and reads have side effects on some devices. One engine
//! (`to_device`/`from_device`) walks the alignment ladder; each CPU variant plugs in the widest
//! stores and loads it has. The variant is chosen once, from CPU feature flags only (never the
//! vendor string: Hygon CPUs report `HygonGenuine`), and cached as a pair of function pointers.
//!
//! Every copy ends with a fence: write-combined stores and streaming loads are weakly ordered,
//! and the caller expects the data to be on its way (or in hand) when the call returns.

use std::ptr;
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
mod aarch64;
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
    supported: fn() -> bool,
}

impl Variant {
    pub fn is_supported(&self) -> bool {
        (self.supported)()
    }
}

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
    supported: always,
};

fn always() -> bool {
    true
}

static SELECTED: OnceLock<&'static Variant> = OnceLock::new();

/// The variant in use by this process, chosen on first call.
pub fn selected() -> &'static Variant {
    SELECTED.get_or_init(select)
}

fn select() -> &'static Variant {
    let best = variants()
        .iter()
        .find(|v| v.is_supported())
        .unwrap_or(&GENERIC);
    let chosen = match std::env::var(VARIANT_ENV) {
        Ok(name) => match variants().iter().find(|v| v.name == name) {
            Some(v) if v.is_supported() => v,
            Some(_) => {
                crate::log::warn(format_args!(
                    "{VARIANT_ENV}={name}: this CPU lacks the features it needs; using {}",
                    best.name
                ));
                best
            }
            None => {
                crate::log::warn(format_args!(
                    "{VARIANT_ENV}={name}: unknown variant (known: {}); using {}",
                    variant_names(),
                    best.name
                ));
                best
            }
        },
        Err(_) => best,
    };
    crate::log::info(format_args!("copy variant: {}", chosen.name));
    chosen
}

fn variant_names() -> String {
    variants()
        .iter()
        .map(|v| v.name)
        .collect::<Vec<_>>()
        .join(", ")
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

/// Host → device: small accesses up to 16-byte alignment, single 16/32-byte steps up to the
/// widest alignment, the bulk at the widest width, then the remainder narrowing down.
#[inline(always)]
pub(crate) unsafe fn to_device<E: Engine>(mut dst: *mut u8, mut src: *const u8, mut n: usize) {
    // SAFETY (whole body): the caller guarantees `n` bytes are valid at both pointers; every
    // step below advances both pointers by exactly the bytes it copied, so the accesses stay
    // inside those ranges, and each wide access is made at a device address aligned to its width.
    unsafe {
        if E::STORE_MAX >= 16 {
            while n > 0 && (dst as usize) % 16 != 0 {
                let w = small_width(dst as usize, n);
                store_small(dst, src, w);
                (dst, src, n) = (dst.add(w), src.add(w), n - w);
            }
            while n >= 16 && (dst as usize) % E::STORE_MAX != 0 {
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
            if n >= 16 {
                let k = n & !15;
                E::store16(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
        }
        while n > 0 {
            let w = small_width(dst as usize, n);
            store_small(dst, src, w);
            (dst, src, n) = (dst.add(w), src.add(w), n - w);
        }
    }
}

/// Device → host, the mirror of [`to_device`] with the device side being `src`.
#[inline(always)]
pub(crate) unsafe fn from_device<E: Engine>(mut dst: *mut u8, mut src: *const u8, mut n: usize) {
    // SAFETY (whole body): as `to_device`, with alignment taken on the device side `src`.
    unsafe {
        if E::LOAD_MAX >= 16 {
            while n > 0 && (src as usize) % 16 != 0 {
                let w = small_width(src as usize, n);
                load_small(dst, src, w);
                (dst, src, n) = (dst.add(w), src.add(w), n - w);
            }
            while n >= 16 && (src as usize) % E::LOAD_MAX != 0 {
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
            if n >= 16 {
                let k = n & !15;
                E::load16(dst, src, k);
                (dst, src, n) = (dst.add(k), src.add(k), n - k);
            }
        }
        while n > 0 {
            let w = small_width(src as usize, n);
            load_small(dst, src, w);
            (dst, src, n) = (dst.add(w), src.add(w), n - w);
        }
    }
}

/// Orders the preceding device stores before anything the caller does next (x86: `sfence`
/// drains the write-combining buffers; arm64: `dmb oshst` covers the outer-shareable device).
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

/// Orders the preceding device loads before later loads. Streaming loads (`movntdqa`) from WC
/// memory are weakly ordered and the SDM asks for `mfence` to order them.
#[inline(always)]
pub(crate) fn load_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: mfence has no preconditions; SSE2 is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_mfence()
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
    unsafe { to_device::<Small>(dst, src, n) };
    store_fence();
}

unsafe fn generic_from_device(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded caller guarantee.
    unsafe { from_device::<Small>(dst, src, n) };
    load_fence();
}

#[cfg(test)]
mod tests;
