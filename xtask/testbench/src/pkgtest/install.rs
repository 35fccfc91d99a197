//! The install test on the host root (bookworm, DKMS, the VM kernel's headers): the four
//! packages install and DKMS builds and installs the module; the purge takes everything away;
//! then the same for the single-package build. Installing from the signed repository is the
//! README test's; the tests of the installed files (the C consumer, the container layout, the
//! module's files) are debian/tests, run by autopkgtest on the same roots.

use std::time::Instant;

use anyhow::{ensure, Result};
use xshell::Shell;

use super::debs::{find, put_debs};
use super::dkms::{check_dkms_installed, check_purged};
use super::root::{self, Root};
use crate::step::timed;
use xtask_base::{host, paths};
use xtask_pack::deb::Built;
use xtask_pack::stage::Package;

use crate::{kernel, vmtest};

pub(super) fn install_test(sh: &Shell, debs: &[Built]) -> Result<()> {
    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    // The roots in build/pkgtest/ are one run's at a time.
    let _lock = xtask_base::files::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running the package install test",
    )?;
    let kernel = kernel::bookworm_kernel()?;
    let release = kernel.release.clone();
    let t = Instant::now();
    let host_layers = root::dkms_layers(sh, &kernel)?;
    timed("cached root layers ready", t);

    let host = Root::fresh(host_layers, "host")?;
    let before = host.file_list(sh)?;

    // 1. Host: the four packages (from the signed repository: the README test).
    let t = Instant::now();
    let split = Package::SPLIT
        .iter()
        .map(|&package| find(debs, package))
        .collect::<Result<Vec<_>>>()?;
    let inside = put_debs(&host, &split)?;
    let output = host.apt_install(sh, &inside.iter().map(String::as_str).collect::<Vec<_>>())?;
    timed("host: apt-get install the four packages (DKMS build)", t);
    let kmod_version = &find(debs, Package::Kmod)?
        .version()
        .split('-')
        .next()
        .unwrap_or_default()
        .to_owned();
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    // 2. Purge.
    let t = Instant::now();
    host.run(
        sh,
        &[
            "apt-get",
            "purge",
            "-y",
            "-q",
            "mtgdrcopy",
            "mtgdrcopy-tests",
            "libgdrapi",
            "mtgdrdrv-dkms",
        ],
    )?;
    check_purged(sh, &host, &release, &before)?;
    timed("host: purge, nothing left behind", t);

    // 3. The bundle.
    let t = Instant::now();
    let bundle = find(debs, Package::Bundle)?;
    let inside = put_debs(&host, &[bundle])?;
    let output = host.apt_install(sh, &inside.iter().map(String::as_str).collect::<Vec<_>>())?;
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    let status = host.run(sh, &["dpkg-query", "-W", "-f", "${Version}", "mtgdrcopy"])?;
    ensure!(
        status == bundle.version(),
        "mtgdrcopy {status} is installed, expected the bundle's {}",
        bundle.version()
    );
    host.run(sh, &["apt-get", "purge", "-y", "-q", "mtgdrcopy"])?;
    check_purged(sh, &host, &release, &before)?;
    timed(
        "host: the single-package build installs (DKMS) and purges clean",
        t,
    );
    Ok(())
}
