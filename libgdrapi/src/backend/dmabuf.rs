//! The dma-buf backend: no kernel module. Each pin asks the MUSA driver for a dma-buf of the
//! range (`muMemGetHandleForAddressRange(..., MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)`), and
//! `gdr_map` mmaps that fd.
//!
//! libmusa (found and its functions resolved as `crate::musa` says) is loaded on the
//! first open of this backend and stays loaded for the life of the process: unloading a GPU
//! driver library that may hold threads and handlers is not safe, and reloading costs. Only
//! success is kept: an open that finds no library, or whose `muInit` fails, leaves the next
//! open to look (and initialise) again, so a driver installed or brought up later is found.
//!
//! How it differs from the module backend is written once, in gdrapi.h's overview (the
//! `OVERVIEW` of xtask/src/codegen/gdrapi.rs); this file implements that list. MUSA errors
//! become errno through [`errno_of`]. A refused mmap (mtgpu 2.7.0-era drivers refuse CPU mmap
//! of their dma-bufs) is reported in one log line that says so and what to use instead.
//!
//! The pointer's device is not queried: `MU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`'s value is not
//! public (docs/musa-abi.md), hence the context rule of the overview; the primary context is
//! retained for the call.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use libloading::Library;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::mman::munmap;

use super::Backend;
use crate::error::{Error, Result};
use crate::log;
use crate::musa::ids::*;
use crate::pages::{host_page_size, round_up};
use crate::types::{Attribute, Info, MapRequest, MappingType, PinFlags};

type MUdevice = c_int;
type MUcontext = *mut c_void;

/// The MUSA driver API entry points the backend uses.
struct Musa {
    init: unsafe extern "C" fn(c_uint) -> MUresult,
    /// `muInit` succeeded once: it need not be called again.
    initialised: AtomicBool,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> MUresult,
    device_get: unsafe extern "C" fn(*mut MUdevice, c_int) -> MUresult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, MUdevice) -> MUresult,
    ctx_get_current: unsafe extern "C" fn(*mut MUcontext) -> MUresult,
    ctx_set_current: unsafe extern "C" fn(MUcontext) -> MUresult,
    primary_ctx_retain: unsafe extern "C" fn(*mut MUcontext, MUdevice) -> MUresult,
    primary_ctx_release: unsafe extern "C" fn(MUdevice) -> MUresult,
    mem_get_handle: unsafe extern "C" fn(*mut c_void, u64, usize, c_int, c_ulonglong) -> MUresult,
    get_error_name: Option<unsafe extern "C" fn(MUresult, *mut *const c_char) -> MUresult>,
    _lib: Library,
}

/// The errno for a MUSA code (CUDA's numbering, which MUSA mirrors): never the raw code.
pub fn errno_of(code: MUresult) -> Errno {
    match code {
        MUSA_ERROR_INVALID_VALUE => Errno::EINVAL,
        MUSA_ERROR_OUT_OF_MEMORY => Errno::ENOMEM,
        MUSA_ERROR_NOT_INITIALIZED | MUSA_ERROR_DEINITIALIZED => Errno::ENODEV,
        MUSA_ERROR_NO_DEVICE | MUSA_ERROR_INVALID_DEVICE => Errno::ENODEV,
        MUSA_ERROR_INVALID_CONTEXT | MUSA_ERROR_CONTEXT_IS_DESTROYED => Errno::EINVAL,
        MUSA_ERROR_OPERATING_SYSTEM => Errno::EIO,
        MUSA_ERROR_INVALID_HANDLE | MUSA_ERROR_NOT_FOUND => Errno::ENOENT,
        MUSA_ERROR_NOT_PERMITTED => Errno::EPERM,
        MUSA_ERROR_NOT_SUPPORTED => Errno::EOPNOTSUPP,
        // SYSTEM_DRIVER_MISMATCH (803), COMPAT_NOT_SUPPORTED (804), UNKNOWN (999), any other.
        _ => Errno::EIO,
    }
}

/// Why the dma-buf backend cannot be used: the errno `gdr_open` sets, and one sentence.
#[derive(Clone, Debug)]
pub(crate) struct Unavailable {
    pub errno: Errno,
    pub why: String,
}

impl Musa {
    fn load() -> std::result::Result<Musa, Unavailable> {
        let (lib, path) = crate::musa::open_library().map_err(|e| Unavailable {
            errno: Errno::ENOENT,
            why: format!("the MUSA driver library cannot be loaded ({e})"),
        })?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the field this is stored in has the C signature of the musa.h
                // prototype of that name; the Library lives in the same struct.
                unsafe { crate::musa::function(&lib, $name) }.ok_or_else(|| Unavailable {
                    errno: Errno::ENOSYS,
                    why: format!(
                        "{path} lacks {}: not a MUSA driver library, or too old",
                        $name
                    ),
                })
            }};
        }
        Ok(Musa {
            init: sym!("muInit")?,
            initialised: AtomicBool::new(false),
            device_get_count: sym!("muDeviceGetCount")?,
            device_get: sym!("muDeviceGet")?,
            device_get_attribute: sym!("muDeviceGetAttribute")?,
            ctx_get_current: sym!("muCtxGetCurrent")?,
            ctx_set_current: sym!("muCtxSetCurrent")?,
            primary_ctx_retain: sym!("muDevicePrimaryCtxRetain")?,
            primary_ctx_release: sym!("muDevicePrimaryCtxRelease")?,
            mem_get_handle: sym!("muMemGetHandleForAddressRange")?,
            get_error_name: sym!("muGetErrorName").ok(),
            _lib: lib,
        })
    }

    /// `muInit`, until it has succeeded once (it may be called any number of times).
    fn init(&self) -> std::result::Result<(), Unavailable> {
        if self.initialised.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: muInit takes no pointers.
        let rc = unsafe { (self.init)(0) };
        self.available("muInit", rc)?;
        self.initialised.store(true, Ordering::Release);
        Ok(())
    }

    /// The code's MUSA name, for the log.
    fn name(&self, code: MUresult) -> String {
        let mut s: *const c_char = std::ptr::null();
        let Some(f) = self.get_error_name else {
            return "MUSA error".into();
        };
        // SAFETY: `s` is a valid out pointer; on success it points to a static C string.
        if unsafe { f(code, &mut s) } != 0 || s.is_null() {
            return "MUSA error".into();
        }
        // SAFETY: non-NULL static NUL-terminated string from the driver.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// `rc` as a `Result`: a failure is logged with its MUSA name and becomes an errno.
    fn check(&self, call: &'static str, rc: MUresult) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let errno = errno_of(rc);
        log::error(format_args!(
            "{call} failed: {} ({rc}), returned as {errno}",
            self.name(rc)
        ));
        Err(Error::new(call, errno))
    }

    /// `rc` of a call made while opening: a failure says why the backend is unavailable.
    fn available(&self, call: &str, rc: MUresult) -> std::result::Result<(), Unavailable> {
        if rc == 0 {
            return Ok(());
        }
        Err(Unavailable {
            errno: errno_of(rc),
            why: format!("{call} failed: {} ({rc})", self.name(rc)),
        })
    }

    /// The first device that reports dma-buf support.
    fn dma_buf_device(&self) -> std::result::Result<MUdevice, Unavailable> {
        let mut count = 0;
        // SAFETY: `count` is a valid out pointer.
        self.available("muDeviceGetCount", unsafe {
            (self.device_get_count)(&mut count)
        })?;
        for ordinal in 0..count {
            let mut dev = 0;
            // SAFETY: `dev` is a valid out pointer.
            self.available("muDeviceGet", unsafe {
                (self.device_get)(&mut dev, ordinal)
            })?;
            let mut supported = 0;
            // SAFETY: `supported` is a valid out pointer.
            let rc = unsafe {
                (self.device_get_attribute)(
                    &mut supported,
                    MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                    dev,
                )
            };
            if rc == 0 && supported != 0 {
                return Ok(dev);
            }
        }
        Err(Unavailable {
            errno: Errno::EOPNOTSUPP,
            why: format!(
                "none of the {count} MUSA device(s) supports dma-buf export \
                 (MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)"
            ),
        })
    }
}

/// One load of libmusa at a time, so that two threads never both load.
static LOADING: Mutex<()> = Mutex::new(());

pub(super) fn lock_statics_for_fork() -> Vec<Box<dyn std::any::Any>> {
    vec![Box::new(
        LOADING.lock().unwrap_or_else(PoisonError::into_inner),
    )]
}

/// libmusa, loaded and initialised. A failure is not kept: the next call tries again.
fn musa() -> std::result::Result<&'static Musa, Unavailable> {
    static MUSA: OnceLock<Musa> = OnceLock::new();
    let musa = match MUSA.get() {
        Some(musa) => musa,
        None => {
            let _one = LOADING.lock().unwrap_or_else(PoisonError::into_inner);
            match MUSA.get() {
                Some(musa) => musa,
                None => {
                    let loaded = Musa::load()?;
                    MUSA.get_or_init(|| loaded)
                }
            }
        }
    };
    musa.init()?;
    Ok(musa)
}

/// Every pin table made (one per open; emptied when its backend closes): kept reachable,
/// as each must be `'static` for the fork handler to hold its guard.
static PIN_TABLES: Mutex<Vec<&'static Mutex<HashMap<u64, DmaPin>>>> = Mutex::new(Vec::new());

fn pins_table() -> &'static Mutex<HashMap<u64, DmaPin>> {
    let table: &'static Mutex<HashMap<u64, DmaPin>> = Box::leak(Box::default());
    PIN_TABLES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(table);
    table
}

/// One pin: the dma-buf of `[va, va + size)` and whether it is mapped.
struct DmaPin {
    fd: OwnedFd,
    va: u64,
    size: u64,
    /// The pinned address minus `va`: mapping needs 0, as upstream's dma-buf backend.
    offset: u64,
    mapped: bool,
}

pub(crate) struct DmaBuf {
    musa: &'static Musa,
    /// The device whose primary context exports when the caller has no current context.
    device: MUdevice,
    page_size: usize,
    /// The fork generation of the process that opened it (see `module::Driver`'s `opener`).
    opener: u64,
    /// From `pins_table` (one small allocation per open, never freed), so that the fork
    /// handler can hold its guard.
    pins: &'static Mutex<HashMap<u64, DmaPin>>,
    next_handle: AtomicU64,
}

impl DmaBuf {
    /// Loads libmusa (until that succeeds once per process) and finds a device that exports dma-bufs; logs
    /// nothing, the caller says why in one line.
    pub fn open() -> std::result::Result<DmaBuf, Unavailable> {
        let musa = musa()?;
        let device = musa.dma_buf_device()?;
        let page_size = host_page_size().map_err(|e| Unavailable {
            errno: e.errno(),
            why: e.to_string(),
        })?;
        Ok(DmaBuf {
            musa,
            device,
            page_size,
            opener: crate::handles::fork_generation(),
            pins: pins_table(),
            next_handle: AtomicU64::new(1),
        })
    }

    fn pins(&self) -> MutexGuard<'_, HashMap<u64, DmaPin>> {
        self.pins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The dma-buf of `[va, va + size)`, exported in the current context or, without one, in
    /// the primary context of `self.device` for the duration of the call.
    fn export(&self, va: u64, size: usize) -> Result<OwnedFd> {
        let m = self.musa;
        let mut current: MUcontext = std::ptr::null_mut();
        // SAFETY: `current` is a valid out pointer.
        m.check("muCtxGetCurrent", unsafe {
            (m.ctx_get_current)(&mut current)
        })?;
        let borrowed = current.is_null();
        if borrowed {
            let mut primary: MUcontext = std::ptr::null_mut();
            // SAFETY: `primary` is a valid out pointer.
            m.check("muDevicePrimaryCtxRetain", unsafe {
                (m.primary_ctx_retain)(&mut primary, self.device)
            })?;
            // SAFETY: `primary` is the context the driver just returned.
            if let Err(e) = m.check("muCtxSetCurrent", unsafe { (m.ctx_set_current)(primary) }) {
                // SAFETY: drops the reference taken above.
                unsafe { (m.primary_ctx_release)(self.device) };
                return Err(e);
            }
        }
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out pointer for the int the DMA_BUF_FD handle type writes.
        let rc = unsafe {
            (m.mem_get_handle)(
                (&mut fd as *mut c_int).cast(),
                va,
                size,
                MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        if borrowed {
            // SAFETY: restores "no current context" and drops the reference taken above.
            unsafe {
                (m.ctx_set_current)(std::ptr::null_mut());
                (m.primary_ctx_release)(self.device);
            }
        }
        m.check("muMemGetHandleForAddressRange", rc)?;
        if fd < 0 {
            return Err(Error::new("muMemGetHandleForAddressRange", Errno::EIO));
        }
        // SAFETY: the driver handed us a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Like /dev/mtgdrdrv's: not leaked into programs the process executes.
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map_err(|e| Error::new("fcntl(FD_CLOEXEC)", e))?;
        Ok(fd)
    }

    /// A `gdr_t` serves the process that opened it, as the module's file does: a forked child
    /// gets `EACCES` for every use of the parent's pins (it may only close its copy).
    fn opener_only(&self, call: &'static str) -> Result<()> {
        if self.in_opener() {
            Ok(())
        } else {
            Err(Error::new(call, Errno::EACCES))
        }
    }
}

/// `[addr, addr + size)` widened to whole pages of `page` bytes: start and length; `EINVAL`
/// for an empty or wrapping range.
fn page_range(page: u64, addr: u64, size: u64) -> Result<(u64, u64)> {
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(size)
        .and_then(|e| e.checked_add(page - 1))
        .map(|e| e & !(page - 1))
        .filter(|_| size > 0)
        .ok_or(Error::new("pin", Errno::EINVAL))?;
    Ok((start, end - start))
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // The map itself is leaked (see `pins`): close the pins' fds and free its table here.
        drop(std::mem::take(&mut *self.pins()));
    }
}

impl Backend for DmaBuf {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn in_opener(&self) -> bool {
        crate::handles::fork_generation() == self.opener
    }

    fn driver_version(&self) -> Result<u32> {
        log::info(format_args!(
            "gdr_driver_get_version: the dma-buf backend uses no kernel module (EOPNOTSUPP)"
        ));
        Err(Error::new("gdr_driver_get_version", Errno::EOPNOTSUPP))
    }

    fn attribute(&self, attr: Attribute) -> Result<u32> {
        Ok(match attr {
            Attribute::UsePersistentMapping => 1,
            Attribute::SupportPinFlagForcePcie => 0,
            Attribute::UsingDmaBufMmap => 1,
        })
    }

    fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<u64> {
        self.opener_only("pin")?;
        if flags != PinFlags::DEFAULT {
            log::error(format_args!(
                "pin flags {:#x} are not supported (mtgpu memory is always reached through PCIe)",
                flags.0
            ));
            return Err(Error::new("pin", Errno::EINVAL));
        }
        let (va, len) = page_range(self.page_size as u64, addr, size)?;
        let len_usize = usize::try_from(len).map_err(|_| Error::new("pin", Errno::EINVAL))?;
        let fd = self.export(va, len_usize)?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.pins().insert(
            handle,
            DmaPin {
                fd,
                va,
                size: len,
                offset: addr - va,
                mapped: false,
            },
        );
        Ok(handle)
    }

    fn pin_with_tokens(&self, addr: u64, size: u64, p2p_token: u64, va_space: u32) -> Result<u64> {
        if p2p_token != 0 || va_space != 0 {
            log::error(format_args!("P2P tokens do not exist on mtgpu: pass 0"));
            return Err(Error::new("pin", Errno::EINVAL));
        }
        Backend::pin(self, addr, size, PinFlags::DEFAULT)
    }

    fn unpin(&self, handle: u64) -> Result<()> {
        self.opener_only("unpin")?;
        // Closing the fd drops this process's reference; the dma-buf (and the memory it keeps)
        // goes once no mapping of it is left either.
        self.pins()
            .remove(&handle)
            .map(drop)
            .ok_or(Error::new("unpin", Errno::EINVAL))
    }

    fn forget(&self, handle: u64) {
        // The child's copy of the fd is the child's own: closing it leaves the parent's pin.
        self.pins().remove(&handle);
    }

    fn lock_for_fork(&self) -> Option<Box<dyn std::any::Any>> {
        let pins: &'static Mutex<_> = self.pins;
        Some(Box::new(
            pins.lock().unwrap_or_else(PoisonError::into_inner),
        ))
    }

    fn info(&self, handle: u64) -> Result<Info> {
        self.opener_only("info")?;
        let pins = self.pins();
        let pin = pins.get(&handle).ok_or(Error::new("info", Errno::EINVAL))?;
        Ok(Info {
            va: pin.va,
            mapped_size: pin.size,
            page_size: self.page_size as u32,
            tm_cycles: 0,
            cycles_per_ms: 0,
            mapping_type: if pin.mapped {
                MappingType::WriteCombining
            } else {
                MappingType::None
            },
        })
    }

    fn callback_flag(&self, handle: u64) -> Result<bool> {
        self.opener_only("callback_flag")?;
        let known = self.pins().contains_key(&handle);
        known
            .then_some(false)
            .ok_or(Error::new("callback_flag", Errno::EINVAL))
    }

    fn map(
        &self,
        handle: u64,
        size: usize,
        request: MapRequest,
    ) -> Result<(NonNull<u8>, usize, MappingType)> {
        if !matches!(request, MapRequest::Default | MapRequest::WriteCombining) {
            log::error(format_args!(
                "the dma-buf backend maps write-combining only (the type is fixed at pin)"
            ));
            return Err(Error::new("map", Errno::EINVAL));
        }
        self.opener_only("map")?;
        let mut pins = self.pins();
        let pin = pins
            .get_mut(&handle)
            .ok_or(Error::new("map", Errno::EINVAL))?;
        if pin.mapped {
            return Err(Error::new("map", Errno::EAGAIN));
        }
        if pin.offset != 0 {
            log::error(format_args!(
                "cannot map a pin whose address is not host-page aligned (it starts {:#x} \
                 bytes into its page)",
                pin.offset
            ));
            return Err(Error::new("map", Errno::EINVAL));
        }
        let length = round_up(size, self.page_size)
            .and_then(NonZeroUsize::new)
            .filter(|l| l.get() as u64 <= pin.size)
            .ok_or(Error::new("map", Errno::EINVAL))?;
        let ptr = super::mmap_shared(&pin.fd, length, 0).map_err(|e| {
            log::error(format_args!(
                "mmap of the MUSA dma-buf was refused ({}): this driver's dma-bufs cannot be \
                 mapped by the CPU; load mtgdrdrv (and unset GDRCOPY_USE_DMABUF_MMAP) to use \
                 the module backend",
                e.desc()
            ));
            Error::new("mmap(dma-buf)", e)
        })?;
        pin.mapped = true;
        Ok((ptr, length.get(), MappingType::WriteCombining))
    }

    unsafe fn unmap(&self, handle: u64, ptr: NonNull<u8>, len: usize) -> Result<()> {
        let mut pins = self.pins();
        if let Some(pin) = pins.get_mut(&handle) {
            pin.mapped = false;
        }
        if !self.in_opener() {
            return Ok(());
        }
        // SAFETY: guaranteed by the caller.
        unsafe { munmap(ptr.cast::<c_void>(), len) }.map_err(|e| Error::new("munmap", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_widen_to_host_pages() {
        assert_eq!(page_range(4096, 0x10000, 1).unwrap(), (0x10000, 0x1000));
        assert_eq!(page_range(4096, 0x10064, 1000).unwrap(), (0x10000, 0x1000));
        assert_eq!(page_range(4096, 0x10ff8, 16).unwrap(), (0x10000, 0x2000));
        assert_eq!(
            page_range(4096, 0x11000, 0x3000).unwrap(),
            (0x11000, 0x3000)
        );
        assert!(page_range(4096, 0x1000, 0).is_err());
        assert!(page_range(4096, u64::MAX - 10, 100).is_err());
    }

    #[test]
    fn musa_codes_become_errno_never_raw() {
        assert_eq!(errno_of(1), Errno::EINVAL);
        assert_eq!(errno_of(2), Errno::ENOMEM);
        assert_eq!(errno_of(100), Errno::ENODEV);
        assert_eq!(errno_of(801), Errno::EOPNOTSUPP);
        // Unknown codes are EIO, not the number itself (801 would read as an errno).
        assert_eq!(errno_of(12345), Errno::EIO);
        assert_eq!(errno_of(999), Errno::EIO);
    }
}
