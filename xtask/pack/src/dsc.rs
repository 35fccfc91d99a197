//! `cargo xtask dist-source`: the Debian source package, in `build/source/`:
//! `mtgdrcopy_<version>.orig.tar.xz`, `mtgdrcopy_<version>-<revision>.debian.tar.xz` and the
//! `.dsc` that names both; what `apt-get source`, sbuild, pbuilder, a PPA or OBS take.
//!
//! The orig tarball is the release's source as a distribution builds it: the product crates
//! (mtgdrdrv with the module's sources, libgdrapi, mtgdrcopy-tests, mtgdrcopy-meta), dkms/,
//! docs/, README.md, LICENSE, CHANGELOG.md, insmod.sh, a workspace manifest listing only those
//! crates, its lock file pruned to them (no version changes: checked) and their dependencies
//! vendored in `vendor/`, so that the build needs no network. What only the developers' tests
//! use (xtask, all of `testing/`, the tools' VM tests, CI files) stays out: it needs a newer
//! Rust than Debian's and crates no package links; the tools' manifest loses the features that
//! would need it (shipped.rs). Files are taken from the working tree, but only
//! those git tracks; timestamps are the newest changelog entry's, owners root: the same tree
//! gives the same bytes.
//!
//! Its test, building the binary packages from it as a Debian build daemon would (`--check`,
//! and a step of `cargo xtask test`), is the test bench's: xtask-testbench's pkgtest/source.rs.

use fs_err as fs;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::workspace::Workspace;
use xtask_base::{chroot, debian, files, paths};

use crate::{shipped, versions};

/// Tracked paths (prefixes) left out of the orig tarball: developer tooling and test
/// infrastructure (all of `testing/`, and the tools' VM tests, which need the `vm` feature the
/// tarball's manifest no longer has), and debian/ (the .debian.tar.xz carries it).
const LEFT_OUT: &[&str] = &[
    ".cargo/",
    ".ci/",
    ".github/",
    "debian/",
    "libgdrapi/fuzz/",
    "mtgdrcopy-tests/tests/vm_module/",
    "testing/",
    "xtask/",
];

/// The files of a source package.
#[derive(Clone, Debug)]
pub struct SourcePackage {
    pub dsc: PathBuf,
    pub orig: PathBuf,
    pub debian: PathBuf,
}

/// Options of `cargo xtask dist-source`.
#[derive(clap::Args)]
pub struct Args {
    /// Then build the binary packages from it as a Debian build daemon would (trixie chroot,
    /// offline), run lintian, and compare them with `cargo xtask deb-all`'s.
    #[arg(long)]
    pub check: bool,
}

/// `cargo xtask dist-source` without `--check` (which the xtask binary hands to the bench):
/// writes the source package and prints its files.
pub fn cli() -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let source = build(&sh)?;
    for path in [&source.dsc, &source.orig, &source.debian] {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes the source package into `build/source/`.
pub fn build(sh: &Shell) -> Result<SourcePackage> {
    xtask_base::host::ensure_host_packages(&["dpkg-dev", "xz-utils"])?;
    let ws = Workspace::load()?;
    // The newest entry of debian/changelog: the name and version of the source package, and
    // SOURCE_DATE_EPOCH as dpkg-buildpackage and dpkg-source set it (its date).
    let entry = debian::Entry::read(&paths::root().join("debian/changelog"))?;
    let (name, version, epoch) = (entry.source, entry.version, entry.timestamp);
    ensure!(
        !epoch.is_empty(),
        "debian/changelog: the newest entry has no trailer"
    );
    let (upstream, _) = version
        .rsplit_once('-')
        .with_context(|| format!("debian/changelog: {version} has no Debian revision"))?;
    let meta = versions::upstream_version(&ws.krate("mtgdrcopy-meta")?.version);
    ensure!(
        upstream == meta,
        "debian/changelog is at {upstream}, the release (mtgdrcopy-meta) at {meta}: add a \
         changelog entry (dch -v {meta}-1)"
    );
    shipped::check_no_test_crates(sh)?;
    let out = paths::build_dir().join("source");
    files::fresh_dir(&out)?;
    let top = format!("{name}-{upstream}");
    let dir = out.join(&top);
    copy_tracked(sh, &dir, ".", LEFT_OUT)?;
    shipped::prune_test_features(&dir, LEFT_OUT)?;
    product_workspace(sh, &dir)?;
    vendor(sh, &dir)?;

    let orig = out.join(format!("{name}_{upstream}.orig.tar.xz"));
    cmd!(
        sh,
        "tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@{epoch} --format=gnu -I 'xz -6 -T1' -C {out} -cf {orig} {top}"
    )
    .quiet()
    .run()
    .context("tar of the orig tarball")?;

    // debian/ joins the unpacked tree; dpkg-source makes the .debian.tar.xz and the .dsc.
    copy_tracked(sh, &dir, "debian", &[])?;
    // dpkg-source sets SOURCE_DATE_EPOCH from debian/changelog itself.
    cmd!(sh, "env -C {out} dpkg-source --build {top}")
        .quiet()
        .ignore_stdout()
        .run()
        .context("dpkg-source --build failed")?;
    chroot::remove_tree(&dir)?;
    let source = SourcePackage {
        dsc: out.join(format!("{name}_{version}.dsc")),
        orig,
        debian: out.join(format!("{name}_{version}.debian.tar.xz")),
    };
    for path in [&source.dsc, &source.debian] {
        ensure!(path.exists(), "dpkg-source wrote no {}", path.display());
    }
    Ok(source)
}

/// Copies the files git tracks under `under` ("." for all), as they are in the working tree,
/// into `dir`, but those under the `left_out` prefixes.
pub fn copy_tracked(sh: &Shell, dir: &Path, under: &str, left_out: &[&str]) -> Result<()> {
    let root = paths::root();
    let _cwd = sh.push_dir(&root);
    let list = cmd!(sh, "git ls-files -z -- {under}")
        .quiet()
        .read()
        .context("git ls-files (the source tarball takes the files git tracks)")?;
    let files: Vec<&str> = list
        .split('\0')
        .filter(|f| !f.is_empty() && !left_out.iter().any(|p| f.starts_with(p)))
        // A tracked file deleted in the working tree is not part of what is built.
        .filter(|f| fs::symlink_metadata(root.join(f)).is_ok())
        .collect();
    fs::create_dir_all(dir)?;
    cmd!(sh, "cp --parents -t {dir} -- {files...}")
        .quiet()
        .run()
        .context("copying the files git tracks")?;
    // git keeps only whether a file is executable: 0755 or 0644, whatever the umask.
    cmd!(sh, "chmod -R u+rw,go-w,a+rX {dir}")
        .quiet()
        .run()
        .with_context(|| format!("chmod of {}", dir.display()))
}

/// The workspace manifest with only the product crates, and the lock file pruned to them.
fn product_workspace(sh: &Shell, dir: &Path) -> Result<()> {
    let manifest = dir.join("Cargo.toml");
    let mut doc: toml_edit::DocumentMut = fs::read_to_string(&manifest)?
        .parse()
        .context("parsing Cargo.toml")?;
    // The orig tarball's workspace has only the crates that build the packages.
    let members = toml_edit::value(toml_edit::Array::from_iter(paths::PRODUCTS));
    for key in ["members", "default-members"] {
        ensure!(
            doc["workspace"].get(key).is_some(),
            "Cargo.toml: no workspace {key}"
        );
        doc["workspace"][key] = members.clone();
    }
    files::put_text(&manifest, &doc.to_string(), 0o644)?;
    let original = lock_entries(&fs::read_to_string(paths::root().join("Cargo.lock"))?)?;
    // cargo drops the lock file's entries that no member needs; nothing else changes offline.
    cmd!(
        sh,
        "cargo metadata --offline --format-version 1 --manifest-path {manifest}"
    )
    .quiet()
    .ignore_stdout()
    .run()
    .context("cargo metadata on the product workspace (pruning Cargo.lock)")?;
    let pruned = lock_entries(&fs::read_to_string(dir.join("Cargo.lock"))?)?;
    let changed: Vec<&String> = pruned.difference(&original).collect();
    ensure!(
        changed.is_empty(),
        "pruning Cargo.lock changed entries: {changed:?}"
    );
    Ok(())
}

/// `name version checksum` of every package of a lock file.
fn lock_entries(lock: &str) -> Result<BTreeSet<String>> {
    let lock: toml_edit::DocumentMut = lock.parse().context("parsing Cargo.lock")?;
    let packages = lock["package"]
        .as_array_of_tables()
        .context("Cargo.lock has no [[package]]")?;
    Ok(packages
        .iter()
        .map(|p| {
            ["name", "version", "checksum"]
                .map(|k| p.get(k).and_then(|v| v.as_str()).unwrap_or(""))
                .join(" ")
        })
        .collect())
}

/// The product crates' dependencies in `vendor/<name>-<version>/` (`cargo vendor`), from the
/// machine's crate cache.
fn vendor(sh: &Shell, dir: &Path) -> Result<()> {
    let manifest = dir.join("Cargo.toml");
    let vendor = dir.join("vendor");
    let out = cmd!(
        sh,
        "cargo vendor --offline --locked --versioned-dirs --manifest-path {manifest} {vendor}"
    )
    .quiet()
    .ignore_status()
    .output()
    .context("running cargo vendor")?;
    ensure!(
        out.status.success(),
        "cargo vendor failed (the crates must be in the local cache: cargo fetch):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    prune_prebuilt(&vendor)
}

/// File names of prebuilt binaries, which some crates carry as test fixtures (libloading's
/// Windows DLLs): a source package holds no binary it cannot rebuild.
fn prebuilt(name: &str) -> bool {
    [".dll", ".exe", ".lib", ".a", ".so", ".dylib", ".o", ".obj"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

/// Removes prebuilt binaries from the vendored crates, and their entries from the crate's
/// `.cargo-checksum.json` (cargo checks the files it lists, and only those).
fn prune_prebuilt(vendor: &Path) -> Result<()> {
    for entry in fs::read_dir(vendor)? {
        let krate = entry?.path();
        let sums_path = krate.join(".cargo-checksum.json");
        let text = fs::read_to_string(&sums_path)?;
        let mut sums: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", sums_path.display()))?;
        let files = sums["files"]
            .as_object_mut()
            .with_context(|| format!("{}: no \"files\"", sums_path.display()))?;
        let doomed: Vec<String> = files.keys().filter(|f| prebuilt(f)).cloned().collect();
        if doomed.is_empty() {
            continue;
        }
        for file in &doomed {
            files.remove(file);
            let path = krate.join(file);
            fs::remove_file(&path)?;
        }
        fs::write(&sums_path, serde_json::to_string(&sums)?)?;
        eprintln!(
            "    vendor/{}: left out {}",
            krate.file_name().unwrap_or_default().to_string_lossy(),
            doomed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_entries_name_version_checksum() -> Result<()> {
        let lock = "version = 4\n\n[[package]]\nname = \"a\"\nversion = \"1.0.0\"\n\
                    checksum = \"ab\"\n\n[[package]]\nname = \"b\"\nversion = \"0.1.0\"\n";
        let entries = lock_entries(lock)?;
        assert!(entries.contains("a 1.0.0 ab"));
        assert!(entries.contains("b 0.1.0 "));
        assert_eq!(entries.len(), 2);
        Ok(())
    }

    #[test]
    fn the_test_trees_stay_out_of_the_tarball() {
        for tree in shipped::TEST_TREES {
            assert!(LEFT_OUT.contains(tree), "{tree} is not left out");
        }
    }

    #[test]
    fn prebuilt_binaries_are_recognised() {
        assert!(prebuilt("tests/nagisa64.dll"));
        assert!(prebuilt("lib/windows.0.52.0.lib"));
        assert!(!prebuilt("src/lib.rs"));
        assert!(!prebuilt("Cargo.toml.orig"));
    }
}
