//! What DKMS did with mtgdrdrv-dkms in the upgrade test's roots, checked by the same
//! debian/tests that autopkgtest and piuparts run on the release's own install. (The postinst
//! with the real DKMS where module builds fail is debian/tests/dkms-failures.)

use std::fs;

use anyhow::{Context, Result};
use xshell::Shell;

use super::root::Root;
use xtask_base::paths;

/// debian/tests/dkms-build and module-files, run in `root`: DKMS built and installed the
/// installed package's mtgdrdrv version for the root's kernel (no stub module), and the
/// module's files (udev rule, softdep, loader, dkms.conf of that version) are in place.
/// `apt_output` is shown when they fail.
pub(super) fn check_dkms_installed(sh: &Shell, root: &Root, apt_output: &str) -> Result<()> {
    for test in ["dkms-build", "module-files"] {
        let inside = format!("/tmp/debian-tests/{test}");
        let copy = root.new_file(&inside);
        let from = paths::root().join("debian/tests").join(test);
        fs::create_dir_all(copy.parent().context("a path in the root")?)?;
        fs::copy(&from, &copy).with_context(|| format!("copying {}", from.display()))?;
        let said = root
            .run(sh, &["sh", &inside])
            .with_context(|| format!("debian/tests/{test}; apt-get said:\n{apt_output}"))?;
        eprintln!("    {}", said.trim());
    }
    Ok(())
}

/// DKMS's module signing key pair, generated the first time DKMS signs a module (here, ours):
/// DKMS's state, not the package's, and kept on purpose, since it may be enrolled in the
/// firmware's MOK list by then.
pub(crate) const KEPT_BY_DKMS: &[&str] = &["/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"];
