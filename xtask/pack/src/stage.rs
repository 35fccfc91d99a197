//! `cargo xtask build-kmod|build-lib|build-tests|build-meta|build-all`: each package's file
//! tree under `build/pkg/<package>/`, with its `DEBIAN/` control files, exactly what its .deb
//! holds; `build/pkg/<package>-dbgsym/` holds the debug symbols split off its ELF files. They
//! are the trees debhelper assembled for the .debs (debhelper.rs), copied out.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::Shell;

use xtask_base::files::lock;
use xtask_base::paths;
use xtask_base::workspace::Workspace;

use crate::debhelper::{self, Flavour, Scope};

/// The packages `cargo xtask deb-*` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Package {
    /// `mtgdrdrv-dkms`: module sources for DKMS, udev rule, modprobe.d softdep.
    Kmod,
    /// `libgdrapi`: shared and static library, header, pkg-config file.
    Lib,
    /// `mtgdrcopy-tests`: the test and benchmark programs.
    Tests,
    /// `mtgdrcopy`: the metapackage depending on the three above.
    Meta,
    /// `mtgdrcopy` built as one package holding all three (`cargo xtask deb-bundle`).
    Bundle,
}

impl Package {
    /// The four packages of a release, in install order.
    pub const SPLIT: [Package; 4] = [Package::Kmod, Package::Lib, Package::Tests, Package::Meta];

    pub fn deb_name(self) -> &'static str {
        match self {
            Package::Kmod => "mtgdrdrv-dkms",
            Package::Lib => "libgdrapi",
            Package::Tests => "mtgdrcopy-tests",
            Package::Meta | Package::Bundle => "mtgdrcopy",
        }
    }

    /// The crate whose version the package takes.
    pub fn crate_name(self) -> &'static str {
        match self {
            Package::Kmod => "mtgdrdrv",
            Package::Lib => "libgdrapi",
            Package::Tests => "mtgdrcopy-tests",
            Package::Meta | Package::Bundle => "mtgdrcopy-meta",
        }
    }

    /// Unique name of the staging directories and of the package's directory in `debian/`.
    pub fn stage_name(self) -> &'static str {
        match self {
            Package::Bundle => "mtgdrcopy-bundle",
            p => p.deb_name(),
        }
    }

    /// Packages without architecture-dependent files: the DKMS sources and the metapackage.
    pub fn arch_all(self) -> bool {
        matches!(self, Package::Kmod | Package::Meta)
    }

    /// The staged file tree: `build/pkg/<stage name>/`.
    pub fn tree(self) -> PathBuf {
        paths::build_dir().join("pkg").join(self.stage_name())
    }

    /// The debug symbols split off its ELF files: `build/pkg/<stage name>-dbgsym/`.
    pub fn dbgsym_tree(self) -> PathBuf {
        paths::build_dir()
            .join("pkg")
            .join(format!("{}-dbgsym", self.stage_name()))
    }

    /// The package's own changelog, installed as changelog.Debian (dh_installchangelogs takes
    /// debian/<package>.changelog over the source package's debian/changelog).
    pub fn changelog(self) -> PathBuf {
        paths::root()
            .join("debian")
            .join(format!("{}.changelog", self.stage_name()))
    }
}

/// The Debian architecture and multiarch tuple of the machine we build on (native builds only).
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    pub debian: &'static str,
    pub multiarch: &'static str,
}

pub fn host_arch() -> Result<Arch> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(Arch {
            debian: "amd64",
            multiarch: "x86_64-linux-gnu",
        }),
        "aarch64" => Ok(Arch {
            debian: "arm64",
            multiarch: "aarch64-linux-gnu",
        }),
        other => bail!("packaging for {other} is not set up (amd64 and arm64 are)"),
    }
}

/// The architecture the packages of `ws` are built for: its cross target, else the machine's.
pub fn package_arch(ws: &Workspace) -> Result<Arch> {
    match ws.target {
        Some(t) => Ok(Arch {
            debian: t.debian,
            multiarch: t.multiarch,
        }),
        None => host_arch(),
    }
}

/// `cargo xtask build-<package>`.
pub fn cli(packages: &[Package]) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    for tree in stage_all(&sh, packages)? {
        println!("{}", tree.display());
    }
    Ok(())
}

/// Stages `packages` (`cargo xtask build-*`) and returns their trees.
pub fn stage_all(sh: &Shell, packages: &[Package]) -> Result<Vec<PathBuf>> {
    let ws = Workspace::load()?;
    let _lock = lock()?;
    if packages.len() == 1 || packages.contains(&Package::Bundle) {
        return packages.iter().map(|&p| stage(sh, &ws, p)).collect();
    }
    // Several split packages: one dpkg-buildpackage run makes them all.
    debhelper::run(sh, &ws, Flavour::Split, Scope::All)?;
    for &package in packages {
        copy_trees(Flavour::Split, package)?;
    }
    Ok(packages.iter().map(|p| p.tree()).collect())
}

/// The test step of `cargo xtask build-all` (the old `make build`): every package's tree is
/// staged, with its `DEBIAN/` (the control file itself is written by deb.rs, last) and the
/// documentation every package carries.
pub fn build_all_test_step(sh: &Shell) -> Result<()> {
    let trees = stage_all(sh, &Package::SPLIT)?;
    anyhow::ensure!(trees.len() == Package::SPLIT.len(), "staged {trees:?}");
    for (tree, package) in trees.iter().zip(Package::SPLIT) {
        let doc = tree.join("usr/share/doc").join(package.deb_name());
        anyhow::ensure!(
            *tree == package.tree() && tree.join("DEBIAN").is_dir() && doc.is_dir(),
            "build-all did not stage {} (with DEBIAN/ and {})",
            package.tree().display(),
            doc.display()
        );
    }
    Ok(())
}

/// Stages `package` (building what it needs) and returns its tree. Callers hold [`lock`].
pub fn stage(sh: &Shell, ws: &Workspace, package: Package) -> Result<PathBuf> {
    let (flavour, scope) = debhelper::plan(package);
    debhelper::run(sh, ws, flavour, scope)?;
    copy_trees(flavour, package)?;
    Ok(package.tree())
}

/// Copies the package's tree and its debug symbols' (where it has any) out of the tree
/// dpkg-buildpackage ran in.
pub fn copy_trees(flavour: Flavour, package: Package) -> Result<()> {
    let debian = flavour.source_dir().join("debian");
    let name = package.deb_name();
    let pairs = [
        (debian.join(name), package.tree()),
        (
            debian.join(".debhelper").join(name).join("dbgsym-root"),
            package.dbgsym_tree(),
        ),
    ];
    for (from, to) in pairs {
        if to.exists() {
            std::fs::remove_dir_all(&to).with_context(|| format!("removing {}", to.display()))?;
        }
        if from.exists() {
            xtask_base::files::copy_path(&from, &to)?;
        }
    }
    Ok(())
}

/// Where mtgdrdrv-dkms installs debian/scripts/mtgdrdrv-load, which decides whether mtgdrdrv
/// may be loaded and loads it; the postinst runs it from there (`@LOAD_SCRIPT@`).
pub const LOAD_SCRIPT: &str = "/usr/lib/mtgdrdrv/mtgdrdrv-load";

/// mtgdrdrv-dkms's `script` (postinst, prerm) from debian/mtgdrdrv-dkms.<script>.in, as
/// debian/rules makes it: the module's version and mtgdrdrv-load's path filled in; then what
/// dh_installdeb does with the `#DEBHELPER#` line when no debhelper snippet applies (none does
/// here): it goes.
pub fn maintainer_script(script: &str, version: &str, load: &str) -> Result<String> {
    let text = template(
        &paths::root().join(format!("debian/mtgdrdrv-dkms.{script}.in")),
        &[("VERSION", version), ("LOAD_SCRIPT", load)],
    )?;
    Ok(text
        .lines()
        .filter(|l| l.trim() != "#DEBHELPER#")
        .map(|l| format!("{l}\n"))
        .collect())
}

/// debian/libgdrapi.symbols: its path, its text and the symbols it lists, sorted.
pub fn listed_symbols() -> Result<(PathBuf, String, Vec<String>)> {
    let path = paths::root().join("debian/libgdrapi.symbols");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let listed = symbols_listed(&text);
    Ok((path, text, listed))
}

/// The symbols a Debian symbols file lists (` name@Base version` lines), sorted.
fn symbols_listed(symbols_file: &str) -> Vec<String> {
    let mut names: Vec<String> = symbols_file
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.strip_suffix("@Base"))
        .map(str::to_owned)
        .collect();
    names.sort_unstable();
    names
}

/// `path` with every `@KEY@` replaced; fails if a placeholder is left.
pub fn template(path: &Path, values: &[(&str, &str)]) -> Result<String> {
    let mut text =
        fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    for (key, value) in values {
        text = text.replace(&format!("@{key}@"), value);
    }
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('@') {
        let key: Vec<u8> = bytes[at + 1..]
            .iter()
            .copied()
            .take_while(|b| b.is_ascii_uppercase() || *b == b'_')
            .collect();
        if !key.is_empty() && bytes.get(at + 1 + key.len()) == Some(&b'@') {
            bail!(
                "{}: no value for @{}@",
                path.display(),
                String::from_utf8_lossy(&key)
            );
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_from_a_symbols_file() {
        let file = "libgdrapi.so.1 libgdrapi #MINVER#\n\
                    * Build-Depends-Package: libgdrapi\n \
                    gdr_open@Base 1.0.0\n \
                    gdr_close@Base 1.0.0\n";
        assert_eq!(symbols_listed(file), ["gdr_close", "gdr_open"]);
    }
}
