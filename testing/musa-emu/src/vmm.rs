//! The virtual memory management calls (`muMemCreate`, `muMemAddressReserve`, `muMemMap`,
//! `muMemSetAccess`, ...), backed by the emulator's VMM records (ALLOC with
//! `MTGPU_EMU_ALLOC_VMM`, and the VMM ioctl).
//!
//! MUSA's VMM headers are not public. These calls take CUDA's signatures, struct layouts and
//! numbers (`CUmemAllocationProp`, `CUmemAccessDesc`, `CU_MEM_ALLOCATION_TYPE_PINNED` = 1, ...),
//! as the rest of this library does for attributes and error codes: an assumption, supported by
//! compiled MUSA code passing CUDA's value 110 for
//! `MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED`.
//!
//! The model: `muMemCreate` makes physical memory whose handle is not an address; a range of VA
//! from `muMemAddressReserve` holds mappings (`muMemMap`) of one or several such allocations;
//! a mapping has no access until `muMemSetAccess`, and a VA without a mapping or without access
//! is not usable (copies and pins fail). The allocation granularity is the emulator's page size
//! (`MTGPU_EMU_PAGE_SIZE`); sizes, offsets and addresses must be multiples of it.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uchar, c_ushort, c_void};
use std::sync::MutexGuard;

use mtgpu_emu_abi::{
    MTGPU_EMU_ACCESS_NONE, MTGPU_EMU_ACCESS_READ, MTGPU_EMU_ACCESS_READWRITE, MTGPU_EMU_ALLOC_RDMA,
    MTGPU_EMU_ALLOC_VMM,
};

use crate::{ffi, from_errno, store, with_context, Driver, MUdeviceptr, MuResult, State};
use crate::{MUresult, MUSA_ERROR_INVALID_VALUE};

/// `MUmemGenericAllocationHandle`: what `muMemCreate` returns (an opaque 64-bit value).
pub type MUmemGenericAllocationHandle = u64;

/// CUDA's `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub const MU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
/// CUDA's `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`; the MUSA name's value
/// is confirmed by compiled MUSA code.
pub const MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED: c_int = 110;
/// `MUmemAllocationType`: device memory pinned in place.
pub const MU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `MUmemLocationType`: a device, `id` its ordinal.
pub const MU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `MUmemAllocationGranularity_flags`.
pub const MU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
pub const MU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_int = 1;
/// `MUmemAccess_flags`.
pub const MU_MEM_ACCESS_FLAGS_PROT_NONE: c_int = 0;
pub const MU_MEM_ACCESS_FLAGS_PROT_READ: c_int = 1;
pub const MU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;

/// `MUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `MUmemAllocationProp::allocFlags`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MUmemAllocFlags {
    pub compressionType: c_uchar,
    pub gpuDirectRDMACapable: c_uchar,
    pub usage: c_ushort,
    pub reserved: [c_uchar; 4],
}

/// `MUmemAllocationProp` (CUDA's `CUmemAllocationProp`: 32 bytes on 64-bit hosts).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MUmemAllocationProp {
    pub type_: c_int,
    pub requestedHandleTypes: c_int,
    pub location: MUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: MUmemAllocFlags,
}

/// `MUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MUmemAccessDesc {
    pub location: MUmemLocation,
    pub flags: c_int,
}

const _: () = assert!(std::mem::size_of::<MUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::offset_of!(MUmemAllocationProp, allocFlags) == 24);
const _: () = assert!(std::mem::size_of::<MUmemAccessDesc>() == 12);

/// This process's VMM objects, for cleanup at the last context release and for the checks
/// that are the API's own (the emulator checks the rest).
#[derive(Default)]
pub(crate) struct Vmm {
    /// Allocation handle → size.
    handles: BTreeMap<MUmemGenericAllocationHandle, u64>,
    /// Reserved VA → size.
    reservations: BTreeMap<MUdeviceptr, u64>,
    /// Mapped VA → size.
    mappings: BTreeMap<MUdeviceptr, u64>,
}

impl Vmm {
    /// Whether `ptr` lies in a mapping.
    pub(crate) fn is_mapped(&self, ptr: MUdeviceptr) -> bool {
        matches!(self.mappings.range(..=ptr).next_back(), Some((&va, &size)) if ptr - va < size)
    }

    /// `[ptr, ptr + len)` cut at mapping boundaries where it starts in a mapping (a copy
    /// through the emulator stays in one record), else whole.
    pub(crate) fn pieces(&self, ptr: MUdeviceptr, len: u64) -> Vec<(MUdeviceptr, u64)> {
        let mut out = Vec::new();
        let (mut at, end) = (ptr, ptr.saturating_add(len));
        while at < end {
            let piece = match self.mappings.range(..=at).next_back() {
                Some((&va, &size)) if at - va < size => (va + size - at).min(end - at),
                _ => end - at,
            };
            out.push((at, piece));
            at += piece;
        }
        out
    }

    #[cfg(test)]
    pub(crate) fn insert_mapping_for_test(&mut self, va: MUdeviceptr, size: u64) {
        self.mappings.insert(va, size);
    }

    /// Everything goes with the last primary-context reference, as with a context's
    /// destruction.
    pub(crate) fn release_all(&mut self, d: &Driver) {
        // Nothing to report to: the objects are gone from our side either way.
        for (va, size) in std::mem::take(&mut self.mappings) {
            let _ = d.emu.vmm_unmap(va, size);
        }
        for (va, size) in std::mem::take(&mut self.reservations) {
            let _ = d.emu.vmm_unreserve(va, size);
        }
        for (h, _) in std::mem::take(&mut self.handles) {
            let _ = d.emu.free(h);
        }
    }
}

/// The granularity: the page size every allocation is backed with.
fn granularity(d: &Driver) -> u64 {
    u64::from(d.config.page_size)
}

/// Reads a non-NULL `prop` that describes pinned memory on device 0.
///
/// # Safety
/// `prop` is NULL or valid for a read of a `MUmemAllocationProp`.
unsafe fn read_prop(prop: *const MUmemAllocationProp) -> MuResult<MUmemAllocationProp> {
    if prop.is_null() {
        return Err(MUSA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid for reads per this function's contract.
    let p = unsafe { prop.read() };
    if p.type_ != MU_MEM_ALLOCATION_TYPE_PINNED
        || p.location.type_ != MU_MEM_LOCATION_TYPE_DEVICE
        || p.location.id != 0
    {
        return Err(MUSA_ERROR_INVALID_VALUE);
    }
    Ok(p)
}

/// Whether `v` is a non-zero multiple of the granularity.
fn granular(d: &Driver, v: u64) -> bool {
    v != 0 && v.is_multiple_of(granularity(d))
}

fn check(ok: bool) -> MuResult {
    ok.then_some(()).ok_or(MUSA_ERROR_INVALID_VALUE)
}

/// The value of the VMM device attributes, if `attrib` is one.
pub(crate) fn attribute(d: &Driver, attrib: c_int) -> Option<c_int> {
    match attrib {
        MU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => Some(1),
        MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED => {
            Some(c_int::from(d.config.vmm_rdma))
        }
        _ => None,
    }
}

fn state(d: &Driver) -> MutexGuard<'_, State> {
    d.state()
}

/// `*granularity` = the page size, for either option.
///
/// # Safety
/// `granularity_out` is NULL or valid for a write of a `size_t`; `prop` as [`read_prop`].
#[no_mangle]
pub unsafe extern "C" fn muMemGetAllocationGranularity(
    granularity_out: *mut usize,
    prop: *const MUmemAllocationProp,
    option: c_int,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        // SAFETY: per this function's contract.
        unsafe { read_prop(prop) }?;
        check(
            option == MU_MEM_ALLOC_GRANULARITY_MINIMUM
                || option == MU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )?;
        // SAFETY: per this function's contract.
        unsafe { store(granularity_out, granularity(d) as usize) }
    })
}

/// Physical memory of `size` bytes (a multiple of the granularity); `flags` must be 0.
///
/// # Safety
/// `handle` is NULL or valid for a write of a handle; `prop` as [`read_prop`].
#[no_mangle]
pub unsafe extern "C" fn muMemCreate(
    handle: *mut MUmemGenericAllocationHandle,
    size: usize,
    prop: *const MUmemAllocationProp,
    flags: u64,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        // SAFETY: per this function's contract.
        let p = unsafe { read_prop(prop) }?;
        check(!handle.is_null() && flags == 0 && granular(d, size as u64))?;
        let rdma = if p.allocFlags.gpuDirectRDMACapable != 0 {
            MTGPU_EMU_ALLOC_RDMA
        } else {
            0
        };
        let c = d.config;
        let h = d
            .emu
            .alloc_flags(
                size as u64,
                c.align,
                c.page_size,
                MTGPU_EMU_ALLOC_VMM | rdma,
            )
            .map_err(from_errno)?;
        state(d).vmm.handles.insert(h, size as u64);
        // SAFETY: non-NULL, and valid for a write per this function's contract.
        unsafe { handle.write(h) };
        Ok(())
    })
}

/// Releases a handle; mapped memory lives on until its last unmap.
///
/// # Safety
/// None: the handle is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemRelease(handle: MUmemGenericAllocationHandle) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        let mut st = state(d);
        check(st.vmm.handles.contains_key(&handle))?;
        d.emu.free(handle).map_err(from_errno)?;
        st.vmm.handles.remove(&handle);
        Ok(())
    })
}

/// Reserves `size` bytes of VA (a multiple of the granularity) aligned to `alignment` (0: the
/// granularity). The address hint `addr` is not honoured, as CUDA allows; `flags` must be 0.
///
/// # Safety
/// `ptr` is NULL or valid for a write of a `MUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn muMemAddressReserve(
    ptr: *mut MUdeviceptr,
    size: usize,
    alignment: usize,
    _addr: MUdeviceptr,
    flags: u64,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        let align = (alignment as u64).max(granularity(d));
        check(!ptr.is_null() && flags == 0 && granular(d, size as u64) && align.is_power_of_two())?;
        let va = d.emu.vmm_reserve(size as u64, align).map_err(from_errno)?;
        state(d).vmm.reservations.insert(va, size as u64);
        // SAFETY: non-NULL, and valid for a write per this function's contract.
        unsafe { ptr.write(va) };
        Ok(())
    })
}

/// Frees a whole reservation, which must have no mapping left.
///
/// # Safety
/// None: the range is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemAddressFree(ptr: MUdeviceptr, size: usize) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        let mut st = state(d);
        check(st.vmm.reservations.get(&ptr) == Some(&(size as u64)))?;
        d.emu.vmm_unreserve(ptr, size as u64).map_err(from_errno)?;
        st.vmm.reservations.remove(&ptr);
        Ok(())
    })
}

/// Maps `[offset, offset + size)` of `handle` at `ptr`, inside a reservation; `flags` must be 0.
///
/// # Safety
/// None: every argument is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemMap(
    ptr: MUdeviceptr,
    size: usize,
    offset: usize,
    handle: MUmemGenericAllocationHandle,
    flags: u64,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        let mut st = state(d);
        check(flags == 0 && st.vmm.handles.contains_key(&handle))?;
        d.emu
            .vmm_map(ptr, size as u64, handle, offset as u64)
            .map_err(from_errno)?;
        st.vmm.mappings.insert(ptr, size as u64);
        Ok(())
    })
}

/// Unmaps every mapping in `[ptr, ptr + size)`; none may stick out of it. Memory a pin holds
/// stays until the pin goes.
///
/// # Safety
/// None: the range is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemUnmap(ptr: MUdeviceptr, size: usize) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        let mut st = state(d);
        d.emu.vmm_unmap(ptr, size as u64).map_err(from_errno)?;
        let end = ptr.saturating_add(size as u64);
        st.vmm.mappings.retain(|&va, _| va < ptr || va >= end);
        Ok(())
    })
}

/// Sets the access of the mapped range `[ptr, ptr + size)` for device 0 (the one device):
/// `count` descriptors, the last one for device 0 winning.
///
/// # Safety
/// `desc` is NULL or valid for reads of `count` descriptors.
#[no_mangle]
pub unsafe extern "C" fn muMemSetAccess(
    ptr: MUdeviceptr,
    size: usize,
    desc: *const MUmemAccessDesc,
    count: usize,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        check(!desc.is_null() && count > 0)?;
        // SAFETY: non-NULL, and valid for `count` reads per this function's contract.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let mut access = None;
        for a in descs {
            check(a.location.type_ == MU_MEM_LOCATION_TYPE_DEVICE && a.location.id == 0)?;
            access = Some(match a.flags {
                MU_MEM_ACCESS_FLAGS_PROT_NONE => MTGPU_EMU_ACCESS_NONE,
                MU_MEM_ACCESS_FLAGS_PROT_READ => MTGPU_EMU_ACCESS_READ,
                MU_MEM_ACCESS_FLAGS_PROT_READWRITE => MTGPU_EMU_ACCESS_READWRITE,
                _ => return Err(MUSA_ERROR_INVALID_VALUE),
            });
        }
        let access = access.ok_or(MUSA_ERROR_INVALID_VALUE)?;
        d.emu
            .vmm_set_access(ptr, size as u64, access)
            .map_err(from_errno)
    })
}
