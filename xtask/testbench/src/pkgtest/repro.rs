//! Reproducible packages: the .debs of `cargo xtask deb-all` built a second time, from a copy of
//! the tree at another path with a target directory of its own, must be the same bytes.
//!
//! What makes them so: the toolchain is pinned (rust-toolchain.toml); the release build maps
//! the tree and the cargo home out of the binaries (`--remap-path-prefix`, build.rs); file
//! times in the archives are the changelog's date (SOURCE_DATE_EPOCH, deb.rs), owners root,
//! members sorted (dpkg-deb); the static library is a deterministic archive.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;
use xtask_pack::deb::Built;
use xtask_pack::dsc;
use xtask_pack::stage::Package;

/// The second tree: a copy of the tracked files, kept between runs so that its cargo build is
/// incremental (the copy is refreshed, its target directory is not).
fn second_tree() -> PathBuf {
    paths::build_dir().join("repro")
}

/// The test step: `built` (this tree's deb-all) against the same packages built in the copy.
pub fn test_step(sh: &Shell, built: &[Built]) -> Result<()> {
    let dir = second_tree();
    let tree = dir.join("tree");
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    dsc::copy_tracked(sh, &tree, ".", &[])?;
    let target = dir.join("target");
    {
        let _cwd = sh.push_dir(&tree);
        cmd!(sh, "cargo xtask deb-all")
            .env("CARGO_TARGET_DIR", &target)
            .quiet()
            .ignore_stdout()
            .run()
            .context("cargo xtask deb-all in the second tree")?;
    }
    let mut compared = 0;
    let mut differ = Vec::new();
    for b in built.iter().filter(|b| b.package != Package::Bundle) {
        for deb in std::iter::once(&b.path).chain(b.dbgsym.iter()) {
            let name = deb.file_name().context("a .deb has no name")?;
            let twin = tree.join("build").join(name);
            if !same_bytes(deb, &twin)? {
                differ.push(name.to_string_lossy().into_owned());
            }
            compared += 1;
        }
    }
    ensure!(
        differ.is_empty(),
        "built twice, these .debs differ: {} (compare {} with {})",
        differ.join(", "),
        paths::build_dir().display(),
        tree.join("build").display()
    );
    eprintln!("    {compared} .debs built twice, at two paths: identical");
    Ok(())
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    let read = |p: &Path| fs::read(p).with_context(|| format!("reading {}", p.display()));
    Ok(read(a)? == read(b)?)
}
