//! Step 1, the next release: this tree copied with its versions bumped and a changelog entry
//! each, built by the copy's own xtask; and a libgdrapi of the next major with no files.

use std::fs;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use super::release::{version, Deb};
use xtask_base::workspace::Workspace;
use xtask_base::{files, paths};
use xtask_pack::stage::Package;

/// The next release: this tree's tracked files in build/upgrade/next/ with the driver's patch
/// and the library line's minor bumped and a changelog entry each, built by that copy's own
/// `cargo xtask deb-all`. Returns its four .debs.
pub(super) fn build_next(sh: &Shell) -> Result<Vec<Deb>> {
    let ws = Workspace::load()?;
    let dir = paths::build_dir().join("upgrade/next");
    files::fresh_dir(&dir)?;
    let root = paths::root();
    let listed = {
        let _cwd = sh.push_dir(&root);
        // Files not committed yet (but not ignored) too: the working tree is what is tested.
        cmd!(sh, "git ls-files -z --cached --others --exclude-standard")
            .quiet()
            .read()
            .context("git ls-files")?
    };
    for rel in listed.split('\0').filter(|f| !f.is_empty()) {
        let from = root.join(rel);
        let Ok(meta) = fs::symlink_metadata(&from) else {
            continue; // deleted in the working tree
        };
        let to = dir.join(rel);
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&from)?;
            files::put_symlink(&target.to_string_lossy(), &to)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            files::put_file(&from, &to, meta.permissions().mode() & 0o7777)?;
            keep_mtime(&to, meta.modified()?)?;
        }
    }

    let drv_old = ws.krate(Package::Kmod.crate_name())?.version.clone();
    let lib_old = ws.krate(Package::Lib.crate_name())?.version.clone();
    let drv = bump(&drv_old, 2)?;
    let lib = bump(&lib_old, 1)?;
    let edit = |file: &str, line_start: &str, from: &str, to: &str| {
        edit_line(&dir.join(file), line_start, from, to)
    };
    let quoted = |v: &str| format!("version = \"{v}\"");
    edit(
        "mtgdrdrv/Cargo.toml",
        "version = ",
        &quoted(&drv_old),
        &quoted(&drv),
    )?;
    for krate in ["libgdrapi", "mtgdrcopy-tests", "mtgdrcopy-meta"] {
        let old = &ws.krate(krate)?.version;
        edit(
            &format!("{krate}/Cargo.toml"),
            "version = ",
            &quoted(old),
            &quoted(&lib),
        )?;
    }
    edit(
        "Cargo.toml",
        "mtgdrdrv = {",
        &quoted(&drv_old),
        &quoted(&drv),
    )?;
    edit(
        "Cargo.toml",
        "libgdrapi = {",
        &quoted(&lib_old),
        &quoted(&lib),
    )?;
    // The library's and the driver's version constants follow their crates' versions (const fns
    // of CARGO_PKG_VERSION_*), and codegen below writes them into the headers.
    // Sources that differ from this release's, as every release's do: srcversion tells them apart.
    rewrite(&dir.join("mtgdrdrv/kmod/mtgdrdrv_main.c"), |text| {
        Ok(format!(
            "{text}MODULE_INFO(upgrade_test_release, \"{drv}\");\n"
        ))
    })?;

    let revision = xtask_base::debian::revision()?;
    // Every entry carries the source package's name, whatever the binary package's
    // (dpkg-gencontrol refuses another).
    let entries = [
        ("changelog", format!("{lib}-{revision}")),
        ("mtgdrdrv-dkms.changelog", format!("{drv}-{revision}")),
        ("libgdrapi.changelog", format!("{lib}-{revision}")),
        ("mtgdrcopy-tests.changelog", format!("{lib}-{revision}")),
        ("mtgdrcopy.changelog", format!("{lib}-{revision}")),
        (
            "mtgdrcopy-bundle.changelog",
            format!("{lib}-{revision}+bundle"),
        ),
    ];
    for (file, version) in entries {
        let path = dir.join("debian").join(file);
        rewrite(&path, |old| {
            let trailer = old
                .lines()
                .find(|l| l.starts_with(" -- "))
                .with_context(|| format!("{}: no trailer line", path.display()))?;
            Ok(format!(
                "mtgdrcopy ({version}) unstable; urgency=medium\n\n  * The next release of the upgrade test \
                 (cargo xtask test-packages --upgrade-only).\n\n{trailer}\n\n{old}"
            ))
        })?;
    }

    // The copy's own xtask, so that paths::root() is the copy; cargo's cache is kept.
    let target = paths::build_dir().join("upgrade/target");
    let _cwd = sh.push_dir(&dir);
    let _env = sh.push_env("CARGO_TARGET_DIR", &target);
    cmd!(sh, "cargo xtask codegen")
        .quiet()
        .run()
        .context("cargo xtask codegen in the next release's copy")?;
    let out = cmd!(sh, "cargo xtask deb-all")
        .quiet()
        .read()
        .context("cargo xtask deb-all in the next release's copy")?;
    let mut debs = Vec::new();
    for line in out.lines() {
        if line.ends_with(".deb") && !line.contains("-dbgsym_") {
            debs.push(Deb::read(sh, Path::new(line))?);
        }
    }
    for (package, want) in [
        (Package::Kmod, &drv),
        (Package::Lib, &lib),
        (Package::Tests, &lib),
        (Package::Meta, &lib),
    ] {
        let got = version(&debs, package)?;
        ensure!(
            got == format!(
                "{}-{revision}",
                xtask_pack::versions::upstream_version(want)
            ),
            "the next release's {} is {got}, expected {want}-{revision}",
            package.deb_name()
        );
    }
    Ok(debs)
}

/// `version` with its part `index` (0 major, 1 minor, 2 patch) incremented and the later ones
/// zeroed; a pre-release or build suffix is dropped.
fn bump(version: &str, index: usize) -> Result<String> {
    let core = version.split(['-', '+']).next().unwrap_or(version);
    let mut parts: Vec<u64> = core
        .split('.')
        .map(|p| p.parse().with_context(|| format!("version {version}")))
        .collect::<Result<_>>()?;
    ensure!(
        parts.len() == 3,
        "version {version} is not major.minor.patch"
    );
    parts[index] += 1;
    for part in &mut parts[index + 1..] {
        *part = 0;
    }
    Ok(parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("."))
}

pub(super) fn major_minor(version: &str) -> Result<(u64, u64)> {
    let mut parts = version.split(['.', '-', '+']).map(str::parse::<u64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
        _ => bail!("version {version} has no major.minor"),
    }
}

/// In the one line of `path` that starts with `line_start` (after indentation; the first such
/// line), `from` becomes `to`; an error names the file when there is none.
fn edit_line(path: &Path, line_start: &str, from: &str, to: &str) -> Result<()> {
    rewrite(path, |text| {
        let mut done = false;
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            if !done && line.trim_start().starts_with(line_start) && line.contains(from) {
                out.push_str(&line.replacen(from, to, 1));
                done = true;
            } else {
                out.push_str(line);
            }
        }
        ensure!(
            done,
            "{}: no line starting with {line_start:?} holds {from:?}",
            path.display()
        );
        Ok(out)
    })
}

/// Rewrites `path` with `change`, keeping its modification time: the copy's files keep this
/// tree's times and an edit is the same in every run, so cargo rebuilds in the copy only what
/// changed in this tree.
fn rewrite(path: &Path, change: impl FnOnce(String) -> Result<String>) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let modified = fs::metadata(path)?.modified()?;
    fs::write(path, change(text)?).with_context(|| format!("writing {}", path.display()))?;
    keep_mtime(path, modified)
}

fn keep_mtime(path: &Path, modified: std::time::SystemTime) -> Result<()> {
    fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(modified))
        .with_context(|| format!("setting the time of {}", path.display()))
}

/// A libgdrapi of the next major, with no files: what apt decides about it depends only on its
/// name and version.
pub(super) fn fake_next_major(sh: &Shell, lib_version: &str) -> Result<Deb> {
    let (major, _) = major_minor(lib_version)?;
    let version = format!("{}.0.0-1", major + 1);
    let arch = crate::pkgtest::debs::host_arch()?.debian;
    let dir = paths::build_dir().join("upgrade/next-major");
    let tree = dir.join("tree");
    files::fresh_dir(&tree)?;
    files::put_text(
        &tree.join("DEBIAN/control"),
        &format!(
            "Package: libgdrapi\nVersion: {version}\nArchitecture: {arch}\nMulti-Arch: same\n\
             Maintainer: mtgdrcopy upgrade test <test@mtgdrcopy.invalid>\n\
             Description: libgdrapi of the next major (upgrade test)\n"
        ),
        0o644,
    )?;
    let deb = dir.join(format!("libgdrapi_{version}_{arch}.deb"));
    cmd!(sh, "dpkg-deb --root-owner-group --build {tree} {deb}")
        .quiet()
        .ignore_stdout()
        .run()
        .context("dpkg-deb --build of the next major's libgdrapi")?;
    Deb::read(sh, &deb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bumps() {
        assert_eq!(bump("0.1.0", 2).unwrap(), "0.1.1");
        assert_eq!(bump("1.0.3", 1).unwrap(), "1.1.0");
        assert_eq!(bump("1.2.0-beta.1", 1).unwrap(), "1.3.0");
        assert!(bump("1.2", 1).is_err());
    }

    #[test]
    fn edits_one_line() {
        let dir = paths::build_dir().join("test-upgrade-edit");
        files::fresh_dir(&dir).unwrap();
        let file = dir.join("Cargo.toml");
        fs::write(
            &file,
            "[workspace.dependencies]\nmtgdrdrv = { path = \"mtgdrdrv\", version = \"0.1.0\" }\n\
             other = { version = \"0.1.0\" }\n",
        )
        .unwrap();
        edit_line(
            &file,
            "mtgdrdrv = {",
            "version = \"0.1.0\"",
            "version = \"0.1.1\"",
        )
        .unwrap();
        let text = fs::read_to_string(&file).unwrap();
        assert!(text.contains("mtgdrdrv = { path = \"mtgdrdrv\", version = \"0.1.1\" }"));
        assert!(text.contains("other = { version = \"0.1.0\" }"));
        assert!(edit_line(&file, "missing = {", "x", "y").is_err());
    }
}
