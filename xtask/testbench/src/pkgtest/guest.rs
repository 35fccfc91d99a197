//! What the package tests' VMs get beside the packages: the emulated provider, and files of a
//! package-test root with the libraries they need.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use super::root::Root;
use crate::step::timed;

use crate::kernel::Kernel;

/// The emulated provider's module for `kernel` and the emulated libmusa, built: what the package
/// tests' VMs need beside the packages.
pub(crate) fn emulated_provider(sh: &Shell, kernel: &Kernel) -> Result<(PathBuf, PathBuf)> {
    let t = Instant::now();
    let (_, emu) = crate::kbuild::build_modules(sh, kernel)?;
    let libmusa = xtask_base::build::emulated_musa(sh)?;
    timed("emulated provider and libmusa built", t);
    Ok((emu, libmusa))
}

/// The libraries `file` (a library built on this machine) loads, as ldd resolves them here:
/// the same paths in the bookworm roots.
pub(crate) fn host_libraries(sh: &Shell, file: &std::path::Path) -> Result<Vec<String>> {
    let listing = cmd!(sh, "ldd {file}")
        .quiet()
        .read()
        .with_context(|| format!("ldd {}", file.display()))?;
    Ok(listing
        .lines()
        .filter_map(|l| l.split_once(" => ")?.1.split_whitespace().next())
        .filter(|lib| lib.starts_with('/'))
        .map(str::to_owned)
        .collect())
}

/// Host files for the guest: `paths` of `root` (symlinks followed), each at `prefix` + its
/// path, plus the shared libraries they need, taken from the root itself (ldd inside it).
pub(super) fn root_files(
    sh: &Shell,
    root: &Root,
    paths: &[String],
    prefix: &str,
    export: &str,
) -> Result<Vec<(PathBuf, String)>> {
    let mut all: Vec<String> = paths.to_vec();
    let mut args = vec!["ldd"];
    args.extend(paths.iter().map(String::as_str));
    // ldd fails for the files that are not dynamic ELF objects; it still lists the others.
    let (_, out, _) = root.output(sh, &args)?;
    for line in out.lines() {
        let line = line.trim();
        // With several files, ldd heads each one's list with `<file>:`.
        if line.ends_with(':') {
            continue;
        }
        let lib = match line.split_once(" => ") {
            Some((_, rest)) => rest.split(" (").next().unwrap_or_default().trim(),
            None if line.starts_with('/') => line.split(" (").next().unwrap_or_default().trim(),
            None => continue,
        };
        // A library among `paths` under another directory name (/lib is /usr/lib here) is
        // the same file: cp would skip it, and the guest's loader searches both.
        let name = lib.rsplit('/').next().unwrap_or(lib);
        if lib.starts_with('/') && !all.iter().any(|p| p.rsplit('/').next() == Some(name)) {
            all.push(lib.to_owned());
        }
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let dir = root.export(sh, &refs, export)?;
    Ok(all
        .iter()
        .map(|p| (dir.join(p.trim_start_matches('/')), format!("{prefix}{p}")))
        .collect())
}

/// What `packages` installed in `root` (dpkg -L: files, links and directories).
pub(super) fn package_files(sh: &Shell, root: &Root, packages: &[&str]) -> Result<Vec<String>> {
    let mut args = vec!["dpkg", "-L"];
    args.extend(packages);
    let out = root.run(sh, &args)?;
    Ok(out.lines().map(String::from).collect())
}
