//! Step 3, the library alone: the next release's library and tools beside this release's
//! module (held, as README's "Versions" says), and the library's next major refused.

use std::time::Instant;

use anyhow::{ensure, Result};
use xshell::Shell;

use super::release::{deb, expect_installed, srcversion, version, Deb};
use super::repo::Repo;
use xtask_pack::stage::Package;

use crate::pkgtest::debian_tests;
use crate::step::timed;

/// Installs this release, then the next release's library and tools alone; the next major of
/// the library (`major`, a .deb) is refused. Returns the srcversion of the installed module.
pub(super) fn library_upgrade(
    sh: &Shell,
    repo: &Repo,
    release: &str,
    this: &[Deb],
    next: &[Deb],
    major: &Deb,
) -> Result<String> {
    let root = repo.root;
    let t = Instant::now();
    repo.publish(sh, this)?;
    let output = repo.apt(sh, &["install", "mtgdrcopy"])?;
    expect_installed(sh, root, this, "after apt-get install mtgdrcopy")?;
    debian_tests::check_dkms(sh, root, &output)?;
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    let module = srcversion(sh, root, &ko)?;
    timed("library only: this release installed (DKMS)", t);

    let t = Instant::now();
    repo.publish(sh, &[this, next, std::slice::from_ref(major)].concat())?;
    let lib_pin = format!("libgdrapi={}", version(next, Package::Lib)?);
    // The relations let the library be upgraded alone: so apt does with its grouping by source
    // package off...
    let alone = planned(&repo.apt(
        sh,
        &[
            "install",
            "--simulate",
            "-o",
            "APT::Get::Upgrade-By-Source-Package=false",
            &lib_pin,
        ],
    )?);
    ensure!(
        alone == ["libgdrapi"],
        "apt-get install {lib_pin} (no grouping by source package) should upgrade libgdrapi \
         alone; it would install {alone:?}"
    );
    // ...but by default (apt 2.5.2 and later), installing one package by name upgrades the
    // other installed packages of its source version too, the module included: README.md
    // ("Versions") and docs/packaging.md ("Building the packages", **Upgrades**) say so.
    let grouped = planned(&repo.apt(sh, &["install", "--simulate", &lib_pin])?);
    ensure!(
        grouped.iter().any(|p| p == "mtgdrdrv-dkms"),
        "README.md and docs/packaging.md say that apt-get install {lib_pin} upgrades \
         mtgdrdrv-dkms too (apt's grouping by source package), but apt would install only \
         {grouped:?}: update README.md's \"Versions\" and docs/packaging.md's **Upgrades**"
    );
    // README's way ("Versions") to keep the module: hold it.
    repo.root.run(sh, &["apt-mark", "hold", "mtgdrdrv-dkms"])?;
    let tests_pin = format!("mtgdrcopy-tests={}", version(next, Package::Tests)?);
    let output = repo.apt(sh, &["install", &lib_pin, &tests_pin])?;
    ensure!(
        output.contains("2 upgraded, 0 newly installed, 0 to remove"),
        "with mtgdrdrv-dkms held, apt-get install {lib_pin} {tests_pin} did more than upgrading \
         those two:\n{output}"
    );
    let expected = [
        deb(this, Package::Kmod)?,
        deb(next, Package::Lib)?,
        deb(next, Package::Tests)?,
        deb(this, Package::Meta)?,
    ]
    .map(Deb::clone);
    expect_installed(
        sh,
        root,
        &expected,
        &format!("with mtgdrdrv-dkms held, after apt-get install {lib_pin} {tests_pin}"),
    )?;
    ensure!(
        srcversion(sh, root, &ko)? == module,
        "{ko} changed while only the library and the tools were upgraded"
    );
    timed(
        &format!(
            "library only: with mtgdrdrv-dkms held, libgdrapi and mtgdrcopy-tests {} beside \
             mtgdrdrv-dkms {} and mtgdrcopy {}; without the hold apt would upgrade {}",
            version(next, Package::Lib)?,
            version(this, Package::Kmod)?,
            version(this, Package::Meta)?,
            grouped.join(" ")
        ),
        t,
    );

    let t = Instant::now();
    let pin = format!("libgdrapi={}", major.version);
    let (ok, out, err) = repo.apt_output(sh, &["install", "--simulate", "--no-remove", &pin])?;
    ensure!(
        !ok,
        "apt-get would install {pin} while mtgdrcopy-tests {} (libgdrapi << 2~) is installed:\n\
         {out}{err}",
        version(next, Package::Tests)?
    );
    let (_, out, _) = repo.apt_output(sh, &["install", "--simulate", &pin])?;
    for package in [Package::Tests, Package::Meta] {
        ensure!(
            out.lines()
                .any(|l| l.starts_with(&format!("Remv {} ", package.deb_name()))),
            "apt-get install {pin} should be possible only by removing {}; apt's plan:\n{out}",
            package.deb_name()
        );
    }
    let (_, upgrade, _) = repo.apt_output(sh, &["upgrade", "--simulate"])?;
    ensure!(
        !upgrade.lines().any(|l| l.starts_with("Inst libgdrapi ")),
        "apt-get upgrade would install libgdrapi {}:\n{upgrade}",
        major.version
    );
    let refusal = err
        .lines()
        .find(|l| l.starts_with("E: "))
        .unwrap_or("(no E: line)")
        .to_owned();
    timed(
        &format!(
            "library only: libgdrapi {} refused while mtgdrcopy-tests {} is installed \
             (apt: {refusal}); apt-get upgrade keeps it back",
            major.version,
            version(next, Package::Tests)?
        ),
        t,
    );
    Ok(module)
}

/// The packages apt-get's output says it installs (`Inst` lines of --simulate).
fn planned(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("Inst ")?.split_whitespace().next())
        .map(String::from)
        .collect()
}
