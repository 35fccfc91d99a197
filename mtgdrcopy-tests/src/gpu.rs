//! What the test programs need from a GPU: device memory to pin, and a way to read and write
//! it that does not go through the CPU mapping (the runtime's memcpy), to check what the
//! mapping did. The one implementation is MUSA's driver API loaded at run time ([`crate::musa`]),
//! which on test machines is the emulated libmusa backed by `mtgpu_emu`.

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
}
