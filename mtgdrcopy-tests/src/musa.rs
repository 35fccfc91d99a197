//! The GPU backend: MUSA's driver API (`libmusa.so.1`), loaded at run time so the programs need
//! no MUSA SDK to build and start on machines without one (they then say what is missing).
//!
//! The library is found, and its functions resolved (`_v2` names first where CUDA has them), by
//! the same rule as libgdrapi's dma-buf backend: `gdrapi::musa`. On test machines the library
//! found is the emulated one backed by `mtgpu_emu` (package `mtgpu-emu-musa`), which the tools
//! refuse unless the test suite sets `MTGDRCOPY_ALLOW_EMULATED_MUSA=1`: it must never pass for
//! the driver's on a real host.
//!
//! Every [`Gpu`] method makes the device's primary context current in the calling thread
//! first (`muCtxSetCurrent` is cheap), so a [`MusaGpu`] can be used from any thread.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::sync::{Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use libloading::Library;

use crate::gpu::{DevicePtr, Gpu};
use crate::vmm::{self, VmmAlloc, VmmApi};

/// `MUdevice`: a device ordinal as the driver hands it out.
pub type MUdevice = c_int;
/// `MUcontext`: an opaque context handle.
pub type MUcontext = *mut c_void;
/// `MUdeviceptr`: a 64-bit device address.
pub type MUdeviceptr = u64;
/// `MUpointer_attribute`: a C enum.
#[allow(non_camel_case_types)]
pub type MUpointer_attribute = c_int;

pub use gdrapi::musa::ids::{
    MUresult, MUSA_ERROR_INVALID_VALUE, MUSA_ERROR_NO_DEVICE, MUSA_SUCCESS, MU_MEM_ATTACH_GLOBAL,
    MU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
};

pub use gdrapi::musa::{DEFAULT_MUSA_HOME, MUSA_HOME_ENV};

/// Set to `1` (exactly), the tools use the test suite's emulated libmusa; without it they refuse
/// it, so that it can never be taken for the MUSA driver's.
pub const ALLOW_EMULATED_ENV: &str = "MTGDRCOPY_ALLOW_EMULATED_MUSA";

/// Whether [`ALLOW_EMULATED_ENV`] allows the emulated libmusa.
pub fn emulated_allowed() -> bool {
    std::env::var_os(ALLOW_EMULATED_ENV).is_some_and(|v| v == "1")
}

/// Why the emulated libmusa at `path` is not used.
pub fn emulated_refusal(path: &str) -> String {
    format!(
        "{path} is the mtgdrcopy test suite's emulated libmusa, not Moore Threads' MUSA driver: \
         remove its directory from LD_LIBRARY_PATH and install the driver (it ships \
         libmusa.so.1); only the test suite uses it, with {ALLOW_EMULATED_ENV}=1"
    )
}

/// A failed driver call: its name, the MUSA code, and the driver's name and text for it.
#[derive(Debug, Clone)]
pub struct MusaError {
    pub call: &'static str,
    pub code: MUresult,
    pub name: String,
    pub message: String,
}

impl fmt::Display for MusaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({}): {}",
            self.call, self.name, self.code, self.message
        )
    }
}

impl std::error::Error for MusaError {}

type MuInit = unsafe extern "C" fn(c_uint) -> MUresult;
type MuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> MUresult;
type MuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> MUresult;
type MuDeviceGet = unsafe extern "C" fn(*mut MUdevice, c_int) -> MUresult;
type MuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, MUdevice) -> MUresult;
type MuDeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, MUdevice) -> MUresult;
type MuPrimaryCtxRetain = unsafe extern "C" fn(*mut MUcontext, MUdevice) -> MUresult;
type MuPrimaryCtxRelease = unsafe extern "C" fn(MUdevice) -> MUresult;
type MuCtxSetCurrent = unsafe extern "C" fn(MUcontext) -> MUresult;
type MuMemAlloc = unsafe extern "C" fn(*mut MUdeviceptr, usize) -> MUresult;
type MuMemAllocManaged = unsafe extern "C" fn(*mut MUdeviceptr, usize, c_uint) -> MUresult;
type MuMemFree = unsafe extern "C" fn(MUdeviceptr) -> MUresult;
type MuMemcpyHtoD = unsafe extern "C" fn(MUdeviceptr, *const c_void, usize) -> MUresult;
type MuMemcpyDtoH = unsafe extern "C" fn(*mut c_void, MUdeviceptr, usize) -> MUresult;
type MuMemsetD8 = unsafe extern "C" fn(MUdeviceptr, u8, usize) -> MUresult;
type MuPointerSetAttribute =
    unsafe extern "C" fn(*const c_void, MUpointer_attribute, MUdeviceptr) -> MUresult;
type MuGetErrorString = unsafe extern "C" fn(MUresult, *mut *const c_char) -> MUresult;

/// The driver API entry points the programs use, resolved once.
struct Api {
    /// The file the library was loaded from (else the name passed to dlopen).
    path: String,
    /// It is the test suite's emulated libmusa (allowed by [`ALLOW_EMULATED_ENV`]).
    emulated: bool,
    driver_get_version: MuDriverGetVersion,
    device_get_count: MuDeviceGetCount,
    device_get: MuDeviceGet,
    device_get_name: MuDeviceGetName,
    device_get_pci_bus_id: Option<MuDeviceGetPciBusId>,
    primary_ctx_retain: MuPrimaryCtxRetain,
    primary_ctx_release: MuPrimaryCtxRelease,
    ctx_set_current: MuCtxSetCurrent,
    mem_alloc: MuMemAlloc,
    mem_alloc_managed: MuMemAllocManaged,
    mem_free: MuMemFree,
    memcpy_htod: MuMemcpyHtoD,
    memcpy_dtoh: MuMemcpyDtoH,
    memset_d8: MuMemsetD8,
    pointer_set_attribute: MuPointerSetAttribute,
    get_error_string: Option<MuGetErrorString>,
    get_error_name: Option<MuGetErrorString>,
    /// The VMM calls, or which one the library lacks (said when VMM memory is asked for).
    vmm: std::result::Result<VmmApi, String>,
    /// What `muInit(0)` returned.
    init: MUresult,
    _lib: Library,
}

impl Api {
    /// `rc` as a `Result`, with the driver's own name and text for a failure.
    fn check(&self, call: &'static str, rc: MUresult) -> std::result::Result<(), MusaError> {
        if rc == MUSA_SUCCESS {
            return Ok(());
        }
        let text = |f: Option<MuGetErrorString>| -> Option<String> {
            let mut s: *const c_char = std::ptr::null();
            // SAFETY: `s` is a valid out pointer; on success the driver stores a pointer to a
            // static NUL-terminated string (or leaves it NULL, checked below).
            let ok = unsafe { f?(rc, &mut s) } == MUSA_SUCCESS && !s.is_null();
            // SAFETY: `s` is non-NULL and points to the driver's static C string.
            ok.then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
        };
        Err(MusaError {
            call,
            code: rc,
            name: text(self.get_error_name).unwrap_or_else(|| "MUSA_ERROR".into()),
            message: text(self.get_error_string).unwrap_or_else(|| "unknown error".into()),
        })
    }
}

fn open_library() -> Result<(Library, String)> {
    gdrapi::musa::open_library().map_err(|e| {
        anyhow!(
            "cannot load the MUSA driver library, {e}: install the Moore Threads driver (it ships \
             libmusa.so.1), or set LD_LIBRARY_PATH or {MUSA_HOME_ENV} to where it is"
        )
    })
}

/// The file `lib` was loaded from, found through the address of its export `symbol` (a name the
/// loader found by its search path says nothing about the directory).
pub fn file_of(lib: &Library, symbol: &str) -> Option<String> {
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    // SAFETY: only the symbol's address is taken, never dereferenced.
    let addr = unsafe { lib.get::<*const c_void>(&name) }.ok()?;
    let addr: *const c_void = *addr;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is writable; dladdr fills it for an address inside a loaded object.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) } != 0;
    // SAFETY: dladdr succeeded, so `info` is initialised (it was zeroed before in any case).
    let info = unsafe { info.assume_init() };
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname points to the loader's NUL-terminated path of the object.
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    let file = file.to_string_lossy().into_owned();
    // The loader's name may be relative to the working directory; make it absolute.
    Some(std::fs::canonicalize(&file).map_or(file, |p| p.display().to_string()))
}

fn load() -> Result<Api> {
    let (lib, path) = open_library()?;
    // The file, not just the name the loader found it by.
    let path = file_of(&lib, "muInit").unwrap_or(path);
    let emulated = gdrapi::musa::is_emulated(&lib);
    if emulated && !emulated_allowed() {
        bail!(emulated_refusal(&path));
    }
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the field it is stored in has the C signature of the musa.h prototype of
            // that name; the Library is kept alive in the same struct.
            unsafe { gdrapi::musa::function(&lib, $name) }
        }};
    }
    macro_rules! req {
        ($name:literal) => {
            sym!($name).ok_or_else(|| {
                anyhow!(
                    "{path} lacks {}: not a MUSA driver library, or too old",
                    $name
                )
            })?
        };
    }
    let init: MuInit = req!("muInit");
    let api = Api {
        driver_get_version: req!("muDriverGetVersion"),
        device_get_count: req!("muDeviceGetCount"),
        device_get: req!("muDeviceGet"),
        device_get_name: req!("muDeviceGetName"),
        device_get_pci_bus_id: sym!("muDeviceGetPCIBusId"),
        primary_ctx_retain: req!("muDevicePrimaryCtxRetain"),
        primary_ctx_release: req!("muDevicePrimaryCtxRelease"),
        ctx_set_current: req!("muCtxSetCurrent"),
        mem_alloc: req!("muMemAlloc"),
        mem_alloc_managed: req!("muMemAllocManaged"),
        mem_free: req!("muMemFree"),
        memcpy_htod: req!("muMemcpyHtoD"),
        memcpy_dtoh: req!("muMemcpyDtoH"),
        memset_d8: req!("muMemsetD8"),
        pointer_set_attribute: req!("muPointerSetAttribute"),
        get_error_string: sym!("muGetErrorString"),
        get_error_name: sym!("muGetErrorName"),
        vmm: VmmApi::load(&lib, &path),
        // SAFETY: muInit takes flags by value; 0 is the only defined value.
        init: unsafe { init(0) },
        path,
        emulated,
        _lib: lib,
    };
    Ok(api)
}

/// The library, loaded and initialised (`muInit(0)`) on first use. A failed `muInit` is kept
/// in [`Api::init`], not reported here, so "no device" can be told apart from "no library".
fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// The file of the library the backend loaded, e.g. `/usr/local/musa/lib/libmusa.so.1`.
pub fn library_path() -> Result<&'static str> {
    Ok(&api()?.path)
}

/// Whether the library loaded is the test suite's emulated libmusa (then allowed).
pub fn is_emulated() -> Result<bool> {
    Ok(api()?.emulated)
}

/// `muDriverGetVersion`, without opening a device (it needs no successful `muInit` either).
pub fn driver_version() -> Result<i32> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out pointer.
    api.check("muDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut v)
    })?;
    Ok(v)
}

/// The API after a successful `muInit`, or the one-line reason there is no usable driver.
fn initialised() -> Result<&'static Api> {
    let api = api()?;
    match api.init {
        MUSA_SUCCESS => Ok(api),
        MUSA_ERROR_NO_DEVICE => bail!(no_device(api)),
        rc => Err(api.check("muInit", rc).unwrap_err().into()),
    }
}

fn no_device(api: &Api) -> String {
    format!(
        "no MUSA device found ({} loaded, but the driver reports none): is the mtgpu kernel \
         driver loaded, and are /dev/mtgpu.N and /dev/dri/renderD* accessible to this user?",
        api.path
    )
}

/// How many devices the driver sees. 0 when `muInit` reports no device; an error (marked
/// unavailable) when the library cannot be loaded or initialised.
pub fn device_count() -> Result<i32> {
    count_devices().map_err(crate::status::unavailable)
}

fn count_devices() -> Result<i32> {
    let api = api()?;
    if api.init == MUSA_ERROR_NO_DEVICE {
        return Ok(0);
    }
    let api = initialised()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer.
    api.check("muDeviceGetCount", unsafe {
        (api.device_get_count)(&mut n)
    })?;
    Ok(n)
}

/// Opens device `device` (an ordinal, 0-based): retains its primary context. A failure means
/// this machine has no such usable device (marked unavailable: the tools exit with 77).
pub fn open(device: i32) -> Result<Box<dyn Gpu>> {
    Ok(Box::new(
        MusaGpu::open(device).map_err(crate::status::unavailable)?,
    ))
}

/// The primary context handle. The driver API allows a context to be made current in, and
/// used from, any thread.
#[derive(Clone, Copy)]
struct Context(MUcontext);

// SAFETY: a MUSA context handle is an opaque token the driver accepts from any thread
// (muCtxSetCurrent binds it per thread); we never dereference it.
unsafe impl Send for Context {}
// SAFETY: as above; shared use only passes the token by value to the driver.
unsafe impl Sync for Context {}

/// One device with its primary context retained; released on drop.
pub struct MusaGpu {
    api: &'static Api,
    device: MUdevice,
    ordinal: i32,
    ctx: Context,
    name: String,
    pci_bus_id: Option<String>,
    /// Live VMM allocations by address.
    vmm_allocs: Mutex<HashMap<DevicePtr, VmmAlloc>>,
}

impl MusaGpu {
    pub fn open(ordinal: i32) -> Result<MusaGpu> {
        let count = device_count()?;
        let api = initialised()?;
        if count == 0 {
            bail!(no_device(api));
        }
        if !(0..count).contains(&ordinal) {
            bail!(
                "no MUSA device {ordinal}: the driver reports {count} device{} (0..{})",
                if count == 1 { "" } else { "s" },
                count - 1
            );
        }
        let mut device: MUdevice = 0;
        // SAFETY: `device` is a valid out pointer.
        api.check("muDeviceGet", unsafe {
            (api.device_get)(&mut device, ordinal)
        })?;

        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for the length passed; the driver NUL-terminates.
        api.check("muDeviceGetName", unsafe {
            (api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, device)
        })?;
        let name = c_buf_to_string(&buf);
        let pci_bus_id = api.device_get_pci_bus_id.and_then(|f| {
            let mut buf = [0 as c_char; 64];
            // SAFETY: as above.
            let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, device) };
            (rc == MUSA_SUCCESS).then(|| c_buf_to_string(&buf))
        });

        let mut ctx: MUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out pointer.
        api.check("muDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut ctx, device)
        })?;
        let gpu = MusaGpu {
            api,
            device,
            ordinal,
            ctx: Context(ctx),
            name,
            pci_bus_id,
            vmm_allocs: Mutex::new(HashMap::new()),
        };
        gpu.make_current()?;
        Ok(gpu)
    }

    /// The ordinal this device was opened with.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The VMM calls, made current, with the check that names failures.
    fn vmm(&self) -> Result<&VmmApi> {
        let api = self.api.vmm.as_ref().map_err(|e| anyhow!("{e}"))?;
        self.make_current()?;
        Ok(api)
    }

    fn check_fn(&self) -> impl Fn(&'static str, MUresult) -> Result<()> + '_ {
        |call, rc| Ok(self.api.check(call, rc)?)
    }

    fn vmm_allocs(&self) -> std::sync::MutexGuard<'_, HashMap<DevicePtr, VmmAlloc>> {
        // Each update is one insert or remove: a panic elsewhere left the map consistent.
        self.vmm_allocs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the primary context current in the calling thread.
    fn make_current(&self) -> Result<()> {
        // SAFETY: the context was retained by us and stays valid until drop.
        let rc = unsafe { (self.api.ctx_set_current)(self.ctx.0) };
        Ok(self.api.check("muCtxSetCurrent", rc)?)
    }
}

pub(crate) fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Drop for MusaGpu {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`. Errors at teardown have nowhere to go.
        unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

impl Gpu for MusaGpu {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn pci_bus_id(&self) -> Option<String> {
        self.pci_bus_id.clone()
    }

    fn driver_version(&self) -> Result<i32> {
        driver_version()
    }

    fn alloc(&self, size: usize) -> Result<DevicePtr> {
        self.make_current()?;
        let mut p: MUdeviceptr = 0;
        // SAFETY: `p` is a valid out pointer.
        let rc = unsafe { (self.api.mem_alloc)(&mut p, size) };
        self.api.check("muMemAlloc", rc)?;
        Ok(p)
    }

    fn alloc_managed(&self, size: usize) -> Result<DevicePtr> {
        self.make_current()?;
        let mut p: MUdeviceptr = 0;
        // SAFETY: `p` is a valid out pointer.
        let rc = unsafe { (self.api.mem_alloc_managed)(&mut p, size, MU_MEM_ATTACH_GLOBAL) };
        self.api.check("muMemAllocManaged", rc)?;
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.make_current()?;
        // SAFETY: takes the address by value; the driver validates it.
        let rc = unsafe { (self.api.mem_free)(ptr) };
        Ok(self.api.check("muMemFree", rc)?)
    }

    fn memcpy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.make_current()?;
        // SAFETY: `src` is readable for its length for the duration of the (synchronous) call.
        let rc = unsafe { (self.api.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) };
        Ok(self.api.check("muMemcpyHtoD", rc)?)
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.make_current()?;
        // SAFETY: `dst` is writable for its length for the duration of the (synchronous) call.
        let rc = unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) };
        Ok(self.api.check("muMemcpyDtoH", rc)?)
    }

    fn memset_d8(&self, dst: DevicePtr, value: u8, count: usize) -> Result<()> {
        self.make_current()?;
        // SAFETY: all arguments by value; the driver validates the range.
        let rc = unsafe { (self.api.memset_d8)(dst, value, count) };
        Ok(self.api.check("muMemsetD8", rc)?)
    }

    fn set_sync_memops(&self, ptr: DevicePtr) -> Result<()> {
        self.make_current()?;
        let flag: c_uint = 1;
        // SAFETY: `flag` outlives the call; SYNC_MEMOPS reads an unsigned int from it.
        let rc = unsafe {
            (self.api.pointer_set_attribute)(
                (&flag as *const c_uint).cast(),
                MU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                ptr,
            )
        };
        Ok(self.api.check("muPointerSetAttribute(SYNC_MEMOPS)", rc)?)
    }

    fn vmm_supported(&self) -> Result<()> {
        let api = self.vmm()?;
        vmm::supported(api, &self.check_fn(), self.device)
    }

    fn vmm_alloc(&self, size: usize) -> Result<DevicePtr> {
        let api = self.vmm()?;
        let a = vmm::alloc(api, &self.check_fn(), self.device, size)?;
        self.vmm_allocs().insert(a.ptr, a);
        Ok(a.ptr)
    }

    fn vmm_free(&self, ptr: DevicePtr) -> Result<()> {
        let api = self.vmm()?;
        let a = self
            .vmm_allocs()
            .remove(&ptr)
            .ok_or_else(|| anyhow!("{ptr:#x} is not a VMM allocation of this process"))?;
        vmm::free(api, &self.check_fn(), &a)
    }
}
