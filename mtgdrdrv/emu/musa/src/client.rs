//! The emulator's char device, `/dev/mtgpu_emu`: the few commands the library needs, with the
//! ABI of `mtgdrdrv::emu`. Allocations belong to the open file, so the library keeps one open
//! for the life of the process.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use mtgdrdrv::emu::*;
use nix::errno::Errno;

nix::ioctl_readwrite_bad!(ioc_alloc, MTGPU_EMU_IOC_ALLOC, mtgpu_emu_alloc);
nix::ioctl_write_ptr_bad!(ioc_free, MTGPU_EMU_IOC_FREE, mtgpu_emu_free);
nix::ioctl_write_ptr_bad!(ioc_read, MTGPU_EMU_IOC_READ, mtgpu_emu_rw);
nix::ioctl_write_ptr_bad!(ioc_write, MTGPU_EMU_IOC_WRITE, mtgpu_emu_rw);
nix::ioctl_write_ptr_bad!(ioc_memset, MTGPU_EMU_IOC_MEMSET, mtgpu_emu_rw);
nix::ioctl_read_bad!(ioc_get_stats, MTGPU_EMU_IOC_GET_STATS, mtgpu_emu_stats);
nix::ioctl_readwrite_bad!(
    ioc_export_dmabuf,
    MTGPU_EMU_IOC_EXPORT_DMABUF,
    mtgpu_emu_export_dmabuf
);

pub fn device_path() -> String {
    format!("/dev/{MTGPU_EMU_DEVICE_NAME}")
}

pub struct Emu {
    file: File,
}

impl Emu {
    /// Opens the device and checks that a BAR is bound (every ioctl fails with ENODEV if not).
    pub fn open() -> Result<Emu, Errno> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device_path())
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let emu = Emu { file };
        let mut st = mtgpu_emu_stats::default();
        // SAFETY: `st` is a live struct of the type the command copies out.
        unsafe { ioc_get_stats(emu.fd(), &mut st) }?;
        Ok(emu)
    }

    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub fn alloc(&self, size: u64, align: u64, page_size: u32, flags: u32) -> Result<u64, Errno> {
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

    /// Copies `size` bytes of device memory at `gpu_va` to `dst`.
    ///
    /// # Safety
    /// `dst` must be writable for `size` bytes for the duration of the call.
    pub unsafe fn read(&self, gpu_va: u64, dst: *mut u8, size: u64) -> Result<(), Errno> {
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
    pub unsafe fn write(&self, gpu_va: u64, src: *const u8, size: u64) -> Result<(), Errno> {
        let rw = mtgpu_emu_rw {
            gpu_va,
            size,
            user_ptr: src as u64,
            ..Default::default()
        };
        // SAFETY: `rw` describes `src`, readable for `size` bytes per this function's contract.
        unsafe { ioc_write(self.fd(), &rw) }.map(drop)
    }

    /// A dma-buf of `[gpu_va, gpu_va + size)` (host-page aligned, inside one allocation of
    /// this process); the caller owns the returned descriptor (close-on-exec).
    pub fn export_dmabuf(&self, gpu_va: u64, size: u64, flags: u32) -> Result<i32, Errno> {
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
}
