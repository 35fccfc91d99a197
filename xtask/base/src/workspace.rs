//! What packaging needs to know about the crates, read from `cargo metadata`: versions (the
//! only source of the packages' versions) and the tools' binary names.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

use crate::{cargo, paths, targets};

#[derive(Clone, Debug)]
pub struct Crate {
    pub name: String,
    pub version: String,
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
    pub fn load(sh: &Shell) -> Result<Workspace> {
        let _cwd = sh.push_dir(paths::root());
        let json = cmd!(sh, "cargo metadata --format-version 1 --no-deps")
            .quiet()
            .read()
            .context("running cargo metadata")?;
        let meta: Value = serde_json::from_str(&json).context("parsing cargo metadata")?;
        let target_dir = meta["target_directory"]
            .as_str()
            .map(PathBuf::from)
            .context("cargo metadata has no target_directory")?;
        let mut crates = Vec::new();
        for p in meta["packages"].as_array().into_iter().flatten() {
            let text = |key: &str| -> Result<String> {
                p[key]
                    .as_str()
                    .map(String::from)
                    .with_context(|| format!("cargo metadata: a package without {key}"))
            };
            let mut bins: Vec<String> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "bin"))
                })
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect();
            bins.sort();
            crates.push(Crate {
                name: text("name")?,
                version: text("version")?,
                bins,
            });
        }
        Ok(Workspace {
            crates,
            target_dir,
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

    /// Where the packaged build (`build::packaged`, `cross::packaged`) puts its products.
    pub fn packaged_dir(&self) -> PathBuf {
        match self.target {
            Some(target) => targets::packaged_release_dir(target),
            None => cargo::packaged_target_dir(&self.target_dir).join("release"),
        }
    }
}
