//! The safe Rust API: an open device, the buffers pinned through it and their CPU mappings.
//!
//! A [`Mapping`] borrows its [`PinnedBuffer`], so a buffer cannot be unpinned while mapped, and
//! device memory is only reachable through copy methods: WC memory is never handed out as an
//! ordinary `&mut [u8]` (the compiler would be free to read it back, merge or split accesses).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use mtgdrdrv::{gdr_mr_type_t, major, minor};
use nix::errno::Errno;

use crate::copy;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::{handles, log};

/// An open `/dev/mtgdrdrv`. Cheap to share between threads (`&Gdr` is `Sync`).
pub struct Gdr {
    drv: Arc<Driver>,
}

/// Flags of [`Gdr::pin`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinFlags(pub u32);

impl PinFlags {
    pub const DEFAULT: PinFlags = PinFlags(mtgdrdrv::GDRDRV_PIN_BUFFER_FLAG_DEFAULT);
    /// Not supported by mtgpu: pins with it fail with `EINVAL`.
    pub const FORCE_PCIE: PinFlags = PinFlags(mtgdrdrv::GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE);
}

/// Attributes of [`Gdr::attribute`]; values are gdrapi.h's `gdr_attr_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribute {
    UsePersistentMapping = 1,
    SupportPinFlagForcePcie = 2,
    UsingDmaBufMmap = 3,
}

impl Attribute {
    pub fn from_raw(value: i32) -> Option<Attribute> {
        match value {
            1 => Some(Attribute::UsePersistentMapping),
            2 => Some(Attribute::SupportPinFlagForcePcie),
            3 => Some(Attribute::UsingDmaBufMmap),
            _ => None,
        }
    }
}

/// How a buffer is mapped; values are gdrapi.h's `gdr_mapping_type_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MappingType {
    None = 0,
    WriteCombining = 1,
    Caching = 2,
    Device = 3,
}

impl MappingType {
    pub fn from_raw(value: u32) -> Option<MappingType> {
        Some(match gdr_mr_type_t::from_u32(value)? {
            gdr_mr_type_t::GDR_MR_NONE => MappingType::None,
            gdr_mr_type_t::GDR_MR_WC => MappingType::WriteCombining,
            gdr_mr_type_t::GDR_MR_CACHING => MappingType::Caching,
            gdr_mr_type_t::GDR_MR_DEVICE => MappingType::Device,
        })
    }

    /// The strings of `gdr_get_mapping_type_string`.
    pub fn description(self) -> &'static str {
        match self {
            MappingType::None => "None",
            MappingType::WriteCombining => "Write Combining",
            MappingType::Caching => "Caching",
            MappingType::Device => "Device",
        }
    }
}

/// What mapping to ask for; values are gdrapi.h's `gdr_map_flags_t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapRequest {
    /// The driver's choice: write-combining on mtgpu.
    #[default]
    Default = 0,
    WriteCombining = 1,
    /// Refused on mtgpu (BAR memory is not coherent): `EOPNOTSUPP`.
    Caching = 2,
    /// Uncached device memory.
    Device = 3,
}

impl MapRequest {
    pub fn from_raw(value: i32) -> Option<MapRequest> {
        match value {
            0 => Some(MapRequest::Default),
            1 => Some(MapRequest::WriteCombining),
            2 => Some(MapRequest::Caching),
            3 => Some(MapRequest::Device),
            _ => None,
        }
    }
}

/// What the driver reports about a pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// Start of the pinned range: the pinned address rounded down to the pin granule.
    pub va: u64,
    /// Length of the pinned range, rounded up to the pin granule.
    pub mapped_size: u64,
    /// The pin granule: 65536, or the host page when the allocation is not 64 KiB aligned.
    pub page_size: u32,
    /// Deprecated (upstream): time get_pages took, in TSC cycles.
    pub tm_cycles: u64,
    /// Deprecated (upstream): TSC rate.
    pub cycles_per_ms: u32,
    pub mapping_type: MappingType,
}

impl Info {
    pub fn mapped(&self) -> bool {
        self.mapping_type != MappingType::None
    }
    pub fn wc_mapping(&self) -> bool {
        self.mapping_type == MappingType::WriteCombining
    }
}

impl Gdr {
    /// Opens `/dev/mtgdrdrv` and checks that driver and library accept each other.
    pub fn open() -> Result<Gdr> {
        Ok(Gdr {
            drv: Arc::new(Driver::open()?),
        })
    }

    /// The driver's version as (major, minor).
    pub fn driver_version(&self) -> (u32, u32) {
        (major(self.drv.version()), minor(self.drv.version()))
    }

    /// This library's version as (major, minor).
    pub fn runtime_version() -> (u32, u32) {
        (crate::GDR_API_MAJOR_VERSION, crate::GDR_API_MINOR_VERSION)
    }

    pub fn attribute(&self, attr: Attribute) -> Result<u32> {
        match attr {
            Attribute::UsingDmaBufMmap => Ok(0),
            _ if !self
                .drv
                .supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_GET_ATTR) =>
            {
                Ok(0)
            }
            other => self.drv.attr(other as u32),
        }
    }

    /// Pins `[addr, addr + size)` of device memory allocated by the calling process.
    pub fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<PinnedBuffer> {
        let handle = if self
            .drv
            .supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_PIN_BUFFER_V2)
        {
            self.drv.pin_v2(addr, size, flags.0)?
        } else if flags != PinFlags::DEFAULT {
            log::error(format_args!("pin flags need a newer mtgdrdrv"));
            return Err(Error::new("pin", Errno::EINVAL));
        } else {
            self.drv.pin_v1(addr, size, 0, 0)?
        };
        Ok(PinnedBuffer {
            drv: Arc::clone(&self.drv),
            handle,
            pinned: true,
        })
    }

    /// The legacy pin with upstream's P2P tokens; mtgpu has none, so they must be 0.
    pub fn pin_with_tokens(
        &self,
        addr: u64,
        size: u64,
        p2p_token: u64,
        va_space: u32,
    ) -> Result<PinnedBuffer> {
        let handle = self.drv.pin_v1(addr, size, p2p_token, va_space)?;
        Ok(PinnedBuffer {
            drv: Arc::clone(&self.drv),
            handle,
            pinned: true,
        })
    }

    pub(crate) fn driver(&self) -> &Driver {
        &self.drv
    }
}

/// A pinned range of device memory; unpinned when dropped (or by [`PinnedBuffer::unpin`],
/// which reports errors).
pub struct PinnedBuffer {
    drv: Arc<Driver>,
    handle: u64,
    /// False once `unpin` ran, so `Drop` does not unpin again.
    pinned: bool,
}

impl PinnedBuffer {
    pub fn info(&self) -> Result<Info> {
        if self
            .drv
            .supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_GET_INFO_V2)
        {
            let p = self.drv.info_v2(self.handle)?;
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
            let p = self.drv.info_v1(self.handle)?;
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

    /// Always false on mtgpu: it has no invalidation callback, a pin holds its memory.
    pub fn callback_flag(&self) -> Result<bool> {
        Ok(self.drv.callback_flag(self.handle)? != 0)
    }

    /// Maps the whole pinned range. The pinned address must have been 64 KiB aligned (or
    /// aligned to the pin granule), else `EINVAL`.
    pub fn map(&self, request: MapRequest) -> Result<Mapping<'_>> {
        let size = usize::try_from(self.info()?.mapped_size)
            .map_err(|_| Error::new("map", Errno::EOVERFLOW))?;
        self.map_len(size, request)
    }

    /// Maps the first `size` bytes of the pinned range.
    pub fn map_len(&self, size: usize, request: MapRequest) -> Result<Mapping<'_>> {
        Ok(Mapping {
            raw: self.map_raw(size, request)?,
            _pin: PhantomData,
        })
    }

    /// The mapping without a lifetime, for the C API's handle table. One live mapping per pin.
    pub(crate) fn map_raw(&self, size: usize, request: MapRequest) -> Result<RawMapping> {
        if self
            .drv
            .supports(mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_REQ_MAPPING_TYPE)
        {
            self.drv.req_mapping_type(self.handle, request as u32)?;
        } else if request != MapRequest::Default {
            return Err(Error::new("map", Errno::EINVAL));
        }
        let page = self.drv.page_size();
        let len = size
            .checked_add(page - 1)
            .map(|s| s & !(page - 1))
            .filter(|&s| s > 0)
            .ok_or(Error::new("map", Errno::EINVAL))?;
        let ptr = self.drv.mmap(self.handle, len)?;
        let mut raw = RawMapping {
            drv: Arc::clone(&self.drv),
            ptr,
            len,
            mapping_type: MappingType::None,
            forks: handles::fork_generation(),
        };
        let info = match self.info() {
            Ok(info) => info,
            Err(e) => {
                // SAFETY: the mapping was just created and nothing refers to it.
                let _ = unsafe { raw.unmap() };
                return Err(e);
            }
        };
        let wanted = match request {
            MapRequest::Default => None,
            MapRequest::WriteCombining => Some(MappingType::WriteCombining),
            MapRequest::Caching => Some(MappingType::Caching),
            MapRequest::Device => Some(MappingType::Device),
        };
        let failure = if !info.mapped() {
            Some(Errno::EAGAIN)
        } else if wanted.is_some_and(|w| w != info.mapping_type) {
            Some(Errno::EINVAL)
        } else {
            None
        };
        if let Some(errno) = failure {
            // SAFETY: as above.
            let _ = unsafe { raw.unmap() };
            return Err(Error::new("map", errno));
        }
        raw.mapping_type = info.mapping_type;
        Ok(raw)
    }

    /// Unpins now, reporting failure; dropping does the same silently.
    pub fn unpin(mut self) -> Result<()> {
        self.pinned = false;
        self.drv.unpin(self.handle)
    }

    /// The driver's handle: per open file, never reused.
    pub fn handle(&self) -> u64 {
        self.handle
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if !self.pinned {
            return;
        }
        if let Err(e) = self.drv.unpin(self.handle) {
            if self.drv.in_opener() {
                log::warn(format_args!("unpin of handle {:#x}: {e}", self.handle));
            }
        }
    }
}

/// A CPU mapping of (part of) a pinned buffer. Reads and writes go through [`Mapping::read`] and
/// [`Mapping::write`], which use the copy variant chosen for this CPU and fence.
///
/// Concurrent copies to overlapping ranges from several threads leave unspecified bytes there,
/// as with any memory shared without synchronisation; they never touch memory outside the
/// mapping. In a forked child (which inherits no mapping) every copy fails with `EINVAL`.
pub struct Mapping<'p> {
    raw: RawMapping,
    _pin: PhantomData<&'p PinnedBuffer>,
}

impl Mapping<'_> {
    /// Bytes mapped (a multiple of the host page).
    pub fn len(&self) -> usize {
        self.raw.len
    }

    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    pub fn mapping_type(&self) -> MappingType {
        self.raw.mapping_type
    }

    /// The mapping's address, for code that must hand it to hardware or other processes' APIs.
    /// Dereferencing it is the caller's responsibility.
    pub fn as_ptr(&self) -> *mut u8 {
        self.raw.ptr.as_ptr()
    }

    /// Copies `src` to `offset` bytes into the mapping.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(offset, src.len(), "Mapping::write")?;
        // SAFETY: `dst .. dst + src.len()` lies inside the live mapping (checked by `range`),
        // which stays mapped while `self` exists; `src` is a valid slice.
        unsafe { (copy::selected().to_device)(dst, src.as_ptr(), src.len()) };
        Ok(())
    }

    /// Copies from `offset` bytes into the mapping into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len(), "Mapping::read")?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { (copy::selected().from_device)(dst.as_mut_ptr(), src, dst.len()) };
        Ok(())
    }

    fn range(&self, offset: usize, len: usize, call: &'static str) -> Result<*mut u8> {
        // A forked child holds a copy of this struct but not the mapping (VM_DONTCOPY).
        if self.raw.forks != handles::fork_generation() {
            return Err(Error::new(call, Errno::EINVAL));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.raw.len => {
                // SAFETY: `offset <= len` of the mapping, so the result stays inside it.
                Ok(unsafe { self.raw.ptr.as_ptr().add(offset) })
            }
            _ => Err(Error::new(call, Errno::EINVAL)),
        }
    }

    /// Unmaps now, reporting failure; dropping does the same silently.
    pub fn unmap(mut self) -> Result<()> {
        // SAFETY: `self` is consumed; no access through it can follow. `Drop` then finds the
        // mapping already gone.
        unsafe { self.raw.unmap() }
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        // SAFETY: the mapping is dropped, so no copy through it can follow.
        if let Err(e) = unsafe { self.raw.unmap() } {
            log::warn(format_args!("unmap: {e}"));
        }
    }
}

// SAFETY: the mapping is plain device memory reachable from any thread of the process; all
// access goes through copy routines that take `&self` and touch only the mapped range.
unsafe impl Send for Mapping<'_> {}
// SAFETY: as above.
unsafe impl Sync for Mapping<'_> {}

/// A live mmap of a pin, without the borrow. Unmapping twice is prevented by `ptr` being taken.
pub(crate) struct RawMapping {
    drv: Arc<Driver>,
    ptr: NonNull<u8>,
    len: usize,
    pub mapping_type: MappingType,
    /// `handles::fork_generation()` when mapped: the mapping exists in that process only.
    forks: u64,
}

impl RawMapping {
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// # Safety
    /// No access through the mapping may happen after this returns.
    pub unsafe fn unmap(&mut self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let len = std::mem::take(&mut self.len);
        // SAFETY: `ptr`/`len` are the live mapping made by `Driver::mmap` (len becomes 0 so it
        // is never unmapped twice); the caller guarantees no further access.
        unsafe { self.drv.munmap(self.ptr, len) }
    }
}

// SAFETY: see `Mapping`.
unsafe impl Send for RawMapping {}
// SAFETY: see `Mapping`.
unsafe impl Sync for RawMapping {}
