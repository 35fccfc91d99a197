//! The gdrapi.h C ABI: a thin shim over the safe API.
//!
//! Each entry point checks its pointers (NULL → `EINVAL`), guards against panics (→ `EIO`, never
//! unwinding into C), calls the safe API, and returns 0 or a positive errno. `include/gdrapi.h`
//! is generated from this file by `cargo xtask codegen`.
//!
//! # The contract (gdrapi.h's opening comment)
//!
#![doc = include_str!("capi/overview.md")]
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use nix::errno::Errno;

use crate::error::Error;
use crate::types::{Attribute, MapRequest, MappingType, PinFlags};
use crate::{handles, log, pages, version};

mod copying;
mod open;

use copying::{checked_copy, FromDevice, ToDevice};
use open::Open;
pub use open::{gdr, gdr_t};

pub const MAJOR_VERSION_SHIFT: c_int = 16;
pub const MINOR_VERSION_MASK: c_uint = 0xffff;
pub const GDR_API_MAJOR_VERSION: c_int = version::GDR_API_MAJOR_VERSION as c_int;
pub const GDR_API_MINOR_VERSION: c_int = version::GDR_API_MINOR_VERSION as c_int;
pub const GDR_API_VERSION: c_int =
    (GDR_API_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | GDR_API_MINOR_VERSION;
/// The oldest driver this library works with.
pub const MINIMUM_GDRDRV_MAJOR_VERSION: c_int = 0;
pub const MINIMUM_GDRDRV_MINOR_VERSION: c_int = 1;
pub const MINIMUM_GDRDRV_VERSION: c_int =
    (MINIMUM_GDRDRV_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | MINIMUM_GDRDRV_MINOR_VERSION;
pub const GPU_PAGE_SHIFT: c_int = 16;
pub const GPU_PAGE_SIZE: c_ulong = 1 << GPU_PAGE_SHIFT;
pub const GPU_PAGE_OFFSET: c_ulong = GPU_PAGE_SIZE - 1;
pub const GPU_PAGE_MASK: c_ulong = !GPU_PAGE_OFFSET;

const _: () = assert!(GDR_API_VERSION as u32 == version::GDR_API_VERSION);
const _: () = assert!(MINIMUM_GDRDRV_VERSION as u32 == version::MINIMUM_GDRDRV_VERSION);
const _: () = assert!(GPU_PAGE_SHIFT as u32 == pages::GPU_PAGE_SHIFT);

/// A C enum: typedef name, tag, enumerators.
pub type CEnum = (&'static str, &'static str, &'static [(&'static str, c_int)]);

/// The C enums: typedef name, tag, and enumerators. gdrapi.h writes them from this table; the
/// functions take them as `c_int` (an out-of-range value from C must not be UB in Rust).
pub const C_ENUMS: &[CEnum] = &[
    (
        "gdr_pin_flags_t",
        "gdr_pin_flags",
        &[("GDR_PIN_FLAG_DEFAULT", 0), ("GDR_PIN_FLAG_FORCE_PCIE", 1)],
    ),
    (
        "gdr_mapping_type_t",
        "gdr_mapping_type",
        &[
            ("GDR_MAPPING_TYPE_NONE", MappingType::None as c_int),
            ("GDR_MAPPING_TYPE_WC", MappingType::WriteCombining as c_int),
            ("GDR_MAPPING_TYPE_CACHING", MappingType::Caching as c_int),
            ("GDR_MAPPING_TYPE_DEVICE", MappingType::Device as c_int),
            ("GDR_MAPPING_TYPE_MAX", 4),
        ],
    ),
    (
        "gdr_map_flags_t",
        "gdr_map_flags",
        &[
            ("GDR_MAP_FLAG_DEFAULT", MapRequest::Default as c_int),
            (
                "GDR_MAP_FLAG_REQ_WC_MAPPING",
                MapRequest::WriteCombining as c_int,
            ),
            (
                "GDR_MAP_FLAG_REQ_CACHE_MAPPING",
                MapRequest::Caching as c_int,
            ),
            (
                "GDR_MAP_FLAG_REQ_DEVICE_MAPPING",
                MapRequest::Device as c_int,
            ),
        ],
    ),
    (
        "gdr_attr_t",
        "gdr_attr",
        &[
            (
                "GDR_ATTR_USE_PERSISTENT_MAPPING",
                Attribute::UsePersistentMapping as c_int,
            ),
            (
                "GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE",
                Attribute::SupportPinFlagForcePcie as c_int,
            ),
            (
                "GDR_ATTR_USING_DMA_BUF_MMAP",
                Attribute::UsingDmaBufMmap as c_int,
            ),
            ("GDR_ATTR_MAX", 4),
        ],
    ),
];

pub type gdr_mapping_type_t = c_int;
pub type gdr_attr_t = c_int;

/// A pinned-buffer handle, passed by value. 0 is never a valid handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gdr_mh_t {
    pub h: c_ulong,
}

/// `gdr_info_v2_t`; `flags` holds the C bitfields `mapped:1` (bit 0) and `wc_mapping:1` (bit 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdr_info_v2 {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub flags: c_uint,
    pub mapping_type: gdr_mapping_type_t,
}

/// The 40-byte layout of libraries before `mapping_type`, for binaries built against them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdr_info_v1 {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub flags: c_uint,
}

impl gdr_mh_t {
    fn key(self) -> u64 {
        self.h
    }
}

// gdrapi.h passes addresses and handles as `unsigned long`: 64 bits on the LP64 targets we build.
const _: () = assert!(std::mem::size_of::<c_ulong>() == 8);
const _: () = assert!(std::mem::size_of::<gdr_mh_t>() == 8);
const _: () = assert!(std::mem::size_of::<gdr_info_v2>() == 48);
const _: () = assert!(std::mem::offset_of!(gdr_info_v2, cycles_per_ms) == 32);
const _: () = assert!(std::mem::offset_of!(gdr_info_v2, flags) == 36);
const _: () = assert!(std::mem::offset_of!(gdr_info_v2, mapping_type) == 40);
const _: () = assert!(std::mem::size_of::<gdr_info_v1>() == 40);

/// Runs `f`, turning a panic into `EIO` so that no unwind crosses into C.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            log::debug(format_args!("{e}"));
            e.errno() as c_int
        }
        Err(_) => {
            log::error(format_args!("internal error (panic) in libgdrapi"));
            Errno::EIO as c_int
        }
    }
}

fn einval(call: &'static str) -> Error {
    Error::new(call, Errno::EINVAL)
}

/// The `gdr_t` argument, open; returns EINVAL from the enclosing closure (run by [`guard`]) for
/// NULL or a closed `gdr_t`.
macro_rules! try_gdr {
    ($g:expr) => {{
        let g: gdr_t = $g;
        // SAFETY: the entry point's contract: NULL or a value `gdr_open` returned.
        unsafe { Open::get(g) }?
    }};
}

/// An out-parameter as a mutable reference; returns EINVAL (naming `$call`) from the enclosing
/// closure for NULL. Only for pointers the entry point's contract says are NULL or writable.
macro_rules! try_out {
    ($ptr:expr, $call:literal) => {{
        let ptr = $ptr;
        // SAFETY: the entry point's contract: NULL or valid for writes.
        unsafe { ptr.as_mut() }.ok_or(einval($call))?
    }};
}

/// Opens a backend: /dev/mtgdrdrv, else (or with GDRCOPY_USE_DMABUF_MMAP=1) the dma-buf
/// backend. NULL with errno set on failure (with logging on, one line says why): the device's
/// open errno when neither backend works, EPROTO when the module and the library do not accept
/// each other (no fallback then), EOPNOTSUPP when forced and no device supports dma-buf.
#[no_mangle]
pub extern "C" fn gdr_open() -> gdr_t {
    open::open()
}

/// Unmaps and unpins everything `g` still owns and closes the device — always, even when an
/// unpin fails (whose errno is then returned). In a forked child it only lets go of the child's
/// share: the pins belong to the parent. `EINVAL` for NULL and for a `gdr_t` already closed.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned.
#[no_mangle]
pub unsafe extern "C" fn gdr_close(g: gdr_t) -> c_int {
    // SAFETY: forwarded caller guarantee.
    unsafe { open::close(g) }
}

/// Pins with upstream's legacy tokens, which mtgpu does not have: both must be 0.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `handle` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer(
    g: gdr_t,
    addr: c_ulong,
    size: usize,
    p2p_token: u64,
    va_space: u32,
    handle: *mut gdr_mh_t,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(handle, "gdr_pin_buffer");
        let pin = g
            .gdr
            .pin_with_tokens(addr, size as u64, p2p_token, va_space)?;
        *out = g.add(pin)?;
        Ok(())
    })
}

/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `handle` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer_v2(
    g: gdr_t,
    addr: c_ulong,
    size: usize,
    flags: u32,
    handle: *mut gdr_mh_t,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(handle, "gdr_pin_buffer_v2");
        let pin = g.gdr.pin(addr, size as u64, PinFlags(flags))?;
        *out = g.add(pin)?;
        Ok(())
    })
}

/// Unmaps the buffer if still mapped (as `gdr_unmap`, waiting for copies in flight), then
/// unpins it. The handle is retired even if the driver reports an error.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`).
#[no_mangle]
pub unsafe extern "C" fn gdr_unpin_buffer(g: gdr_t, handle: gdr_mh_t) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let memh = g.remove(handle).ok_or(einval("gdr_unpin_buffer"))?;
        open::unpin_memh(memh, handle.key(), g.gdr.in_opener())
    })
}

/// Always 0 on mtgpu: there is no invalidation callback.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `flag` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_callback_flag(
    g: gdr_t,
    handle: gdr_mh_t,
    flag: *mut c_int,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(flag, "gdr_get_callback_flag");
        *out = g.with_memh(handle, |m| m.pin().callback_flag())? as c_int;
        Ok(())
    })
}

fn info_of(g: &Open, handle: gdr_mh_t) -> Result<gdr_info_v2, Error> {
    let info = g.with_memh(handle, |m| m.pin().info())?;
    Ok(gdr_info_v2 {
        va: info.va,
        mapped_size: info.mapped_size,
        page_size: info.page_size,
        tm_cycles: info.tm_cycles,
        cycles_per_ms: info.cycles_per_ms,
        flags: c_uint::from(info.mapped()) | c_uint::from(info.wc_mapping()) << 1,
        mapping_type: info.mapping_type as gdr_mapping_type_t,
    })
}

/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `info` is NULL or points to a writable `gdr_info_v2_t`.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_info_v2(
    g: gdr_t,
    handle: gdr_mh_t,
    info: *mut gdr_info_v2,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(info, "gdr_get_info_v2");
        *out = info_of(&g, handle)?;
        Ok(())
    })
}

/// The 40-byte `gdr_info` of binaries built before `mapping_type` existed. New code reaches
/// `gdr_get_info_v2` through the header's `gdr_get_info` macro.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `info` is NULL or points to a writable 40-byte `gdr_info_v1`.
#[export_name = "gdr_get_info"]
pub unsafe extern "C" fn gdr_get_info_v1(
    g: gdr_t,
    handle: gdr_mh_t,
    info: *mut gdr_info_v1,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(info, "gdr_get_info");
        let v2 = info_of(&g, handle)?;
        *out = gdr_info_v1 {
            va: v2.va,
            mapped_size: v2.mapped_size,
            page_size: v2.page_size,
            tm_cycles: v2.tm_cycles,
            cycles_per_ms: v2.cycles_per_ms,
            flags: v2.flags,
        };
        Ok(())
    })
}

/// # Safety
/// As `gdr_map_v2`.
#[no_mangle]
pub unsafe extern "C" fn gdr_map(
    g: gdr_t,
    handle: gdr_mh_t,
    va: *mut *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { gdr_map_v2(g, handle, va, size, MapRequest::Default as c_int) }
}

/// Maps the first `size` bytes of a pinned buffer. One mapping per handle (`EAGAIN` if already
/// mapped); the pinned address must be aligned to the pin granule (`info.page_size`), else
/// `EINVAL`. On the dma-buf backend only DEFAULT and WC requests map (the type is fixed at pin).
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `va` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_map_v2(
    g: gdr_t,
    handle: gdr_mh_t,
    va: *mut *mut c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(va, "gdr_map");
        let request = MapRequest::from_raw(flags).ok_or(einval("gdr_map"))?;
        g.with_memh(handle, |memh| {
            if memh.mapping().is_some() {
                return Err(Error::new("gdr_map", Errno::EAGAIN));
            }
            if memh.kept() {
                // A copy may still read the kept mapping's base and length in the slot.
                return Err(Error::new("gdr_map", Errno::EBUSY));
            }
            let mapping = memh.pin().map_raw(size, request)?;
            handles::set_mapped(handle.key(), mapping.ptr().as_ptr() as usize, mapping.len());
            *out = mapping.ptr().as_ptr().cast();
            memh.set_mapping(mapping);
            Ok(())
        })
    })
}

/// Unmaps what `gdr_map` returned: `va` must be that address and `size` round up to the same
/// length, else `EINVAL`. Copies through the handle then fail with `EINVAL`; one already in
/// flight in another thread is waited for before the memory goes.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); no access through the mapping may follow.
#[no_mangle]
pub unsafe extern "C" fn gdr_unmap(
    g: gdr_t,
    handle: gdr_mh_t,
    va: *mut c_void,
    size: usize,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let page = g.gdr.page_size();
        g.with_memh(handle, |memh| {
            let mapping = memh.mapping().ok_or(einval("gdr_unmap"))?;
            let rounded = size.checked_add(page - 1).map(|s| s & !(page - 1));
            if mapping.ptr().as_ptr().cast() != va || rounded != Some(mapping.len()) {
                return Err(einval("gdr_unmap"));
            }
            handles::set_unmapped(handle.key());
            memh.unmap_retired(handle.key()).map(drop)
        })
    })
}

/// Host → device. `map_d_ptr .. + size` must lie inside the live mapping of `handle`, else
/// `EINVAL` (also in a forked child, which inherits no mapping). A copy racing
/// `gdr_unmap`/`gdr_unpin_buffer`/`gdr_close` of its handle in another thread either completes
/// before the mapping goes (the unmap waits for it) or returns `EINVAL`; it never faults. The
/// check takes no lock and makes no system call (see `handles`).
///
/// # Safety
/// `h_ptr` is readable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn gdr_copy_to_mapping(
    handle: gdr_mh_t,
    map_d_ptr: *mut c_void,
    h_ptr: *const c_void,
    size: usize,
) -> c_int {
    // SAFETY: forwarded caller guarantee; the host side is only read on this path.
    unsafe { checked_copy::<ToDevice>(handle, map_d_ptr, h_ptr.cast_mut(), size) }
}

/// Device → host. `map_d_ptr .. + size` must lie inside the live mapping of `handle`, else
/// `EINVAL`; racing an unmap as `gdr_copy_to_mapping`.
///
/// # Safety
/// `h_ptr` is writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn gdr_copy_from_mapping(
    handle: gdr_mh_t,
    h_ptr: *mut c_void,
    map_d_ptr: *const c_void,
    size: usize,
) -> c_int {
    // SAFETY: forwarded caller guarantee; the device side is only read on this path.
    unsafe { checked_copy::<FromDevice>(handle, h_ptr, map_d_ptr.cast_mut(), size) }
}

/// # Safety
/// Each pointer is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
    // SAFETY: guaranteed by the caller.
    if let Some(m) = unsafe { major.as_mut() } {
        *m = GDR_API_MAJOR_VERSION;
    }
    // SAFETY: guaranteed by the caller.
    if let Some(m) = unsafe { minor.as_mut() } {
        *m = GDR_API_MINOR_VERSION;
    }
}

/// The module's version. EOPNOTSUPP on the dma-buf backend (no module), leaving both outputs
/// untouched; EINVAL for a NULL output.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); each pointer is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_driver_get_version(
    g: gdr_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let major = try_out!(major, "gdr_driver_get_version");
        let minor = try_out!(minor, "gdr_driver_get_version");
        let (ma, mi) = g.gdr.driver_version()?;
        (*major, *minor) = (ma as c_int, mi as c_int);
        Ok(())
    })
}

/// `*v` = the attribute's value: GDR_ATTR_USING_DMA_BUF_MMAP is 1 on the dma-buf backend, 0 on
/// the module's. EINVAL for an unknown attribute.
///
/// # Safety
/// `g` is NULL or a value `gdr_open` returned (a closed one gives `EINVAL`); `v` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_attribute(g: gdr_t, attr: gdr_attr_t, v: *mut c_int) -> c_int {
    guard(|| {
        let g = try_gdr!(g);
        let out = try_out!(v, "gdr_get_attribute");
        *out = 0;
        let attr = Attribute::from_raw(attr).ok_or(einval("gdr_get_attribute"))?;
        *out = g.gdr.attribute(attr)? as c_int;
        Ok(())
    })
}

/// # Safety
/// `type_str` is NULL or writable; the string it receives is static.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_mapping_type_string(
    mapping_type: gdr_mapping_type_t,
    type_str: *mut *const c_char,
) -> c_int {
    // SAFETY: guaranteed by the caller.
    let Some(out) = (unsafe { type_str.as_mut() }) else {
        return Errno::EINVAL as c_int;
    };
    let Some(t) = u32::try_from(mapping_type)
        .ok()
        .and_then(MappingType::from_raw)
    else {
        return Errno::EINVAL as c_int;
    };
    *out = match t {
        MappingType::None => c"None",
        MappingType::WriteCombining => c"Write Combining",
        MappingType::Caching => c"Caching",
        MappingType::Device => c"Device",
    }
    .as_ptr();
    0
}
