//! The gdrapi C API, loaded at run time from `libgdrapi.so.1` exactly as consumers such as
//! UCX load it, so the programs test the installed shared library (and its package dependency
//! is real). `GDRCOPY_LIBRARY` names another file to load.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
pub use gdrapi::capi::{gdr_info_v1, gdr_info_v2, gdr_mh_t, gdr_t};
use libloading::Library;
use nix::errno::Errno;

/// Environment variable naming the library file to load instead of `libgdrapi.so.1`.
pub const LIBRARY_ENV: &str = "GDRCOPY_LIBRARY";
const DEFAULT_LIBRARY: &str = "libgdrapi.so.1";

/// Every entry point of gdrapi.h, resolved once.
pub struct Api {
    _lib: Library,
    pub open: unsafe extern "C" fn() -> gdr_t,
    pub close: unsafe extern "C" fn(gdr_t) -> c_int,
    pub pin_buffer: unsafe extern "C" fn(gdr_t, c_ulong, usize, u64, u32, *mut gdr_mh_t) -> c_int,
    pub pin_buffer_v2: unsafe extern "C" fn(gdr_t, c_ulong, usize, u32, *mut gdr_mh_t) -> c_int,
    pub unpin_buffer: unsafe extern "C" fn(gdr_t, gdr_mh_t) -> c_int,
    pub get_callback_flag: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut c_int) -> c_int,
    pub get_info_v1: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut gdr_info_v1) -> c_int,
    pub get_info_v2: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut gdr_info_v2) -> c_int,
    pub map: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut *mut c_void, usize) -> c_int,
    pub map_v2: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut *mut c_void, usize, c_int) -> c_int,
    pub unmap: unsafe extern "C" fn(gdr_t, gdr_mh_t, *mut c_void, usize) -> c_int,
    pub copy_to_mapping: unsafe extern "C" fn(gdr_mh_t, *mut c_void, *const c_void, usize) -> c_int,
    pub copy_from_mapping:
        unsafe extern "C" fn(gdr_mh_t, *mut c_void, *const c_void, usize) -> c_int,
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int, *mut c_int),
    pub driver_get_version: unsafe extern "C" fn(gdr_t, *mut c_int, *mut c_int) -> c_int,
    pub get_attribute: unsafe extern "C" fn(gdr_t, c_int, *mut c_int) -> c_int,
    pub get_mapping_type_string: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int,
}

/// The library, loaded on first use; an error is marked unavailable (the tools exit with 77).
pub fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| crate::status::unavailable(anyhow!("{e}")))
}

/// The file the loaded libgdrapi came from, as the dynamic loader names it.
pub fn library_path() -> Option<String> {
    let api = api().ok()?;
    // SAFETY: Dl_info is plain data; all-zero is a valid value for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is a function of the loaded library and `info` a valid out pointer.
    if unsafe { libc::dladdr(api.open as *const c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr sets dli_fname to a NUL-terminated string owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn load() -> Result<Api> {
    let name = std::env::var(LIBRARY_ENV).unwrap_or_else(|_| DEFAULT_LIBRARY.into());
    // SAFETY: loading libgdrapi runs no initialisers with preconditions (it has none).
    let lib = unsafe { Library::new(&name) }.with_context(|| {
        format!("cannot load {name}: install the libgdrapi package or set LD_LIBRARY_PATH")
    })?;
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is declared in gdrapi.h with exactly the type of the field it
            // is stored in; the Library is kept alive in the same struct.
            let s = unsafe { lib.get($name) }.with_context(|| {
                format!(
                    "{name} lacks {}",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?;
            *s
        }};
    }
    Ok(Api {
        open: sym!(b"gdr_open\0"),
        close: sym!(b"gdr_close\0"),
        pin_buffer: sym!(b"gdr_pin_buffer\0"),
        pin_buffer_v2: sym!(b"gdr_pin_buffer_v2\0"),
        unpin_buffer: sym!(b"gdr_unpin_buffer\0"),
        get_callback_flag: sym!(b"gdr_get_callback_flag\0"),
        get_info_v1: sym!(b"gdr_get_info\0"),
        get_info_v2: sym!(b"gdr_get_info_v2\0"),
        map: sym!(b"gdr_map\0"),
        map_v2: sym!(b"gdr_map_v2\0"),
        unmap: sym!(b"gdr_unmap\0"),
        copy_to_mapping: sym!(b"gdr_copy_to_mapping\0"),
        copy_from_mapping: sym!(b"gdr_copy_from_mapping\0"),
        runtime_get_version: sym!(b"gdr_runtime_get_version\0"),
        driver_get_version: sym!(b"gdr_driver_get_version\0"),
        get_attribute: sym!(b"gdr_get_attribute\0"),
        get_mapping_type_string: sym!(b"gdr_get_mapping_type_string\0"),
        _lib: lib,
    })
}

/// A gdrapi return code as a `Result`.
pub fn check(rc: c_int) -> std::result::Result<(), Errno> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw(rc))
    }
}

/// `gdr_get_mapping_type_string`, or `"?"` for an unknown type.
pub fn mapping_type_name(api: &Api, mapping_type: c_int) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: `s` is a valid out pointer; on success it points to a static C string.
    if unsafe { (api.get_mapping_type_string)(mapping_type, &mut s) } == 0 && !s.is_null() {
        // SAFETY: the library returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    } else {
        "?".into()
    }
}

/// The loaded library's version (`gdr_runtime_get_version`), which needs no open `gdr_t`.
pub fn runtime_version(api: &Api) -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out pointers.
    unsafe { (api.runtime_get_version)(&mut major, &mut minor) };
    (major, minor)
}

/// An open `gdr_t`, closed on drop.
pub struct Gdr {
    pub(crate) api: &'static Api,
    pub(crate) g: gdr_t,
}

impl Gdr {
    pub fn open() -> Result<Gdr> {
        let api = api()?;
        // SAFETY: gdr_open takes no arguments; a NULL return is handled.
        let g = unsafe { (api.open)() };
        if g.is_null() {
            return Err(open_failure(std::io::Error::last_os_error()));
        }
        Ok(Gdr { api, g })
    }

    /// Whether the dma-buf backend is in use (`GDR_ATTR_USING_DMA_BUF_MMAP`).
    pub fn using_dmabuf(&self) -> bool {
        let mut v: c_int = 0;
        let attr = gdrapi::Attribute::UsingDmaBufMmap as c_int;
        // SAFETY: `g` is open and `v` a valid out pointer.
        let rc = unsafe { (self.api.get_attribute)(self.g, attr, &mut v) };
        rc == 0 && v != 0
    }

    pub fn api(&self) -> &'static Api {
        self.api
    }

    /// The loaded library's version (`gdr_runtime_get_version`).
    pub fn runtime_version(&self) -> (i32, i32) {
        runtime_version(self.api)
    }

    /// The kernel module's version (`gdr_driver_get_version`).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `g` is open; both are valid out pointers.
        let rc = unsafe { (self.api.driver_get_version)(self.g, &mut major, &mut minor) };
        check(rc).context("gdr_driver_get_version")?;
        Ok((major, minor))
    }
}

impl Drop for Gdr {
    fn drop(&mut self) {
        // SAFETY: `g` is open and is not used again; every Pin borrowed it and is gone.
        unsafe { (self.api.close)(self.g) };
    }
}

/// Whether `GDRCOPY_USE_DMABUF_MMAP=1` forces the dma-buf backend (libgdrapi's exact rule).
fn dmabuf_forced() -> bool {
    std::env::var_os(gdrapi::USE_DMABUF_ENV).is_some_and(|v| v == "1")
}

/// Why the module backend is not usable by this process, if it is not.
fn module_problem() -> Option<std::io::Error> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(gdrapi::DEVICE_PATH)
        .err()
}

/// The error for a failed `gdr_open` (`errno` is its errno), marked unavailable, with a hint
/// that fits the backend libgdrapi tried.
pub fn open_failure(errno: std::io::Error) -> anyhow::Error {
    let device = gdrapi::DEVICE_PATH;
    let env = gdrapi::USE_DMABUF_ENV;
    let why = "GDRCOPY_ENABLE_LOGGING=1 says why";
    let hint = if dmabuf_forced() {
        format!(
            "the dma-buf backend was forced ({env}=1): it needs the MUSA driver's libmusa.so.1 \
             and a driver that lets the CPU map exported device memory; unset {env} to use \
             mtgdrdrv; {why}"
        )
    } else {
        match module_problem() {
            Some(e) if e.kind() == std::io::ErrorKind::NotFound => format!(
                "mtgdrdrv is not loaded ({device} does not exist) and the dma-buf backend did \
                 not work either: load the module (sudo modprobe mtgdrdrv, or sudo ./insmod.sh \
                 in a source tree); {why}"
            ),
            Some(e) if e.kind() == std::io::ErrorKind::PermissionDenied => format!(
                "{device} exists but this user may not open it, and the dma-buf backend did not \
                 work either: join its group (ls -l {device}; sudo usermod -aG render $(id -un), \
                 then log in again); {why}"
            ),
            Some(e) => format!("{device}: {e}; {why}"),
            None => why.to_string(),
        }
    };
    crate::status::unavailable(anyhow::anyhow!("gdr_open failed: {errno} ({hint})"))
}

/// The warning for a process that got the dma-buf backend only because it may not open
/// `/dev/mtgdrdrv`: otherwise the slower fallback would go unnoticed.
pub fn fallback_warning(using_dmabuf: bool) -> Option<String> {
    if !using_dmabuf || dmabuf_forced() || !Path::new(gdrapi::DEVICE_PATH).exists() {
        return None;
    }
    let e = module_problem()?;
    Some(format!(
        "{}: {e}: using the dma-buf backend instead of mtgdrdrv (join the device's group to \
         use the module: sudo usermod -aG render $(id -un))",
        gdrapi::DEVICE_PATH
    ))
}
