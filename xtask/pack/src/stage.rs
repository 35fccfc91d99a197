//! The packages and where their trees are staged: `build/pkg/<package>/`, with its `DEBIAN/`
//! control files, exactly what its .deb holds; `build/pkg/<package>-dbgsym/` holds the debug
//! symbols split off its ELF files (`cargo xtask build-*`, debhelper.rs).

use fs_err as fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use xtask_base::paths;

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

/// `path` with every `@KEY@` replaced; fails if a placeholder is left.
pub fn template(path: &Path, values: &[(&str, &str)]) -> Result<String> {
    let mut text = fs::read_to_string(path)?;
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
