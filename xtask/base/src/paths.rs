//! Where things live in the tree.

use std::path::{Path, PathBuf};

/// The product crates, each in the directory of its name: what the packages and the source
/// tarball are made of. The other members (the xtask crates, the fuzzer, the emulated libmusa)
/// are development tools.
pub const PRODUCTS: [&str; 4] = ["mtgdrdrv", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy-meta"];

pub fn root() -> PathBuf {
    // This crate is xtask/base/.
    let base_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    base_dir.ancestors().nth(2).unwrap_or(base_dir).into()
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the root), else `target/`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// Where `cargo build --release` puts the machine's own products.
pub fn release_dir() -> PathBuf {
    target_dir().join("release")
}

/// The emulated libmusa's own target directory (`build::emulated_musa`): beside cargo's, never
/// inside target/release.
pub fn emulated_musa_target_dir() -> PathBuf {
    target_dir().join("emulated-musa")
}

pub fn build_dir() -> PathBuf {
    root().join("build")
}

/// Downloads and chroots live outside the repository so that clean clones rerun fast.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MTGDRCOPY_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    home.join(".cache").join("mtgdrcopy")
}

/// Cargo's home (the crate registry's sources are under it): `$CARGO_HOME`, else `~/.cargo`.
pub fn cargo_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    home.join(".cargo")
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_is_the_workspace_root() {
        let manifest = std::fs::read_to_string(super::root().join("Cargo.toml")).unwrap();
        assert!(manifest.starts_with("[workspace]"), "{manifest}");
    }
}
