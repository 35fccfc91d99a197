//! The minimum supported Rust version (`rust-version` in the workspace's Cargo.toml) kept true
//! without a toolchain of that version (rustup here cannot fetch one):
//! - our code: clippy's `incompatible_msrv` lint (on by default, an error under `-D warnings`)
//!   rejects any standard library item stabilised after `rust-version`;
//! - our dependencies: this check, that every crate in the lock file's resolution declares a
//!   `rust-version` no newer than ours (cargo would refuse to build it with that toolchain);
//! - the newest end: the arm64 steps build with Debian's rustc (cross.rs), the host's rustup
//!   toolchain builds everything else.

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

use crate::paths;

/// `major.minor[.patch]` as a comparable triple.
fn parse(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor, patch))
}

/// The crates (name, version, rust-version) that need a newer Rust than `msrv`.
fn too_new(packages: &[Value], msrv: (u32, u32, u32)) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for p in packages {
        let Some(rv) = p["rust_version"].as_str() else {
            continue;
        };
        let name = p["name"].as_str().unwrap_or("?");
        let version = p["version"].as_str().unwrap_or("?");
        let parsed = parse(rv).with_context(|| format!("{name}: rust-version {rv:?}"))?;
        if parsed > msrv {
            found.push(format!("{name} {version} (rust-version {rv})"));
        }
    }
    Ok(found)
}

/// The test step: the workspace's rust-version, and no dependency needing a newer one.
pub fn check(sh: &Shell) -> Result<()> {
    let _cwd = sh.push_dir(paths::root());
    let json = cmd!(sh, "cargo metadata --format-version 1 --locked --offline")
        .quiet()
        .read()
        .context("running cargo metadata")?;
    let meta: Value = serde_json::from_str(&json).context("parsing cargo metadata")?;
    let packages = meta["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let members: Vec<&Value> = meta["workspace_members"]
        .as_array()
        .context("cargo metadata has no workspace_members")?
        .iter()
        .collect();
    let ours: Vec<&str> = packages
        .iter()
        .filter(|p| members.contains(&&p["id"]))
        .map(|p| p["rust_version"].as_str().unwrap_or(""))
        .collect();
    let msrv = ours.first().copied().unwrap_or("");
    ensure!(
        !msrv.is_empty() && ours.iter().all(|v| *v == msrv),
        "every workspace crate must take rust-version from the workspace (got {ours:?})"
    );
    let msrv_parsed = parse(msrv).with_context(|| format!("workspace rust-version {msrv:?}"))?;
    let newer = too_new(packages, msrv_parsed)?;
    ensure!(
        newer.is_empty(),
        "dependencies need a newer Rust than rust-version {msrv}: {}",
        newer.join(", ")
    );
    eprintln!(
        "    rust-version {msrv}: {} crates, none needs a newer Rust",
        packages.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(parse("1.89"), Some((1, 89, 0)));
        assert_eq!(parse("1.85.0"), Some((1, 85, 0)));
        assert!(parse("1.100").unwrap() > parse("1.89").unwrap());
        assert_eq!(parse("1"), None);
        assert_eq!(parse("1.x"), None);
    }

    #[test]
    fn newer_dependencies_are_named() {
        let packages: Vec<Value> = serde_json::from_str(
            r#"[{"name": "a", "version": "1.0.0", "rust_version": "1.88.0"},
                {"name": "b", "version": "2.0.0", "rust_version": "1.90"},
                {"name": "c", "version": "0.1.0", "rust_version": null}]"#,
        )
        .unwrap();
        let newer = too_new(&packages, (1, 89, 0)).unwrap();
        assert_eq!(newer, ["b 2.0.0 (rust-version 1.90)"]);
        assert!(too_new(&packages, (1, 90, 0)).unwrap().is_empty());
    }
}
