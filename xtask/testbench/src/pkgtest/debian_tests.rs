//! debian/tests run inside a package-test root, where autopkgtest's testbeds do not reach: the
//! bullseye root (its own DKMS and kernel) and the upgrade test's roots after each apt step.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use xshell::Shell;

use super::root::Root;
use xtask_base::paths;

/// What DKMS did with the installed mtgdrdrv-dkms: the module built and installed for the
/// root's kernel (no stub), its files in place (udev rule, softdep, loader, dkms.conf).
pub(super) const DKMS: &[&str] = &["dkms-build", "module-files"];

/// The file of the debian/tests test `name` in this tree.
pub(crate) fn path(name: &str) -> PathBuf {
    paths::root().join("debian/tests").join(name)
}

/// [`DKMS`]'s tests after an apt step; `apt_output` is shown when one fails.
pub(super) fn check_dkms(sh: &Shell, root: &Root, apt_output: &str) -> Result<()> {
    run(sh, root, DKMS, &format!("apt-get said:\n{apt_output}"))
}

/// Runs each of `tests` (names in debian/tests) in `root`; `context` is shown when one fails.
pub(super) fn run(sh: &Shell, root: &Root, tests: &[&str], context: &str) -> Result<()> {
    for test in tests {
        let inside = format!("/tmp/debian-tests/{test}");
        let copy = root.new_file(&inside);
        let from = path(test);
        fs::create_dir_all(copy.parent().context("a path in the root")?)?;
        fs::copy(&from, &copy).with_context(|| format!("copying {}", from.display()))?;
        let said = root
            .run(sh, &["sh", &inside])
            .with_context(|| format!("debian/tests/{test}; {context}"))?;
        for line in said.lines() {
            eprintln!("    {line}");
        }
    }
    Ok(())
}
