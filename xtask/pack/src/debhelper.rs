//! The packages, built the packager's way: `dpkg-buildpackage` runs debian/rules (debhelper) in
//! a copy of the tree; `cargo xtask build-*` keep the package trees it assembles, `deb-*`
//! (deb.rs) its .debs. xtask only builds the library and the tools first (with its reproducible
//! flags, and for arm64 with Debian's cross toolchain) and names their release directory in
//! `MTGDRCOPY_RELEASE_DIR`; everything after that — installing, splitting, stripping into
//! -dbgsym packages, shlibs and symbols, maintainer scripts, control files, the archives — is
//! debhelper's and dpkg's, from the same debian/ files a Debian build daemon uses.
//!
//! The copy lives in `build/deb/<split|bundle>/mtgdrcopy/`, so that dpkg-buildpackage leaves
//! the .debs, .buildinfo and .changes in `build/deb/<split|bundle>/`; deb.rs moves the .debs to
//! `build/`. A cross build runs dpkg-buildpackage in the toolchain chroot (cross.rs), whose dpkg
//! knows the arm64 libraries that dh_shlibdeps resolves.

use fs_err as fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::workspace::Workspace;
use xtask_base::{build, files, paths};

use crate::stage::Package;

/// What debian/rules reads: the packaging, the module's sources, the library's header,
/// pkg-config template and manual page, the tools' manual pages, the crates' versions. Copied
/// as they are in the working tree (which need not be a git checkout: the reproducibility and
/// upgrade tests build from copies).
const INPUTS: &[&str] = &[
    "debian",
    "dkms",
    "mtgdrdrv",
    "libgdrapi",
    "mtgdrcopy-tests",
    "mtgdrcopy-meta",
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    // dh_installchangelogs installs it as every package's upstream changelog, as it does in the
    // source package's build: the two builds must ship the same files.
    "CHANGELOG.md",
];

/// What the `deb-*` commands run besides cargo: dpkg-buildpackage (dpkg-dev) with debhelper,
/// ld, objcopy and ar (binutils), xz. Installed with apt when missing, as `cargo xtask test`
/// installs its own.
pub const HOST_PACKAGES: [&str; 4] = ["binutils", "debhelper", "dpkg-dev", "xz-utils"];

/// `cargo xtask build-<package>`.
pub fn cli(packages: &[Package]) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    for tree in stage_all(&sh, packages)? {
        println!("{}", tree.display());
    }
    Ok(())
}

/// Stages `packages` (`cargo xtask build-*`) and returns their trees.
pub fn stage_all(sh: &Shell, packages: &[Package]) -> Result<Vec<PathBuf>> {
    let ws = Workspace::load()?;
    let _lock = files::lock()?;
    run(sh, &ws, packages)?;
    Ok(packages.iter().map(|p| p.tree()).collect())
}

/// Runs the dpkg-buildpackage run that makes `packages`: the bundle's own (the bundle is built
/// alone), else the split one, architecture-independent only (`-A`) when all of them are.
/// Copies their trees to build/pkg/ and returns the .debs it made. Callers hold
/// `files::lock()`.
pub fn run(sh: &Shell, ws: &Workspace, packages: &[Package]) -> Result<Vec<PathBuf>> {
    let bundle = packages.contains(&Package::Bundle);
    ensure!(!bundle || packages.len() == 1, "the bundle is built alone");
    xtask_base::host::ensure_host_packages(&HOST_PACKAGES)?;
    // Also for the architecture-independent packages: install-tree installs every file.
    build::packaged(sh, ws)?;
    let out = paths::build_dir()
        .join("deb")
        .join(if bundle { "bundle" } else { "split" });
    files::fresh_dir(&out)?;
    let src = out.join("mtgdrcopy");
    let root = paths::root();
    let mut inputs: Vec<PathBuf> = INPUTS.iter().map(|i| root.join(i)).collect();
    // libgdrapi but its fuzzer, whose corpus and build are no input (and can be large).
    inputs.retain(|i| !i.ends_with("libgdrapi"));
    for entry in fs::read_dir(root.join("libgdrapi")).context("reading libgdrapi/")? {
        inputs.extend(Some(entry?.path()).filter(|p| !p.ends_with("fuzz")));
    }
    for from in inputs {
        files::copy_path(sh, &from, &src.join(from.strip_prefix(&root)?))?;
    }
    if bundle {
        bundle_debian_dir(&src.join("debian"))?;
    }
    let mode = if packages.iter().all(|p| p.arch_all()) {
        "-A"
    } else {
        "-b"
    };
    let env = [
        format!("MTGDRCOPY_RELEASE_DIR={}", ws.packaged_dir().display()),
        // The libc6 dependency: the glibc floor the build linked against (zigbuild.rs).
        format!(
            "MTGDRCOPY_GLIBC_FLOOR={}.{}",
            xtask_base::zigbuild::GLIBC_FLOOR.0,
            xtask_base::zigbuild::GLIBC_FLOOR.1
        ),
        // The tests run elsewhere (`cargo xtask test`); -d: the Build-Depends name Debian's
        // cargo and rustc, and this build uses the developer's.
        "DEB_BUILD_OPTIONS=nocheck".to_owned(),
    ];
    let args = [mode, "-us", "-uc", "-nc", "-d"];
    let log = out.join("dpkg-buildpackage.log");
    let build = match ws.target {
        Some(target) => xtask_base::cross::toolchain(sh)?
            .cmd(sh, target, &env, Some(&src), "dpkg-buildpackage")
            .arg(format!("--host-arch={}", target.debian))
            .args(args),
        None => cmd!(sh, "env -C {src} {env...} dpkg-buildpackage {args...}"),
    };
    xtask_base::host::run_logged(build, &log, "dpkg-buildpackage (debhelper, dpkg-dev)")?;
    // The package trees and their debug symbols' (where they have ELF files), as
    // `cargo xtask build-*` leaves them in build/pkg/.
    let debian = src.join("debian");
    for &package in packages {
        let name = package.deb_name();
        let dbgsym = debian.join(".debhelper").join(name).join("dbgsym-root");
        for (from, to) in [
            (debian.join(name), package.tree()),
            (dbgsym, package.dbgsym_tree()),
        ] {
            if to.exists() {
                fs::remove_dir_all(&to)?;
            }
            if from.exists() {
                files::copy_path(sh, &from, &to)?;
            }
        }
    }
    // The .debs, which deb.rs picks by name (`out` is made fresh for each run).
    let mut debs = Vec::new();
    for entry in fs::read_dir(&out)? {
        debs.extend(Some(entry?.path()).filter(|p| p.extension().is_some_and(|e| e == "deb")));
    }
    Ok(debs)
}

/// Turns the copy's debian/ into the single-package build's: one binary package `mtgdrcopy`
/// (debian/mtgdrcopy-bundle.control) with every file of the three split packages, their
/// maintainer scripts, the library's symbols, and its own changelog and lintian overrides.
fn bundle_debian_dir(debian: &Path) -> Result<()> {
    let read = |name: &str| {
        let path = debian.join(name);
        fs::read_to_string(&path)
    };
    let control = read("control")?;
    let source = control
        .split("\n\n")
        .next()
        .context("debian/control has no source paragraph")?;
    let bundle = read("mtgdrcopy-bundle.control")?;
    let mut install = String::new();
    for part in [Package::Kmod, Package::Lib, Package::Tests] {
        let list = read(&format!("{}.install", part.deb_name()))?;
        install.push_str(&list);
    }
    let renames = [
        ("mtgdrcopy-bundle.changelog", "mtgdrcopy.changelog"),
        (
            "mtgdrcopy-bundle.lintian-overrides",
            "mtgdrcopy.lintian-overrides",
        ),
        ("libgdrapi.symbols", "mtgdrcopy.symbols"),
        ("mtgdrdrv-dkms.postinst.in", "mtgdrcopy.postinst.in"),
        ("mtgdrdrv-dkms.prerm.in", "mtgdrcopy.prerm.in"),
    ];
    for part in [Package::Kmod, Package::Lib, Package::Tests, Package::Meta] {
        for suffix in ["install", "changelog", "lintian-overrides"] {
            let path = debian.join(format!("{}.{suffix}", part.deb_name()));
            if path.exists() && !renames.iter().any(|(from, _)| debian.join(from) == path) {
                fs::remove_file(&path)?;
            }
        }
    }
    for (from, to) in renames {
        fs::rename(debian.join(from), debian.join(to))
            .with_context(|| format!("renaming debian/{from}"))?;
    }
    fs::remove_file(debian.join("mtgdrcopy-bundle.control"))?;
    fs::write(debian.join("control"), format!("{source}\n\n{bundle}"))?;
    fs::write(debian.join("mtgdrcopy.install"), install)?;
    let mut rules = read("rules")?;
    rules.push_str(
        "\n# The single-package build: the module's README, under its own name.\n\
         execute_after_dh_install:\n\
         \tmkdir -p debian/mtgdrcopy/usr/share/doc/mtgdrcopy\n\
         \tmv debian/mtgdrcopy/usr/share/doc/mtgdrdrv-dkms/README.md \\\n\
         \t\tdebian/mtgdrcopy/usr/share/doc/mtgdrcopy/README.mtgdrdrv.md\n\
         \trmdir debian/mtgdrcopy/usr/share/doc/mtgdrdrv-dkms\n",
    );
    fs::write(debian.join("rules"), rules)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real debian/ turned into the bundle's: one binary package with every file of the
    /// three, their scripts and the library's symbols; nothing of the split packages left.
    #[test]
    fn the_bundle_is_one_package_with_everything() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-bundle-{}", std::process::id()));
        let debian = dir.join("debian");
        files::fresh_dir(&dir)?;
        files::copy_path(&Shell::new()?, &paths::root().join("debian"), &debian)?;
        bundle_debian_dir(&debian)?;
        let control = xtask_base::debian::parse(&fs::read_to_string(debian.join("control"))?)?;
        let names: Vec<&str> = control.iter().filter_map(|p| p.get("Package")).collect();
        assert_eq!(names, ["mtgdrcopy"]);
        assert!(control[1].get("Conflicts").is_some());
        let install = fs::read_to_string(debian.join("mtgdrcopy.install"))?;
        for part in [Package::Kmod, Package::Lib, Package::Tests] {
            let list = fs::read_to_string(
                paths::root().join(format!("debian/{}.install", part.deb_name())),
            )?;
            assert!(
                list.lines().all(|l| install.lines().any(|i| i == l)),
                "{list}"
            );
            assert!(!debian.join(format!("{}.install", part.deb_name())).exists());
        }
        for file in [
            "mtgdrcopy.symbols",
            "mtgdrcopy.postinst.in",
            "mtgdrcopy.prerm.in",
        ] {
            assert!(debian.join(file).exists(), "{file}");
        }
        let changelog = fs::read_to_string(debian.join("mtgdrcopy.changelog"))?;
        assert!(changelog.starts_with("mtgdrcopy (") && changelog.contains("+bundle)"));
        assert!(fs::read_to_string(debian.join("rules"))?.contains("README.mtgdrdrv.md"));
        fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
