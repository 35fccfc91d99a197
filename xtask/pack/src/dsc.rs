//! `cargo xtask dist-source`: the Debian source package, in `build/source/`:
//! `mtgdrcopy_<version>.orig.tar.xz`, `mtgdrcopy_<version>-<revision>.debian.tar.xz` and the
//! `.dsc` that names both; what `apt-get source`, sbuild, pbuilder, a PPA or OBS take.
//!
//! The orig tarball is the release's source as a distribution builds it: the product crates
//! (mtgdrdrv with the module's sources, libgdrapi, mtgdrcopy-tests, mtgdrcopy-meta), dkms/,
//! docs/, README.md, insmod.sh, a workspace manifest listing only those crates, its lock file
//! pruned to them (no version changes: checked) and their dependencies vendored in `vendor/`,
//! so that the build needs no network. What only the developers' tests use (xtask, the
//! emulated provider and libmusa, the fuzzers, CI files) stays out: it needs a newer Rust than
//! Debian's and crates no package links. Files are taken from the working tree, but only
//! those git tracks; timestamps are the newest changelog entry's, owners root: the same tree
//! gives the same bytes.
//!
//! The test step (`cargo xtask test`) builds the binary packages from that source package the
//! way a Debian build daemon would: `dpkg-buildpackage -b` in a clean trixie chroot whose
//! Build-Depends come from Debian only (its rustc and cargo), without a network. Then lintian
//! checks the .dsc and the .debs, and the packages must hold the same files, with the same
//! control fields, as `cargo xtask deb-all`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::debian::{self, Control};
use xtask_base::workspace::Workspace;
use xtask_base::{chroot, files, paths};

use crate::deb::{self, Built};
use crate::stage::Package;

/// Tracked paths (prefixes) left out of the orig tarball: developer tooling and test
/// infrastructure, and debian/ (the .debian.tar.xz carries it).
const LEFT_OUT: &[&str] = &[
    ".cargo/",
    ".ci/",
    ".github/",
    "debian/",
    "libgdrapi/fuzz/",
    "testing/copy-harness/",
    "testing/fuzz/",
    "testing/mtgpu-emu/",
    "testing/musa-emu/",
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
    check: bool,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    if args.check {
        let ws = Workspace::load(&sh)?;
        let built = deb::build_everything(&sh, &ws)?;
        return test_step(&sh, &built);
    }
    let source = build(&sh)?;
    for path in [&source.dsc, &source.orig, &source.debian] {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes the source package into `build/source/`.
pub fn build(sh: &Shell) -> Result<SourcePackage> {
    xtask_base::host::ensure_host_packages(&["dpkg-dev", "xz-utils"])?;
    let ws = Workspace::load(sh)?;
    let control = Control::load()?;
    let name = control.source_name().to_owned();
    let changelog = fs::read_to_string(paths::root().join("debian/changelog"))?;
    let version = debian::changelog_version(&changelog)
        .context("debian/changelog has no version")?
        .to_owned();
    let (upstream, _) = version
        .rsplit_once('-')
        .with_context(|| format!("debian/changelog: {version} has no Debian revision"))?;
    let meta = deb::upstream_version(&ws.krate("mtgdrcopy-meta")?.version);
    ensure!(
        upstream == meta,
        "debian/changelog is at {upstream}, the release (mtgdrcopy-meta) at {meta}: add a \
         changelog entry (dch -v {meta}-1)"
    );
    let out = paths::build_dir().join("source");
    files::fresh_dir(&out)?;
    let dir = out.join(format!("{name}-{upstream}"));
    copy_tracked(sh, &dir, LEFT_OUT)?;
    product_workspace(sh, &dir)?;
    vendor(sh, &dir)?;

    let epoch = deb::source_date_epoch(sh)?;
    let orig = out.join(format!("{name}_{upstream}.orig.tar.xz"));
    let top = dir
        .file_name()
        .context("the source directory has no name")?
        .to_owned();
    let tar = cmd!(
        sh,
        "tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@{epoch} --format=gnu -C {out} -cf - {top}"
    )
    .quiet()
    .output()
    .context("tar of the orig tarball")?;
    ensure!(
        tar.status.success(),
        "tar failed: {}",
        String::from_utf8_lossy(&tar.stderr)
    );
    let xz = cmd!(sh, "xz -6 -T1 -c")
        .stdin(tar.stdout)
        .quiet()
        .output()
        .context("xz of the orig tarball")?;
    ensure!(xz.status.success(), "xz failed");
    fs::write(&orig, xz.stdout).with_context(|| format!("writing {}", orig.display()))?;

    // debian/ joins the unpacked tree; dpkg-source makes the .debian.tar.xz and the .dsc.
    for file in tracked(sh, "debian")? {
        copy_file(&paths::root().join(&file), &dir.join(&file))?;
    }
    {
        let _cwd = sh.push_dir(&out);
        let top = top.clone();
        cmd!(sh, "dpkg-source --build {top}")
            .env("SOURCE_DATE_EPOCH", &epoch)
            .quiet()
            .ignore_stdout()
            .run()
            .context("dpkg-source --build failed")?;
    }
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

/// The paths git tracks under `under` ("." for all), relative to the root.
fn tracked(sh: &Shell, under: &str) -> Result<Vec<String>> {
    let _cwd = sh.push_dir(paths::root());
    let list = cmd!(sh, "git ls-files -z -- {under}")
        .quiet()
        .read()
        .context("git ls-files (the source tarball takes the files git tracks)")?;
    Ok(list
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect())
}

/// Copies the files git tracks, as they are in the working tree, into `dir`, but those under
/// the `left_out` prefixes.
pub fn copy_tracked(sh: &Shell, dir: &Path, left_out: &[&str]) -> Result<()> {
    let root = paths::root();
    for file in tracked(sh, ".")? {
        if left_out.iter().any(|p| file.starts_with(p)) {
            continue;
        }
        let from = root.join(&file);
        // A tracked file deleted in the working tree is not part of what is built.
        if fs::symlink_metadata(&from).is_err() {
            continue;
        }
        copy_file(&from, &dir.join(&file))?;
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(from)
        .with_context(|| format!("reading {}", from.display()))?
        .permissions()
        .mode();
    // git keeps only whether a file is executable.
    let mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
    files::put_file(from, to, mode)
}

/// The workspace manifest with only the product crates, and the lock file pruned to them.
fn product_workspace(sh: &Shell, dir: &Path) -> Result<()> {
    let manifest = dir.join("Cargo.toml");
    let text = fs::read_to_string(&manifest)?;
    // The orig tarball's workspace has only the crates that build the packages.
    let members = paths::PRODUCTS
        .iter()
        .map(|m| format!("\"{m}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut replaced = 0;
    let edited: String = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or_default().trim();
            if key == "members" || key == "default-members" {
                replaced += 1;
                format!("{key} = [{members}]\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    ensure!(
        replaced == 2,
        "Cargo.toml: expected one `members` and one `default-members` line, found {replaced}"
    );
    files::put_text(&manifest, &edited, 0o644)?;
    let original = lock_entries(&fs::read_to_string(paths::root().join("Cargo.lock"))?);
    // cargo drops the lock file's entries that no member needs; nothing else changes offline.
    cmd!(
        sh,
        "cargo metadata --offline --format-version 1 --manifest-path {manifest}"
    )
    .quiet()
    .ignore_stdout()
    .run()
    .context("cargo metadata on the product workspace (pruning Cargo.lock)")?;
    let pruned = lock_entries(&fs::read_to_string(dir.join("Cargo.lock"))?);
    let changed: Vec<&String> = pruned.difference(&original).collect();
    ensure!(
        changed.is_empty(),
        "pruning Cargo.lock changed entries: {changed:?}"
    );
    Ok(())
}

/// `name version checksum` of every package of a lock file.
fn lock_entries(lock: &str) -> BTreeSet<String> {
    let mut entries = BTreeSet::new();
    for block in lock.split("[[package]]").skip(1) {
        let value = |key: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key} = ")))
                .unwrap_or_default()
                .trim_matches('"')
                .to_owned()
        };
        entries.insert(format!(
            "{} {} {}",
            value("name"),
            value("version"),
            value("checksum")
        ));
    }
    entries
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
        let text = fs::read_to_string(&sums_path)
            .with_context(|| format!("reading {}", sums_path.display()))?;
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
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
        fs::write(&sums_path, serde_json::to_string(&sums)?)
            .with_context(|| format!("writing {}", sums_path.display()))?;
        eprintln!(
            "    vendor/{}: left out {}",
            krate.file_name().unwrap_or_default().to_string_lossy(),
            doomed.join(", ")
        );
    }
    Ok(())
}

/// The trixie chroot the source package is built in: build-essential and the Build-Depends of
/// debian/control, from Debian; remade when those change.
fn build_chroot(sh: &Shell) -> Result<chroot::Chroot> {
    let control = Control::load()?;
    let depends = control
        .source
        .get("Build-Depends")
        .context("debian/control has no Build-Depends")?;
    let mut names: Vec<String> = depends
        .split(',')
        .filter_map(|d| d.split_whitespace().next())
        .map(|n| n.split(':').next().unwrap_or(n).to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    // debhelper-compat is a virtual package debhelper provides.
    let packages: Vec<String> = ["build-essential", "dpkg-dev", "debhelper"]
        .into_iter()
        .map(String::from)
        .chain(names.into_iter().filter(|n| n != "debhelper-compat"))
        .collect();
    let recipe = format!("debbuild 1: {}", packages.join(" "));
    let log = paths::build_dir().join("logs/trixie-build-chroot.log");
    chroot::prepare_named(
        sh,
        "trixie-build",
        "trixie",
        &recipe,
        false,
        &log,
        |sh, root, log| {
            chroot::run_logged(
                chroot::command(sh, root, None, "apt-get").arg("update"),
                log,
                "apt-get update",
            )?;
            chroot::run_logged(
                chroot::command(sh, root, None, "apt-get")
                    .args(["install", "-y"])
                    .args(&packages),
                log,
                "apt-get install (Build-Depends)",
            )?;
            chroot::run_logged(
                chroot::command(sh, root, None, "rustc").arg("--version"),
                log,
                "rustc --version",
            )
        },
    )
}

/// The .debs `dpkg-buildpackage -b` made from `source` in the trixie chroot, offline, copied to
/// `build/source/debs/`.
pub fn dpkg_buildpackage(sh: &Shell, source: &SourcePackage) -> Result<Vec<PathBuf>> {
    let chroot = build_chroot(sh)?;
    eprintln!("    building with Debian's {}", chroot.info.trim());
    let work = Path::new("/build");
    let host_work = chroot.host_path(work);
    chroot::remove_tree(&host_work)?;
    fs::create_dir_all(&host_work)?;
    for file in [&source.dsc, &source.orig, &source.debian] {
        let name = file.file_name().context("a source file has no name")?;
        fs::copy(file, host_work.join(name))
            .with_context(|| format!("copying {} into the chroot", file.display()))?;
    }
    let dsc = work.join(source.dsc.file_name().context("the .dsc has no name")?);
    let tree = work.join("src");
    // A fresh log for each build (run_logged appends).
    let log = paths::build_dir().join("logs/dpkg-buildpackage.log");
    files::put_text(&log, "", 0o644)?;
    chroot::run_logged(
        chroot::offline_command(sh, &chroot.root, Some(work), "dpkg-source")
            .arg("-x")
            .arg(&dsc)
            .arg(&tree),
        &log,
        "dpkg-source -x",
    )?;
    chroot::run_logged(
        chroot::offline_command(sh, &chroot.root, Some(&tree), "dpkg-buildpackage")
            .args(["-b", "-us", "-uc"]),
        &log,
        "dpkg-buildpackage -b (offline, trixie)",
    )?;
    let out = paths::build_dir().join("source/debs");
    files::fresh_dir(&out)?;
    let mut debs = Vec::new();
    for entry in fs::read_dir(&host_work)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            let to = out.join(path.file_name().context("a .deb has no name")?);
            fs::copy(&path, &to)?;
            debs.push(to);
        }
    }
    debs.sort();
    chroot::remove_tree(&host_work)?;
    ensure!(
        !debs.is_empty(),
        "dpkg-buildpackage made no .deb (log: {})",
        log.display()
    );
    Ok(debs)
}

/// What a .deb is, for the comparison: its control fields and its file list (path, mode, link
/// target; not sizes, which another compiler changes).
#[derive(Debug)]
struct Contents {
    fields: BTreeMap<String, String>,
    files: Vec<String>,
}

fn contents(sh: &Shell, deb: &Path) -> Result<Contents> {
    let control = cmd!(sh, "dpkg-deb --field {deb}")
        .quiet()
        .read()
        .with_context(|| format!("dpkg-deb --field {}", deb.display()))?;
    let mut fields = BTreeMap::new();
    for p in debian::parse(&control)? {
        for (name, value) in p.fields {
            fields.insert(name, value);
        }
    }
    let listing = cmd!(sh, "dpkg-deb --contents {deb}")
        .quiet()
        .read()
        .with_context(|| format!("dpkg-deb --contents {}", deb.display()))?;
    let mut files: Vec<String> = listing
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // mode owner size date time path [-> target]
            let path = f.get(5..).unwrap_or(&[]).join(" ");
            format!("{} {}", f.first().unwrap_or(&""), without_build_id(&path))
        })
        // How the IDs spread over directories is chance; the debug files are counted.
        .filter(|l| !l.ends_with("/.build-id/*/"))
        .collect();
    files.sort();
    Ok(Contents { fields, files })
}

/// A debug file's path with its build ID (which another compiler changes) written as `*`:
/// `./usr/lib/debug/.build-id/ab/cdef….debug` → `./usr/lib/debug/.build-id/*/*.debug`.
fn without_build_id(path: &str) -> String {
    const DIR: &str = "/usr/lib/debug/.build-id/";
    match path.find(DIR) {
        Some(at) => {
            let rest = &path[at + DIR.len()..];
            let masked = match rest.split_once('/') {
                Some((_, "")) => "*/".to_owned(),
                Some((_, file)) if file.ends_with(".debug") => "*/*.debug".to_owned(),
                _ => rest.to_owned(),
            };
            format!("{}{DIR}{masked}", &path[..at])
        }
        None => path.to_owned(),
    }
}

/// Control fields that differ between two correct builds: the size (another compiler), the
/// debug symbol ids, and the library versions dpkg-shlibdeps derives from the build's libc.
const DIFFERING: &[&str] = &["Installed-Size", "Build-Ids", "Depends"];

/// The differences between the packages of `ours` (deb-all) and `debs` (dpkg-buildpackage).
fn compare(sh: &Shell, ours: &[PathBuf], debs: &[PathBuf]) -> Result<Vec<String>> {
    let key = |p: &PathBuf| -> Result<String> {
        let c = cmd!(sh, "dpkg-deb --field {p} Package").quiet().read()?;
        Ok(c.trim().to_owned())
    };
    let mut left = BTreeMap::new();
    for p in ours {
        left.insert(key(p)?, p.clone());
    }
    let mut right = BTreeMap::new();
    for p in debs {
        right.insert(key(p)?, p.clone());
    }
    let mut findings = Vec::new();
    let names: BTreeSet<&String> = left.keys().chain(right.keys()).collect();
    for name in names {
        let (Some(a), Some(b)) = (left.get(name), right.get(name)) else {
            findings.push(format!(
                "{name}: built only by {}",
                if left.contains_key(name) {
                    "cargo xtask deb-all"
                } else {
                    "dpkg-buildpackage"
                }
            ));
            continue;
        };
        let (a, b) = (contents(sh, a)?, contents(sh, b)?);
        let fields: BTreeSet<&String> = a.fields.keys().chain(b.fields.keys()).collect();
        for field in fields {
            let (x, y) = (a.fields.get(field), b.fields.get(field));
            if x == y {
                continue;
            }
            if DIFFERING.contains(&field.as_str()) && x.is_some() && y.is_some() {
                if field == "Depends" && shlibs_only_differ(x, y) {
                    continue;
                }
                if field != "Depends" {
                    continue;
                }
            }
            findings.push(format!(
                "{name}: {field}: deb-all {x:?}, dpkg-buildpackage {y:?}"
            ));
        }
        // Counted, not only listed: masked debug files must be as many on both sides.
        let count = |files: &[String]| {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for f in files {
                *counts.entry(f.clone()).or_default() += 1;
            }
            counts
        };
        let (fa, fb) = (count(&a.files), count(&b.files));
        for (f, n) in &fa {
            let m = fb.get(f).copied().unwrap_or(0);
            if *n != m {
                findings.push(format!(
                    "{name}: {f}: {n} in deb-all, {m} in dpkg-buildpackage"
                ));
            }
        }
        for (f, m) in &fb {
            if !fa.contains_key(f) {
                findings.push(format!("{name}: only dpkg-buildpackage has {f} ({m})"));
            }
        }
    }
    Ok(findings)
}

/// Whether two Depends differ only in the versions of the same libraries (libc6, libgcc-s1:
/// what dpkg-shlibdeps reads off the build's own libc).
fn shlibs_only_differ(a: Option<&String>, b: Option<&String>) -> bool {
    let names = |v: Option<&String>| -> Vec<String> {
        v.map(|v| {
            v.split(',')
                .map(|r| r.split_whitespace().next().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
    };
    let (na, nb) = (names(a), names(b));
    na == nb
        && a.zip(b).is_some_and(|(a, b)| {
            a.split(',').zip(b.split(',')).all(|(x, y)| {
                x == y
                    || ["libc6", "libgcc-s1"].contains(&x.split_whitespace().next().unwrap_or(""))
            })
        })
}

/// The test step: source package → dpkg-buildpackage in trixie → lintian → same as deb-all.
pub fn test_step(sh: &Shell, built: &[Built]) -> Result<()> {
    let source = build(sh)?;
    let size = |p: &Path| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "    {} ({} KiB), orig {} KiB",
        source.dsc.display(),
        size(&source.debian) / 1024,
        size(&source.orig) / 1024
    );
    let debs = dpkg_buildpackage(sh, &source)?;
    let mut files: Vec<PathBuf> = vec![source.dsc.clone()];
    files.extend(debs.iter().cloned());
    xtask_base::lintian::lintian_files(sh, &files)?;
    let mut ours = Vec::new();
    for b in built.iter().filter(|b| b.package != Package::Bundle) {
        ours.push(b.path.clone());
        ours.extend(b.dbgsym.clone());
    }
    let findings = compare(sh, &ours, &debs)?;
    if !findings.is_empty() {
        bail!(
            "cargo xtask deb-all and dpkg-buildpackage disagree:\n  {}",
            findings.join("\n  ")
        );
    }
    eprintln!(
        "    dpkg-buildpackage: {} .debs, the same files and fields as deb-all's",
        debs.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_entries_name_version_checksum() {
        let lock = "version = 4\n\n[[package]]\nname = \"a\"\nversion = \"1.0.0\"\n\
                    checksum = \"ab\"\n\n[[package]]\nname = \"b\"\nversion = \"0.1.0\"\n";
        let entries = lock_entries(lock);
        assert!(entries.contains("a 1.0.0 ab"));
        assert!(entries.contains("b 0.1.0 "));
        assert_eq!(entries.len(), 2);
    }

    #[test]
    fn build_ids_are_masked() {
        assert_eq!(
            without_build_id("./usr/lib/debug/.build-id/ab/cdef0123.debug"),
            "./usr/lib/debug/.build-id/*/*.debug"
        );
        assert_eq!(
            without_build_id("./usr/lib/debug/.build-id/ab/"),
            "./usr/lib/debug/.build-id/*/"
        );
        assert_eq!(without_build_id("./usr/bin/x"), "./usr/bin/x");
    }

    #[test]
    fn prebuilt_binaries_are_recognised() {
        assert!(prebuilt("tests/nagisa64.dll"));
        assert!(prebuilt("lib/windows.0.52.0.lib"));
        assert!(!prebuilt("src/lib.rs"));
        assert!(!prebuilt("Cargo.toml.orig"));
    }

    #[test]
    fn only_shlibs_versions_may_differ() {
        let a = "libc6 (>= 2.34), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-1)".to_owned();
        let b = "libc6 (>= 2.38), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-1)".to_owned();
        assert!(shlibs_only_differ(Some(&a), Some(&b)));
        let c = "libc6 (>= 2.34), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-2)".to_owned();
        assert!(!shlibs_only_differ(Some(&a), Some(&c)));
        let d = "libc6 (>= 2.34), libgdrapi (>= 1.0.0-1)".to_owned();
        assert!(!shlibs_only_differ(Some(&a), Some(&d)));
    }
}
