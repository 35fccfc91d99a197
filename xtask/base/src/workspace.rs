//! What packaging needs to know about the crates, read from `cargo metadata`: versions (the
//! only source of the packages' versions) and the tools' binary names.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::{cargo, paths, targets};

#[derive(Clone, Debug)]
pub struct Crate {
    pub name: String,
    pub version: String,
    /// `rust-version`, as cargo reads it (`1.85` is `1.85.0`); `None` if undeclared.
    pub rust_version: Option<String>,
    /// Binary targets, sorted.
    pub bins: Vec<String>,
}

impl Crate {
    /// `major.minor` of the crate version.
    pub fn major_minor(&self) -> Result<(u32, u32)> {
        let mut parts = self.version.split(['.', '-', '+']);
        let mut next = |what: &str| -> Result<u32> {
            parts
                .next()
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("{}: no {what} in version {}", self.name, self.version))
        };
        Ok((next("major")?, next("minor")?))
    }
}

#[derive(Clone, Debug)]
pub struct Workspace {
    pub crates: Vec<Crate>,
    pub target_dir: PathBuf,
    /// The cross target packages are built for; `None`: the machine's own architecture.
    pub target: Option<&'static targets::Target>,
}

impl Workspace {
    pub fn load() -> Result<Workspace> {
        let meta = crate::cargo::metadata(&paths::root(), &["--no-deps"])?;
        let crates = meta
            .packages
            .into_iter()
            .map(|p| {
                let mut bins: Vec<String> = p
                    .targets
                    .into_iter()
                    .filter(|t| t.is_bin())
                    .map(|t| t.name)
                    .collect();
                bins.sort();
                Crate {
                    name: p.name.into_inner(),
                    version: p.version.to_string(),
                    rust_version: p.rust_version.map(|v| v.to_string()),
                    bins,
                }
            })
            .collect();
        Ok(Workspace {
            crates,
            target_dir: meta.target_directory.into_std_path_buf(),
            target: None,
        })
    }

    pub fn krate(&self, name: &str) -> Result<&Crate> {
        match self.crates.iter().find(|c| c.name == name) {
            Some(c) => Ok(c),
            None => bail!("the workspace has no crate {name}"),
        }
    }

    /// The same workspace, packaged for `target` (see [`Workspace::target`]).
    pub fn for_target(self, target: Option<&'static targets::Target>) -> Workspace {
        Workspace { target, ..self }
    }

    /// Where `cargo build --release` puts its products (for the cross target, if any).
    pub fn release_dir(&self) -> PathBuf {
        match self.target {
            Some(target) => targets::release_dir(target),
            None => self.target_dir.join("release"),
        }
    }

    /// Where the packaged build (`build::packaged`) puts its products.
    pub fn packaged_dir(&self) -> PathBuf {
        match self.target {
            Some(target) => targets::packaged_release_dir(target),
            // cargo-zigbuild builds with --target, also for the machine's own (zigbuild.rs).
            None => cargo::packaged_target_dir(&self.target_dir)
                .join(targets::host_triple())
                .join("release"),
        }
    }
}
