//! The source package's test: the binary packages built from what `cargo xtask dist-source`
//! writes (xtask-pack's dsc.rs) the way a Debian build daemon would: `dpkg-buildpackage -b` in
//! a clean trixie chroot whose Build-Depends come from Debian only (its rustc and cargo),
//! without a network. Then lintian checks the .dsc and the .debs, and the packages must hold
//! the same files, with the same control fields, as `cargo xtask deb-all`'s. A step of `cargo
//! xtask test`, and `cargo xtask dist-source --check`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::debian;
use xtask_base::workspace::Workspace;
use xtask_base::{chroot, files, paths};
use xtask_pack::deb::{self, Built};
use xtask_pack::dsc::{self, SourcePackage};
use xtask_pack::stage::Package;

/// `cargo xtask dist-source --check`: this tree's .debs (deb-all), then the test step.
pub fn cli() -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load()?;
    let built = deb::build_everything(&sh, &ws)?;
    test_step(&sh, &built)
}

/// The trixie chroot the source package is built in: build-essential and the Build-Depends of
/// debian/control, from Debian; remade when those change.
fn build_chroot(sh: &Shell) -> Result<chroot::Chroot> {
    let control = debian::parse(&fs::read_to_string(paths::root().join("debian/control"))?)?;
    let depends = control
        .first()
        .and_then(|source| source.get("Build-Depends"))
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
    chroot::prepare(
        sh,
        "trixie-build",
        "trixie",
        &recipe,
        false,
        &log,
        |sh, root, log| {
            xtask_base::host::run_logged(
                chroot::command(sh, root, &Default::default(), "apt-get").arg("update"),
                log,
                "apt-get update",
            )?;
            xtask_base::host::run_logged(
                chroot::command(sh, root, &Default::default(), "apt-get")
                    .args(["install", "-y"])
                    .args(&packages),
                log,
                "apt-get install (Build-Depends)",
            )?;
            xtask_base::host::run_logged(
                chroot::command(sh, root, &Default::default(), "rustc").arg("--version"),
                log,
                "rustc --version",
            )
        },
    )
}

/// This build is the proof of the product crates' `rust-version`: the chroot's rustc must be
/// that version (major.minor), or the build proves nothing about it. cargo refuses any crate
/// whose `rust-version` is newer than the rustc it runs, so the build and the package's
/// `cargo test -p libgdrapi` cover every dependency, dev-dependencies included, that the
/// packages need.
fn ensure_rustc_is_the_msrv(rustc_version: &str, declared: Option<&str>) -> Result<()> {
    let declared = declared.context("libgdrapi declares no rust-version")?;
    let major_minor = |v: &str| -> Option<String> {
        let mut parts = v.split('.');
        Some(format!("{}.{}", parts.next()?, parts.next()?))
    };
    let built_with = rustc_version
        .split_whitespace()
        .nth(1)
        .and_then(major_minor)
        .with_context(|| format!("no version in `rustc --version`: {rustc_version:?}"))?;
    ensure!(
        major_minor(declared).as_deref() == Some(built_with.as_str()),
        "the product crates declare rust-version {declared}, but Debian trixie's rustc is \
         {built_with}: set the workspace's rust-version to {built_with} (the build proves \
         that one), or build with a trixie that has {declared}"
    );
    Ok(())
}

/// The .debs `dpkg-buildpackage -b` made from `source` in the trixie chroot, offline, copied to
/// `build/source/debs/`.
pub fn dpkg_buildpackage(sh: &Shell, source: &SourcePackage) -> Result<Vec<PathBuf>> {
    let chroot = build_chroot(sh)?;
    eprintln!("    building with Debian's {}", chroot.info.trim());
    let ws = Workspace::load()?;
    let declared = ws.krate("libgdrapi")?.rust_version.clone();
    ensure_rustc_is_the_msrv(&chroot.info, declared.as_deref())?;
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
    // Offline: the build must need nothing but the chroot's packages.
    let offline = |cwd: &Path, program: &str| {
        let opts = chroot::Options {
            cwd: Some(cwd),
            offline: true,
            ..Default::default()
        };
        chroot::command(sh, &chroot.root, &opts, program)
    };
    xtask_base::host::run_logged(
        offline(work, "dpkg-source").arg("-x").arg(&dsc).arg(&tree),
        &log,
        "dpkg-source -x",
    )?;
    xtask_base::host::run_logged(
        offline(&tree, "dpkg-buildpackage").args(["-b", "-us", "-uc"]),
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
        for (name, value) in p {
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

/// Whether two Depends differ only in what dpkg-shlibdeps reads off the build's own toolchain:
/// libc6's version (the glibc floor of deb-all's zig link, zigbuild.rs, against the build
/// chroot's glibc) and libgcc-s1 (Debian's gcc links libgcc_s.so.1, zig its own libunwind
/// statically). Every other relation must be the same, in the same order.
fn shlibs_only_differ(a: Option<&String>, b: Option<&String>) -> bool {
    let relations = |v: &String| -> Vec<String> {
        v.split(',')
            .map(str::trim)
            .filter(|r| r.split_whitespace().next() != Some("libgcc-s1"))
            .map(|r| match r.split_whitespace().next() {
                Some("libc6") => "libc6".to_owned(),
                _ => r.to_owned(),
            })
            .collect()
    };
    a.zip(b).is_some_and(|(a, b)| relations(a) == relations(b))
}

/// The test step: source package → dpkg-buildpackage in trixie → lintian → same as deb-all.
pub fn test_step(sh: &Shell, built: &[Built]) -> Result<()> {
    let source = dsc::build(sh)?;
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
    fn the_trixie_rustc_must_be_the_declared_rust_version() {
        let trixie = "rustc 1.85.0 (4d91de4e4 2025-02-17) (built from a source tarball)\n";
        assert!(ensure_rustc_is_the_msrv(trixie, Some("1.85.0")).is_ok());
        assert!(ensure_rustc_is_the_msrv(trixie, Some("1.85")).is_ok());
        assert!(ensure_rustc_is_the_msrv(trixie, Some("1.84.0")).is_err());
        assert!(ensure_rustc_is_the_msrv("rustc 1.86.0 (x)", Some("1.85.0")).is_err());
        assert!(ensure_rustc_is_the_msrv(trixie, None).is_err());
        assert!(ensure_rustc_is_the_msrv("", Some("1.85.0")).is_err());
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
    fn only_shlibs_versions_may_differ() {
        let a = "libc6 (>= 2.34), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-1)".to_owned();
        let b = "libc6 (>= 2.38), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-1)".to_owned();
        assert!(shlibs_only_differ(Some(&a), Some(&b)));
        let c = "libc6 (>= 2.34), libgcc-s1 (>= 4.2), libgdrapi (>= 1.0.0-2)".to_owned();
        assert!(!shlibs_only_differ(Some(&a), Some(&c)));
        // zig links no libgcc_s.so.1: deb-all's packages do without libgcc-s1.
        let d = "libc6 (>= 2.28), libgdrapi (>= 1.0.0-1)".to_owned();
        assert!(shlibs_only_differ(Some(&a), Some(&d)));
        let e = "libc6 (>= 2.28), libgdrapi (>= 1.0.0-1), libfoo1".to_owned();
        assert!(!shlibs_only_differ(Some(&a), Some(&e)));
        assert!(!shlibs_only_differ(Some(&a), None));
    }

    /// Lintian's DEP-5 check runs on source packages only: a minimal one around the committed
    /// copyright (one file under each vendor/ pattern), for `cargo test`; the source package
    /// step runs it on the real one.
    #[test]
    fn lintian_accepts_the_copyright_in_a_source_package() {
        let has = |tool: &str| {
            std::process::Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !has("lintian") || !has("dpkg-source") {
            eprintln!("skipped: lintian or dpkg-source is not installed");
            return;
        }
        let copyright = fs::read_to_string(paths::root().join("debian/copyright")).unwrap();
        let dir = std::env::temp_dir().join(format!("xtask-licences-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let tree = dir.join("mtgdrcopy-1.0.0");
        let write = |rel: &str, text: &str| {
            let path = tree.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        };
        write("debian/copyright", &copyright);
        write("debian/source/format", "3.0 (native)\n");
        write("debian/rules", "#!/usr/bin/make -f\n%:\n\tdh $@\n");
        write(
            "debian/control",
            "Source: mtgdrcopy\nSection: libs\nPriority: optional\n\
             Maintainer: mtgdrcopy developers <mtgdrcopy@users.noreply.github.com>\n\
             Build-Depends: debhelper-compat (= 13)\nStandards-Version: 4.6.2\n\
             Rules-Requires-Root: no\n\n\
             Package: libgdrapi\nArchitecture: any\nDepends: ${misc:Depends}\n\
             Description: test\n test package.\n",
        );
        write(
            "debian/changelog",
            "mtgdrcopy (1.0.0) unstable; urgency=medium\n\n  * Test.\n\n \
             -- mtgdrcopy developers <mtgdrcopy@users.noreply.github.com>  \
             Mon, 30 Nov 2026 10:30:00 +0000\n",
        );
        write("mtgdrdrv/kmod/mtgdrdrv.c", "x\n");
        write("README.md", "x\n");
        for p in debian::parse(&copyright).unwrap() {
            for pattern in p.get("Files").unwrap_or("").split_whitespace() {
                if let Some(dir) = pattern.strip_prefix("vendor/") {
                    write(
                        &format!("vendor/{}Cargo.toml", dir.trim_end_matches('*')),
                        "x\n",
                    );
                }
            }
        }
        let run = |args: &[&str]| {
            std::process::Command::new(args[0])
                .args(&args[1..])
                .current_dir(&dir)
                .output()
                .unwrap()
        };
        let built = run(&["dpkg-source", "-b", "mtgdrcopy-1.0.0"]);
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = run(&["lintian", "-EvIL", "+pedantic", "mtgdrcopy_1.0.0.dsc"]);
        let _ = fs::remove_dir_all(&dir);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let tags: Vec<&str> = stdout
            .lines()
            .filter(|l| !l.starts_with("N:"))
            .filter(|l| l.contains("copyright"))
            // The standard library is in no file of the source (see its paragraph).
            .filter(|l| !l.contains("superfluous-file-pattern rust-std/*"))
            .collect();
        assert!(tags.is_empty(), "lintian:\n{}", tags.join("\n"));
    }
}
