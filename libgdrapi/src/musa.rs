//! Finding the MUSA driver library and its functions: one rule for libgdrapi's dma-buf backend
//! and the test tools.
//!
//! The library: `libmusa.so.1` through the dynamic loader (so `LD_LIBRARY_PATH` applies), then
//! `lib64/` and `lib/` under `$MUSA_HOME` and under `/usr/local/musa`, where Moore Threads'
//! installer puts it, and only then a bare `libmusa.so` through the loader. The soname is what
//! every driver install provides; the unversioned name is a development link, which on a real
//! host sits next to a `libmusa.so.1` already found, so trying it last loses nothing there and
//! keeps a stray `libmusa.so` on the loader path (a build tree's) from shadowing the installed
//! driver.
//!
//! The emulated libmusa of the test suite exports [`EMULATED_MARKER`]; the real one never does,
//! so [`is_emulated`] tells them apart.
//!
//! The functions: MUSA's driver API mirrors CUDA's, including CUDA's versioned exports. Where
//! CUDA's libcuda exports a function under a `_v2` name for the current ABI (what `cuda.h`'s
//! `#define`s select), libmusa does too, and may export only that name: real libmusa 3.1.0 has
//! `muDevicePrimaryCtxRelease_v2` and no plain `muDevicePrimaryCtxRelease`. So each function is
//! looked up by its `_v2` name first where CUDA has one, then by its plain name; a plain name is
//! never required where CUDA has a `_v2`.

use std::path::Path;

use libloading::Library;

/// The MUSA driver API's numbers that libgdrapi and the tools use, in one place. MUSA mirrors
/// CUDA's driver API: error codes, device and pointer attributes carry CUDA's values. MUSA's own
/// headers for the dma-buf ones are not public (docs/musa-abi.md); unverified on hardware. The
/// emulated libmusa's tests compare its values with these.
///
/// cbindgen:ignore
pub mod ids {
    use std::ffi::{c_int, c_uint};

    /// `MUresult`.
    pub type MUresult = c_int;

    pub const MUSA_SUCCESS: MUresult = 0;
    pub const MUSA_ERROR_INVALID_VALUE: MUresult = 1;
    pub const MUSA_ERROR_OUT_OF_MEMORY: MUresult = 2;
    pub const MUSA_ERROR_NOT_INITIALIZED: MUresult = 3;
    pub const MUSA_ERROR_DEINITIALIZED: MUresult = 4;
    pub const MUSA_ERROR_NO_DEVICE: MUresult = 100;
    pub const MUSA_ERROR_INVALID_DEVICE: MUresult = 101;
    pub const MUSA_ERROR_INVALID_CONTEXT: MUresult = 201;
    pub const MUSA_ERROR_OPERATING_SYSTEM: MUresult = 304;
    pub const MUSA_ERROR_INVALID_HANDLE: MUresult = 400;
    pub const MUSA_ERROR_NOT_FOUND: MUresult = 500;
    pub const MUSA_ERROR_CONTEXT_IS_DESTROYED: MUresult = 709;
    pub const MUSA_ERROR_NOT_PERMITTED: MUresult = 800;
    pub const MUSA_ERROR_NOT_SUPPORTED: MUresult = 801;
    pub const MUSA_ERROR_UNKNOWN: MUresult = 999;

    /// `MUdevice_attribute`: CUDA's `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub const MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
    /// `MUmemRangeHandleType`: CUDA's `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
    pub const MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;
    /// `MUpointer_attribute`: CUDA's `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
    pub const MU_POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;
    /// `MUdevice_attribute`: CUDA's `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`
    /// (the MUSA name's value, 110, is what compiled MUSA code passes).
    pub const MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED: c_int = 110;
    /// The VMM API's enums, CUDA's values (`CU_MEM_ALLOCATION_TYPE_PINNED`,
    /// `CU_MEM_LOCATION_TYPE_DEVICE`, `CU_MEM_ALLOC_GRANULARITY_MINIMUM`,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`); MUSA's headers for them are not public.
    pub const MU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
    pub const MU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
    pub const MU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
    pub const MU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
    /// `muMemAllocManaged` flags: accessible from any stream on any device, or from the host.
    pub const MU_MEM_ATTACH_GLOBAL: c_uint = 1;
    pub const MU_MEM_ATTACH_HOST: c_uint = 2;
}

/// Where the MUSA installation is (its `lib64/` and `lib/` are searched).
pub const MUSA_HOME_ENV: &str = "MUSA_HOME";
/// The installation searched besides `$MUSA_HOME`.
pub const DEFAULT_MUSA_HOME: &str = "/usr/local/musa";

/// Driver-API functions whose current ABI CUDA exports as `<name>_v2` (cuda.h maps the plain
/// name to it). Only the names the MUSA mirror of each matters here.
pub const V2_FUNCTIONS: [&str; 21] = [
    "muCtxCreate",
    "muCtxDestroy",
    "muCtxPopCurrent",
    "muCtxPushCurrent",
    "muDevicePrimaryCtxRelease",
    "muDevicePrimaryCtxReset",
    "muDevicePrimaryCtxSetFlags",
    "muDeviceTotalMem",
    "muEventDestroy",
    "muMemAlloc",
    "muMemAllocHost",
    "muMemAllocPitch",
    "muMemFree",
    "muMemGetAddressRange",
    "muMemGetInfo",
    "muMemHostGetDevicePointer",
    "muMemcpyDtoD",
    "muMemcpyDtoH",
    "muMemcpyHtoD",
    "muMemsetD8",
    "muStreamDestroy",
];

/// The exported names `function` is looked up by, in order.
pub fn export_names(function: &str) -> Vec<String> {
    if V2_FUNCTIONS.contains(&function) {
        vec![format!("{function}_v2"), function.to_string()]
    } else {
        vec![function.to_string()]
    }
}

/// The data symbol only the emulated libmusa exports (a NUL-terminated description).
pub const EMULATED_MARKER: &str = "mtgdrcopy_emulated_musa";

/// Whether `lib` is the test suite's emulated libmusa (it exports [`EMULATED_MARKER`]).
pub fn is_emulated(lib: &Library) -> bool {
    let mut symbol = EMULATED_MARKER.as_bytes().to_vec();
    symbol.push(0);
    // SAFETY: only the symbol's presence is asked; its address is never dereferenced.
    unsafe { lib.get::<*const u8>(&symbol) }.is_ok()
}

/// The library paths tried, in order.
pub fn library_candidates() -> Vec<String> {
    let mut names = vec!["libmusa.so.1".to_string()];
    let home = std::env::var_os(MUSA_HOME_ENV).filter(|h| !h.is_empty());
    let homes = home
        .map(|h| h.to_string_lossy().trim_end_matches('/').to_string())
        .into_iter()
        .chain(std::iter::once(DEFAULT_MUSA_HOME.to_string()));
    for home in homes {
        for dir in ["lib64", "lib"] {
            let path = format!("{home}/{dir}/libmusa.so.1");
            if !names.contains(&path) {
                names.push(path);
            }
        }
    }
    names.push("libmusa.so".to_string());
    names
}

/// Why no MUSA driver library could be loaded.
#[derive(Clone, Debug)]
pub struct NotLoaded {
    /// Every path tried.
    pub tried: Vec<String>,
    /// A loader error other than "not found" (wrong architecture, missing dependency), if any:
    /// worth naming, since the file is there.
    pub error: Option<String>,
}

impl std::fmt::Display for NotLoaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tried {}", self.tried.join(", "))?;
        if let Some(e) = &self.error {
            write!(f, " ({e})")?;
        }
        Ok(())
    }
}

/// Loads the first candidate that loads: the library and the name it was found by.
pub fn open_library() -> Result<(Library, String), NotLoaded> {
    let tried = library_candidates();
    let mut error = None;
    for name in &tried {
        // An absolute candidate that does not exist is skipped without asking the loader.
        if name.starts_with('/') && !Path::new(name).exists() {
            continue;
        }
        // SAFETY: libmusa's initialisers have no preconditions a caller must establish.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => {
                let text =
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                if error.is_none() && !text.contains("No such file") {
                    error = Some(text);
                }
            }
        }
    }
    Err(NotLoaded { tried, error })
}

/// The function `function` of `lib` by the `_v2` rule, or `None` if it exports no such name.
///
/// # Safety
/// `T` is the function-pointer type of the musa.h prototype of `function` (a `_v2` export has
/// the signature of the prototype its plain name maps to).
pub unsafe fn function<T: Copy>(lib: &Library, function: &str) -> Option<T> {
    export_names(function).iter().find_map(|name| {
        let mut symbol = name.clone().into_bytes();
        symbol.push(0);
        // SAFETY: guaranteed by the caller: `T` is the symbol's type.
        unsafe { lib.get::<T>(&symbol) }.ok().map(|s| *s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_names_come_first_where_cuda_has_them() {
        assert_eq!(
            export_names("muDevicePrimaryCtxRelease"),
            ["muDevicePrimaryCtxRelease_v2", "muDevicePrimaryCtxRelease"]
        );
        assert_eq!(export_names("muMemAlloc"), ["muMemAlloc_v2", "muMemAlloc"]);
        assert_eq!(export_names("muInit"), ["muInit"]);
        assert_eq!(
            export_names("muMemGetHandleForAddressRange"),
            ["muMemGetHandleForAddressRange"]
        );
    }

    #[test]
    fn the_loader_then_musa_home_then_usr_local_then_the_bare_name() {
        let names = library_candidates();
        assert_eq!(names[0], "libmusa.so.1");
        assert!(names.ends_with(&[
            "/usr/local/musa/lib64/libmusa.so.1".to_string(),
            "/usr/local/musa/lib/libmusa.so.1".to_string(),
            "libmusa.so".to_string()
        ]));
        assert_eq!(names.iter().filter(|n| *n == "libmusa.so").count(), 1);
    }

    #[test]
    fn a_library_without_the_marker_is_not_emulated() {
        // SAFETY: libc is already loaded in this process; loading it again runs nothing.
        let libc = unsafe { Library::new("libc.so.6") }.expect("libc.so.6");
        assert!(!is_emulated(&libc));
    }
}
