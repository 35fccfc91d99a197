//! The safe Rust API: an open device, the buffers pinned through it and their CPU mappings.
//!
//! A [`Mapping`] borrows its [`PinnedBuffer`], so a buffer cannot be unpinned while mapped, and
//! device memory is only reachable through copy methods: WC memory is never handed out as an
//! ordinary `&mut [u8]` (the compiler would be free to read it back, merge or split accesses).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use mtgdrdrv::{major, minor};
use nix::errno::Errno;

use crate::backend::{choose, Backend};
use crate::copy;
use crate::error::{Error, Result};
use crate::types::{Attribute, Info, MapRequest, MappingType, PinFlags};
use crate::{handles, log, version};

/// An open backend: `/dev/mtgdrdrv`, or the MUSA driver's dma-bufs (see [`Gdr::open`]).
/// Cheap to share between threads (`&Gdr` is `Sync`).
pub struct Gdr {
    drv: Arc<dyn Backend>,
}

impl Gdr {
    /// Opens `/dev/mtgdrdrv` and checks that driver and library accept each other; when the
    /// node cannot be opened, or `GDRCOPY_USE_DMABUF_MMAP=1`, opens the dma-buf backend
    /// instead (libmusa's dma-buf export, no kernel module).
    pub fn open() -> Result<Gdr> {
        Ok(Gdr {
            drv: Arc::from(choose::open()?),
        })
    }

    /// The driver's version as (major, minor); `EOPNOTSUPP` on the dma-buf backend, which
    /// uses no kernel module.
    pub fn driver_version(&self) -> Result<(u32, u32)> {
        let v = self.drv.driver_version()?;
        Ok((major(v), minor(v)))
    }

    /// This library's version as (major, minor).
    pub fn runtime_version() -> (u32, u32) {
        (
            version::GDR_API_MAJOR_VERSION,
            version::GDR_API_MINOR_VERSION,
        )
    }

    pub fn attribute(&self, attr: Attribute) -> Result<u32> {
        self.drv.attribute(attr)
    }

    /// Whether this is the dma-buf backend.
    pub fn using_dma_buf(&self) -> bool {
        self.drv
            .attribute(Attribute::UsingDmaBufMmap)
            .is_ok_and(|v| v == 1)
    }

    /// Pins `[addr, addr + size)` of device memory allocated by the calling process.
    pub fn pin(&self, addr: u64, size: u64, flags: PinFlags) -> Result<PinnedBuffer> {
        let handle = self.drv.pin(addr, size, flags)?;
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
        let handle = self.drv.pin_with_tokens(addr, size, p2p_token, va_space)?;
        Ok(PinnedBuffer {
            drv: Arc::clone(&self.drv),
            handle,
            pinned: true,
        })
    }

    /// Whether the calling process opened this (false in a forked child, which must leave the
    /// parent's pins and mappings alone).
    /// The backend's lock, held across a fork by the fork handler (see `handles::fork`).
    pub(crate) fn lock_for_fork(&self) -> Option<Box<dyn std::any::Any>> {
        self.drv.lock_for_fork()
    }

    pub fn in_opener(&self) -> bool {
        self.drv.in_opener()
    }

    /// The granule of pins and mappings: the host page.
    pub fn page_size(&self) -> usize {
        self.drv.page_size()
    }
}

/// A pinned range of device memory; unpinned when dropped (or by [`PinnedBuffer::unpin`],
/// which reports errors).
pub struct PinnedBuffer {
    drv: Arc<dyn Backend>,
    handle: u64,
    /// False once `unpin` ran, so `Drop` does not unpin again.
    pinned: bool,
}

impl PinnedBuffer {
    pub fn info(&self) -> Result<Info> {
        self.drv.info(self.handle)
    }

    /// Always false on mtgpu: it has no invalidation callback, a pin holds its memory.
    pub fn callback_flag(&self) -> Result<bool> {
        self.drv.callback_flag(self.handle)
    }

    /// Maps the whole pinned range. The pinned address must have been aligned to the pin
    /// granule (the host page), else `EINVAL`.
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
        let (ptr, len, mapping_type) = self.drv.map(self.handle, size, request)?;
        Ok(RawMapping {
            drv: Arc::clone(&self.drv),
            handle: self.handle,
            ptr,
            len,
            mapping_type,
            forks: handles::fork_generation(),
            // Before the mapping is published: copies to it must know it is uncached.
            _uncached: (mapping_type == MappingType::Device)
                .then(|| copy::register_uncached(ptr.as_ptr() as usize, len)),
        })
    }

    /// Unpins now, reporting failure; dropping does the same silently.
    pub fn unpin(mut self) -> Result<()> {
        self.pinned = false;
        self.drv.unpin(self.handle)
    }

    /// The backend's handle: per open backend, never reused.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// In a forked child: lets go of the child's share of the pin (the dma-buf backend's copy
    /// of the fd) without unpinning the parent's.
    pub(crate) fn forget_in_child(mut self) {
        self.pinned = false;
        self.drv.forget(self.handle);
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
        unsafe { copy::to_device(dst, src.as_ptr(), src.len()) };
        Ok(())
    }

    /// Copies from `offset` bytes into the mapping into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len(), "Mapping::read")?;
        // SAFETY: as in `write`, with the roles swapped.
        unsafe { copy::from_device(dst.as_mut_ptr(), src, dst.len()) };
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
    drv: Arc<dyn Backend>,
    handle: u64,
    ptr: NonNull<u8>,
    len: usize,
    pub mapping_type: MappingType,
    /// `handles::fork_generation()` when mapped: the mapping exists in that process only.
    forks: u64,
    /// DEVICE mappings are listed for the copy routines until the mapping is dropped (after
    /// its unmap, when no copy can reach it).
    _uncached: Option<copy::UncachedRegistration>,
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
        // SAFETY: `ptr`/`len` are the live mapping made by `Backend::map` (len becomes 0 so it
        // is never unmapped twice); the caller guarantees no further access.
        unsafe { self.drv.unmap(self.handle, self.ptr, len) }
    }
}

// SAFETY: see `Mapping`.
unsafe impl Send for RawMapping {}
// SAFETY: see `Mapping`.
unsafe impl Sync for RawMapping {}
