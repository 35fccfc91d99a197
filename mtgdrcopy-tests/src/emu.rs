//! Client of the emulated mtgpu provider (`/dev/mtgpu_emu`), the stand-in for GPU memory in
//! tests: allocate and free "device memory" by GPU VA, read and write it through the emulator's
//! own path (the "DMA" that checks what CPU mappings did), inject faults and read counters.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use mtgdrdrv::emu::*;
use nix::errno::Errno;

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

pub use mtgdrdrv::emu::mtgpu_emu_fault_kind as FaultKind;
pub use mtgdrdrv::emu::mtgpu_emu_stats as Stats;

/// Path of the emulator's device node.
pub fn device_path() -> String {
    format!("/dev/{MTGPU_EMU_DEVICE_NAME}")
}

/// An open emulator. Allocations belong to this open file and are released when it closes.
pub struct Emu {
    file: File,
}

/// Page sizes the emulator backs allocations with.
pub const PAGE_SIZES: [u32; 3] = [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K, MTGPU_EMU_PAGE_2M];

impl Emu {
    pub fn open() -> Result<Emu, Errno> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device_path())
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        Ok(Emu { file })
    }

    fn fd(&self) -> i32 {
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

    /// [`Emu::alloc`] with any `MTGPU_EMU_ALLOC_*` flags (e.g. sparse memory).
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
        let rw = mtgpu_emu_rw {
            gpu_va,
            size: buf.len() as u64,
            user_ptr: buf.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `rw` describes `buf`, which is writable for its length during the call.
        unsafe { ioc_read(self.fd(), &rw) }.map(drop)
    }

    /// Writes device memory through the emulator, bypassing any CPU mapping.
    pub fn write(&self, gpu_va: u64, buf: &[u8]) -> Result<(), Errno> {
        let rw = mtgpu_emu_rw {
            gpu_va,
            size: buf.len() as u64,
            user_ptr: buf.as_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `rw` describes `buf`, which is readable for its length during the call.
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

    /// Makes the next `count` get_pages calls show `kind`; count 0 clears.
    pub fn inject_fault(&self, kind: FaultKind, count: u32) -> Result<(), Errno> {
        let f = mtgpu_emu_fault {
            kind: kind as u32,
            count,
        };
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
