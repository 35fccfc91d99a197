//! The third-party part of debian/copyright, written by `cargo xtask codegen` from the lock file
//! (`cargo metadata --locked`), so that a dependency change leaves it stale for
//! `codegen --check` instead of silently wrong.
//!
//! Covered: every crate the product crates reach through normal, build and dev dependencies on
//! every platform, which is what `cargo vendor --versioned-dirs` puts under
//! `vendor/<name>-<version>/` in the source tarball; xtask's, the fuzzer's and the emulated
//! libmusa's own dependencies are development tools, neither shipped nor vendored. One Files
//! paragraph each, saying whether the binary packages link it; one for the Rust standard
//! library, which every Rust binary links; then one standalone License paragraph per short
//! name that the hand-written part above does not already give. Copyright holders are the
//! copyright lines of a crate's licence files and its Cargo.toml `authors`; licence texts are
//! the SPDX licence list's, or a pointer to those Debian ships in /usr/share/common-licenses.

mod crates;
mod render;
mod spdx;

use fs_err as fs;
use std::path::Path;

use anyhow::Result;

use xtask_base::generated::Generated;

use crate::identity::Identity;

use crates::{dependencies, metadata, TARGETS};
use render::copyright;

/// debian/copyright with its generated part and header fields up to date.
pub fn generate(root: &Path, identity: &Identity) -> Result<Generated> {
    let path = root.join("debian/copyright");
    let current = fs::read_to_string(&path)?;
    let all = metadata(root, None)?;
    let per_target = TARGETS
        .iter()
        .map(|t| metadata(root, Some(t)))
        .collect::<Result<Vec<_>>>()?;
    let contents = copyright(&current, identity, &dependencies(&all, &per_target)?)?;
    Ok(Generated { path, contents })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Usage {
    /// Statically linked into these binary packages.
    Linked(Vec<&'static str>),
    /// Compiled for Linux but not linked: build scripts, procedural macros, tests.
    Build,
    /// A dependency on other platforms only.
    Vendored,
}

#[derive(Clone, Debug)]
struct Dep {
    name: String,
    version: String,
    /// Cargo.toml `license` (SPDX).
    license: Option<String>,
    /// Cargo.toml `license-file`.
    license_file: Option<String>,
    /// The Copyright field's lines.
    holders: Vec<String>,
    usage: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    use xtask_base::{debian, paths};

    /// The committed file: every licence given once, valid for dpkg's parser, header from
    /// debian/control.
    #[test]
    fn the_committed_copyright_is_valid() {
        let path = paths::root().join("debian/copyright");
        let text = fs::read_to_string(&path).unwrap();
        let paragraphs = debian::parse(&text).unwrap();
        let header = &paragraphs[0];
        let id = crate::identity::identity().unwrap();
        assert_eq!(header.get("Upstream-Contact"), Some(id.maintainer.as_str()));
        assert_eq!(header.get("Source"), Some(id.homepage.as_str()));
        assert!(text.contains("\nFiles: vendor/libloading-"));
        // Each short name the Files paragraphs use has exactly one standalone License
        // paragraph, and no other has one, as lintian checks (here also without lintian).
        let (files, standalone): (Vec<_>, Vec<_>) = paragraphs[1..]
            .iter()
            .partition(|p| p.get("Files").is_some());
        let mut given: Vec<&str> = standalone
            .iter()
            .map(|p| p.get("License").unwrap().split_once('\n').unwrap().0)
            .collect();
        given.sort_unstable();
        let mut used = BTreeSet::new();
        for p in files {
            let licence = p.get("License").unwrap().replace(',', "");
            for names in licence.split(" or ") {
                used.extend(names.split(" and ").map(String::from));
            }
        }
        assert_eq!(given, used.iter().map(String::as_str).collect::<Vec<_>>());

        let has_dpkg = std::process::Command::new("perl")
            .args(["-MDpkg::Control::HashCore", "-e", "1"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_dpkg {
            eprintln!("skipped dpkg's parser: no perl with Dpkg::Control (package libdpkg-perl)");
            return;
        }
        let script = "open(my $fh, '<', $ARGV[0]) or die; my $n = 0; \
                      while (Dpkg::Control::HashCore->new->parse($fh, $ARGV[0])) { $n++ } \
                      print $n";
        let out = std::process::Command::new("perl")
            .args(["-MDpkg::Control::HashCore", "-e", script])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let count = debian::parse(&text).unwrap().len();
        assert_eq!(String::from_utf8_lossy(&out.stdout), count.to_string());
    }
}
