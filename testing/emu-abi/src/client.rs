//! The client of `/dev/mtgpu_emu`: allocate and free "device memory" by GPU VA, read and write it
//! through the emulator's own path (the "DMA" that checks what CPU mappings did), export it as a
//! dma-buf, inject faults and read counters. Allocations belong to the open file and go when it
//! closes.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};

use nix::errno::Errno;

use crate::abi::*;

pub use crate::abi::mtgpu_emu_fault_kind as FaultKind;
pub use crate::abi::mtgpu_emu_stats as Stats;

nix::ioctl_readwrite_bad!(ioc_alloc, MTGPU_EMU_IOC_ALLOC, mtgpu_emu_alloc);
nix::ioctl_write_ptr_bad!(ioc_free, MTGPU_EMU_IOC_FREE, mtgpu_emu_free);
nix::ioctl_write_ptr_bad!(ioc_read, MTGPU_EMU_IOC_READ, mtgpu_emu_rw);
nix::ioctl_write_ptr_bad!(ioc_write, MTGPU_EMU_IOC_WRITE, mtgpu_emu_rw);
nix::ioctl_write_ptr_bad!(ioc_memset, MTGPU_EMU_IOC_MEMSET, mtgpu_emu_rw);
nix::ioctl_write_ptr_bad!(
    ioc_inject_fault,
    MTGPU_EMU_IOC_INJECT_FAULT,
    mtgpu_emu_fault
);
nix::ioctl_read_bad!(ioc_get_stats, MTGPU_EMU_IOC_GET_STATS, mtgpu_emu_stats);
nix::ioctl_readwrite_bad!(
    ioc_export_dmabuf,
    MTGPU_EMU_IOC_EXPORT_DMABUF,
    mtgpu_emu_export_dmabuf
);

/// Page sizes the emulator backs allocations with.
///
/// cbindgen:ignore
pub const PAGE_SIZES: [u32; 3] = [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K, MTGPU_EMU_PAGE_2M];

/// Path of the emulator's device node.
pub fn device_path() -> String {
    format!("/dev/{MTGPU_EMU_DEVICE_NAME}")
}

/// An open emulator.
pub struct Emu {
    file: File,
}

impl Emu {
    pub fn open() -> Result<Emu, Errno> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device_path())
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        Ok(Emu { file })
    }

    /// The open file, for calls outside this client (the fuzzer's malformed ioctls).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Allocates `size` bytes backed by `page_size` pages, the GPU VA aligned to `align`
    /// (0: the page size). `scatter` backs it with non-contiguous pages.
    pub fn alloc(
        &self,
        size: u64,
        align: u64,
        page_size: u32,
        scatter: bool,
    ) -> Result<u64, Errno> {
        let flags = if scatter { MTGPU_EMU_ALLOC_SCATTER } else { 0 };
        self.alloc_flags(size, align, page_size, flags)
    }

    /// [`Emu::alloc`] with any `MTGPU_EMU_ALLOC_*` flags (e.g. sparse or managed memory).
    pub fn alloc_flags(
        &self,
        size: u64,
        align: u64,
        page_size: u32,
        flags: u32,
    ) -> Result<u64, Errno> {
        let mut a = mtgpu_emu_alloc {
            size,
            align,
            page_size,
            flags,
            gpu_va: 0,
        };
        // SAFETY: `a` is a live struct of the type the command copies in and out.
        unsafe { ioc_alloc(self.fd(), &mut a) }?;
        Ok(a.gpu_va)
    }

    pub fn free(&self, gpu_va: u64) -> Result<(), Errno> {
        let f = mtgpu_emu_free { gpu_va };
        // SAFETY: `f` is a live struct of the type the command copies in.
        unsafe { ioc_free(self.fd(), &f) }.map(drop)
    }

    /// Reads device memory through the emulator, bypassing any CPU mapping.
    pub fn read(&self, gpu_va: u64, buf: &mut [u8]) -> Result<(), Errno> {
        // SAFETY: `buf` is writable for its length during the call.
        unsafe { self.read_to(gpu_va, buf.as_mut_ptr(), buf.len() as u64) }
    }

    /// Writes device memory through the emulator, bypassing any CPU mapping.
    pub fn write(&self, gpu_va: u64, buf: &[u8]) -> Result<(), Errno> {
        // SAFETY: `buf` is readable for its length during the call.
        unsafe { self.write_from(gpu_va, buf.as_ptr(), buf.len() as u64) }
    }

    /// Copies `size` bytes of device memory at `gpu_va` to `dst`.
    ///
    /// # Safety
    /// `dst` must be writable for `size` bytes for the duration of the call.
    pub unsafe fn read_to(&self, gpu_va: u64, dst: *mut u8, size: u64) -> Result<(), Errno> {
        let rw = mtgpu_emu_rw {
            gpu_va,
            size,
            user_ptr: dst as u64,
            ..Default::default()
        };
        // SAFETY: `rw` describes `dst`, writable for `size` bytes per this function's contract;
        // the kernel checks the user range itself.
        unsafe { ioc_read(self.fd(), &rw) }.map(drop)
    }

    /// Copies `size` bytes from `src` to device memory at `gpu_va`.
    ///
    /// # Safety
    /// `src` must be readable for `size` bytes for the duration of the call.
    pub unsafe fn write_from(&self, gpu_va: u64, src: *const u8, size: u64) -> Result<(), Errno> {
        let rw = mtgpu_emu_rw {
            gpu_va,
            size,
            user_ptr: src as u64,
            ..Default::default()
        };
        // SAFETY: `rw` describes `src`, readable for `size` bytes per this function's contract.
        unsafe { ioc_write(self.fd(), &rw) }.map(drop)
    }

    pub fn memset(&self, gpu_va: u64, size: u64, value: u8) -> Result<(), Errno> {
        let rw = mtgpu_emu_rw {
            gpu_va,
            size,
            value: value.into(),
            ..Default::default()
        };
        // SAFETY: `rw` is a live struct of the type the command copies in.
        unsafe { ioc_memset(self.fd(), &rw) }.map(drop)
    }

    /// A dma-buf of `[gpu_va, gpu_va + size)` (host-page aligned, inside one allocation of
    /// this open file); the caller owns the returned descriptor (close-on-exec).
    pub fn export_dmabuf(&self, gpu_va: u64, size: u64, flags: u32) -> Result<RawFd, Errno> {
        let mut e = mtgpu_emu_export_dmabuf {
            gpu_va,
            size,
            flags,
            fd: 0,
        };
        // SAFETY: `e` is a live struct of the type the command copies in and out.
        unsafe { ioc_export_dmabuf(self.fd(), &mut e) }?;
        Ok(e.fd)
    }

    /// Makes the next `count` get_pages calls show `kind`; count 0 clears.
    pub fn inject_fault(&self, kind: FaultKind, count: u32) -> Result<(), Errno> {
        self.inject_fault_raw(kind as u32, count)
    }

    /// [`Emu::inject_fault`] with any kind number, valid or not (the emulator refuses unknown
    /// kinds with EINVAL).
    pub fn inject_fault_raw(&self, kind: u32, count: u32) -> Result<(), Errno> {
        let f = mtgpu_emu_fault { kind, count };
        // SAFETY: `f` is a live struct of the type the command copies in.
        unsafe { ioc_inject_fault(self.fd(), &f) }.map(drop)
    }

    pub fn stats(&self) -> Result<Stats, Errno> {
        let mut s = Stats::default();
        // SAFETY: `s` is a live struct of the type the command copies out.
        unsafe { ioc_get_stats(self.fd(), &mut s) }?;
        Ok(s)
    }
}
