//! The module backend: ioctls and mmap over `/dev/mtgdrdrv`, and its [`Backend`] implementation. Thin on purpose: every call is one syscall with
//! the ABI crate's structs, so tests against the real module exercise the real thing.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use mtgdrdrv::*;
use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sys::mman::munmap;
use nix::sys::stat::Mode;

use super::Backend;
use crate::error::{Error, Result};
use crate::log;
use crate::pages::{host_page_size, round_up};
use crate::types::{Attribute, Info, MapRequest, MappingType, PinFlags};
use crate::version::{GDR_API_VERSION, MINIMUM_GDRDRV_VERSION};

/// The device node, created by udev when the module loads.
pub const DEVICE_PATH: &str = "/dev/mtgdrdrv";

// Upstream encodes a pointer size in seven of the commands, so nix's size-deriving macros cannot
// express them: the `_bad` forms take the exact command value.
nix::ioctl_readwrite_bad!(
    ioc_pin_buffer,
    GDRDRV_IOC_PIN_BUFFER,
    GDRDRV_IOC_PIN_BUFFER_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_pin_buffer_v2,
    GDRDRV_IOC_PIN_BUFFER_V2,
    GDRDRV_IOC_PIN_BUFFER_V2_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_unpin_buffer,
    GDRDRV_IOC_UNPIN_BUFFER,
    GDRDRV_IOC_UNPIN_BUFFER_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_get_cb_flag,
    GDRDRV_IOC_GET_CB_FLAG,
    GDRDRV_IOC_GET_CB_FLAG_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_get_info,
    GDRDRV_IOC_GET_INFO,
    GDRDRV_IOC_GET_INFO_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_get_info_v2,
    GDRDRV_IOC_GET_INFO_V2,
    GDRDRV_IOC_GET_INFO_V2_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_get_attr,
    GDRDRV_IOC_GET_ATTR,
    GDRDRV_IOC_GET_ATTR_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_req_mapping_type,
    GDRDRV_IOC_REQ_MAPPING_TYPE,
    GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS
);
nix::ioctl_readwrite_bad!(
    ioc_get_version,
    GDRDRV_IOC_GET_VERSION,
    GDRDRV_IOC_GET_VERSION_PARAMS
);

/// One open file of the device.
pub(crate) struct Driver {
    fd: OwnedFd,
    version: u32,
    page_size: usize,
    /// The driver serves only the process that opened the file; a forked child must not touch
    /// the parent's mappings (they are not inherited, and the addresses may be reused). The
    /// fork generation it opened at, not its PID: a child in a new PID namespace, or one with a
    /// reused PID, can have the opener's PID.
    opener: u64,
}

/// Issues one ioctl; `what` names it in the error.
macro_rules! ioctl {
    ($self:ident, $f:ident, $what:literal, $params:expr) => {{
        let params = $params;
        // SAFETY: `params` is a live, exclusively borrowed `#[repr(C)]` struct of exactly the
        // type the command copies in and out; the fd is open for the lifetime of `self`.
        unsafe { $f($self.fd.as_raw_fd(), params) }
            .map(|_| ())
            .map_err(|e| Error::new(concat!("ioctl(", $what, ")"), e))
    }};
}

impl Driver {
    /// Opens the device node; the errno when it cannot be opened (the caller then may fall back
    /// to the dma-buf backend, and explains the failure with [`open_failure_text`] if not).
    pub fn open_node() -> std::result::Result<OwnedFd, Errno> {
        let fd = open(DEVICE_PATH, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())?;
        // SAFETY: `open` returned a new descriptor that nothing else owns.
        Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// The driver behind `fd` (from [`Driver::open_node`]), once driver and library accept
    /// each other.
    pub fn with_node(fd: OwnedFd) -> Result<Driver> {
        let mut driver = Driver {
            fd,
            version: 0,
            page_size: host_page_size()?,
            opener: crate::handles::fork_generation(),
        };
        driver.version = driver.handshake()?;
        Ok(driver)
    }

    /// Library 1.x accepts driver 0.x with minor ≥ its minimum, and only when the driver
    /// accepts this library; anything else is refused naming both versions.
    fn handshake(&self) -> Result<u32> {
        let mut params = GDRDRV_IOC_GET_VERSION_PARAMS::default();
        ioctl!(self, ioc_get_version, "GET_VERSION", &mut params).inspect_err(|e| {
            log::error(format_args!(
                "{DEVICE_PATH} did not answer GET_VERSION ({e}): it is not mtgdrdrv, or too old"
            ))
        })?;
        let drv = params.gdrdrv_version;
        let min_lib = params.minimum_gdr_api_version;
        if let Err(why) = compatibility(drv, min_lib) {
            log::error(format_args!(
                "driver mtgdrdrv {}.{} and library libgdrapi {}.{} are incompatible: {why}",
                major(drv),
                minor(drv),
                major(GDR_API_VERSION),
                minor(GDR_API_VERSION)
            ));
            return Err(Error::new("version handshake", Errno::EPROTO));
        }
        log::info(format_args!(
            "mtgdrdrv {}.{} (accepts libgdrapi >= {}.{})",
            major(drv),
            minor(drv),
            major(min_lib),
            minor(min_lib)
        ));
        Ok(drv)
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Whether the calling process is the one that opened the device.
    pub fn in_opener(&self) -> bool {
        crate::handles::fork_generation() == self.opener
    }

    pub fn supports(&self, since: u32) -> bool {
        self.version >= since
    }

    pub fn pin_v1(&self, addr: u64, size: u64, p2p_token: u64, va_space: u32) -> Result<u64> {
        let mut p = GDRDRV_IOC_PIN_BUFFER_PARAMS {
            addr,
            size,
            p2p_token,
            va_space,
            ..Default::default()
        };
        ioctl!(self, ioc_pin_buffer, "PIN_BUFFER", &mut p)?;
        Ok(p.handle)
    }

    pub fn pin_v2(&self, addr: u64, size: u64, flags: u32) -> Result<u64> {
        let mut p = GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
            addr,
            size,
            flags,
            ..Default::default()
        };
        ioctl!(self, ioc_pin_buffer_v2, "PIN_BUFFER_V2", &mut p)?;
        Ok(p.handle)
    }

    pub fn unpin(&self, handle: u64) -> Result<()> {
        let mut p = GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
        ioctl!(self, ioc_unpin_buffer, "UNPIN_BUFFER", &mut p)
    }

    pub fn callback_flag(&self, handle: u64) -> Result<u32> {
        let mut p = GDRDRV_IOC_GET_CB_FLAG_PARAMS {
            handle,
            ..Default::default()
        };
        ioctl!(self, ioc_get_cb_flag, "GET_CB_FLAG", &mut p)?;
        Ok(p.flag)
    }

    pub fn info_v1(&self, handle: u64) -> Result<GDRDRV_IOC_GET_INFO_PARAMS> {
        let mut p = GDRDRV_IOC_GET_INFO_PARAMS {
            handle,
            ..Default::default()
        };
        ioctl!(self, ioc_get_info, "GET_INFO", &mut p)?;
        Ok(p)
    }

    pub fn info_v2(&self, handle: u64) -> Result<GDRDRV_IOC_GET_INFO_V2_PARAMS> {
        let mut p = GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        ioctl!(self, ioc_get_info_v2, "GET_INFO_V2", &mut p)?;
        Ok(p)
    }

    pub fn attr(&self, attr: u32) -> Result<u32> {
        let mut p = GDRDRV_IOC_GET_ATTR_PARAMS { attr, val: 0 };
        ioctl!(self, ioc_get_attr, "GET_ATTR", &mut p)?;
        Ok(p.val)
    }

    pub fn req_mapping_type(&self, handle: u64, mapping_type: u32) -> Result<()> {
        let mut p = GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
            handle,
            mapping_type,
            _pad: 0,
        };
        ioctl!(self, ioc_req_mapping_type, "REQ_MAPPING_TYPE", &mut p)
    }

    /// Maps `len` bytes (a multiple of the host page) of the pin `handle`, shared, read/write.
    pub fn mmap(&self, handle: u64, len: usize) -> Result<NonNull<u8>> {
        let len = NonZeroUsize::new(len).ok_or(Error::new("mmap", Errno::EINVAL))?;
        // The module finds the pin from the offset: handle << PAGE_SHIFT.
        let offset = handle
            .checked_mul(self.page_size as u64)
            .and_then(|o| i64::try_from(o).ok())
            .ok_or(Error::new("mmap", Errno::EOVERFLOW))?;
        super::mmap_shared(&self.fd, len, offset as libc::off_t).map_err(|e| Error::new("mmap", e))
    }

    /// Unmaps a mapping made by [`Driver::mmap`]; in a forked child, where the mapping was not
    /// inherited and the range may hold something else now, it does nothing.
    ///
    /// # Safety
    /// `ptr`/`len` must be exactly a live mapping returned by `mmap` on this driver, and no
    /// reference into it may be used afterwards.
    pub unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) -> Result<()> {
        if !self.in_opener() {
            return Ok(());
        }
        // SAFETY: guaranteed by the caller.
        unsafe { munmap(ptr.cast::<c_void>(), len) }.map_err(|e| Error::new("munmap", e))
    }
}

/// Whether driver `drv` (which accepts libraries from `min_lib` on) and this library work
/// together; otherwise what to do about it.
fn compatibility(drv: u32, min_lib: u32) -> std::result::Result<(), String> {
    if major(drv) != major(MINIMUM_GDRDRV_VERSION) {
        return Err(format!(
            "this library supports driver major version {} only; install matching packages",
            major(MINIMUM_GDRDRV_VERSION)
        ));
    }
    if drv < MINIMUM_GDRDRV_VERSION {
        return Err(format!(
            "the driver is older than {}.{}; upgrade mtgdrdrv-dkms",
            major(MINIMUM_GDRDRV_VERSION),
            minor(MINIMUM_GDRDRV_VERSION)
        ));
    }
    if min_lib > GDR_API_VERSION {
        return Err(format!(
            "the driver needs libgdrapi {}.{} or newer; upgrade libgdrapi",
            major(min_lib),
            minor(min_lib)
        ));
    }
    Ok(())
}

/// What to do, for the failures to open the node users actually hit.
pub(crate) fn open_failure_text(errno: Errno) -> String {
    match errno {
        Errno::ENOENT | Errno::ENXIO | Errno::ENODEV => format!(
            "{DEVICE_PATH} does not exist: the mtgdrdrv module is not loaded. Load the mtgpu \
             driver, then `modprobe mtgdrdrv` (package mtgdrdrv-dkms)"
        ),
        Errno::EACCES | Errno::EPERM => format!(
            "permission denied on {DEVICE_PATH}: the device is readable and writable by the \
             'render' group (udev rule 60-mtgdrdrv.rules); add the user to that group or pass \
             the device into the container"
        ),
        e => format!("cannot open {DEVICE_PATH}: {}", e.desc()),
    }
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
        // Checked here rather than left to the module: mmap refuses a length beyond the address
        // space with ENOMEM before the module sees it, and the contract says EINVAL.
        let pinned = Backend::info(self, handle)?.mapped_size;
        let len = round_up(size, Driver::page_size(self))
            .filter(|&l| l as u64 <= pinned)
            .ok_or(Error::new("map", Errno::EINVAL))?;
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
    use super::compatibility;
    use mtgdrdrv::pack;

    #[test]
    fn library_1_x_accepts_every_driver_0_x_from_its_minimum() {
        assert!(compatibility(pack(0, 1), pack(1, 0)).is_ok());
        assert!(
            compatibility(pack(0, 9), pack(1, 0)).is_ok(),
            "newer 0.x minors are accepted"
        );
        assert!(compatibility(pack(0, 1), pack(0, 5)).is_ok());
    }

    #[test]
    fn mismatches_are_refused_with_what_to_do() {
        let older = compatibility(pack(0, 0), pack(1, 0)).unwrap_err();
        assert!(older.contains("upgrade mtgdrdrv-dkms"), "{older}");
        let major = compatibility(pack(1, 0), pack(1, 0)).unwrap_err();
        assert!(major.contains("driver major version 0"), "{major}");
        let lib = compatibility(pack(0, 2), pack(1, 1)).unwrap_err();
        assert!(lib.contains("needs libgdrapi 1.1"), "{lib}");
    }
}
