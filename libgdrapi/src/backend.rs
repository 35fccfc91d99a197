//! The interface both backends implement, and the choice between them at `gdr_open`.
//!
//! - the module backend (`driver`): ioctls and mmap on `/dev/mtgdrdrv`;
//! - the dma-buf backend (`dmabuf`): one dma-buf per pin from the MUSA driver
//!   (`muMemGetHandleForAddressRange`), mmapped directly; no kernel module needed.
//!
//! Choice: the module when `/dev/mtgdrdrv` can be opened; the dma-buf backend when it cannot
//! (not loaded, not passed into the container, no permission) or when
//! `GDRCOPY_USE_DMABUF_MMAP=1` forces it. A module that opens but fails the version handshake
//! is an error, not a reason to fall back: the installation is broken and should say so.

use std::ptr::NonNull;

use nix::errno::Errno;

use crate::driver::{self, Driver};
use crate::error::{Error, Result};
use crate::gdr::{Attribute, Info, MapRequest, MappingType, PinFlags};
use crate::{dmabuf, handles, log};

/// The environment variable that forces the dma-buf backend when it is exactly `1`.
pub const USE_DMABUF_ENV: &str = "GDRCOPY_USE_DMABUF_MMAP";

/// The operations of a backend, each on the backend's own pin handle (never 0).
pub(crate) trait Backend: Send + Sync {
    /// The host page: mapping lengths are rounded up to it.
    fn page_size(&self) -> usize;
    /// Whether the calling process is the one that opened the backend (not a forked child).
    fn in_opener(&self) -> bool;
    /// The kernel module's version (packed); the dma-buf backend has none.
    fn driver_version(&self) -> Result<u32>;
    fn attribute(&self, attr: Attribute) -> Result<u32>;
    fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<u64>;
    fn pin_with_tokens(&self, addr: u64, size: u64, p2p_token: u64, va_space: u32) -> Result<u64>;
    fn unpin(&self, handle: u64) -> Result<()>;
    /// In a forked child: lets go of the child's share of a pin without touching the parent's.
    fn forget(&self, handle: u64);
    fn info(&self, handle: u64) -> Result<Info>;
    fn callback_flag(&self, handle: u64) -> Result<bool>;
    /// Maps the first `size` bytes of the pin, rounded up to the host page, shared read/write,
    /// as `request` asks: the mapping, its length and its type. The request is judged before
    /// the size, as upstream's order of errors has it.
    fn map(
        &self,
        handle: u64,
        size: usize,
        request: MapRequest,
    ) -> Result<(NonNull<u8>, usize, MappingType)>;
    /// Removes a mapping made by [`Backend::map`]; in a forked child (which did not inherit
    /// it) it only forgets it.
    ///
    /// # Safety
    /// `ptr`/`len` are exactly a live mapping of `handle` from `map`, and nothing accesses it
    /// afterwards.
    unsafe fn unmap(&self, handle: u64, ptr: NonNull<u8>, len: usize) -> Result<()>;
}

/// Which backend `gdr_open` takes, from `GDRCOPY_USE_DMABUF_MMAP`'s value.
fn forced(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "1")
}

/// Opens the backend as described at the top of this file.
pub(crate) fn open() -> Result<Box<dyn Backend>> {
    // Before any mapping exists: the fork handler and the unmap/copy barrier.
    handles::init();
    let module_error = if forced(std::env::var_os(USE_DMABUF_ENV).as_deref()) {
        log::info(format_args!(
            "{USE_DMABUF_ENV}=1: using the dma-buf backend"
        ));
        None
    } else {
        match Driver::open_node() {
            Ok(fd) => return Ok(Box::new(Driver::with_node(fd)?)),
            Err(errno) => Some(errno),
        }
    };
    match dmabuf::DmaBuf::open() {
        Ok(backend) => {
            if let Some(errno) = module_error {
                log::info(format_args!(
                    "{} cannot be opened ({}): using the dma-buf backend",
                    driver::DEVICE_PATH,
                    errno.desc()
                ));
            }
            Ok(Box::new(backend))
        }
        Err(unavailable) => {
            // One line, whichever way it failed.
            let Some(errno) = module_error else {
                log::error(format_args!(
                    "{USE_DMABUF_ENV}=1, but the dma-buf backend is not available: {}",
                    unavailable.why
                ));
                return Err(Error::new("dma-buf backend", unavailable.errno));
            };
            log::error(format_args!(
                "{}; the dma-buf backend (no module needed) is not available either: {}",
                driver::open_failure_text(errno),
                unavailable.why
            ));
            Err(Error::new("open(/dev/mtgdrdrv)", errno))
        }
    }
}

/// Rounds `size` up to `page` (a power of two); `None` on overflow or for 0.
pub(crate) fn round_up(size: usize, page: usize) -> Option<usize> {
    size.checked_add(page - 1)
        .map(|s| s & !(page - 1))
        .filter(|&s| s > 0)
}

impl Backend for Driver {
    fn page_size(&self) -> usize {
        Driver::page_size(self)
    }

    fn in_opener(&self) -> bool {
        Driver::in_opener(self)
    }

    fn driver_version(&self) -> Result<u32> {
        Ok(self.version())
    }

    fn attribute(&self, attr: Attribute) -> Result<u32> {
        match attr {
            Attribute::UsingDmaBufMmap => Ok(0),
            _ if !self.supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_GET_ATTR) => Ok(0),
            other => self.attr(other as u32),
        }
    }

    fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<u64> {
        if self.supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_PIN_BUFFER_V2) {
            self.pin_v2(addr, size, flags.0)
        } else if flags != PinFlags::DEFAULT {
            log::error(format_args!("pin flags need a newer mtgdrdrv"));
            Err(Error::new("pin", Errno::EINVAL))
        } else {
            self.pin_v1(addr, size, 0, 0)
        }
    }

    fn pin_with_tokens(&self, addr: u64, size: u64, p2p_token: u64, va_space: u32) -> Result<u64> {
        self.pin_v1(addr, size, p2p_token, va_space)
    }

    fn unpin(&self, handle: u64) -> Result<()> {
        Driver::unpin(self, handle)
    }

    fn forget(&self, _handle: u64) {
        // The pin lives in the parent's open file; the child holds nothing of its own.
    }

    fn info(&self, handle: u64) -> Result<Info> {
        if self.supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_GET_INFO_V2) {
            let p = self.info_v2(handle)?;
            Ok(Info {
                va: p.va,
                mapped_size: p.mapped_size,
                page_size: p.page_size,
                tm_cycles: p.tm_cycles,
                cycles_per_ms: p.tsc_khz,
                mapping_type: MappingType::from_raw(p.mapping_type)
                    .ok_or(Error::new("ioctl(GET_INFO_V2)", Errno::EPROTO))?,
            })
        } else {
            let p = self.info_v1(handle)?;
            let mapping_type = match (p.mapped != 0, p.wc_mapping != 0) {
                (_, true) => MappingType::WriteCombining,
                (true, false) => MappingType::Caching,
                (false, false) => MappingType::None,
            };
            Ok(Info {
                va: p.va,
                mapped_size: p.mapped_size,
                page_size: p.page_size,
                tm_cycles: p.tm_cycles,
                cycles_per_ms: p.tsc_khz,
                mapping_type,
            })
        }
    }

    fn callback_flag(&self, handle: u64) -> Result<bool> {
        Ok(Driver::callback_flag(self, handle)? != 0)
    }

    fn map(
        &self,
        handle: u64,
        size: usize,
        request: MapRequest,
    ) -> Result<(NonNull<u8>, usize, MappingType)> {
        if self.supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_REQ_MAPPING_TYPE) {
            self.req_mapping_type(handle, request as u32)?;
        } else if request != MapRequest::Default {
            return Err(Error::new("map", Errno::EINVAL));
        }
        let len =
            round_up(size, Driver::page_size(self)).ok_or(Error::new("map", Errno::EINVAL))?;
        let ptr = self.mmap(handle, len)?;
        let wanted = match request {
            MapRequest::Default => None,
            MapRequest::WriteCombining => Some(MappingType::WriteCombining),
            MapRequest::Caching => Some(MappingType::Caching),
            MapRequest::Device => Some(MappingType::Device),
        };
        let outcome = match Backend::info(self, handle) {
            Err(e) => Err(e),
            Ok(info) if !info.mapped() => Err(Error::new("map", Errno::EAGAIN)),
            Ok(info) if wanted.is_some_and(|w| w != info.mapping_type) => {
                Err(Error::new("map", Errno::EINVAL))
            }
            Ok(info) => Ok(info.mapping_type),
        };
        match outcome {
            Ok(mapping_type) => Ok((ptr, len, mapping_type)),
            Err(e) => {
                // SAFETY: the mapping was just created and nothing refers to it.
                let _ = unsafe { self.munmap(ptr, len) };
                Err(e)
            }
        }
    }

    unsafe fn unmap(&self, _handle: u64, ptr: NonNull<u8>, len: usize) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        unsafe { self.munmap(ptr, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_value_1_forces_dma_buf() {
        assert!(forced(Some("1".as_ref())));
        for v in ["", "0", "true", "yes", " 1", "11"] {
            assert!(!forced(Some(v.as_ref())), "{v:?}");
        }
        assert!(!forced(None));
    }

    #[test]
    fn lengths_round_up_to_the_page() {
        assert_eq!(round_up(1, 4096), Some(4096));
        assert_eq!(round_up(4096, 4096), Some(4096));
        assert_eq!(round_up(4097, 4096), Some(8192));
        assert_eq!(round_up(0, 4096), None);
        assert_eq!(round_up(usize::MAX, 4096), None);
    }
}
