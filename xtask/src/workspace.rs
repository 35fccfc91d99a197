//! What packaging needs to know about the crates, read from `cargo metadata`: versions (the
//! only source of the packages' versions), the tools' binary names and each crate's
//! `[package.metadata.deb]` revision.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

use crate::paths;

#[derive(Clone, Debug)]
pub struct Crate {
    pub name: String,
    pub version: String,
    pub manifest_path: PathBuf,
    /// Binary targets, sorted.
    pub bins: Vec<String>,
    metadata: Value,
}

impl Crate {
    /// `[package.metadata.deb]` key `key`, from `variants.<variant>` first when given.
    pub fn deb_key(&self, variant: Option<&str>, key: &str) -> Option<&str> {
        let deb = self.metadata.get("deb")?;
        variant
            .and_then(|v| deb.get("variants")?.get(v)?.get(key)?.as_str())
            .or_else(|| deb.get(key)?.as_str())
    }

    /// The Debian version cargo-deb gives the package: the crate version (a semver pre-release
    /// `-beta.1` becomes `~beta.1`, so that it sorts before the release) and the revision
    /// (`[package.metadata.deb] revision`, default 1). `deb.rs` checks the result against the
    /// control file cargo-deb wrote, so the two cannot drift apart unnoticed.
    pub fn debian_version(&self, variant: Option<&str>) -> String {
        let mut version = self.version.clone();
        if let Some((main, pre)) = self.version.split_once('-') {
            let has_digit = pre.bytes().any(|c| c.is_ascii_digit());
            let has_other = pre.bytes().any(|c| !c.is_ascii_digit());
            if has_digit && has_other {
                version = format!("{main}~{pre}");
            }
        }
        let revision = self.deb_key(variant, "revision").unwrap_or("1");
        if !revision.is_empty() && revision != "0" {
            version.push('-');
            version.push_str(revision);
        }
        version
    }

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
    pub target: Option<&'static crate::cross::Target>,
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
                manifest_path: PathBuf::from(text("manifest_path")?),
                bins,
                metadata: p["metadata"].clone(),
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
    pub fn for_target(self, target: Option<&'static crate::cross::Target>) -> Workspace {
        Workspace { target, ..self }
    }

    /// Where `cargo build --release` puts its products (for the cross target, if any).
    pub fn release_dir(&self) -> PathBuf {
        match self.target {
            Some(target) => crate::cross::release_dir(target),
            None => self.target_dir.join("release"),
        }
    }

    /// Where the packaged build (`build::packaged`, `cross::packaged`) puts its products.
    pub fn packaged_dir(&self) -> PathBuf {
        match self.target {
            Some(target) => crate::cross::packaged_release_dir(target),
            None => crate::build::packaged_target_dir(&self.target_dir).join("release"),
        }
    }
}
