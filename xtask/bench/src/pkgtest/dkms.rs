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

/// A kernel newer than the VM's whose module build fails (its build/ has headers, include/, and
/// a Makefile that fails), and one older than BUILD_EXCLUSIVE_KERNEL allows.
const BROKEN_KERNEL: &str = "6.1.0-9999-amd64";
const EXCLUDED_KERNEL: &str = "5.3.0-1-amd64";
const BROKEN_MAKEFILE: &str =
    "modules clean:\n\t@echo 'broken on purpose by the package install test' >&2; exit 1\n";

/// What mtgdrdrv-load, or the postinst around it, prints when it tries to load the module.
const LOAD_LINES: &[&str] = &[
    "could not load the module now",
    "driver is not loaded",
    "loaded with disable_driver=1",
];

/// Step 1b: the postinst with the real DKMS where builds fail, in a root of its own that
/// believes it runs the VM's kernel (a `uname` printing its release for -r; in /usr/sbin, since
/// apt runs dpkg with PATH=/usr/sbin:/usr/bin:/sbin:/bin, DPkg::Path, so /usr/local/bin is not
/// seen), with BROKEN_KERNEL and EXCLUDED_KERNEL beside it. mtgdrdrv-dkms alone is installed
/// and purged three times:
/// - /etc/dkms/no-autoinstall: installs, builds nothing (DKMS: added), says so.
/// - The newest kernel's build fails: apt succeeds with one warning naming it and its kept
///   make.log, nothing is left half-configured (`dpkg --audit`), the module is installed for the
///   running kernel, `apt-get -f install` has nothing to fix. EXCLUDED_KERNEL is not built.
/// - autoinstall_all_kernels, and the running kernel's build fails too: configure fails saying
///   so, EXCLUDED_KERNEL is skipped as not supported (DKMS's exit 77); with the build fixed,
///   `dpkg --configure -a` succeeds and installs the module.
///
/// No case tries to load the module (a chroot; mtgpu is absent anyway). The purges leave the root
/// as it was.
pub(super) fn dkms_failures(
    sh: &Shell,
    layers: Vec<PathBuf>,
    kmod: &Built,
    release: &str,
    version: &str,
) -> Result<()> {
    let root = Root::fresh(layers, "dkms")?;
    files::put_text(
        &root.new_file("/usr/sbin/uname"),
        &format!(
            "#!/bin/sh\n# The package install test: this root runs the VM's kernel.\n\
             if [ \"$1\" = -r ]; then echo {release}; else exec /usr/bin/uname \"$@\"; fi\n"
        ),
        0o755,
    )?;
    let running = root.run(sh, &["uname", "-r"])?;
    ensure!(
        running.trim() == release,
        "uname -r in the root says {running:?}, not {release}"
    );
    let broken = format!("/lib/modules/{BROKEN_KERNEL}/build");
    root.run(
        sh,
        &[
            "mkdir",
            "-p",
            &format!("{broken}/include"),
            &format!("/lib/modules/{EXCLUDED_KERNEL}/build/include"),
        ],
    )?;
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "printf '%s' \"$2\" >\"$1\"",
            "-",
            &format!("{broken}/Makefile"),
            BROKEN_MAKEFILE,
        ],
    )?;
    let before = root.file_list(sh)?;
    let deb = put_debs(&root, &[kmod])?;
    let install = |what: &str| -> Result<(bool, String)> {
        let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
        args.extend(deb.iter().map(String::as_str));
        let (ok, out, err) = root.output(sh, &args)?;
        let all = format!("{out}{err}");
        for line in LOAD_LINES {
            ensure!(
                !all.contains(line),
                "{what}: the postinst tried to load mtgdrdrv in a chroot without mtgpu:\n{all}"
            );
        }
        Ok((ok, all))
    };
    let status = |root: &Root| root.run(sh, &["dkms", "status", "-m", "mtgdrdrv"]);
    let audit = |root: &Root| root.run(sh, &["dpkg", "--audit"]);
    let purge = |root: &Root| {
        root.run(sh, &["apt-get", "purge", "-y", "-q", "mtgdrdrv-dkms"])
            .map(drop)
    };
    let kept_log = format!("/var/lib/dkms/mtgdrdrv/{version}/make-{BROKEN_KERNEL}.log");
    let warning = format!(
        "mtgdrdrv: warning: the DKMS build failed for kernel {BROKEN_KERNEL} (not the running \
         one; dkms exit 10), which stays without mtgdrdrv: see {kept_log}"
    );

    // /etc/dkms/no-autoinstall.
    root.run(sh, &["touch", "/etc/dkms/no-autoinstall"])?;
    let (ok, out) = install("no-autoinstall")?;
    ensure!(
        ok,
        "with /etc/dkms/no-autoinstall, the install failed:\n{out}"
    );
    ensure!(
        out.contains(&format!(
            "mtgdrdrv: DKMS autoinstall is disabled (/etc/dkms/no-autoinstall), so the module is \
             not built; build it by hand: dkms install mtgdrdrv/{version} -k <kernel>"
        )) && !out.contains("Building module"),
        "with /etc/dkms/no-autoinstall, apt-get said:\n{out}"
    );
    let st = status(&root)?;
    ensure!(
        st.trim() == format!("mtgdrdrv/{version}: added"),
        "with /etc/dkms/no-autoinstall, dkms status says:\n{st}"
    );
    purge(&root)?;
    root.run(sh, &["rm", "/etc/dkms/no-autoinstall"])?;
    eprintln!("    no-autoinstall: registered, nothing built, said so");

    // The newest kernel's build fails; the running kernel's works.
    let (ok, out) = install("newest kernel broken")?;
    ensure!(
        ok,
        "a failed build for {BROKEN_KERNEL}, which is not running, failed the install:\n{out}"
    );
    for line in [
        format!(
            "mtgdrdrv: building for kernel(s) {BROKEN_KERNEL} {release} (the newest installed \
             kernel and the running one)"
        ),
        warning.clone(),
    ] {
        ensure!(
            out.lines().any(|l| l == line),
            "apt-get did not say\n{line}\nbut:\n{out}"
        );
    }
    ensure!(
        !out.contains(EXCLUDED_KERNEL),
        "the postinst built for {EXCLUDED_KERNEL}, neither running nor newest:\n{out}"
    );
    let left = audit(&root)?;
    ensure!(
        left.trim().is_empty(),
        "dpkg --audit after the install:\n{left}"
    );
    check_dkms_installed(sh, &root, release, version, &out)?;
    let log = root.read(sh, &kept_log)?;
    ensure!(
        log.contains("broken on purpose"),
        "{kept_log} is not {BROKEN_KERNEL}'s make.log:\n{log}"
    );
    root.run(sh, &["apt-get", "-f", "install", "-y", "-q"])?;
    purge(&root)?;
    eprintln!(
        "    a newer kernel's build fails: a warning, apt goes on, the running kernel has it"
    );

    // Every kernel, and the running kernel's build fails.
    let conf = "/etc/dkms/framework.conf.d/mtgdrcopy-test.conf";
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "echo autoinstall_all_kernels=yes >\"$1\"",
            "-",
            conf,
        ],
    )?;
    let build = format!("/lib/modules/{release}/build");
    let real = format!("/lib/modules/{release}/build.real");
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "mv \"$1\" \"$2\" && mkdir -p \"$1/include\" && printf '%s' \"$3\" >\"$1/Makefile\"",
            "-",
            &build,
            &real,
            BROKEN_MAKEFILE,
        ],
    )?;
    let (ok, out) = install("running kernel broken")?;
    ensure!(
        !ok,
        "a failed build for the running kernel {release} did not fail the install:\n{out}"
    );
    for line in [
        format!(
            "mtgdrdrv: not supported by kernel {EXCLUDED_KERNEL} (BUILD_EXCLUSIVE_* in \
             dkms.conf), skipped"
        ),
        warning,
        format!(
            "mtgdrdrv: the DKMS build failed for the running kernel {release} (dkms exit 10): \
             see /var/lib/dkms/mtgdrdrv/{version}/build/make.log; once the cause is fixed, \
             retry with: dpkg --configure -a"
        ),
    ] {
        ensure!(
            out.lines().any(|l| l == line),
            "apt-get did not say\n{line}\nbut:\n{out}"
        );
    }
    let left = audit(&root)?;
    ensure!(
        left.contains("mtgdrdrv-dkms"),
        "after the failed configure, dpkg --audit does not list mtgdrdrv-dkms:\n{left}"
    );
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "rm -r \"$1\" && mv \"$2\" \"$1\"",
            "-",
            &build,
            &real,
        ],
    )?;
    let (ok, out, err) = root.output(sh, &["dpkg", "--configure", "-a"])?;
    ensure!(
        ok,
        "dpkg --configure -a failed once the running kernel's build was fixed:\n{out}{err}"
    );
    let left = audit(&root)?;
    ensure!(
        left.trim().is_empty(),
        "dpkg --audit after the retry:\n{left}"
    );
    check_dkms_installed(sh, &root, release, version, &format!("{out}{err}"))?;
    purge(&root)?;
    root.run(sh, &["rm", conf])?;
    eprintln!(
        "    the running kernel's build fails: configure fails and says so; \
         dpkg --configure -a once fixed; {EXCLUDED_KERNEL} skipped (DKMS exit 77)"
    );
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
