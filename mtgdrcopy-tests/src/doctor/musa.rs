//! `libmusa` (found, where, which version, and whether it is the test suite's emulated one) and
//! `dma-buf` (whether libgdrapi's dma-buf backend would work: libmusa exports
//! `muMemGetHandleForAddressRange` and the GPUs report `DMA_BUF_SUPPORTED`).
//!
//! The library is found by the tools' and libgdrapi's one rule (`gdrapi::musa`) and only
//! initialised (`muInit`) when mtgpu is live, and, for the emulated one, when the test suite
//! allows it: the doctor must not be the program that crashes on a disabled driver.

use std::ffi::{c_char, c_int, c_uint};

use gdrapi::musa::ids::{MUresult, MUSA_SUCCESS, MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED};

use super::report::Line;
use crate::musa::{emulated_allowed, file_of, ALLOW_EMULATED_ENV, MUSA_HOME_ENV};

/// One device as libmusa reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub ordinal: i32,
    pub name: String,
    pub pci: Option<String>,
    /// `MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, if the library has `muDeviceGetAttribute`.
    pub dmabuf: Option<i32>,
}

/// The library found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its file, or what it was not found by.
    pub path: Result<String, String>,
    pub emulated: bool,
    pub version: Option<i32>,
    pub exports_dmabuf: bool,
    /// The devices, when the library was initialised; why not otherwise.
    pub devices: Result<Vec<Device>, String>,
}

impl Found {
    pub fn file(&self) -> &str {
        match &self.path {
            Ok(p) | Err(p) => p,
        }
    }
}

/// The export `name` of `lib` by the `_v2` rule, as the type `t`.
macro_rules! lookup {
    ($lib:expr, $t:ty, $name:literal) => {
        // SAFETY: `$t` is the musa.h prototype of `$name` (the types above), or a data pointer
        // that is only compared with null.
        unsafe { gdrapi::musa::function::<$t>($lib, $name) }
    };
}

type MuInit = unsafe extern "C" fn(c_uint) -> MUresult;
type MuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> MUresult;
type MuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> MUresult;
type MuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> MUresult;
type MuDeviceGetString = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> MUresult;
type MuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> MUresult;

/// Finds libmusa; `Err` says what was tried. Initialises it only if `may_init`.
pub fn probe(mtgpu_live: bool) -> Option<Found> {
    let (lib, name) = gdrapi::musa::open_library().ok()?;
    let path = file_of(&lib, "muInit").ok_or(name);
    let emulated = gdrapi::musa::is_emulated(&lib);
    let version = lookup!(&lib, MuDriverGetVersion, "muDriverGetVersion").and_then(|f| {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out pointer; muDriverGetVersion needs no muInit.
        (unsafe { f(&mut v) } == MUSA_SUCCESS).then_some(v)
    });
    // Only looked up, never called: a data-pointer type is enough.
    let exports_dmabuf = lookup!(&lib, *const (), "muMemGetHandleForAddressRange").is_some();
    let devices = if !mtgpu_live {
        Err("mtgpu is not live, so libmusa was not initialised".to_string())
    } else if emulated && !emulated_allowed() {
        Err(format!(
            "the emulated libmusa is not used without {ALLOW_EMULATED_ENV}=1"
        ))
    } else {
        devices(&lib)
    };
    // The library stays loaded: the process ends soon after, and libmusa's own threads (on a
    // real driver) must not lose their code under them.
    std::mem::forget(lib);
    Some(Found {
        path,
        emulated,
        version,
        exports_dmabuf,
        devices,
    })
}

fn devices(lib: &libloading::Library) -> Result<Vec<Device>, String> {
    let init = lookup!(lib, MuInit, "muInit");
    let count = lookup!(lib, MuDeviceGetCount, "muDeviceGetCount");
    let get = lookup!(lib, MuDeviceGet, "muDeviceGet");
    let name = lookup!(lib, MuDeviceGetString, "muDeviceGetName");
    let pci = lookup!(lib, MuDeviceGetString, "muDeviceGetPCIBusId");
    let attr = lookup!(lib, MuDeviceGetAttribute, "muDeviceGetAttribute");
    let (Some(init), Some(count), Some(get), Some(name)) = (init, count, get, name) else {
        return Err(
            "libmusa lacks muInit, muDeviceGetCount, muDeviceGet or muDeviceGetName".into(),
        );
    };
    // SAFETY: flags by value, 0 the only defined value.
    let rc = unsafe { init(0) };
    if rc != MUSA_SUCCESS {
        return Err(format!("muInit failed with MUSA error {rc}"));
    }
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer.
    if unsafe { count(&mut n) } != MUSA_SUCCESS {
        return Err("muDeviceGetCount failed".into());
    }
    let string = |f: MuDeviceGetString, dev: c_int| -> Option<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for the length passed; the driver NUL-terminates.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        (rc == MUSA_SUCCESS).then(|| crate::musa::c_buf_to_string(&buf))
    };
    let mut found = Vec::new();
    for ordinal in 0..n {
        let mut dev: c_int = 0;
        // SAFETY: `dev` is a valid out pointer.
        if unsafe { get(&mut dev, ordinal) } != MUSA_SUCCESS {
            continue;
        }
        let dmabuf = attr.and_then(|f| {
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out pointer.
            let rc = unsafe { f(&mut v, MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) };
            (rc == MUSA_SUCCESS).then_some(v)
        });
        found.push(Device {
            ordinal,
            name: string(name, dev).unwrap_or_else(|| "unnamed".into()),
            pci: pci
                .and_then(|f| string(f, dev))
                .map(|p| p.to_ascii_lowercase()),
            dmabuf,
        });
    }
    Ok(found)
}

pub fn library_line(found: Option<&Found>) -> Line {
    let Some(found) = found else {
        let tried = gdrapi::musa::library_candidates().join(", ");
        return Line::fail(
            "libmusa",
            format!("not found (tried {tried})"),
            format!(
                "install Moore Threads' MUSA driver (it ships libmusa.so.1), or set \
                 {MUSA_HOME_ENV} to its installation"
            ),
        );
    };
    let version = found
        .version
        .map_or_else(|| "version unknown".to_string(), |v| format!("version {v}"));
    let file = found.file();
    if found.emulated {
        let dir = std::path::Path::new(file)
            .parent()
            .map_or_else(|| file.to_string(), |d| d.display().to_string());
        return Line::warn(
            "libmusa",
            format!("{file} ({version}) is the mtgdrcopy test suite's emulated libmusa, not Moore Threads' driver"),
            format!(
                "remove {dir} from LD_LIBRARY_PATH and install Moore Threads' MUSA driver; the \
                 tools refuse the emulated one unless {ALLOW_EMULATED_ENV}=1 (only the test suite sets it)"
            ),
        );
    }
    Line::ok("libmusa", format!("{file} ({version})"))
}

pub fn dmabuf_line(found: Option<&Found>, gpus: &[super::gpus::Gpu], module_usable: bool) -> Line {
    let why_not = match found {
        None => Some("no libmusa".to_string()),
        Some(f) if !f.exports_dmabuf => Some(format!(
            "{} does not export muMemGetHandleForAddressRange (a MUSA driver too old for it)",
            f.file()
        )),
        Some(f) => match &f.devices {
            Err(e) => Some(format!("not judged: {e}")),
            Ok(devices) => {
                let refusing: Vec<String> = gpus
                    .iter()
                    .filter(|g| {
                        devices
                            .iter()
                            .any(|d| d.ordinal == g.ordinal && d.dmabuf.unwrap_or(0) == 0)
                    })
                    .map(|g| format!("GPU {}", g.ordinal))
                    .collect();
                (!refusing.is_empty()).then(|| {
                    format!(
                        "{} report{} no DMA_BUF_SUPPORTED",
                        refusing.join(", "),
                        if refusing.len() == 1 { "s" } else { "" }
                    )
                })
            }
        },
    };
    match why_not {
        None => Line::ok(
            "dma-buf",
            "would work: libmusa exports muMemGetHandleForAddressRange and the GPUs support dma-buf",
        ),
        Some(why) if module_usable => Line::ok(
            "dma-buf",
            format!("would not work ({why}); not needed while mtgdrdrv is usable"),
        ),
        Some(why) => Line::warn(
            "dma-buf",
            format!("would not work either ({why})"),
            "make mtgdrdrv usable (above), or install a MUSA driver whose libmusa exports \
             muMemGetHandleForAddressRange",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::gpus::Gpu;
    use crate::doctor::Level;

    fn found(emulated: bool, exports: bool, dmabuf: i32) -> Found {
        Found {
            path: Ok("/usr/lib/mtgdrcopy/emu/libmusa.so.1".into()),
            emulated,
            version: Some(30000),
            exports_dmabuf: exports,
            devices: Ok(vec![Device {
                ordinal: 0,
                name: "MTT S4000".into(),
                pci: Some("0000:00:04.0".into()),
                dmabuf: Some(dmabuf),
            }]),
        }
    }

    fn gpu0() -> Vec<Gpu> {
        vec![Gpu {
            ordinal: 0,
            name: "MTT S4000".into(),
            pci: Some("0000:00:04.0".into()),
            numa: None,
            bar: None,
        }]
    }

    #[test]
    fn the_emulated_library_is_a_warning_naming_its_directory() {
        let line = library_line(Some(&found(true, true, 1)));
        assert_eq!(line.level, Level::Warn);
        assert!(line.to_string().starts_with(
            "WARN  libmusa: /usr/lib/mtgdrcopy/emu/libmusa.so.1 (version 30000) is the mtgdrcopy test suite's emulated libmusa"
        ), "{line}");
        assert!(
            line.fix
                .starts_with("remove /usr/lib/mtgdrcopy/emu from LD_LIBRARY_PATH"),
            "{line}"
        );
        let real = library_line(Some(&found(false, true, 1)));
        assert_eq!(
            real.to_string(),
            "OK    libmusa: /usr/lib/mtgdrcopy/emu/libmusa.so.1 (version 30000)"
        );
        assert_eq!(library_line(None).level, Level::Fail);
    }

    #[test]
    fn dma_buf_needs_the_export_and_the_attribute() {
        let ok = dmabuf_line(Some(&found(false, true, 1)), &gpu0(), false);
        assert_eq!(ok.level, Level::Ok, "{ok}");
        assert!(ok.finding.starts_with("would work"), "{ok}");
        let no_attr = dmabuf_line(Some(&found(false, true, 0)), &gpu0(), false);
        assert_eq!(no_attr.level, Level::Warn, "{no_attr}");
        assert!(
            no_attr
                .finding
                .contains("GPU 0 reports no DMA_BUF_SUPPORTED"),
            "{no_attr}"
        );
        let old = dmabuf_line(Some(&found(false, false, 1)), &gpu0(), true);
        assert_eq!(old.level, Level::Ok, "{old}");
        assert!(
            old.finding.contains("not needed while mtgdrdrv is usable"),
            "{old}"
        );
        assert_eq!(dmabuf_line(None, &gpu0(), false).level, Level::Warn);
    }
}
