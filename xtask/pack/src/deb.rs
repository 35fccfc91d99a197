//! `cargo xtask deb-kmod|deb-lib|deb-tests|deb-meta|deb-all|deb-bundle|deb`: the .debs, in
//! build/, named `<package>_<version>_<arch>.deb`, with a `<package>-dbgsym` .deb beside each
//! package that holds ELF files.
//!
//! Built by dpkg-buildpackage with debian/rules (debhelper.rs), as a packager builds them, with
//! this machine's Rust toolchain instead of Debian's; `cargo xtask test` also builds them from
//! the source package with Debian's, offline, and compares the two
//! (xtask-testbench's pkgtest/source.rs).
//!
//! Versions: each package's is its crate's (a semver pre-release `-beta.1` becomes `~beta.1`)
//! with the source package's Debian revision (debian/changelog); the bundle's revision is
//! `<revision>+bundle`. The packages:
//! - `mtgdrdrv-dkms` (all): module sources for DKMS in /usr/src/mtgdrdrv-<version>, udev rule,
//!   modprobe.d softdep, mtgdrdrv-load (/usr/lib/mtgdrdrv/); the postinst builds the module with
//!   DKMS and loads it through mtgdrdrv-load.
//! - `libgdrapi` (amd64/arm64, Multi-Arch: same): libgdrapi.so.1 and its links, libgdrapi.a,
//!   gdrapi.h, gdrapi.pc; shlibs, symbols, ldconfig trigger.
//! - `mtgdrcopy-tests`: the programs; no MUSA dependency (dlopen).
//! - `mtgdrcopy` (all): metapackage on the three, any 0.x module and any 1.x library and tools
//!   from this release on.
//! - `mtgdrcopy` as a bundle (`deb-bundle`, `deb`): the three in one package, which conflicts
//!   with, replaces and provides them (debian/mtgdrcopy-bundle.control: the bundle is not part
//!   of the source package). It shares the metapackage's name (the historical single-package
//!   name, like upstream's `gdrcopy`), so its revision is `<revision>+bundle`: an upgrade from
//!   the split install, and a distinct file in build/.

use fs_err as fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use xtask_base::workspace::Workspace;
use xtask_base::{debian, files, lintian, paths, targets};

use crate::stage::Package;
use crate::{debhelper, versions};

/// A .deb written to build/.
#[derive(Clone, Debug)]
pub struct Built {
    pub package: Package,
    pub path: PathBuf,
    /// The final control file.
    pub control: String,
    /// The package's -dbgsym .deb, if it has ELF files.
    pub dbgsym: Option<PathBuf>,
}

impl Built {
    pub fn version(&self) -> &str {
        field(&self.control, "Version").unwrap_or_default()
    }
}

/// Options of the `deb-*` commands.
#[derive(clap::Args)]
pub struct Args {
    /// Rust target triple of the architecture-dependent packages: the machine's own (default)
    /// or aarch64-unknown-linux-gnu (arm64, cross-built with Debian's toolchain in a chroot).
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
}

/// `cargo xtask deb-*`: builds `packages` and prints their files.
pub fn cli(packages: &[Package], args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load()?.for_target(targets::parse(args.target.as_deref())?);
    for b in build(&sh, &ws, packages)? {
        println!("{}", b.path.display());
        if let Some(dbgsym) = &b.dbgsym {
            println!("{}", dbgsym.display());
        }
    }
    Ok(())
}

/// The four packages of a release and the bundle, in that order.
pub fn build_everything(sh: &Shell, ws: &Workspace) -> Result<Vec<Built>> {
    let mut all = build(sh, ws, &Package::SPLIT)?;
    all.extend(build(sh, ws, &[Package::Bundle])?);
    Ok(all)
}

/// Builds `packages` (each with its -dbgsym package) into build/, in one dpkg-buildpackage
/// run (the bundle alone), replacing older builds.
pub fn build(sh: &Shell, ws: &Workspace, packages: &[Package]) -> Result<Vec<Built>> {
    // dh_gencontrol takes each version from the package's changelog: it must be the crate's.
    let revision = debian::revision()?;
    for &package in packages {
        let entry = debian::Entry::read(&package.changelog())?;
        let version = versions::package_version(ws, package, &revision)?;
        versions::changelog_entry(package, &version, &entry).map_err(anyhow::Error::msg)?;
    }
    let _lock = files::lock()?;
    let debs = debhelper::run(sh, ws, packages)?;
    packages.iter().map(|&p| collect(sh, &debs, p)).collect()
}

/// Moves `package`'s .deb and -dbgsym .deb out of what dpkg-buildpackage made into build/.
fn collect(sh: &Shell, debs: &[PathBuf], package: Package) -> Result<Built> {
    let named = |name: &str| {
        let prefix = format!("{name}_");
        let file = |d: &&PathBuf| {
            d.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&prefix))
        };
        debs.iter().find(file).cloned()
    };
    let name = package.deb_name();
    let made = named(name).with_context(|| format!("dpkg-buildpackage made no {name} .deb"))?;
    let control = cmd!(sh, "dpkg-deb --field {made}")
        .quiet()
        .read()
        .with_context(|| format!("reading the control file of {}", made.display()))?;
    let architecture = field(&control, "Architecture")
        .unwrap_or_default()
        .to_owned();
    let into_build = |from: &Path, name: &str| -> Result<PathBuf> {
        let to = paths::build_dir().join(from.file_name().context("a .deb has no name")?);
        remove_old_debs(name, &architecture, &to)?;
        fs::rename(from, &to)?;
        Ok(to)
    };
    let path = into_build(&made, name)?;
    let dbgsym_name = format!("{name}-dbgsym");
    let dbgsym = named(&dbgsym_name)
        .map(|d| into_build(&d, &dbgsym_name))
        .transpose()?;
    Ok(Built {
        package,
        path,
        control: format!("{control}\n"),
        dbgsym,
    })
}

/// Removes other builds of `name` for `architecture` beside `keep` (those of another
/// architecture stay: amd64 and arm64 packages are built side by side).
fn remove_old_debs(name: &str, architecture: &str, keep: &Path) -> Result<()> {
    let dir = keep.parent().context("a .deb path has no directory")?;
    fs::create_dir_all(dir)?;
    let prefix = format!("{name}_");
    let bundle = keep.to_string_lossy().contains("+bundle_");
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // The bundle and the metapackage share a name; their versions tell them apart.
        let is_bundle = file.contains("+bundle_");
        if file.starts_with(&prefix)
            && file.ends_with(&format!("_{architecture}.deb"))
            && is_bundle == bundle
            && path != keep
        {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// The value of `field` in a control file.
pub fn field<'a>(control: &'a str, field: &str) -> Option<&'a str> {
    control.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

/// lintian on every .deb: no error, no warning, no info tag (so also no unused override); the
/// remaining ones are overridden in debian/<package>/lintian-overrides, each with its reason.
pub fn lintian(sh: &Shell, debs: &[Built]) -> Result<()> {
    // No other xtask rewrites the .debs meanwhile.
    let _lock = files::lock()?;
    let files: Vec<PathBuf> = debs
        .iter()
        .flat_map(|d| std::iter::once(d.path.clone()).chain(d.dbgsym.clone()))
        .collect();
    lintian::lintian_files(sh, &files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new build replaces the package's older builds for its architecture only, and the
    /// metapackage and the bundle (one name) do not replace each other.
    #[test]
    fn old_builds_go_other_architectures_and_the_bundle_stay() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-old-debs-{}", std::process::id()));
        files::fresh_dir(&dir)?;
        let all = [
            "mtgdrcopy_0.9.0-1_all.deb",
            "mtgdrcopy_1.0.0-1_all.deb",
            "mtgdrcopy_0.9.0-1+bundle_amd64.deb",
            "mtgdrcopy-tests_0.9.0-1_amd64.deb",
            "libgdrapi_0.9.0-1_amd64.deb",
            "libgdrapi_0.9.0-1_arm64.deb",
            "libgdrapi_1.0.0-1_amd64.deb",
        ];
        for name in all {
            fs::write(dir.join(name), "")?;
        }
        remove_old_debs(
            "libgdrapi",
            "amd64",
            &dir.join("libgdrapi_1.0.0-1_amd64.deb"),
        )?;
        remove_old_debs("mtgdrcopy", "all", &dir.join("mtgdrcopy_1.0.0-1_all.deb"))?;
        let mut left: Vec<String> = fs::read_dir(&dir)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        left.sort();
        assert_eq!(
            left,
            [
                "libgdrapi_0.9.0-1_arm64.deb",
                "libgdrapi_1.0.0-1_amd64.deb",
                "mtgdrcopy-tests_0.9.0-1_amd64.deb",
                "mtgdrcopy_0.9.0-1+bundle_amd64.deb",
                "mtgdrcopy_1.0.0-1_all.deb",
            ]
        );
        fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
