//! What DKMS did with mtgdrdrv-dkms: the module built and installed for a kernel, nothing left
//! behind by a purge. (The postinst with the real DKMS where module builds fail is
//! debian/tests/dkms-failures, run by autopkgtest.)

use anyhow::{ensure, Context, Result};
use xshell::Shell;

use super::installed::{LOAD_SCRIPT, SOFTDEP};
use super::root::Root;

/// DKMS built and installed mtgdrdrv for `release`: its status, the module file, no stub, the
/// generated dkms.conf. Reports whether DKMS signed the module.
pub(super) fn check_dkms_installed(
    sh: &Shell,
    host: &Root,
    release: &str,
    version: &str,
    apt_output: &str,
) -> Result<()> {
    let status = host.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.lines().any(
            |l| l.starts_with(&format!("mtgdrdrv/{version}, {release},"))
                && l.ends_with(": installed")
        ),
        "dkms status does not show mtgdrdrv {version} installed for {release}:\n{status}\n\
         apt-get said:\n{apt_output}"
    );
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    ensure!(host.exists(sh, &ko)?, "{ko} is missing");
    let modules = host.run(
        sh,
        &["find", &format!("/lib/modules/{release}"), "-name", "*.ko*"],
    )?;
    ensure!(
        !modules.contains("mtgpu_p2p_stub"),
        "the CRC stub was installed:\n{modules}"
    );
    let conf = host.read(sh, &format!("/usr/src/mtgdrdrv-{version}/dkms.conf"))?;
    ensure!(
        conf.contains(&format!("PACKAGE_VERSION=\"{version}\"")),
        "dkms.conf's PACKAGE_VERSION is not {version}, the source directory's version"
    );
    for file in [
        "/usr/lib/udev/rules.d/60-mtgdrdrv.rules",
        SOFTDEP,
        LOAD_SCRIPT,
    ] {
        ensure!(host.exists(sh, file)?, "{file} is missing");
    }
    // mtgdrdrv loads with mtgpu (the softdep), not at every boot whatever is there.
    let ours = host.run(
        sh,
        &[
            "find",
            "/usr/lib",
            "/etc",
            "-path",
            "*/modules-load.d/*mtgdrdrv*",
        ],
    )?;
    ensure!(
        ours.trim().is_empty(),
        "a modules-load.d file of ours is installed: {ours}"
    );
    let signed = host.run(sh, &["tail", "-c", "28", &ko])? == "~Module signature appended~\n";
    let size: u64 = host
        .run(sh, &["stat", "-c", "%s", &ko])?
        .trim()
        .parse()
        .context("the module's size")?;
    eprintln!(
        "    DKMS: mtgdrdrv {version} installed for {release} ({}, {} KiB)",
        if signed {
            "signed with DKMS's MOK key"
        } else {
            "not signed"
        },
        size / 1024
    );
    Ok(())
}

/// DKMS's module signing key pair, generated the first time DKMS signs a module (here, ours):
/// DKMS's state, not the package's, and kept on purpose, since it may be enrolled in the
/// firmware's MOK list by then.
pub(crate) const KEPT_BY_DKMS: &[&str] = &["/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"];

/// After purging: DKMS forgot mtgdrdrv, the module is gone, and the root has no file that was
/// not there before the install.
pub(super) fn check_purged(
    sh: &Shell,
    host: &Root,
    release: &str,
    before: &[String],
) -> Result<()> {
    let status = host.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.trim().is_empty(),
        "DKMS still knows mtgdrdrv after the purge:\n{status}"
    );
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    ensure!(!host.exists(sh, &ko)?, "{ko} is still there");
    let after = host.file_list(sh)?;
    let left: Vec<&String> = after
        .iter()
        .filter(|f| before.binary_search(f).is_err() && !KEPT_BY_DKMS.contains(&f.as_str()))
        .collect();
    ensure!(
        left.is_empty(),
        "the purge left files behind:\n  {}",
        left.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    Ok(())
}
