//! The C API: a thin wrapper over gdrapi's C functions (errno results, close on drop), the
//! gdrapi.h values as those functions take them, and pin-and-map in one step.

use std::ffi::{c_int, c_ulong, c_void};
use std::fmt;
use std::ptr;

use anyhow::{bail, ensure, Result};
use nix::errno::Errno;

use crate::gdr::{self, gdr_info_v2, gdr_mh_t, gdr_t, Api};
use crate::gpu::DevicePtr;
use crate::sanity::note;

/// gdrapi.h values, as the C functions take them.
pub const PIN_FLAG_FORCE_PCIE: u32 = 1;
pub const MAP_FLAG_WC: c_int = gdrapi::MapRequest::WriteCombining as c_int;
pub const MAP_FLAG_CACHE: c_int = gdrapi::MapRequest::Caching as c_int;
pub const MAP_FLAG_DEVICE: c_int = gdrapi::MapRequest::Device as c_int;
pub const MAPPING_TYPE_NONE: c_int = gdrapi::MappingType::None as c_int;
pub const MAPPING_TYPE_WC: c_int = gdrapi::MappingType::WriteCombining as c_int;
pub const MAPPING_TYPE_DEVICE: c_int = gdrapi::MappingType::Device as c_int;
pub const ATTR_USE_PERSISTENT_MAPPING: c_int = gdrapi::Attribute::UsePersistentMapping as c_int;
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int =
    gdrapi::Attribute::SupportPinFlagForcePcie as c_int;
pub const ATTR_USING_DMA_BUF_MMAP: c_int = gdrapi::Attribute::UsingDmaBufMmap as c_int;
/// `gdr_info_v2.flags` bits (the C bitfields `mapped` and `wc_mapping`).
pub const INFO_MAPPED: u32 = 1;
pub const INFO_WC_MAPPING: u32 = 2;

/// A failed gdrapi call: which one, and the errno it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrErr {
    pub call: &'static str,
    pub errno: Errno,
}

impl fmt::Display for GdrErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.call,
            self.errno,
            self.errno.desc()
        )
    }
}

impl std::error::Error for GdrErr {}

pub type GdrResult<T> = std::result::Result<T, GdrErr>;

fn check(call: &'static str, rc: c_int) -> GdrResult<()> {
    gdr::check(rc).map_err(|errno| GdrErr { call, errno })
}

/// Requires `r` to have failed with `want`; `what` names the operation in the error.
pub fn expect_errno<T>(r: GdrResult<T>, want: Errno, what: &str) -> Result<()> {
    match r {
        Ok(_) => bail!("{what} succeeded; expected {want}"),
        Err(e) if e.errno == want => {
            note!("{what}: {want} as expected");
            Ok(())
        }
        Err(e) => bail!("{what}: {e}; expected {want}"),
    }
}

/// An open `gdr_t`, closed on drop unless [`Gdr::close`] or [`Gdr::leak`] consumed it.
pub struct Gdr {
    api: &'static Api,
    g: gdr_t,
}

// SAFETY: libgdrapi documents a gdr_t as safe to use from several threads at once.
unsafe impl Send for Gdr {}
// SAFETY: as above.
unsafe impl Sync for Gdr {}

impl Gdr {
    /// `gdr_open`; the errno on failure.
    pub fn try_open() -> Result<GdrResult<Gdr>> {
        let api = gdr::api()?;
        // SAFETY: gdr_open takes no arguments.
        let g = unsafe { (api.open)() };
        if g.is_null() {
            return Ok(Err(GdrErr {
                call: "gdr_open",
                errno: Errno::last(),
            }));
        }
        Ok(Ok(Gdr { api, g }))
    }

    /// `gdr_open`, which must work.
    pub fn open() -> Result<Gdr> {
        Ok(Gdr::try_open()??)
    }

    /// `gdr_close`.
    pub fn close(self) -> GdrResult<()> {
        let api = self.api;
        let g = self.leak();
        // SAFETY: `g` is live and not used again (leak consumed the wrapper).
        check("gdr_close", unsafe { (api.close)(g) })
    }

    /// `gdr_close` of a forked child's copy of the parent's `gdr_t` (the parent keeps its
    /// own): frees the child's copy and closes the child's descriptor.
    ///
    /// # Safety
    /// Only in a forked child, which must not use this `gdr_t` afterwards.
    pub unsafe fn close_inherited(&self) -> GdrResult<()> {
        // SAFETY: per the caller, this process holds a copy nobody else uses afterwards.
        check("gdr_close", unsafe { (self.api.close)(self.g) })
    }

    /// Gives up the wrapper without closing (for a `gdr_t` whose file was closed behind its
    /// back, or that a forked child must not close).
    pub fn leak(self) -> gdr_t {
        let g = self.g;
        std::mem::forget(self);
        g
    }

    /// `gdr_pin_buffer` without tokens.
    pub fn pin(&self, addr: DevicePtr, size: usize) -> GdrResult<gdr_mh_t> {
        self.pin_with_tokens(addr, size, 0, 0)
    }

    /// `gdr_pin_buffer`.
    pub fn pin_with_tokens(
        &self,
        addr: DevicePtr,
        size: usize,
        p2p_token: u64,
        va_space: u32,
    ) -> GdrResult<gdr_mh_t> {
        let mut mh = gdr_mh_t::default();
        // SAFETY: `self.g` is live; `mh` is a valid out pointer.
        let rc = unsafe {
            (self.api.pin_buffer)(self.g, addr as c_ulong, size, p2p_token, va_space, &mut mh)
        };
        check("gdr_pin_buffer", rc)?;
        Ok(mh)
    }

    /// `gdr_pin_buffer_v2`.
    pub fn pin_v2(&self, addr: DevicePtr, size: usize, flags: u32) -> GdrResult<gdr_mh_t> {
        let mut mh = gdr_mh_t::default();
        // SAFETY: `self.g` is live; `mh` is a valid out pointer.
        let rc = unsafe { (self.api.pin_buffer_v2)(self.g, addr as c_ulong, size, flags, &mut mh) };
        check("gdr_pin_buffer_v2", rc)?;
        Ok(mh)
    }

    pub fn unpin(&self, mh: gdr_mh_t) -> GdrResult<()> {
        // SAFETY: `self.g` is live; the handle is checked by the library.
        check("gdr_unpin_buffer", unsafe {
            (self.api.unpin_buffer)(self.g, mh)
        })
    }

    pub fn info(&self, mh: gdr_mh_t) -> GdrResult<gdr_info_v2> {
        let mut info = gdr_info_v2::default();
        // SAFETY: `self.g` is live; `info` is a valid out pointer of the v2 layout.
        check("gdr_get_info_v2", unsafe {
            (self.api.get_info_v2)(self.g, mh, &mut info)
        })?;
        Ok(info)
    }

    pub fn callback_flag(&self, mh: gdr_mh_t) -> GdrResult<c_int> {
        let mut flag: c_int = -1;
        // SAFETY: `self.g` is live; `flag` is a valid out pointer.
        check("gdr_get_callback_flag", unsafe {
            (self.api.get_callback_flag)(self.g, mh, &mut flag)
        })?;
        Ok(flag)
    }

    /// `gdr_map`: the address of the mapping's first byte.
    pub fn map(&self, mh: gdr_mh_t, size: usize) -> GdrResult<*mut u8> {
        let mut va: *mut c_void = ptr::null_mut();
        // SAFETY: `self.g` is live; `va` is a valid out pointer.
        check("gdr_map", unsafe {
            (self.api.map)(self.g, mh, &mut va, size)
        })?;
        Ok(va.cast())
    }

    /// `gdr_map_v2`.
    pub fn map_v2(&self, mh: gdr_mh_t, size: usize, flags: c_int) -> GdrResult<*mut u8> {
        let mut va: *mut c_void = ptr::null_mut();
        // SAFETY: `self.g` is live; `va` is a valid out pointer.
        check("gdr_map_v2", unsafe {
            (self.api.map_v2)(self.g, mh, &mut va, size, flags)
        })?;
        Ok(va.cast())
    }

    /// `gdr_unmap`. The caller makes no access through the mapping afterwards.
    pub fn unmap(&self, mh: gdr_mh_t, va: *mut u8, size: usize) -> GdrResult<()> {
        // SAFETY: `self.g` is live; the library checks `va`/`size` against the mapping.
        check("gdr_unmap", unsafe {
            (self.api.unmap)(self.g, mh, va.cast(), size)
        })
    }

    /// `gdr_copy_to_mapping` of `src` to `dst` (inside the mapping of `mh`).
    pub fn copy_to(&self, mh: gdr_mh_t, dst: *mut u8, src: &[u8]) -> GdrResult<()> {
        // SAFETY: `src` is readable for its length; the library refuses a device range that
        // is not inside the live mapping of `mh`.
        check("gdr_copy_to_mapping", unsafe {
            (self.api.copy_to_mapping)(mh, dst.cast(), src.as_ptr().cast(), src.len())
        })
    }

    /// `gdr_copy_from_mapping` from `src` (inside the mapping of `mh`) to `dst`.
    pub fn copy_from(&self, mh: gdr_mh_t, dst: &mut [u8], src: *const u8) -> GdrResult<()> {
        // SAFETY: `dst` is writable for its length; the library refuses a device range that
        // is not inside the live mapping of `mh`.
        check("gdr_copy_from_mapping", unsafe {
            (self.api.copy_from_mapping)(mh, dst.as_mut_ptr().cast(), src.cast(), dst.len())
        })
    }

    pub fn attribute(&self, attr: c_int) -> GdrResult<c_int> {
        let mut v: c_int = -1;
        // SAFETY: `self.g` is live; `v` is a valid out pointer.
        check("gdr_get_attribute", unsafe {
            (self.api.get_attribute)(self.g, attr, &mut v)
        })?;
        Ok(v)
    }

    pub fn driver_version(&self) -> GdrResult<(c_int, c_int)> {
        let (mut major, mut minor) = (-1, -1);
        // SAFETY: `self.g` is live; both are valid out pointers.
        check("gdr_driver_get_version", unsafe {
            (self.api.driver_get_version)(self.g, &mut major, &mut minor)
        })?;
        Ok((major, minor))
    }
}

impl Drop for Gdr {
    fn drop(&mut self) {
        // SAFETY: `self.g` is live and never used after this.
        unsafe { (self.api.close)(self.g) };
    }
}

/// Pins `size` bytes at `addr`, maps them and checks that `info` describes the pin.
pub fn pin_and_map(gdr: &Gdr, addr: DevicePtr, size: usize) -> Result<(gdr_mh_t, *mut u8)> {
    let mh = gdr.pin(addr, size)?;
    let info = gdr.info(mh)?;
    ensure!(
        info.va == addr,
        "info.va {:#x} for a pin at {addr:#x}: the buffer is not aligned to the pin granule",
        info.va
    );
    let map = gdr.map(mh, size)?;
    Ok((mh, map))
}

/// Undoes [`pin_and_map`] and closes `gdr`: the end of most cases.
pub fn unmap_unpin_close(gdr: Gdr, mh: gdr_mh_t, map: *mut u8, size: usize) -> Result<()> {
    gdr.unmap(mh, map, size)?;
    gdr.unpin(mh)?;
    Ok(gdr.close()?)
}
