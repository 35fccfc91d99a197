//! The release library staged under its real name with its links, for the tests that link
//! against it (the static-library check, the arm64 tests under qemu-user).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use xtask_base::library::{gdrapi_version, soname};
use xtask_base::paths;

/// Builds the release library and stages it under build/lib with its real name
/// (`libgdrapi.so.1.0.0`), the soname link and the development link; returns that directory.
pub fn build_library(sh: &Shell) -> Result<PathBuf> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --locked").run()?;
    link_library(&paths::release_dir(), &paths::build_dir().join("lib"))
}

/// Stages the library built in `target` (a release directory) in `lib` with its real name, the
/// soname link and the development link; returns `lib`.
pub fn link_library(target: &Path, lib: &Path) -> Result<PathBuf> {
    let lib = lib.to_path_buf();
    std::fs::create_dir_all(&lib)?;
    let version = gdrapi_version();
    let real = format!("libgdrapi.so.{version}");
    let soname = soname();
    std::fs::copy(target.join("libgdrapi.so"), lib.join(&real))?;
    std::fs::copy(target.join("libgdrapi.a"), lib.join("libgdrapi.a"))?;
    for (link, to) in [
        (soname.as_str(), real.as_str()),
        ("libgdrapi.so", soname.as_str()),
    ] {
        let path = lib.join(link);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(to, &path)
            .with_context(|| format!("linking {}", path.display()))?;
    }
    Ok(lib)
}
