//! The cross targets `--target` accepts and where their builds land. The toolchain that builds
//! for them is cross.rs's.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::paths;

/// A target other than the machine's, reached through Debian's cross toolchain.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    /// Rust's name, `--target`.
    pub triple: &'static str,
    /// Debian's architecture name (`Architecture:` of the packages).
    pub debian: &'static str,
    /// The multiarch tuple: library directory, and the GNU tools' prefix.
    pub multiarch: &'static str,
    /// The qemu-user emulator that runs its programs.
    pub qemu: &'static str,
}

pub const AARCH64: Target = Target {
    triple: "aarch64-unknown-linux-gnu",
    debian: "arm64",
    multiarch: "aarch64-linux-gnu",
    qemu: "qemu-aarch64",
};

/// The targets `--target` accepts besides the machine's own.
pub const TARGETS: &[&Target] = &[&AARCH64];

/// `--target TRIPLE` of `build` and `deb-*`: `None` for the machine's own triple (or none given).
pub fn parse(triple: Option<&str>) -> Result<Option<&'static Target>> {
    let Some(triple) = triple else {
        return Ok(None);
    };
    if triple == host_triple() {
        return Ok(None);
    }
    match TARGETS.iter().find(|t| t.triple == triple) {
        Some(t) => Ok(Some(*t)),
        None => bail!(
            "cannot build for {triple}: the cross targets are {} (and the machine's own, {})",
            TARGETS
                .iter()
                .map(|t| t.triple)
                .collect::<Vec<_>>()
                .join(", "),
            host_triple()
        ),
    }
}

/// The machine's own triple.
pub fn host_triple() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "aarch64-unknown-linux-gnu",
        _ => "x86_64-unknown-linux-gnu",
    }
}

/// The cross toolchain's target directory (next to the host's, never shared with it).
pub fn target_dir() -> PathBuf {
    paths::target_dir().join("cross")
}

/// Where the release build for `target` lands.
pub fn release_dir(target: &Target) -> PathBuf {
    target_dir().join(target.triple).join("release")
}

/// Where `build::packaged` puts its products for `target`.
pub fn packaged_release_dir(target: &Target) -> PathBuf {
    packaged_dir().join(target.triple).join("release")
}

/// The packaged build's target directory (inside the cross toolchain's, so mounted with it).
pub fn packaged_dir() -> PathBuf {
    crate::cargo::packaged_target_dir(&target_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(parse(None).ok(), Some(None));
        assert_eq!(
            parse(Some("aarch64-unknown-linux-gnu")).ok().flatten(),
            Some(&AARCH64).filter(|_| host_triple() != AARCH64.triple)
        );
        assert!(parse(Some("riscv64gc-unknown-linux-gnu")).is_err());
        assert_eq!(parse(Some(host_triple())).ok(), Some(None));
    }
}
