//! A release as apt sees it, its .debs' packages and versions, and what a root has installed of
//! one: the packages at their versions, and the module's srcversion, which tells builds apart.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_pack::stage::Package;

use crate::pkgtest::root::Root;

/// A .deb as apt sees it.
#[derive(Clone, Debug)]
pub(super) struct Deb {
    pub(super) package: String,
    pub(super) version: String,
    pub(super) path: PathBuf,
}

impl Deb {
    pub(super) fn read(sh: &Shell, path: &Path) -> Result<Deb> {
        let format = "${Package}\t${Version}";
        let fields = cmd!(sh, "dpkg-deb --show --showformat {format} {path}")
            .quiet()
            .read()
            .with_context(|| format!("reading {}", path.display()))?;
        let (package, version) = fields
            .split_once('\t')
            .with_context(|| format!("{}: no package and version", path.display()))?;
        Ok(Deb {
            package: package.to_owned(),
            version: version.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// The .deb of `package` in `release`.
pub(super) fn deb(release: &[Deb], package: Package) -> Result<&Deb> {
    release
        .iter()
        .find(|d| d.package == package.deb_name())
        .with_context(|| format!("no {} .deb in the release", package.deb_name()))
}

pub(super) fn version(release: &[Deb], package: Package) -> Result<&str> {
    Ok(&deb(release, package)?.version)
}

/// The upstream part of a Debian version.
pub(super) fn upstream(version: &str) -> &str {
    version.rsplit_once('-').map_or(version, |(u, _)| u)
}

/// Each package of `release` is installed at its version.
pub(super) fn expect_installed(sh: &Shell, root: &Root, release: &[Deb], when: &str) -> Result<()> {
    let mut found = Vec::new();
    let mut wrong = Vec::new();
    for deb in release {
        let (_, out, _) = root.output(
            sh,
            &[
                "dpkg-query",
                "-W",
                "-f",
                "${db:Status-Status} ${Version}",
                &deb.package,
            ],
        )?;
        let want = format!("installed {}", deb.version);
        if out.trim() != want {
            wrong.push(format!(
                "{} is {:?}, expected {want:?}",
                deb.package,
                out.trim()
            ));
        }
        found.push(format!("{} {}", deb.package, out.trim()));
    }
    ensure!(
        wrong.is_empty(),
        "{when}: {}\n(dpkg: {})",
        wrong.join("; "),
        found.join(", ")
    );
    Ok(())
}

pub(super) fn srcversion(sh: &Shell, root: &Root, ko: &str) -> Result<String> {
    let out = root.run(sh, &["modinfo", "-F", "srcversion", ko])?;
    let out = out.trim();
    ensure!(!out.is_empty(), "{ko} has no srcversion");
    Ok(out.to_owned())
}
