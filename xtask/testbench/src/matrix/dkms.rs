//! The matrix's "dkms build" cell: the mtgdrdrv-dkms .deb of this tree installed into a suite's
//! chroot with dpkg (its postinst runs DKMS), debian/tests/dkms-build run there (from DKMS 2.8
//! in bullseye to sid's), the build log's warnings read, and the package purged so that the
//! cached chroot stays as it was.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::chroot::Chroot;
use xtask_base::workspace::Workspace;
use xtask_pack::deb;
use xtask_pack::stage::Package;

use crate::kbuild::Warnings;
use crate::pkgtest::debian_tests;

/// The mtgdrdrv-dkms .deb of this tree (`cargo xtask deb-kmod`).
pub(super) fn dkms_deb(sh: &Shell) -> Result<PathBuf> {
    let ws = Workspace::load()?;
    let kmod = deb::build(sh, &ws, &[Package::Kmod])?;
    Ok(kmod[0].path.clone())
}

/// Installs the DKMS package `deb` in `chroot` as users do and checks that its postinst built
/// and installed the module for `release` (debian/tests/dkms-build) and that the build log has
/// no warning in our files; purges the package again, so that the cached chroot stays as it
/// was.
pub(super) fn dkms_build(
    sh: &Shell,
    chroot: &Chroot,
    deb: &Path,
    release: &str,
    log: &Path,
) -> Result<()> {
    fs::write(log, "").with_context(|| format!("creating {}", log.display()))?;
    let package = cmd!(sh, "dpkg-deb -f {deb} Package")
        .quiet()
        .read()
        .with_context(|| format!("reading {}", deb.display()))?;
    // Left over by an interrupted run.
    purge(sh, chroot, &package, log)?;

    let file_name = deb.file_name().context("the .deb path has no file name")?;
    let inside = Path::new("/var/tmp").join(file_name);
    fs::copy(deb, chroot.host_path(&inside))
        .with_context(|| format!("copying {} into {}", deb.display(), chroot.root.display()))?;
    let version = cmd!(sh, "dpkg-deb -f {deb} Version").quiet().read()?;
    let version = version.split('-').next().unwrap_or_default();
    let result = install_and_build(sh, chroot, &package, &inside, version, release, log);
    let purged = purge(sh, chroot, &package, log);
    let _ = fs::remove_file(chroot.host_path(&inside));
    result.and(purged)
}

fn install_and_build(
    sh: &Shell,
    chroot: &Chroot,
    package: &str,
    deb: &Path,
    version: &str,
    release: &str,
    log: &Path,
) -> Result<()> {
    xtask_base::host::run_logged(
        chroot.cmd(sh, "dpkg").arg("-i").arg(deb),
        log,
        &format!("dpkg -i {package}"),
    )?;
    // The package's own test of what its postinst did: the module built and installed for every
    // kernel with headers (the suite's; the host's `uname -r` has none here), its vermagic, no
    // stub module installed.
    let test = Path::new("/var/tmp/dkms-build");
    fs::copy(debian_tests::path("dkms-build"), chroot.host_path(test))
        .context("copying debian/tests/dkms-build into the chroot")?;
    let checked = xtask_base::host::run_logged(
        chroot.cmd(sh, "sh").arg(test),
        log,
        "debian/tests/dkms-build",
    );
    let _ = fs::remove_file(chroot.host_path(test));
    checked?;

    let module = format!("/var/lib/dkms/mtgdrdrv/{version}");
    let tree = chroot.host_path(Path::new(&format!("{module}/{release}")));
    let make_log = fs::read_dir(&tree)
        .with_context(|| format!("reading {}", tree.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("log/make.log")))
        .find(|p| p.is_file())
        .with_context(|| format!("{} holds no build log", tree.display()))?;
    let text =
        fs::read_to_string(&make_log).with_context(|| format!("reading {}", make_log.display()))?;
    let warnings = Warnings::find(&text, Path::new(&format!("{module}/build")));
    ensure!(
        warnings.ours.is_empty(),
        "the DKMS build warned in our files:\n  {}",
        warnings.ours.join("\n  ")
    );
    Ok(())
}

/// `dpkg --purge package` if it is installed (its prerm unregisters it from DKMS).
pub(super) fn purge(sh: &Shell, chroot: &Chroot, package: &str, log: &Path) -> Result<()> {
    let status = chroot
        .cmd(sh, "dpkg-query")
        .args(["-W", "-f", "${Status}", package])
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .read()
        .context("dpkg-query")?;
    if status.trim().is_empty() || status.ends_with("not-installed") {
        return Ok(());
    }
    xtask_base::host::run_logged(
        chroot.cmd(sh, "dpkg").args(["--purge", package]),
        log,
        &format!("dpkg --purge {package}"),
    )
    .map(drop)
}
