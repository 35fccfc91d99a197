//! What DKMS did with mtgdrdrv-dkms: the module built and installed for a kernel, nothing left
//! behind by a purge, and the postinst with the real DKMS where module builds fail (step 1b).

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use xshell::Shell;

use super::debs::put_debs;
use super::installed::{LOAD_SCRIPT, SOFTDEP};
use super::root::Root;
use xtask_base::files;
use xtask_pack::deb::Built;

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

/// Step 1b, the postinst with the real DKMS where builds fail: shell, since it is a sequence of
/// apt, dpkg and dkms commands and their messages (xtask/testbench/scripts/dkms-failures.sh says
/// what each phase proves). It runs in a root of its own that believes it runs the VM's kernel
/// `release`; here, between its phases, the module installed for that kernel is checked, and at
/// the end that the purges left the root as it was.
pub(super) fn dkms_failures(
    sh: &Shell,
    layers: Vec<PathBuf>,
    kmod: &Built,
    release: &str,
    version: &str,
) -> Result<()> {
    const SCRIPT: &str = include_str!("../../scripts/dkms-failures.sh");
    let root = Root::fresh(layers, "dkms")?;
    files::put_text(&root.new_file("/tmp/dkms-failures.sh"), SCRIPT, 0o755)?;
    let phase = |name: &str, deb: &str| {
        root.run(
            sh,
            &["sh", "/tmp/dkms-failures.sh", name, release, version, deb],
        )
    };
    phase("setup", "")?;
    let before = root.file_list(sh)?;
    let deb = put_debs(&root, &[kmod])?.concat();
    phase("no-autoinstall", &deb)?;
    eprintln!("    no-autoinstall: registered, nothing built, said so");
    let out = phase("newest-broken", &deb)?;
    check_dkms_installed(sh, &root, release, version, &out)?;
    eprintln!(
        "    a newer kernel's build fails: a warning, apt goes on, the running kernel has it"
    );
    let out = phase("running-broken", &deb)?;
    check_dkms_installed(sh, &root, release, version, &out)?;
    eprintln!(
        "    the running kernel's build fails: configure fails and says so; dpkg --configure -a \
         once fixed; an excluded kernel skipped (DKMS exit 77), one without headers named"
    );
    phase("cleanup", &deb)?;
    check_purged(sh, &root, release, &before)
}

/// DKMS's module signing key pair, generated the first time DKMS signs a module (here, ours):
/// DKMS's state, not the package's, and kept on purpose, since it may be enrolled in the
/// firmware's MOK list by then.
pub(super) const KEPT_BY_DKMS: &[&str] = &["/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"];

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
