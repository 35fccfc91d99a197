//! Step 2, the full upgrade: this release installed from the repository, `apt-get upgrade` to
//! the next, and nothing of the old release left behind.

use std::time::Instant;

use anyhow::{ensure, Result};
use xshell::Shell;

use super::release::{expect_installed, srcversion, upstream, version, Deb};
use super::repo::Repo;
use xtask_pack::stage::Package;

use crate::piuparts::KEPT_BY_DKMS;
use crate::pkgtest::debian_tests;
use crate::pkgtest::guest::package_files;
use crate::pkgtest::root::Root;
use crate::step::timed;

/// Installs this release, upgrades to `next`, checks what is left. Returns the srcversion of
/// the installed module.
pub(super) fn full_upgrade(
    sh: &Shell,
    repo: &Repo,
    release: &str,
    this: &[Deb],
    next: &[Deb],
) -> Result<String> {
    let root = repo.root;
    let t = Instant::now();
    repo.publish(sh, this)?;
    let before = root.file_list(sh)?;
    let output = repo.apt(sh, &["install", "mtgdrcopy"])?;
    expect_installed(sh, root, this, "after apt-get install mtgdrcopy")?;
    let old_kmod = upstream(version(this, Package::Kmod)?);
    debian_tests::check_dkms(sh, root, &output)?;
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    let old_module = srcversion(sh, root, &ko)?;
    timed("full upgrade: this release installed (DKMS)", t);

    let t = Instant::now();
    repo.publish(sh, &[this, next].concat())?;
    let output = repo.apt(sh, &["upgrade"])?;
    expect_installed(sh, root, next, "after apt-get upgrade")?;
    ensure!(
        output.contains(&format!(
            "{} upgraded, 0 newly installed, 0 to remove",
            next.len()
        )),
        "apt-get upgrade did not upgrade exactly the {} packages:\n{output}",
        next.len()
    );
    let new_kmod = upstream(version(next, Package::Kmod)?);
    debian_tests::check_dkms(sh, root, &output)?;
    let status = root.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.trim().lines().count() == 1,
        "dkms status should show mtgdrdrv {new_kmod} only, it shows:\n{status}"
    );
    for gone in [
        format!("/var/lib/dkms/mtgdrdrv/{old_kmod}"),
        format!("/usr/src/mtgdrdrv-{old_kmod}"),
    ] {
        ensure!(
            !root.exists(sh, &gone)?,
            "{gone} is still there after the upgrade"
        );
    }
    let new_module = srcversion(sh, root, &ko)?;
    let marker = root.run(sh, &["modinfo", "-F", "upgrade_test_release", &ko])?;
    ensure!(
        marker.trim() == new_kmod && new_module != old_module,
        "{ko} is not the build of mtgdrdrv {new_kmod}: its upgrade_test_release is {:?} \
         (expected {new_kmod:?}) and its srcversion {new_module} ({old_kmod}'s: {old_module})",
        marker.trim()
    );
    check_nothing_left(sh, root, release, &before, old_kmod, new_kmod)?;
    timed(
        &format!(
            "full upgrade: apt-get upgrade to the next release; DKMS rebuilt mtgdrdrv \
             {new_kmod} (srcversion {new_module}, was {old_module}), nothing of {old_kmod} left"
        ),
        t,
    );
    Ok(new_module)
}

/// Nothing of the old release is left: every file the install and the upgrade added to the
/// root (compared with `before`) belongs to an installed package or is DKMS's state of the new
/// module version, and DKMS's per-kernel link names that version.
fn check_nothing_left(
    sh: &Shell,
    root: &Root,
    release: &str,
    before: &[String],
    old_kmod: &str,
    new_kmod: &str,
) -> Result<()> {
    let names: Vec<&str> = Package::SPLIT.iter().map(|p| p.deb_name()).collect();
    let owned = package_files(sh, root, &names)?;
    let after = root.file_list(sh)?;
    let left = leftovers(before, &after, &owned, release, old_kmod);
    ensure!(
        left.is_empty(),
        "after the upgrade to mtgdrdrv {new_kmod}, these files are neither the new packages' \
         nor DKMS's for {new_kmod} (left by the old release?):\n  {}",
        left.join("\n  ")
    );
    let links = root.run(
        sh,
        &[
            "find",
            "/var/lib/dkms/mtgdrdrv",
            "-maxdepth",
            "1",
            "-type",
            "l",
            "-printf",
            "%f -> %l\n",
        ],
    )?;
    ensure!(
        !links.contains(&format!("{old_kmod}/")),
        "DKMS still links to {old_kmod}:\n{links}"
    );
    Ok(())
}

/// The files of `after` that are not in `before` (sorted), not `owned` by a package and not
/// DKMS's: its tree of a module version other than `old_kmod` under /var/lib/dkms/mtgdrdrv, the
/// module it installed for `release`, its signing key.
fn leftovers(
    before: &[String],
    after: &[String],
    owned: &[String],
    release: &str,
    old_kmod: &str,
) -> Vec<String> {
    // /lib is /usr/lib in bookworm: find lists the latter, dpkg may list either.
    let merged = |p: &str| match p.strip_prefix("/lib/") {
        Some(rest) => format!("/usr/lib/{rest}"),
        None => p.to_owned(),
    };
    let owned: std::collections::BTreeSet<String> = owned.iter().map(|p| merged(p)).collect();
    let updates = format!("/usr/lib/modules/{release}/updates");
    let dkms = |p: &str| match p.strip_prefix("/var/lib/dkms/mtgdrdrv") {
        Some("") => true,
        Some(rest) => rest.strip_prefix('/').and_then(|r| r.split('/').next()) != Some(old_kmod),
        None => {
            [
                updates.clone(),
                format!("{updates}/dkms"),
                format!("{updates}/dkms/mtgdrdrv.ko"),
            ]
            .contains(&p.to_owned())
                || KEPT_BY_DKMS.contains(&p)
        }
    };
    after
        .iter()
        .filter(|f| before.binary_search(f).is_err() && !owned.contains(&merged(f)) && !dkms(f))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_the_old_release_left() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let before = strings(&["/usr", "/usr/lib", "/var/lib/dkms"]);
        let owned = strings(&[
            "/lib/x86_64-linux-gnu/libgdrapi.so.1.1.0",
            "/usr/src/m-0.1.1",
        ]);
        let after = strings(&[
            "/usr",
            "/usr/lib",
            "/usr/lib/modules/6.1/updates/dkms/mtgdrdrv.ko",
            "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.0.0",
            "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.1.0",
            "/usr/src/m-0.1.1",
            "/var/lib/dkms",
            "/var/lib/dkms/mok.key",
            "/var/lib/dkms/mtgdrdrv",
            "/var/lib/dkms/mtgdrdrv/0.1.0/6.1/x86_64/module/mtgdrdrv.ko",
            "/var/lib/dkms/mtgdrdrv/0.1.1/6.1/x86_64/module/mtgdrdrv.ko",
            "/var/lib/dkms/mtgdrdrv/kernel-6.1-x86_64",
        ]);
        assert_eq!(
            leftovers(&before, &after, &owned, "6.1", "0.1.0"),
            [
                "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.0.0",
                "/var/lib/dkms/mtgdrdrv/0.1.0/6.1/x86_64/module/mtgdrdrv.ko"
            ]
        );
    }
}
