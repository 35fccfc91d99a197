//! The packaged (reproducible) build's target directory and rustc flags, shared by the native
//! build (build.rs) and the cross one (cross.rs); and `cargo metadata`, read through
//! cargo_metadata's types.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cargo_metadata::{Metadata, MetadataCommand};

/// The packaged build's target directory, inside `target_dir` (cargo's).
pub fn packaged_target_dir(target_dir: &Path) -> PathBuf {
    target_dir.join("packaged")
}

/// Where the sources appear in the packaged binaries (panic locations, debug info): the same
/// for every checkout, so that two builds of one commit give the same bytes.
pub const REMAPPED_ROOT: &str = "/usr/src/mtgdrcopy";

/// rustc flags that take the build machine's paths out of the binaries: the workspace `root`,
/// the `target_dir` (build scripts' OUT_DIR) and cargo's home `cargo_home` (the crate
/// registry's sources) become fixed paths. Nothing else of the machine is embedded: no time
/// (no build script or crate reads the clock, so SOURCE_DATE_EPOCH is not needed), and the
/// standard library's paths are already remapped by the toolchain's build. Same toolchain
/// (rust-toolchain.toml), same Cargo.lock, these flags: the same bytes.
///
/// Each path is remapped as given and, when it differs, with symbolic links resolved (for
/// cargo's home, also its registry and git directories, which CI caches may link elsewhere):
/// cargo passes the sources' paths as it has them, but rustc records its working directory (a
/// dependency's own directory) as the kernel reports it, resolved.
pub fn reproducible_rustflags(root: &Path, target_dir: &Path, cargo_home: &Path) -> Vec<String> {
    // When several prefixes match, rustc applies the last one: the target directory is usually
    // inside the workspace.
    let mut flags = Vec::new();
    let mut remap = |from: &Path, to: &str, resolved_only: bool| {
        let resolved = std::fs::canonicalize(from).ok();
        let given = (!resolved_only).then_some(from);
        let resolved = resolved.as_deref().filter(|r| *r != from);
        for from in given.into_iter().chain(resolved) {
            flags.push(format!("--remap-path-prefix={}={to}", from.display()));
        }
    };
    remap(root, REMAPPED_ROOT, false);
    remap(target_dir, &format!("{REMAPPED_ROOT}/target"), false);
    remap(cargo_home, "/cargo", false);
    for dir in ["registry", "git"] {
        remap(&cargo_home.join(dir), &format!("/cargo/{dir}"), true);
    }
    flags
}

/// `flags` as CARGO_ENCODED_RUSTFLAGS (separated by 0x1f, so paths may contain spaces).
pub fn encode_rustflags(flags: &[String]) -> String {
    flags.join("\x1f")
}

/// `cargo metadata OPTIONS` of the workspace at `root`, parsed.
pub fn metadata(root: &Path, options: &[&str]) -> Result<Metadata> {
    MetadataCommand::new()
        .current_dir(root)
        .other_options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .exec()
        .with_context(|| format!("running cargo metadata {}", options.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packaged_builds_remap_the_machine_paths() {
        let flags = reproducible_rustflags(
            Path::new("/home/me/src/mtgdrcopy"),
            Path::new("/home/me/src/mtgdrcopy/target/packaged"),
            Path::new("/home/me/.cargo"),
        );
        // The target directory after the workspace: rustc applies the last matching prefix.
        assert_eq!(
            flags,
            [
                "--remap-path-prefix=/home/me/src/mtgdrcopy=/usr/src/mtgdrcopy",
                "--remap-path-prefix=/home/me/src/mtgdrcopy/target/packaged=/usr/src/mtgdrcopy/target",
                "--remap-path-prefix=/home/me/.cargo=/cargo",
            ]
        );
        let encoded = encode_rustflags(&flags);
        assert_eq!(encoded.split('\x1f').collect::<Vec<_>>(), flags);
        // A path with a space stays one argument.
        let spaced = reproducible_rustflags(Path::new("/a b"), Path::new("/t"), Path::new("/c"));
        assert_eq!(encode_rustflags(&spaced).split('\x1f').count(), 3);
    }

    #[test]
    fn paths_through_symbolic_links_are_remapped_resolved_too() {
        let dir = std::env::temp_dir().join(format!("xtask-remap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real/.cargo")).unwrap();
        std::fs::create_dir_all(dir.join("cache/registry")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("home")).unwrap();
        std::os::unix::fs::symlink(dir.join("cache/registry"), dir.join("real/.cargo/registry"))
            .unwrap();
        let home = dir.join("home/.cargo");
        let resolved = std::fs::canonicalize(&home).unwrap();
        let registry = std::fs::canonicalize(dir.join("cache/registry")).unwrap();
        let flags = reproducible_rustflags(Path::new("/nonexistent"), Path::new("/nt"), &home);
        std::fs::remove_dir_all(&dir).unwrap();
        // Paths that do not exist (or are already resolved) are remapped once, as given; the
        // registry (git does not exist) only resolved, its given path is under cargo's home.
        assert_eq!(
            flags[2..],
            [
                format!("--remap-path-prefix={}=/cargo", home.display()),
                format!("--remap-path-prefix={}=/cargo", resolved.display()),
                format!("--remap-path-prefix={}=/cargo/registry", registry.display()),
            ]
        );
    }
}
