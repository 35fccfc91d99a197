//! Device memory through MUSA's virtual memory management API, as upstream GDRCopy's
//! `gpu_vmm_alloc` makes it: `muMemCreate` with `gpuDirectRDMACapable`, granularity rounded up
//! to the 64 KiB GPU page, `muMemAddressReserve`, `muMemMap`, `muMemSetAccess` read-write; freed
//! with `muMemUnmap`, `muMemRelease`, `muMemAddressFree`.
//!
//! MUSA's VMM headers are not public: the signatures, struct layouts and numbers here are
//! CUDA's (`CUmemAllocationProp`, `CUmemAccessDesc`, ...), which MUSA's driver API mirrors
//! elsewhere (docs/musa-abi.md). None of these calls has a `_v2` name in CUDA, so each is
//! resolved by its plain name (`gdrapi::musa::function`). A libmusa without them is reported
//! when VMM memory is asked for, not when the library loads.

use std::ffi::{c_int, c_uchar, c_ushort, c_void};

use anyhow::{bail, Result};
use libloading::Library;

use crate::gpu::DevicePtr;
use gdrapi::musa::ids::{
    MUresult, MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED,
    MU_MEM_ACCESS_FLAGS_PROT_READWRITE, MU_MEM_ALLOCATION_TYPE_PINNED,
    MU_MEM_ALLOC_GRANULARITY_MINIMUM, MU_MEM_LOCATION_TYPE_DEVICE,
};

/// `MUmemGenericAllocationHandle`.
pub type MUmemGenericAllocationHandle = u64;

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
    pub compression_type: c_uchar,
    pub gpu_direct_rdma_capable: c_uchar,
    pub usage: c_ushort,
    pub reserved: [c_uchar; 4],
}

/// `MUmemAllocationProp` (32 bytes, as CUDA's `CUmemAllocationProp`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: MUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: MUmemAllocFlags,
}

/// `MUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MUmemAccessDesc {
    pub location: MUmemLocation,
    pub flags: c_int,
}

const _: () = assert!(std::mem::size_of::<MUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::offset_of!(MUmemAllocationProp, alloc_flags) == 24);
const _: () = assert!(std::mem::size_of::<MUmemAccessDesc>() == 12);

type GetGranularity =
    unsafe extern "C" fn(*mut usize, *const MUmemAllocationProp, c_int) -> MUresult;
type Create = unsafe extern "C" fn(
    *mut MUmemGenericAllocationHandle,
    usize,
    *const MUmemAllocationProp,
    u64,
) -> MUresult;
type Release = unsafe extern "C" fn(MUmemGenericAllocationHandle) -> MUresult;
type Reserve = unsafe extern "C" fn(*mut DevicePtr, usize, usize, DevicePtr, u64) -> MUresult;
type AddressFree = unsafe extern "C" fn(DevicePtr, usize) -> MUresult;
type Map =
    unsafe extern "C" fn(DevicePtr, usize, usize, MUmemGenericAllocationHandle, u64) -> MUresult;
type Unmap = unsafe extern "C" fn(DevicePtr, usize) -> MUresult;
type SetAccess = unsafe extern "C" fn(DevicePtr, usize, *const MUmemAccessDesc, usize) -> MUresult;
type DeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> MUresult;

/// The VMM entry points, resolved from the loaded libmusa.
pub(crate) struct VmmApi {
    get_granularity: GetGranularity,
    create: Create,
    release: Release,
    reserve: Reserve,
    address_free: AddressFree,
    map: Map,
    unmap: Unmap,
    set_access: SetAccess,
    device_get_attribute: DeviceGetAttribute,
}

/// The 64 KiB GPU page the granularity is rounded up to, as upstream does.
const GPU_PAGE: usize = gdrapi::GPU_PAGE_SIZE as usize;

impl VmmApi {
    /// Resolves every call, or says which one `path` lacks.
    pub(crate) fn load(lib: &Library, path: &str) -> std::result::Result<VmmApi, String> {
        macro_rules! req {
            ($name:literal) => {
                // SAFETY: the field it is stored in has the C signature of the CUDA prototype
                // MUSA mirrors for that name; the Library outlives the Api that holds this.
                unsafe { gdrapi::musa::function(lib, $name) }.ok_or_else(|| {
                    format!(
                        "{path} lacks {}: this MUSA driver has no virtual memory management \
                         API (muMemCreate); allocate with muMemAlloc instead",
                        $name
                    )
                })?
            };
        }
        Ok(VmmApi {
            get_granularity: req!("muMemGetAllocationGranularity"),
            create: req!("muMemCreate"),
            release: req!("muMemRelease"),
            reserve: req!("muMemAddressReserve"),
            address_free: req!("muMemAddressFree"),
            map: req!("muMemMap"),
            unmap: req!("muMemUnmap"),
            set_access: req!("muMemSetAccess"),
            device_get_attribute: req!("muDeviceGetAttribute"),
        })
    }
}

/// One VMM allocation, as [`alloc`] made it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VmmAlloc {
    pub handle: MUmemGenericAllocationHandle,
    pub ptr: DevicePtr,
    pub size: usize,
}

/// What the calls report errors through: `MusaGpu`'s check (name and code → error).
pub(crate) type Check<'a> = &'a dyn Fn(&'static str, MUresult) -> Result<()>;

/// Whether `device` can pin VMM memory (`..._GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED`, which
/// upstream checks before every VMM allocation).
pub(crate) fn supported(api: &VmmApi, check: Check, device: c_int) -> Result<()> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out pointer.
    let rc = unsafe {
        (api.device_get_attribute)(
            &mut v,
            MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED,
            device,
        )
    };
    check(
        "muDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED)",
        rc,
    )?;
    if v == 0 {
        bail!(
            "MUSA device {device} does not support GPUDirect RDMA with VMM memory \
             (MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED is 0): allocate with \
             muMemAlloc instead"
        );
    }
    Ok(())
}

fn prop(device: c_int) -> MUmemAllocationProp {
    MUmemAllocationProp {
        type_: MU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: MUmemLocation {
            type_: MU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: MUmemAllocFlags {
            gpu_direct_rdma_capable: 1,
            ..Default::default()
        },
    }
}

/// At least `size` bytes of read-write VMM memory on `device`, mapped at a fresh reservation.
/// Whatever was made is undone when a later step fails.
pub(crate) fn alloc(api: &VmmApi, check: Check, device: c_int, size: usize) -> Result<VmmAlloc> {
    supported(api, check, device)?;
    let prop = prop(device);
    let mut granularity = 0usize;
    // SAFETY: valid out pointer and property struct, both live for the call.
    let rc =
        unsafe { (api.get_granularity)(&mut granularity, &prop, MU_MEM_ALLOC_GRANULARITY_MINIMUM) };
    check("muMemGetAllocationGranularity", rc)?;
    let granularity = granularity.max(1).div_ceil(GPU_PAGE) * GPU_PAGE;
    let size = size.max(1).div_ceil(granularity) * granularity;

    let mut handle = 0;
    // SAFETY: valid out pointer and property struct.
    check("muMemCreate", unsafe {
        (api.create)(&mut handle, size, &prop, 0)
    })?;
    let mut ptr = 0;
    // SAFETY: valid out pointer; the rest by value.
    let rc = unsafe { (api.reserve)(&mut ptr, size, granularity, 0, 0) };
    if let Err(e) = check("muMemAddressReserve", rc) {
        // SAFETY: the handle was just created; undoing it.
        unsafe { (api.release)(handle) };
        return Err(e);
    }
    let a = VmmAlloc { handle, ptr, size };
    // SAFETY: all by value: a mapping of the whole new allocation at the new reservation.
    let rc = unsafe { (api.map)(ptr, size, 0, handle, 0) };
    if let Err(e) = check("muMemMap", rc) {
        undo(api, &a, false);
        return Err(e);
    }
    let desc = MUmemAccessDesc {
        location: prop.location,
        flags: MU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one live descriptor.
    let rc = unsafe { (api.set_access)(ptr, size, &desc, 1) };
    if let Err(e) = check("muMemSetAccess", rc) {
        undo(api, &a, true);
        return Err(e);
    }
    Ok(a)
}

/// Undoes [`alloc`]'s steps after a failure (errors have nowhere better to go).
fn undo(api: &VmmApi, a: &VmmAlloc, mapped: bool) {
    // SAFETY: all by value, on objects alloc made.
    unsafe {
        if mapped {
            (api.unmap)(a.ptr, a.size);
        }
        (api.release)(a.handle);
        (api.address_free)(a.ptr, a.size);
    }
}

/// Unmaps, releases and frees the range of `a`; every step is tried, the first error returned.
pub(crate) fn free(api: &VmmApi, check: Check, a: &VmmAlloc) -> Result<()> {
    // SAFETY: all by value; the driver validates them.
    let results = unsafe {
        [
            check("muMemUnmap", (api.unmap)(a.ptr, a.size)),
            check("muMemRelease", (api.release)(a.handle)),
            check("muMemAddressFree", (api.address_free)(a.ptr, a.size)),
        ]
    };
    results.into_iter().collect()
}
