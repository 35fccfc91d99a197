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
