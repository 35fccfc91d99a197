//! The matrix's "dkms build" cell: the mtgdrdrv-dkms .deb of this tree installed into a suite's
//! chroot with dpkg (its postinst runs DKMS), `dkms build` for the suite's kernel, the module's
//! vermagic checked, and the package purged so that the cached chroot stays as it was.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::chroot::Chroot;
use xtask_base::workspace::Workspace;
use xtask_pack::deb;
use xtask_pack::stage::Package;

use crate::kbuild::Warnings;

/// The mtgdrdrv-dkms .deb of this tree (`cargo xtask deb-kmod`).
pub(super) fn dkms_deb(sh: &Shell) -> Result<PathBuf> {
    let ws = Workspace::load()?;
    let kmod = deb::build(sh, &ws, &[Package::Kmod])?;
    Ok(kmod[0].path.clone())
}

/// Installs the DKMS package `deb` in `chroot` as users do and checks that its postinst built
/// and installed the module for `release`; runs `dkms build` for `release` (already built by
/// then: dkms says so); checks the module's vermagic and the build log's warnings; purges the
/// package again, so that the cached chroot stays as it was.
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
    let result = install_and_build(sh, chroot, &package, &inside, release, log);
    let purged = purge(sh, chroot, &package, log);
    let _ = fs::remove_file(chroot.host_path(&inside));
    result.and(purged)
}

fn install_and_build(
    sh: &Shell,
    chroot: &Chroot,
    package: &str,
    deb: &Path,
    release: &str,
    log: &Path,
) -> Result<()> {
    xtask_base::host::run_logged(
        chroot.cmd(sh, "dpkg").arg("-i").arg(deb),
        log,
        &format!("dpkg -i {package}"),
    )?;
    let listed = chroot
        .cmd(sh, "dpkg")
        .args(["-L", package])
        .quiet()
        .read()
        .context("dpkg -L")?;
    let conf = listed
        .lines()
        .find(|l| l.starts_with("/usr/src/") && l.ends_with("/dkms.conf"))
        .with_context(|| format!("{package} has no /usr/src/*/dkms.conf"))?;
    let conf_text = fs::read_to_string(chroot.host_path(Path::new(conf)))
        .with_context(|| format!("reading {conf}"))?;
    let field = |key: &str| {
        conf_text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .with_context(|| format!("{conf} has no {key}"))
    };
    let (name, version) = (field("PACKAGE_NAME")?, field("PACKAGE_VERSION")?);
    let module = format!("{name}/{version}");

    let status = chroot
        .cmd(sh, "dkms")
        .args(["status", &module])
        .quiet()
        // dkms 3.0 runs readelf on every module, which complains about missing sections.
        .ignore_stderr()
        .read()
        .context("dkms status")?;
    ensure!(
        status
            .lines()
            .any(|l| l.contains(release) && l.contains(": installed")),
        "after dpkg -i, dkms status does not show {module} installed for {release} (the \
         postinst should have built it):\n{status}"
    );
    xtask_base::host::run_logged(
        chroot
            .cmd(sh, "dkms")
            .args(["build", &module, "-k", release]),
        log,
        &format!("dkms build {module} -k {release}"),
    )?;

    let tree = chroot.host_path(Path::new(&format!("/var/lib/dkms/{module}/{release}")));
    let arch_dir = fs::read_dir(&tree)
        .with_context(|| format!("reading {}", tree.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.is_dir())
        .with_context(|| format!("{} holds no build", tree.display()))?;
    let ko = fs::read_dir(arch_dir.join("module"))
        .with_context(|| format!("reading {}/module", arch_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}.ko")))
        })
        .with_context(|| format!("dkms built no {name}.ko in {}", arch_dir.display()))?;
    let ko_inside = Path::new("/").join(ko.strip_prefix(&chroot.root)?);
    let vermagic = chroot
        .cmd(sh, "modinfo")
        .args(["-F", "vermagic"])
        .arg(&ko_inside)
        .quiet()
        .read()
        .context("modinfo")?;
    ensure!(
        vermagic.starts_with(&format!("{release} ")),
        "{} has vermagic {vermagic:?}, not {release}",
        ko_inside.display()
    );

    let make_log = arch_dir.join("log/make.log");
    let text =
        fs::read_to_string(&make_log).with_context(|| format!("reading {}", make_log.display()))?;
    let warnings = Warnings::find(&text, Path::new(&format!("/var/lib/dkms/{module}/build")));
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
