//! What every mtgdrcopy tool shares: the exit statuses, the one error printer, `--version`, and
//! the hint after a failed `gdr_open`, which depends on the backend that was tried.
//!
//! The exit statuses are those of automake's test harness, so that CI scripts and container
//! health checks can tell "this machine cannot run the tool" from "the tool found a fault":
//! 0 passed, 1 a test or copy failed, 2 usage error, 77 the environment lacks something (no
//! libgdrapi, no libmusa or GPU, no usable backend).

use std::ffi::c_int;
use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;

use crate::bench::Term;

/// How a tool ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Everything ran and passed.
    Passed = 0,
    /// A test, a copy or a check of the data failed.
    Failed = 1,
    /// The command line is wrong (clap exits with 2 for its own errors too).
    Usage = 2,
    /// The machine lacks what the tool needs: libgdrapi, the MUSA driver or a GPU, mtgdrdrv or
    /// a working dma-buf backend.
    Unavailable = 77,
}

impl Status {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Status> for ExitCode {
    fn from(s: Status) -> ExitCode {
        ExitCode::from(s.code())
    }
}

/// An error meaning the environment lacks something (exit status 77).
#[derive(Debug)]
struct Unavailable(anyhow::Error);

/// An error in what the user asked for, found after parsing (exit status 2).
#[derive(Debug)]
struct Usage(String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}
impl std::error::Error for Usage {}

/// Marks `e` as "the environment lacks something": the tool exits with 77.
pub fn unavailable(e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Unavailable(e.into()))
}

/// A usage error found after parsing (a value out of range for another value): exit status 2.
pub fn usage(msg: impl fmt::Display) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.to_string()))
}

/// The exit status an error stands for (contexts added on top do not change it).
pub fn status_of(e: &anyhow::Error) -> Status {
    if e.downcast_ref::<Unavailable>().is_some() {
        Status::Unavailable
    } else if e.downcast_ref::<Usage>().is_some() {
        Status::Usage
    } else {
        Status::Failed
    }
}

/// Ends a tool: prints a failure as `program: message` on standard error (the whole context
/// chain on one line, after a usage error the pointer to `--help`) and returns its status.
pub fn finish(program: &str, term: &Term, outcome: Result<Status>) -> ExitCode {
    match outcome {
        Ok(status) => status.into(),
        Err(e) => {
            let status = status_of(&e);
            term.error(program, &e);
            if status == Status::Usage {
                eprintln!("\nFor more information, try '--help'.");
            }
            status.into()
        }
    }
}

/// The `-V`/`--version` flag every tool has: it prints more than clap's own would.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct VersionFlag {
    /// Print the versions a bug report needs: this tool's, libgdrapi's (the library loaded at
    /// run time), the kernel module's (or that the dma-buf backend is in use) and the MUSA
    /// driver's; then exit.
    #[arg(short = 'V', long = "version")]
    pub version: bool,
}

/// What `--version` prints, one `name: value` line each after the tool's own; a part that
/// cannot be found says why instead, and the exit status stays 0.
pub fn versions(program: &str) -> String {
    let mut out = format!("{program} {}\n", env!("CARGO_PKG_VERSION"));
    let line = |name: &str, value: String| format!("{:<12} {value}\n", format!("{name}:"));
    match crate::gdr::api() {
        Ok(api) => {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: both are valid out pointers.
            unsafe { (api.runtime_get_version)(&mut major, &mut minor) };
            let path = crate::gdr::library_path().unwrap_or_else(|| "path unknown".into());
            out += &line("libgdrapi", format!("{major}.{minor} ({path})"));
            out += &line("driver", backend_description(api));
        }
        Err(e) => {
            out += &line("libgdrapi", format!("not loaded: {e:#}"));
            out += &line("driver", "unknown (libgdrapi not loaded)".into());
        }
    }
    let musa = match (crate::musa::driver_version(), crate::musa::library_path()) {
        (Ok(v), Ok(path)) => format!("{v} ({path})"),
        (Err(e), _) | (_, Err(e)) => format!("not loaded: {e:#}"),
    };
    out += &line("MUSA driver", musa);
    out
}

/// The backend a `gdr_open` gets: "mtgdrdrv X.Y", "dma-buf backend", or why none.
fn backend_description(api: &crate::gdr::Api) -> String {
    // SAFETY: gdr_open takes no arguments; a NULL return is handled.
    let g = unsafe { (api.open)() };
    if g.is_null() {
        return format!("none: {:#}", open_failure(std::io::Error::last_os_error()));
    }
    let mut dmabuf: c_int = 0;
    // SAFETY: `g` is open and `dmabuf` a valid out pointer.
    let rc =
        unsafe { (api.get_attribute)(g, gdrapi::Attribute::UsingDmaBufMmap as c_int, &mut dmabuf) };
    let text = if rc == 0 && dmabuf != 0 {
        "dma-buf backend (no kernel module in use)".to_string()
    } else {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `g` is open; both are valid out pointers.
        match unsafe { (api.driver_get_version)(g, &mut major, &mut minor) } {
            0 => format!("mtgdrdrv {major}.{minor} ({})", gdrapi::DEVICE_PATH),
            rc => format!(
                "mtgdrdrv, version unknown: {}",
                nix::errno::Errno::from_raw(rc)
            ),
        }
    };
    // SAFETY: `g` is open and not used again.
    unsafe { (api.close)(g) };
    text
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
                 work either: join its group (ls -l {device}; sudo usermod -aG render USER, \
                 then log in again); {why}"
            ),
            Some(e) => format!("{device}: {e}; {why}"),
            None => why.to_string(),
        }
    };
    unavailable(anyhow::anyhow!("gdr_open failed: {errno} ({hint})"))
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
         use the module: sudo usermod -aG render USER)",
        gdrapi::DEVICE_PATH
    ))
}

/// The project's home, whose README the manual pages point to (the workspace's `repository`,
/// which `cargo xtask codegen` takes from debian/control).
pub const HOMEPAGE: &str = env!("CARGO_PKG_REPOSITORY");

/// What the manual pages' EXIT STATUS section says (status, meaning).
pub const EXIT_STATUSES: &[(u8, &str)] = &[
    (0, "Everything ran and passed (for mtgdrcopy_sanity: no case failed; skipped cases do not count)."),
    (1, "A test, a copy or a check of the data failed."),
    (2, "The command line is wrong."),
    (
        77,
        "The machine lacks what the tool needs: libgdrapi, the MUSA driver library or a GPU, \
         or a usable backend (mtgdrdrv not loaded or not accessible, and the dma-buf backend \
         not working). The message says which.",
    ),
];

/// What the manual pages' ENVIRONMENT section says (variable, meaning).
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        gdrapi::log::ENABLE_ENV,
        "1: libgdrapi logs errors to standard error (why gdr_open or a pin failed).",
    ),
    (
        gdrapi::log::LEVEL_ENV,
        "1: libgdrapi logs everything, with GDRCOPY_ENABLE_LOGGING=1.",
    ),
    (
        gdrapi::USE_DMABUF_ENV,
        "1 (exactly): libgdrapi uses the dma-buf backend even when /dev/mtgdrdrv can be opened.",
    ),
    (
        gdrapi::copy::VARIANT_ENV,
        "The copy routines libgdrapi uses (e.g. avx2, sse4.1, generic) instead of the ones it \
         picks for the CPU; an unknown or unsupported name is ignored with a logged reason.",
    ),
    (
        crate::gdr::LIBRARY_ENV,
        "The libgdrapi file to load instead of libgdrapi.so.1.",
    ),
    (
        gdrapi::musa::MUSA_HOME_ENV,
        "Where the MUSA driver is installed: $MUSA_HOME/lib64 and $MUSA_HOME/lib are searched \
         for libmusa.so.1 after the dynamic loader's path.",
    ),
    (
        "NO_COLOR",
        "Set and not empty: no colour in warnings and errors (colour is used only on a terminal).",
    ),
];

/// What the manual pages' FILES section says (path, meaning).
pub const FILES: &[(&str, &str)] = &[
    (
        gdrapi::DEVICE_PATH,
        "The mtgdrdrv kernel module's device: group render, mode 0660 by the package's udev rule.",
    ),
    (
        mtgdrdrv::procfs::PARAMS_PATH,
        "The module's parameters and version.",
    ),
    (
        mtgdrdrv::procfs::COUNTERS_PATH,
        "The module's pins and mappings outstanding, and its totals.",
    ),
    (
        "libgdrapi.so.1",
        "The GDRCopy library, loaded at run time through the dynamic loader's path.",
    ),
    (
        "libmusa.so.1",
        "The MUSA driver library: the loader's path, then $MUSA_HOME/lib64, $MUSA_HOME/lib, \
         /usr/local/musa/lib64 and /usr/local/musa/lib.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn statuses_survive_added_context() {
        let e = unavailable(anyhow::anyhow!("no libmusa"));
        assert_eq!(status_of(&e), Status::Unavailable);
        let e = Err::<(), _>(e).context("opening GPU 0").unwrap_err();
        assert_eq!(status_of(&e), Status::Unavailable);
        assert_eq!(format!("{e:#}"), "opening GPU 0: no libmusa");
        let e = Err::<(), _>(usage("-o must be a multiple of 4"))
            .context("plan")
            .unwrap_err();
        assert_eq!(status_of(&e), Status::Usage);
        assert_eq!(status_of(&anyhow::anyhow!("data differs")), Status::Failed);
    }

    #[test]
    fn exit_codes_are_the_documented_ones() {
        let codes: Vec<u8> = [
            Status::Passed,
            Status::Failed,
            Status::Usage,
            Status::Unavailable,
        ]
        .iter()
        .map(|s| s.code())
        .collect();
        assert_eq!(codes, [0, 1, 2, 77]);
    }
}
