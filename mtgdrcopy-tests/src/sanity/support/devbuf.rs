//! Device memory: a device allocation freed on drop, placed as upstream's `gpu_mem_alloc`
//! places it.

use anyhow::{Context, Result};

use super::GPU_PAGE;
use crate::gpu::{DevicePtr, Gpu};
use crate::sanity::note;

/// A device allocation, freed on drop unless freed explicitly. `ptr` is the address to use:
/// the allocation's start, or its first 64 KiB boundary for [`DevBuf::aligned`].
pub struct DevBuf<'g> {
    gpu: &'g dyn Gpu,
    base: DevicePtr,
    pub ptr: DevicePtr,
    pub size: usize,
    freed: bool,
}

impl<'g> DevBuf<'g> {
    /// `size` bytes as the driver places them (upstream `gpu_mem_alloc(.., aligned=false)`).
    pub fn new(gpu: &'g dyn Gpu, size: usize) -> Result<DevBuf<'g>> {
        let base = gpu
            .alloc(size)
            .with_context(|| format!("allocating {size} bytes"))?;
        Ok(DevBuf::adopt(gpu, base, base, size))
    }

    /// `size` bytes starting on a 64 KiB boundary: allocates `size + 64 KiB - 1` and rounds
    /// the pointer up, as upstream's `gpu_mem_alloc(.., aligned=true)`.
    pub fn aligned(gpu: &'g dyn Gpu, size: usize) -> Result<DevBuf<'g>> {
        let total = size + GPU_PAGE - 1;
        let base = gpu
            .alloc(total)
            .with_context(|| format!("allocating {total} bytes"))?;
        let ptr = (base + GPU_PAGE as u64 - 1) & !(GPU_PAGE as u64 - 1);
        Ok(DevBuf::adopt(gpu, base, ptr, size))
    }

    fn adopt(gpu: &'g dyn Gpu, base: DevicePtr, ptr: DevicePtr, size: usize) -> DevBuf<'g> {
        if let Err(e) = gpu.set_sync_memops(base) {
            note!("warning: SYNC_MEMOPS not set on {base:#x}: {e:#}");
        }
        note!("device buffer {ptr:#x} (allocation {base:#x}), {size} bytes");
        DevBuf {
            gpu,
            base,
            ptr,
            size,
            freed: false,
        }
    }

    pub fn free(&mut self) -> Result<()> {
        if !self.freed {
            self.freed = true;
            self.gpu.free(self.base)?;
        }
        Ok(())
    }

    pub fn fill(&self, value: u8) -> Result<()> {
        self.gpu.memset_d8(self.ptr, value, self.size)
    }

    /// The buffer through the driver's copy, bypassing any CPU mapping.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.gpu.memcpy_dtoh(&mut v, self.ptr + offset as u64)?;
        Ok(v)
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        if !self.freed {
            let _ = self.gpu.free(self.base);
        }
    }
}
