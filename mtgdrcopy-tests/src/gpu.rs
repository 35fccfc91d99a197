//! What the test programs need from a GPU: device memory to pin, and a way to read and write
//! it that does not go through the CPU mapping (the runtime's memcpy), to check what the
//! mapping did. The one implementation is MUSA's driver API loaded at run time ([`crate::musa`]),
//! which on test machines is the emulated libmusa backed by `mtgpu_emu`.
//!
//! Memory comes from `muMemAlloc` or, as upstream's `-a cuMemCreate` and `_vmmalloc` cases
//! allocate it, from the VMM API ([`Gpu::vmm_alloc`]); [`with_alloc_fn`] gives a GPU whose
//! [`Gpu::alloc`] is the one asked for, so that code written for one serves both.

use anyhow::Result;

/// A device address as the GPU driver API hands it out (`MUdeviceptr`).
pub type DevicePtr = u64;

pub trait Gpu: Send + Sync {
    /// Device name as the driver reports it.
    fn name(&self) -> String;
    /// `DDDD:BB:DD.F`, when the driver can tell.
    fn pci_bus_id(&self) -> Option<String>;
    /// The driver's version number (`muDriverGetVersion`).
    fn driver_version(&self) -> Result<i32>;
    /// Device memory (`muMemAlloc`). Not zeroed.
    fn alloc(&self, size: usize) -> Result<DevicePtr>;
    /// Managed (unified) memory (`muMemAllocManaged`): the P2P API refuses to pin it.
    fn alloc_managed(&self, size: usize) -> Result<DevicePtr>;
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Host → device through the driver (`muMemcpyHtoD`), bypassing any CPU mapping.
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Device → host through the driver (`muMemcpyDtoH`).
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    /// `muMemsetD8`.
    fn memset_d8(&self, dst: DevicePtr, value: u8, count: usize) -> Result<()>;
    /// Asks the driver to synchronise every memory operation on `ptr` (SYNC_MEMOPS), as
    /// GDRCopy users must. Failure is reported, and callers treat it as a warning.
    fn set_sync_memops(&self, ptr: DevicePtr) -> Result<()>;
    /// Whether the device gives pinnable VMM memory (the GPUDirect-RDMA-with-VMM attribute);
    /// the error says why not.
    fn vmm_supported(&self) -> Result<()>;
    /// At least `size` bytes of VMM memory, as upstream's `gpu_vmm_alloc`: created
    /// GPUDirect-RDMA capable, the granularity rounded up to 64 KiB, reserved, mapped and
    /// read-write. Not zeroed.
    fn vmm_alloc(&self, size: usize) -> Result<DevicePtr>;
    /// Unmaps, releases and frees what [`Gpu::vmm_alloc`] returned.
    fn vmm_free(&self, ptr: DevicePtr) -> Result<()>;
}

/// How device buffers are allocated (`-a`, and the cases' `_mumemalloc` / `_vmmalloc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocFn {
    /// `muMemAlloc` (upstream: `cuMemAlloc`).
    #[default]
    MuMemAlloc,
    /// The VMM API (`muMemCreate` + reserve + map + access; upstream: `cuMemCreate`).
    MuMemCreate,
}

impl AllocFn {
    pub fn name(self) -> &'static str {
        match self {
            AllocFn::MuMemAlloc => "muMemAlloc",
            AllocFn::MuMemCreate => "muMemCreate",
        }
    }
}

/// `gpu` with [`Gpu::alloc`] and [`Gpu::free`] by `alloc_fn`; for VMM memory, an error when
/// the device cannot give pinnable VMM memory.
pub fn with_alloc_fn(gpu: Box<dyn Gpu>, alloc_fn: AllocFn) -> Result<Box<dyn Gpu>> {
    match alloc_fn {
        AllocFn::MuMemAlloc => Ok(gpu),
        AllocFn::MuMemCreate => {
            gpu.vmm_supported()?;
            Ok(Box::new(VmmGpu(gpu)))
        }
    }
}

/// A GPU whose `alloc`/`free` are the VMM API's.
struct VmmGpu(Box<dyn Gpu>);

impl Gpu for VmmGpu {
    fn name(&self) -> String {
        self.0.name()
    }
    fn pci_bus_id(&self) -> Option<String> {
        self.0.pci_bus_id()
    }
    fn driver_version(&self) -> Result<i32> {
        self.0.driver_version()
    }
    fn alloc(&self, size: usize) -> Result<DevicePtr> {
        self.0.vmm_alloc(size)
    }
    fn alloc_managed(&self, size: usize) -> Result<DevicePtr> {
        self.0.alloc_managed(size)
    }
    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.0.vmm_free(ptr)
    }
    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.0.memcpy_htod(dst, src)
    }
    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.0.memcpy_dtoh(dst, src)
    }
    fn memset_d8(&self, dst: DevicePtr, value: u8, count: usize) -> Result<()> {
        self.0.memset_d8(dst, value, count)
    }
    fn set_sync_memops(&self, ptr: DevicePtr) -> Result<()> {
        self.0.set_sync_memops(ptr)
    }
    fn vmm_supported(&self) -> Result<()> {
        self.0.vmm_supported()
    }
    fn vmm_alloc(&self, size: usize) -> Result<DevicePtr> {
        self.0.vmm_alloc(size)
    }
    fn vmm_free(&self, ptr: DevicePtr) -> Result<()> {
        self.0.vmm_free(ptr)
    }
}
