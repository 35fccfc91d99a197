//! The interface both backends implement ([`Backend`]), each backend with its implementation,
//! and the choice between them at `gdr_open` ([`choose`]):
//!
//! - the module backend ([`module`]): ioctls and mmap on `/dev/mtgdrdrv`;
//! - the dma-buf backend ([`dmabuf`]): one dma-buf per pin from the MUSA driver
//!   (`muMemGetHandleForAddressRange`), mmapped directly; no kernel module needed.

use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use nix::sys::mman::{mmap, MapFlags, ProtFlags};

use crate::error::Result;
use crate::types::{Attribute, Info, MapRequest, MappingType, PinFlags};

pub(crate) mod choose;
pub(crate) mod dmabuf;
pub(crate) mod module;

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
    /// Takes the backend's lock for a fork (see `handles::fork`): the guard is dropped after
    /// it, in both processes. None: the backend has no lock.
    fn lock_for_fork(&self) -> Option<Box<dyn std::any::Any>> {
        None
    }
}

/// Takes the backends' process-wide locks for a fork; first in the lock order.
pub(crate) fn lock_statics_for_fork() -> Vec<Box<dyn std::any::Any>> {
    dmabuf::lock_statics_for_fork()
}

/// A fresh shared read/write mapping of `len` bytes of `fd` from `offset`, placed by the
/// kernel: how both backends map a pin.
pub(crate) fn mmap_shared(
    fd: impl AsFd,
    len: NonZeroUsize,
    offset: libc::off_t,
) -> nix::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping chosen by the kernel (no address hint), so no existing
    // memory is replaced; the descriptor is open (borrowed for the call).
    let ptr = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd,
            offset,
        )
    }?;
    Ok(ptr.cast())
}
