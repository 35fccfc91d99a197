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
nix::ioctl_readwrite_bad!(ioc_vmm, MTGPU_EMU_IOC_VMM, mtgpu_emu_vmm);
nix::ioctl_readwrite_bad!(
    ioc_export_dmabuf,
    MTGPU_EMU_IOC_EXPORT_DMABUF,
    mtgpu_emu_export_dmabuf
);

/// Page sizes the emulator backs allocations with.
///
/// cbindgen:ignore
pub const PAGE_SIZES: [u32; 3] = [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K, MTGPU_EMU_PAGE_2M];

/// The counters of [`Stats`] that count what exists now: all 0 once every allocation, pin,
/// dma-buf and mapping is released, which the VM tests' leak check requires (by these names, as
/// [`Stats::named`] gives them).
///
/// cbindgen:ignore
pub const LIVE_STATS: [&str; 4] = [
    "allocations",
    "pins_outstanding",
    "dmabufs_live",
    "dmabuf_mappings",
];

impl Stats {
    /// The counters by name (the field's), for whatever prints them: one list, so that the
    /// printed names and [`LIVE_STATS`] cannot drift apart unnoticed.
    pub fn named(&self) -> [(&'static str, u64); 10] {
        [
            ("allocations", self.allocations),
            ("bytes_allocated", self.bytes_allocated),
            ("pins_outstanding", self.pins_outstanding),
            ("get_pages_calls", self.get_pages_calls),
            ("put_pages_calls", self.put_pages_calls),
            ("freed_while_pinned", self.freed_while_pinned),
            ("dmabufs_live", self.dmabufs_live),
            ("dmabuf_exports", self.dmabuf_exports),
            ("dmabuf_mappings", self.dmabuf_mappings),
            ("freed_while_exported", self.freed_while_exported),
        ]
    }
}

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

    /// One VMM operation (reserve, unreserve, map, unmap, set access); returns `gpu_va` as the
    /// emulator left it (RESERVE's new range).
    pub fn vmm(&self, mut op: mtgpu_emu_vmm) -> Result<u64, Errno> {
        // SAFETY: `op` is a live struct of the type the command copies in and out.
        unsafe { ioc_vmm(self.fd(), &mut op) }?;
        Ok(op.gpu_va)
    }

    /// Reserves `size` bytes of GPU VA aligned to `align` (0: 4 KiB).
    pub fn vmm_reserve(&self, size: u64, align: u64) -> Result<u64, Errno> {
        self.vmm(mtgpu_emu_vmm {
            op: mtgpu_emu_vmm_op::MTGPU_EMU_VMM_RESERVE as u32,
            size,
            align,
            ..Default::default()
        })
    }

    /// Frees the reservation `[gpu_va, gpu_va + size)`.
    pub fn vmm_unreserve(&self, gpu_va: u64, size: u64) -> Result<(), Errno> {
        self.vmm_range(mtgpu_emu_vmm_op::MTGPU_EMU_VMM_UNRESERVE, gpu_va, size, 0)
    }

    /// Maps `[offset, offset + size)` of the VMM allocation `handle` at `gpu_va`.
    pub fn vmm_map(&self, gpu_va: u64, size: u64, handle: u64, offset: u64) -> Result<(), Errno> {
        self.vmm(mtgpu_emu_vmm {
            op: mtgpu_emu_vmm_op::MTGPU_EMU_VMM_MAP as u32,
            gpu_va,
            size,
            handle,
            offset,
            ..Default::default()
        })
        .map(drop)
    }

    /// Unmaps the mappings in `[gpu_va, gpu_va + size)`.
    pub fn vmm_unmap(&self, gpu_va: u64, size: u64) -> Result<(), Errno> {
        self.vmm_range(mtgpu_emu_vmm_op::MTGPU_EMU_VMM_UNMAP, gpu_va, size, 0)
    }

    /// Gives the mapped range `[gpu_va, gpu_va + size)` the access `access` (`MTGPU_EMU_ACCESS_*`).
    pub fn vmm_set_access(&self, gpu_va: u64, size: u64, access: u32) -> Result<(), Errno> {
        self.vmm_range(
            mtgpu_emu_vmm_op::MTGPU_EMU_VMM_SET_ACCESS,
            gpu_va,
            size,
            access,
        )
    }

    fn vmm_range(
        &self,
        op: mtgpu_emu_vmm_op,
        gpu_va: u64,
        size: u64,
        access: u32,
    ) -> Result<(), Errno> {
        self.vmm(mtgpu_emu_vmm {
            op: op as u32,
            access,
            gpu_va,
            size,
            ..Default::default()
        })
        .map(drop)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_live_counter_is_named() {
        let names = Stats::default().named().map(|(name, _)| name);
        for live in LIVE_STATS {
            assert!(names.contains(&live), "{live} is not among {names:?}");
        }
    }
}
