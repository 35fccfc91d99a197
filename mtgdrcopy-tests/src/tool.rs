//! What every mtgdrcopy tool shares: the exit statuses, the one error printer, `--version`, and
//! the hint after a failed `gdr_open`, which depends on the backend that was tried.
//!
//! The exit statuses are those of automake's test harness, so that CI scripts and container
//! health checks can tell "this machine cannot run the tool" from "the tool found a fault":
//! 0 passed, 1 a test or copy failed, 2 usage error, 77 the environment lacks something (no
//! libgdrapi, no libmusa or GPU, no usable backend).

use std::process::ExitCode;

use anyhow::Result;

use crate::gdr::Gdr;
pub use crate::status::{status_of, unavailable, usage, Status};
use crate::term::Term;

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

/// A tool's `main` after parsing: `--version`, else `run`, ended by [`finish`].
pub fn main(
    program: &str,
    version: &VersionFlag,
    run: impl FnOnce(Term) -> Result<Status>,
) -> ExitCode {
    if version.version {
        print!("{}", versions(program));
        return ExitCode::SUCCESS;
    }
    let term = Term::detect();
    finish(program, &term, run(term))
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
            let (major, minor) = crate::gdr::runtime_version(api);
            let path = crate::gdr::library_path().unwrap_or_else(|| "path unknown".into());
            out += &line("libgdrapi", format!("{major}.{minor} ({path})"));
            out += &line("driver", backend_description());
        }
        Err(e) => {
            out += &line("libgdrapi", format!("not loaded: {e:#}"));
            out += &line("driver", "unknown (libgdrapi not loaded)".into());
        }
    }
    let musa = match (
        crate::musa::driver_version(),
        crate::musa::library_path(),
        crate::musa::is_emulated(),
    ) {
        (Ok(v), Ok(path), Ok(true)) => format!("{v} (emulated, {path})"),
        (Ok(v), Ok(path), Ok(false)) => format!("{v} ({path})"),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => format!("not loaded: {e:#}"),
    };
    out += &line("MUSA driver", musa);
    out
}

/// The backend a `gdr_open` gets: "mtgdrdrv X.Y", "dma-buf backend", or why none.
fn backend_description() -> String {
    let gdr = match Gdr::open() {
        Ok(gdr) => gdr,
        Err(e) => return format!("none: {e:#}"),
    };
    if gdr.using_dmabuf() {
        return "dma-buf backend (no kernel module in use)".into();
    }
    match gdr.driver_version() {
        Ok((major, minor)) => format!("mtgdrdrv {major}.{minor} ({})", gdrapi::DEVICE_PATH),
        Err(e) => format!("mtgdrdrv, version unknown: {e:#}"),
    }
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
