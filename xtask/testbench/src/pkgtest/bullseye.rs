//! The packages on Debian 11 (bullseye: glibc 2.31, kernel 5.10, gcc 10), the oldest root this
//! machine's archive serves, and the README's commands on bookworm (readme.rs).
//!
//! On bullseye, in a root of bullseye's minbase with DKMS and bullseye's own kernel headers
//! (root.rs), what runs:
//! - the README's quick start, apt repository lines and `apt-get source` (readme.rs): apt
//!   installs the four packages from the release's files and from the signed repository
//!   (refused if a package needed a newer libc6), and DKMS builds mtgdrdrv there;
//! - DKMS built and installed mtgdrdrv.ko for the root's 5.10 kernel, with bullseye's gcc and
//!   DKMS 2.8, with the module's files in place (debian/tests/dkms-build, module-files);
//! - every mtgdrcopy_* program and libgdrapi.so.1 load under glibc 2.31: each program answers
//!   `--version` and `--help`, and without a GPU exits 77 with one line
//!   (debian/tests/tools-without-gpu).
//!
//! Not here: loading the module and copying (no 5.10 VM with the emulated provider): the
//! kernel matrix builds the module against 5.10 in its own bullseye chroot, and the VM tests run
//! it on bookworm's kernel.

use anyhow::Result;
use xshell::Shell;

use super::root::{self, Root};
use super::{debian_tests, readme};
use crate::kernel;
use xtask_base::paths;
use xtask_pack::aptrepo;
use xtask_pack::deb::Built;

fn key(sh: &Shell, name: &str) -> Result<aptrepo::TestKey> {
    let home = paths::build_dir()
        .join("pkgtest")
        .join(format!("gnupg-{name}"));
    aptrepo::TestKey::generate(sh, &home, "mtgdrcopy-test-archive")
}

/// The README's commands on bookworm, in a root of the DKMS layers (root.rs).
pub(super) fn readme_on_bookworm(sh: &Shell, debs: &[Built]) -> Result<()> {
    // The roots in build/pkgtest/ are one run's at a time.
    let _lock = xtask_base::files::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running a package test",
    )?;
    let layers = root::dkms_layers(sh, &kernel::bookworm_kernel()?)?;
    let root = Root::fresh(layers, "readme-bookworm")?;
    let source = xtask_pack::dsc::build(sh)?;
    readme::test(sh, &root, debs, &source, &key(sh, "readme")?)
}

/// The bullseye test (module doc).
pub(super) fn test_step(sh: &Shell, debs: &[Built]) -> Result<()> {
    // The roots in build/pkgtest/ are one run's at a time.
    let _lock = xtask_base::files::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running a package test",
    )?;
    let layers = root::bullseye_layers(sh)?;
    let root = Root::fresh(layers, "bullseye")?;
    let glibc = root.run(sh, &["sh", "-c", "ldd --version | head -n 1"])?;
    eprintln!("    bullseye root: {}", glibc.trim());
    let source = xtask_pack::dsc::build(sh)?;
    readme::test(sh, &root, debs, &source, &key(sh, "bullseye")?)?;

    // DKMS built the module for bullseye's kernel (the only headers in the root) with its
    // files in place; every program (and so libgdrapi.so.1, which they link) runs under its
    // glibc.
    let tests = [debian_tests::DKMS, &["tools-without-gpu"]].concat();
    debian_tests::run(
        sh,
        &root,
        &tests,
        &format!("in the bullseye root ({})", glibc.trim()),
    )?;
    Ok(())
}
