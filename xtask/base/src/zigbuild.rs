//! The glibc floor of the released binaries: libgdrapi.so.1 and the mtgdrcopy_* programs that the
//! .debs ship need at most [`GLIBC_FLOOR`] (2.28: UOS 20 and Kylin V10, and so also Debian 11,
//! Ubuntu 20.04 and everything newer), whatever glibc the machine that builds them has.
//!
//! How: the packaged build (build.rs) links with zig through cargo-zigbuild, for the target
//! `<triple>.2.28`: zig carries the symbol tables of every glibc release and links against
//! 2.28's, so a symbol that glibc versioned later (e.g. `__libc_start_main@GLIBC_2.34`) is
//! taken at the version 2.28 has, and one that 2.28 lacks fails the link. The same tool serves
//! amd64 (the host's rustc) and arm64 (Debian's rustc and arm64 standard library in the cross
//! chroot, cross.rs, with zig as the linker there too). Rust's standard library reaches newer
//! glibc functions only through weak references, so it links against 2.28.
//!
//! Why not the alternatives: an older Debian root would need buster for 2.28, which this
//! machine's archive no longer serves (bullseye is 2.31, above the floor), and a Rust standard
//! library for arm64 that fits the root's rustc, which only the sid cross chroot has here; an
//! older glibc sysroot would be a tarball fetched from outside any package registry, with gcc
//! and ld flags of its own per architecture.
//!
//! What changes with zig: zig's libunwind is linked in statically instead of `libgcc_s.so.1`
//! (zig has no libgcc_s), so the packages no longer depend on libgcc-s1; the build-id note that
//! Debian's gcc asks ld for by default is asked for explicitly (dh_strip names the -dbgsym files
//! by it). The copy routines are Rust compiled by the same rustc with the same flags, so the
//! code the copy-count step measures (`target/release`, linked by the system's cc) is the code
//! the packages ship; only the linker differs. Reproducibility holds as before: zig and
//! cargo-zigbuild are pinned here, and zig's own objects (libunwind, the glibc stubs) are built
//! from the pinned zig's sources. Their debug information names those sources under the tool's
//! directory in `cache_dir()`, so the -dbgsym packages are the same bytes only where that
//! directory is the same (the packages themselves hold no debug information).
//!
//! Both tools come from PyPI, installed on first use into a venv under `cache_dir()/tools/`
//! (the way actionlint is, workflows.rs): `cargo-zigbuild`'s wheel carries its static binary,
//! `ziglang`'s a static zig with its library sources.

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::{files, host, paths};

/// The newest glibc symbol version a shipped ELF file may need.
pub const GLIBC_FLOOR: (u32, u32) = (2, 28);

const CARGO_ZIGBUILD: &str = "cargo-zigbuild==0.24.1";
const ZIGLANG: &str = "ziglang==0.17.1";

/// The installed tools.
#[derive(Clone, Debug)]
pub struct Zig {
    /// The tools' venv (bind-mounted into the cross chroot at the same path).
    pub dir: PathBuf,
    /// The `cargo-zigbuild` binary (static).
    pub cargo_zigbuild: PathBuf,
    /// The `zig` binary (static), for `CARGO_ZIGBUILD_ZIG_PATH`: no Python is needed to find it,
    /// also in the cross chroot.
    pub zig: PathBuf,
}

impl Zig {
    /// `target` with the glibc floor, as cargo-zigbuild takes it: `x86_64-unknown-linux-gnu.2.28`.
    pub fn target(triple: &str) -> String {
        let (major, minor) = GLIBC_FLOOR;
        format!("{triple}.{major}.{minor}")
    }
}

/// The tools, installed on first use.
pub fn tools(sh: &Shell) -> Result<Zig> {
    let name = format!("{CARGO_ZIGBUILD}-{ZIGLANG}").replace("==", "-");
    let dir = paths::cache_dir().join("tools").join(name);
    let zig = Zig {
        cargo_zigbuild: dir.join("bin/cargo-zigbuild"),
        zig: dir.join(format!(
            "lib/python{}/site-packages/ziglang/zig",
            python_version(sh)?
        )),
        dir,
    };
    // Written last: a venv without it is a broken install, redone.
    let done = zig.dir.join(".complete");
    if done.exists() && zig.cargo_zigbuild.exists() && zig.zig.exists() {
        return Ok(zig);
    }
    host::ensure_host_packages(&["python3-venv"])?;
    let _lock = files::lock_file(
        &paths::cache_dir().join("tools/zig.lock"),
        "installing zig and cargo-zigbuild",
    )?;
    // In place: a venv's scripts name their interpreter by its path.
    files::fresh_dir(&zig.dir)?;
    let dir = &zig.dir;
    cmd!(sh, "python3 -m venv {dir}")
        .quiet()
        .run()
        .context("creating a Python venv for zig and cargo-zigbuild (python3-venv)")?;
    let pip = dir.join("bin/pip");
    eprintln!(
        "xtask: installing {CARGO_ZIGBUILD} and {ZIGLANG} from PyPI into {} (once)",
        dir.display()
    );
    // --only-binary: the wheels carry the binaries; nothing is built or downloaded by URL.
    cmd!(
        sh,
        "{pip} install --quiet --disable-pip-version-check --only-binary :all: {CARGO_ZIGBUILD} {ZIGLANG}"
    )
    .run()
    .with_context(|| format!("pip install {CARGO_ZIGBUILD} {ZIGLANG}"))?;
    ensure!(
        zig.cargo_zigbuild.exists() && zig.zig.exists(),
        "pip installed no {} or {}",
        zig.cargo_zigbuild.display(),
        zig.zig.display()
    );
    std::fs::write(&done, "")?;
    Ok(zig)
}

/// `major.minor` of the host's python3: the venv's site-packages directory.
fn python_version(sh: &Shell) -> Result<String> {
    let format = "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')";
    let version = cmd!(sh, "python3 -c {format}")
        .quiet()
        .read()
        .context("running python3 (the zig tools are installed from PyPI)")?;
    Ok(version.trim().to_owned())
}

/// The linker flags every packaged build adds: the build-id note that Debian's toolchain
/// writes by default and zig does not, which dh_strip's -dbgsym packages are named by.
pub const LINK_FLAGS: &[&str] = &["-Clink-arg=-Wl,--build-id=sha1"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_the_floor() {
        assert_eq!(
            Zig::target("aarch64-unknown-linux-gnu"),
            "aarch64-unknown-linux-gnu.2.28"
        );
    }
}
