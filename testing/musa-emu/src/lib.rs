//! Test-only `libmusa.so.1`: the MUSA driver API subset used by the mtgdrcopy tools, with the
//! real names and C signatures, backed by the emulated provider's `/dev/mtgpu_emu`.
//!
//! One device, ordinal 0, named [`DEVICE_NAME`]. `muInit` opens `/dev/mtgpu_emu` once for the
//! process; every allocation belongs to that open file, so it lives until `muMemFree`, the
//! release of the last primary-context reference, or process exit.
//!
//! | call | emulator |
//! | --- | --- |
//! | `muMemAlloc` | ALLOC, page size and VA alignment from the environment ([`config`]) |
//! | `muMemAllocManaged` | ALLOC with `MTGPU_EMU_ALLOC_MANAGED`: `get_pages` refuses it |
//! | `muMemFree` | FREE |
//! | `muMemcpyHtoD` / `muMemcpyDtoH` | WRITE / READ (the emulator's "DMA" path) |
//! | `muMemsetD8` | MEMSET |
//! | `muPointerSetAttribute(SYNC_MEMOPS)` | nothing: the emulator's operations are synchronous |
//! | `muMemGetHandleForAddressRange(DMA_BUF_FD)` | EXPORT_DMABUF (see `config` for `MTGPU_EMU_DMABUF`) |
//! | `muDeviceGetAttribute(DMA_BUF_SUPPORTED)` | 1 unless `MTGPU_EMU_DMABUF=off` |
//! | `muMemCreate` / `muMemRelease` | ALLOC with `MTGPU_EMU_ALLOC_VMM` (+ `_RDMA` for `gpuDirectRDMACapable`) / FREE |
//! | `muMemAddressReserve` / `muMemAddressFree` | VMM RESERVE / UNRESERVE |
//! | `muMemMap` / `muMemUnmap` / `muMemSetAccess` | VMM MAP / UNMAP / SET_ACCESS |
//! | `muMemGetAllocationGranularity` | the page size (`MTGPU_EMU_PAGE_SIZE`) |
//! | `muDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED)` | 1 unless `MTGPU_EMU_VMM_RDMA=off` |
//!
//! The VMM calls (module [`vmm`]) take CUDA's signatures, layouts and numbers: an assumption.
//!
//! Like the real driver, calls other than `muDriverGetVersion`, `muGetErrorName` and
//! `muGetErrorString` fail with `MUSA_ERROR_NOT_INITIALIZED` before a successful `muInit`, and
//! memory calls fail with `MUSA_ERROR_INVALID_CONTEXT` in a thread without a current context
//! (`muCtxSetCurrent` of the primary context, which must be retained). Codes are in [`error`].
//!
//! Export names follow libmusa's: `muDevicePrimaryCtxRelease` only as `_v2` (what real libmusa
//! 3.1.0 exports), the memory calls under their plain names (which real MUSA code resolves), so
//! that a caller resolving names by the `_v2` rule (`gdrapi::musa`) is tested on both kinds.
//!
//! A panic never unwinds into C: it becomes `MUSA_ERROR_UNKNOWN`.
#![allow(non_snake_case)]

pub mod config;
pub mod error;
pub mod vmm;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mtgpu_emu_abi::{MTGPU_EMU_ALLOC_MANAGED, MTGPU_EMU_EXPORT_NO_MMAP};

use crate::config::{Config, DmaBuf};
pub use crate::error::*;
use mtgpu_emu_abi::Emu;

pub type MUdevice = c_int;
pub type MUcontext = *mut c_void;
pub type MUdeviceptr = u64;
#[allow(non_camel_case_types)]
pub type MUpointer_attribute = c_int;

/// What `muDeviceGetName` reports.
pub const DEVICE_NAME: &str = "MTT S4000 (emulated)";
/// What `muDriverGetVersion` reports: 3.0.0, encoded `major * 10000 + minor * 100 + patch`
/// like MUSA's library version macros (the real driver's encoding is not public).
pub const DRIVER_VERSION: c_int = 30000;
/// `muDeviceGetPCIBusId` when the ivshmem device cannot be found in sysfs.
pub const FALLBACK_PCI_BUS_ID: &str = "0000:00:00.0";
/// CUDA's `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, which MUSA is taken to mirror (the mtgdrcopy
/// tools use the same value).
pub const MU_POINTER_ATTRIBUTE_SYNC_MEMOPS: MUpointer_attribute = 6;
pub const MU_MEM_ATTACH_GLOBAL: c_uint = 1;
pub const MU_MEM_ATTACH_HOST: c_uint = 2;
#[allow(non_camel_case_types)]
pub type MUdevice_attribute = c_int;
#[allow(non_camel_case_types)]
pub type MUmemRangeHandleType = c_int;
/// CUDA's `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, which MUSA is taken to mirror like its other
/// device attributes (docs/musa-abi.md); libgdrapi uses the same value.
pub const MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: MUdevice_attribute = 124;
/// CUDA's `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`, likewise.
pub const MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: MUmemRangeHandleType = 1;

/// The process's driver state, created by the first `muInit`.
struct Driver {
    emu: Emu,
    config: Config,
    pci_bus_id: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// References on the primary context (`muDevicePrimaryCtxRetain` minus releases).
    ctx_refs: u32,
    /// Live allocations: VA → size (rounded up to the page size, as the emulator does).
    allocs: BTreeMap<MUdeviceptr, u64>,
    /// VMM handles, reservations and mappings.
    vmm: vmm::Vmm,
}

impl Driver {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock left the map consistent (each update is one call).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

static DRIVER: OnceLock<Result<Driver, MUresult>> = OnceLock::new();

/// The primary context handle: any unique non-NULL address; it is never dereferenced.
static PRIMARY_CTX: u8 = 0;

fn primary_ctx() -> MUcontext {
    (&PRIMARY_CTX as *const u8).cast_mut().cast()
}

thread_local! {
    /// Whether the primary context is current in this thread.
    static CURRENT: Cell<bool> = const { Cell::new(false) };
}

type MuResult<T = ()> = Result<T, MUresult>;

/// Runs the body of an exported function: its error as the return code, a panic as UNKNOWN.
fn ffi(body: impl FnOnce() -> MuResult) -> MUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => MUSA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => MUSA_ERROR_UNKNOWN,
    }
}

fn driver() -> MuResult<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(MUSA_ERROR_NOT_INITIALIZED),
    }
}

fn check_device(dev: MUdevice) -> MuResult {
    if dev == 0 {
        Ok(())
    } else {
        Err(MUSA_ERROR_INVALID_DEVICE)
    }
}

/// The driver, when the calling thread has a live current context.
fn with_context() -> MuResult<&'static Driver> {
    let d = driver()?;
    if !CURRENT.with(Cell::get) || d.state().ctx_refs == 0 {
        return Err(MUSA_ERROR_INVALID_CONTEXT);
    }
    Ok(d)
}

/// Stores `value` through `out`.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn store<T>(out: *mut T, value: T) -> MuResult {
    if out.is_null() {
        return Err(MUSA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL, and valid for writes per this function's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `s` into the C buffer `buf` of `len` bytes, truncating, always NUL-terminated.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes.
unsafe fn store_str(buf: *mut c_char, len: c_int, s: &str) -> MuResult {
    if buf.is_null() || len <= 0 {
        return Err(MUSA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `buf` holds `len` > n bytes per this function's contract; `s` does not overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, n);
        buf.add(n).write(0);
    }
    Ok(())
}

/// The bus id of the ivshmem device mtgpu_emu is bound to, from sysfs (its PCI driver is named
/// "mtgpu", as the vendor's).
fn find_pci_bus_id() -> Option<String> {
    let dir = std::fs::read_dir("/sys/bus/pci/drivers/mtgpu").ok()?;
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.len() == 12 && n.as_bytes()[4] == b':' && n.as_bytes()[7] == b':')
}

fn init() -> MuResult<Driver> {
    let config = Config::from_env().map_err(|msg| {
        eprintln!("libmusa (mtgpu_emu): {msg}");
        MUSA_ERROR_INVALID_VALUE
    })?;
    let emu = Emu::open().map_err(from_errno)?;
    // Every command fails with ENODEV while no BAR is bound: find that out at muInit.
    emu.stats().map_err(from_errno)?;
    Ok(Driver {
        emu,
        config,
        pci_bus_id: find_pci_bus_id().unwrap_or_else(|| FALLBACK_PCI_BUS_ID.into()),
        state: Mutex::new(State::default()),
    })
}

/// What makes this library unmistakable for the real one: the mtgdrcopy tools look this symbol
/// up (`gdrapi::musa::is_emulated`, by the name `gdrapi::musa::EMULATED_MARKER`) and refuse the
/// library unless the test suite allows it; real libmusa never exports it.
#[no_mangle]
#[used]
#[allow(non_upper_case_globals)]
pub static mtgdrcopy_emulated_musa: [u8; 48] =
    *b"mtgdrcopy test-only emulated libmusa, not MUSA\0\0";

/// `muInit`: opens `/dev/mtgpu_emu` and reads the configuration; the first call's outcome is
/// every later call's.
///
/// # Safety
/// None beyond the C API's: no pointer arguments.
#[no_mangle]
pub unsafe extern "C" fn muInit(flags: c_uint) -> MUresult {
    ffi(|| {
        if flags != 0 {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        DRIVER.get_or_init(init).as_ref().map(drop).map_err(|e| *e)
    })
}

/// # Safety
/// `version` is NULL or valid for a write of an int.
#[no_mangle]
pub unsafe extern "C" fn muDriverGetVersion(version: *mut c_int) -> MUresult {
    // SAFETY: per this function's contract.
    ffi(|| unsafe { store(version, DRIVER_VERSION) })
}

/// # Safety
/// `count` is NULL or valid for a write of an int.
#[no_mangle]
pub unsafe extern "C" fn muDeviceGetCount(count: *mut c_int) -> MUresult {
    ffi(|| {
        driver()?;
        // SAFETY: per this function's contract.
        unsafe { store(count, 1) }
    })
}

/// # Safety
/// `device` is NULL or valid for a write of an int.
#[no_mangle]
pub unsafe extern "C" fn muDeviceGet(device: *mut MUdevice, ordinal: c_int) -> MUresult {
    ffi(|| {
        driver()?;
        check_device(ordinal)?;
        // SAFETY: per this function's contract.
        unsafe { store(device, ordinal) }
    })
}

/// # Safety
/// `name` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn muDeviceGetName(name: *mut c_char, len: c_int, dev: MUdevice) -> MUresult {
    ffi(|| {
        driver()?;
        check_device(dev)?;
        // SAFETY: per this function's contract.
        unsafe { store_str(name, len, DEVICE_NAME) }
    })
}

/// # Safety
/// `bus_id` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn muDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: MUdevice,
) -> MUresult {
    ffi(|| {
        let d = driver()?;
        check_device(dev)?;
        // SAFETY: per this function's contract.
        unsafe { store_str(bus_id, len, &d.pci_bus_id) }
    })
}

/// # Safety
/// `ctx` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn muDevicePrimaryCtxRetain(ctx: *mut MUcontext, dev: MUdevice) -> MUresult {
    ffi(|| {
        let d = driver()?;
        check_device(dev)?;
        if ctx.is_null() {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        let mut st = d.state();
        st.ctx_refs = st.ctx_refs.checked_add(1).ok_or(MUSA_ERROR_UNKNOWN)?;
        // SAFETY: non-NULL, and valid for writes per this function's contract.
        unsafe { store(ctx, primary_ctx()) }
    })
}

/// Drops a primary-context reference; the last one frees every allocation, as destroying a
/// context does. Exported only under its `_v2` name, as real libmusa 3.1.0 does (CUDA's current
/// ABI name): callers that require the plain name fail here as they would there.
///
/// # Safety
/// None beyond the C API's: no pointer arguments.
#[no_mangle]
pub unsafe extern "C" fn muDevicePrimaryCtxRelease_v2(dev: MUdevice) -> MUresult {
    ffi(|| {
        let d = driver()?;
        check_device(dev)?;
        let mut st = d.state();
        st.ctx_refs = st
            .ctx_refs
            .checked_sub(1)
            .ok_or(MUSA_ERROR_INVALID_CONTEXT)?;
        if st.ctx_refs == 0 {
            for (va, _) in std::mem::take(&mut st.allocs) {
                // Nothing to report to: the memory is gone from our side either way.
                let _ = d.emu.free(va);
            }
            st.vmm.release_all(d);
        }
        Ok(())
    })
}

/// Makes the primary context current in the calling thread (NULL: none).
///
/// # Safety
/// None: `ctx` is compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn muCtxSetCurrent(ctx: MUcontext) -> MUresult {
    ffi(|| {
        driver()?;
        if !ctx.is_null() && ctx != primary_ctx() {
            return Err(MUSA_ERROR_INVALID_CONTEXT);
        }
        CURRENT.with(|c| c.set(!ctx.is_null()));
        Ok(())
    })
}

/// `*pctx` = the current context of this thread, NULL if none.
///
/// # Safety
/// `pctx` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn muCtxGetCurrent(pctx: *mut MUcontext) -> MUresult {
    ffi(|| {
        driver()?;
        let current = if CURRENT.with(Cell::get) {
            primary_ctx()
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: per this function's contract.
        unsafe { store(pctx, current) }
    })
}

/// Only `MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` and the VMM ones ([`vmm`]); other attributes are not emulated
/// (`MUSA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// `pi` is NULL or valid for a write of an int.
#[no_mangle]
pub unsafe extern "C" fn muDeviceGetAttribute(
    pi: *mut c_int,
    attrib: MUdevice_attribute,
    dev: MUdevice,
) -> MUresult {
    ffi(|| {
        let d = driver()?;
        check_device(dev)?;
        let value = match vmm::attribute(d, attrib) {
            Some(v) => v,
            None if attrib == MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED => {
                c_int::from(d.config.dmabuf != DmaBuf::Off)
            }
            None => return Err(MUSA_ERROR_INVALID_VALUE),
        };
        // SAFETY: per this function's contract.
        unsafe { store(pi, value) }
    })
}

/// A dma-buf fd for `[dptr, dptr + size)`, which must be host-page aligned and inside one
/// live allocation; `flags` must be 0. The caller owns the fd (close-on-exec); the memory
/// stays valid while the dma-buf lives, even if the allocation is freed.
///
/// # Safety
/// `handle` is NULL or valid for a write of an int (the fd).
#[no_mangle]
pub unsafe extern "C" fn muMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: MUdeviceptr,
    size: usize,
    handle_type: MUmemRangeHandleType,
    flags: u64,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        if handle.is_null() || handle_type != MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        let emu_flags = match d.config.dmabuf {
            DmaBuf::Off => return Err(MUSA_ERROR_NOT_SUPPORTED),
            DmaBuf::On => 0,
            DmaBuf::NoMmap => MTGPU_EMU_EXPORT_NO_MMAP,
        };
        let fd = d
            .emu
            .export_dmabuf(dptr, size as u64, emu_flags)
            .map_err(from_errno)?;
        // SAFETY: non-NULL, and valid for a write of an int per this function's contract.
        unsafe { handle.cast::<c_int>().write(fd) };
        Ok(())
    })
}

fn alloc(dptr: *mut MUdeviceptr, size: usize, flags: u32) -> MuResult {
    let d = with_context()?;
    if dptr.is_null() || size == 0 {
        return Err(MUSA_ERROR_INVALID_VALUE);
    }
    let c = d.config;
    let va = d
        .emu
        .alloc_flags(size as u64, c.align, c.page_size, flags)
        .map_err(from_errno)?;
    let page = u64::from(c.page_size);
    d.state()
        .allocs
        .insert(va, (size as u64).div_ceil(page) * page);
    // SAFETY: non-NULL; the callers' contract makes it valid for a write.
    unsafe { dptr.write(va) };
    Ok(())
}

/// # Safety
/// `dptr` is NULL or valid for a write of a `MUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn muMemAlloc(dptr: *mut MUdeviceptr, bytesize: usize) -> MUresult {
    ffi(|| alloc(dptr, bytesize, 0))
}

/// Managed memory: usable through this API like any, but the P2P API refuses to pin it.
///
/// # Safety
/// `dptr` is NULL or valid for a write of a `MUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn muMemAllocManaged(
    dptr: *mut MUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> MUresult {
    ffi(|| {
        if flags != MU_MEM_ATTACH_GLOBAL && flags != MU_MEM_ATTACH_HOST {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        alloc(dptr, bytesize, MTGPU_EMU_ALLOC_MANAGED)
    })
}

/// Frees an allocation of this process; 0 is a no-op.
///
/// # Safety
/// None beyond the C API's: the address is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemFree(dptr: MUdeviceptr) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        if dptr == 0 {
            return Ok(());
        }
        let mut st = d.state();
        if !st.allocs.contains_key(&dptr) {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        d.emu.free(dptr).map_err(from_errno)?;
        st.allocs.remove(&dptr);
        Ok(())
    })
}

/// # Safety
/// `src` is valid for reads of `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn muMemcpyHtoD(
    dst: MUdeviceptr,
    src: *const c_void,
    count: usize,
) -> MUresult {
    host_copy(dst, count, src.is_null(), |d, at, done, len| {
        // SAFETY: `src` is readable for `count` >= `done + len` bytes per this function's
        // contract.
        unsafe { d.emu.write_from(at, src.cast::<u8>().add(done), len) }
    })
}

/// # Safety
/// `dst` is valid for writes of `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn muMemcpyDtoH(
    dst: *mut c_void,
    src: MUdeviceptr,
    count: usize,
) -> MUresult {
    host_copy(src, count, dst.is_null(), |d, at, done, len| {
        // SAFETY: `dst` is writable for `count` >= `done + len` bytes per this function's
        // contract.
        unsafe { d.emu.read_to(at, dst.cast::<u8>().add(done), len) }
    })
}

/// A copy between `count` bytes of the device at `dev` and host memory: nothing for 0 bytes, an
/// invalid value for a NULL host pointer, else `copy(driver, device address, bytes done, len)`
/// for each piece in one record of the emulator (VMM mappings that follow each other are
/// separate records).
fn host_copy(
    dev: MUdeviceptr,
    count: usize,
    host_is_null: bool,
    copy: impl Fn(&Driver, u64, usize, u64) -> Result<(), nix::errno::Errno>,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        if count == 0 {
            return Ok(());
        }
        if host_is_null {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        let pieces = d.state().vmm.pieces(dev, count as u64);
        for (at, len) in pieces {
            copy(d, at, (at - dev) as usize, len).map_err(from_errno)?;
        }
        Ok(())
    })
}

/// # Safety
/// None beyond the C API's: the range is validated.
#[no_mangle]
pub unsafe extern "C" fn muMemsetD8(dst: MUdeviceptr, value: c_uchar, count: usize) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        if count == 0 {
            return Ok(());
        }
        let pieces = d.state().vmm.pieces(dst, count as u64);
        for (at, len) in pieces {
            d.emu.memset(at, len, value).map_err(from_errno)?;
        }
        Ok(())
    })
}

/// Only `MU_POINTER_ATTRIBUTE_SYNC_MEMOPS` on an address inside a live allocation: it succeeds
/// and changes nothing, because every memory operation of the emulator is synchronous.
///
/// # Safety
/// `value` is NULL or points to the attribute's value (an unsigned int for SYNC_MEMOPS).
#[no_mangle]
pub unsafe extern "C" fn muPointerSetAttribute(
    value: *const c_void,
    attribute: MUpointer_attribute,
    ptr: MUdeviceptr,
) -> MUresult {
    ffi(|| {
        let d = with_context()?;
        if attribute != MU_POINTER_ATTRIBUTE_SYNC_MEMOPS || value.is_null() {
            return Err(MUSA_ERROR_INVALID_VALUE);
        }
        let st = d.state();
        match st.allocs.range(..=ptr).next_back() {
            Some((&va, &size)) if ptr - va < size => Ok(()),
            _ if st.vmm.is_mapped(ptr) => Ok(()),
            _ => Err(MUSA_ERROR_INVALID_VALUE),
        }
    })
}

#[cfg(test)]
mod tests;
