//! The packaging steps of `cargo xtask test`: build every .deb, check the glibc floor of every
//! ELF file in them (glibcfloor.rs), run lintian on them, build them again from the source
//! package (source.rs) and from a copy of the tree at another path (repro.rs), and prove them by
//! installing them: the README's own commands with the apt repository and `apt-get source`
//! (readme.rs) on bookworm, all of that on bullseye (bullseye.rs), and the upgrade paths
//! (upgrade.rs). The maintainer scripts' and mtgdrdrv-load's unit tests are in scripts/.
//!
//! Elsewhere, on roots of the same layers (root.rs): the install and purge of the four packages
//! and of the single-package build, with DKMS building the module, are piuparts' (piuparts.rs);
//! the tests of the installed files (DKMS's build, the module's files, the C consumer, the
//! container layout, the DKMS failure paths) are debian/tests under autopkgtest
//! (autopkgtest.rs); what the packages do on a booted host with a GPU is debian/tests/gpu on a
//! VM with the emulated GPU (autopkgtest/vm.rs).

mod bullseye;
pub(crate) mod debian_tests;
mod debs;
mod guest;
mod readme;
mod repro;
pub(crate) mod root;
#[cfg(test)]
mod scripts;
pub mod source;
mod upgrade;

use std::cell::RefCell;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::rc::Rc;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::step::Step;
use xtask_base::paths;
use xtask_base::workspace::Workspace;

use crate::elf;
use xtask_pack::deb::{self, Built};
use xtask_pack::debhelper;
use xtask_pack::stage::Package;

use debs::{built, find, host_arch};

pub(crate) use guest::emulated_provider;

/// The packaging steps; the install tests only with `vm` (the upgrade test boots QEMU).
pub fn test_steps(vm: bool) -> Vec<Step<'static>> {
    let debs: Rc<RefCell<Option<Vec<Built>>>> = Rc::default();
    let upgrade = upgrade::test_step(debs.clone());
    let (d1, d2, d4, d5) = (debs.clone(), debs.clone(), debs.clone(), debs.clone());
    let (d6, d7, d8) = (debs.clone(), debs.clone(), debs);
    let mut steps: Vec<Step<'static>> = vec![
        (
            "packages: build every .deb (deb-all, deb-bundle); xz, -dbgsym, libgdrapi.a",
            Box::new(move |sh: &Shell| contents_check(sh, &built(sh, &d1)?)),
        ),
        (
            "packages: every shipped ELF needs at most glibc 2.28 (symbol versions)",
            Box::new(move |sh: &Shell| glibc_floor(sh, &built(sh, &d6)?)),
        ),
        (
            "packages: build-all stages every package tree (make build)",
            Box::new(build_all_test_step),
        ),
        (
            "from source: install lib exes --prefix --destdir (make install)",
            Box::new(install_from_source_step),
        ),
        (
            "from source: install as a user with sudo into a prefix only root writes",
            Box::new(install_as_user_step),
        ),
        (
            "packages: lintian on every .deb",
            Box::new(move |sh: &Shell| deb::lintian(sh, &built(sh, &d2)?)),
        ),
        (
            "source package: dpkg-buildpackage in trixie offline, lintian, same as deb-all",
            Box::new(move |sh: &Shell| source::test_step(sh, &built(sh, &d4)?)),
        ),
        (
            "packages: reproducible (deb-all again from a copy at another path)",
            Box::new(move |sh: &Shell| repro::test_step(sh, &built(sh, &d5)?)),
        ),
    ];
    if vm {
        steps.push((
            "packages: README quick start, apt repository, apt-get source (bookworm)",
            Box::new(move |sh: &Shell| bullseye::readme_on_bookworm(sh, &built(sh, &d7)?)),
        ));
        steps.push((
            "packages: install on bullseye (README, DKMS for 5.10, tools run, apt-get source)",
            Box::new(move |sh: &Shell| bullseye::test_step(sh, &built(sh, &d8)?)),
        ));
        steps.push(upgrade);
    }
    steps
}

/// `cargo xtask test-packages`: only these steps, for working on packaging.
#[derive(clap::Args)]
pub struct Args {
    /// Skip lintian.
    #[arg(long)]
    no_lintian: bool,
    /// Skip the install tests (piuparts) and the upgrade test.
    #[arg(long)]
    no_install: bool,
    #[command(flatten)]
    upgrade: upgrade::Options,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    if args.upgrade.upgrade_only {
        return upgrade::cli(&sh);
    }
    let ws = Workspace::load()?;
    let debs = deb::build_everything(&sh, &ws)?;
    if !args.no_lintian {
        deb::lintian(&sh, &debs)?;
    }
    if !args.no_install {
        crate::piuparts::test_step(&sh)?;
    }
    if !args.no_install && !args.upgrade.no_upgrade {
        upgrade::test(&sh, &debs)?;
    }
    Ok(())
}

/// What `cargo xtask build-all` (the old `make build`) must leave: every package's tree
/// staged, with its `DEBIAN/` and the documentation every package carries.
fn build_all_test_step(sh: &Shell) -> Result<()> {
    let trees = debhelper::stage_all(sh, &Package::SPLIT)?;
    ensure!(trees.len() == Package::SPLIT.len(), "staged {trees:?}");
    for (tree, package) in trees.iter().zip(Package::SPLIT) {
        let doc = tree.join("usr/share/doc").join(package.deb_name());
        ensure!(
            *tree == package.tree() && tree.join("DEBIAN").is_dir() && doc.is_dir(),
            "build-all did not stage {} (with DEBIAN/ and {})",
            package.tree().display(),
            doc.display()
        );
    }
    Ok(())
}

/// `cargo xtask install` run the way the README says, as a user with sudo, not as root: the
/// script (scripts/install-as-user.sh) makes that user in a mount namespace of its own and checks
/// the result. It needs sudo on this machine, and root to make the namespace.
fn install_as_user_step(sh: &Shell) -> Result<()> {
    xtask_base::host::ensure_host_packages(&["sudo"])?;
    // Outside the tree and /root: the overlays' upper directories must not lie in what they cover.
    let work = std::env::temp_dir().join("mtgdrcopy-install-as-user");
    xtask_base::files::fresh_dir(&work)?;
    let script = paths::root().join("xtask/testbench/scripts/install-as-user.sh");
    let repo = paths::root();
    let log = paths::build_dir().join("logs/install-as-user.log");
    fs::create_dir_all(paths::build_dir().join("logs"))?;
    fs::remove_file(&log).ok();
    let result = xtask_base::host::run_logged(
        cmd!(sh, "bash {script} {repo} {work}"),
        &log,
        "the install as a user with sudo",
    );
    // The user's clone and build are large; the log stays.
    fs::remove_dir_all(&work).ok();
    result.map(|_| ())
}

/// What `cargo xtask install lib exes` (upstream's `make lib_install exes_install`) leaves
/// under a prefix: the library under its real name with its two links, the reduced static
/// library, the header, a pkg-config file pointing at the prefix, the programs, stripped, and
/// the manual pages (gdrapi(3), one page per program).
/// The driver's install needs a kernel build tree and is not run here.
fn install_from_source_step(sh: &Shell) -> Result<()> {
    let dest = paths::build_dir().join("install-test");
    xtask_base::files::fresh_dir(&dest)?;
    let xtask = std::env::current_exe()?;
    cmd!(
        sh,
        "{xtask} install lib exes --prefix /opt/mtg --destdir {dest}"
    )
    .quiet()
    .run()?;
    let ws = Workspace::load()?;
    let version = &ws.krate("libgdrapi")?.version;
    let prefix = dest.join("opt/mtg");
    let lib = prefix.join("lib");
    let link = |name: &str| fs::read_link(lib.join(name)).map_err(anyhow::Error::from);
    ensure!(link("libgdrapi.so")? == Path::new("libgdrapi.so.1"));
    ensure!(link("libgdrapi.so.1")?.to_string_lossy() == format!("libgdrapi.so.{version}"));
    let bins = ws.krate("mtgdrcopy-tests")?.bins.clone();
    let pages = bins
        .iter()
        .map(|bin| (prefix.join(format!("share/man/man1/{bin}.1")), 0o644));
    for (path, mode) in [
        (lib.join(format!("libgdrapi.so.{version}")), 0o644),
        (lib.join("libgdrapi.a"), 0o644),
        (prefix.join("include/gdrapi.h"), 0o644),
        (prefix.join("share/man/man3/gdrapi.3"), 0o644),
    ]
    .into_iter()
    .chain(pages)
    {
        let actual = fs::metadata(&path)
            .with_context(|| format!("install left no {}", path.display()))?
            .permissions()
            .mode()
            & 0o7777;
        ensure!(actual == mode, "{}: mode {actual:o}", path.display());
    }
    let pc = fs::read_to_string(lib.join("pkgconfig/gdrapi.pc"))?;
    ensure!(
        pc.contains("prefix=/opt/mtg\n") && pc.contains(&format!("Version: {version}")),
        "gdrapi.pc:\n{pc}"
    );
    for bin in &bins {
        let path = prefix.join("bin").join(bin);
        let sections = cmd!(sh, "readelf -S {path}").quiet().read()?;
        ensure!(
            !sections.contains(".debug_info"),
            "{} is not stripped",
            path.display()
        );
    }
    eprintln!("    installed under {}", prefix.display());
    Ok(())
}

/// The glibc floor on every .deb but the -dbgsym ones (their files are never loaded).
fn glibc_floor(sh: &Shell, debs: &[Built]) -> Result<()> {
    let paths: Vec<&Path> = debs.iter().map(|b| b.path.as_path()).collect();
    crate::glibcfloor::check_debs(sh, &paths).map(drop)
}

/// What the archives must be: xz members; a -dbgsym package beside each package with ELF
/// files; the manual pages; a libgdrapi.a without bitcode whose only global symbols are the
/// API, linking beside another Rust staticlib (staticlib.rs). Prints the sizes.
fn contents_check(sh: &Shell, debs: &[Built]) -> Result<()> {
    for b in debs {
        for deb in std::iter::once(&b.path).chain(b.dbgsym.iter()) {
            let members = cmd!(sh, "ar t {deb}").quiet().read()?;
            let members: Vec<&str> = members.lines().collect();
            ensure!(
                members == ["debian-binary", "control.tar.xz", "data.tar.xz"],
                "{}: members {members:?}, expected xz-compressed control and data",
                deb.display()
            );
            let size = fs::metadata(deb)?.len();
            eprintln!("    {:>9} KiB  {}", size.div_ceil(1024), deb.display());
        }
        let has_elf = !elf::elf_files(&b.package.tree())?.is_empty();
        ensure!(
            has_elf == b.dbgsym.is_some(),
            "{}: {} ELF files, but {} -dbgsym package",
            b.package.deb_name(),
            if has_elf { "has" } else { "no" },
            if b.dbgsym.is_some() { "a" } else { "no" }
        );
    }
    // The manual pages, compressed by dh_compress: gdrapi(3) and one page per program.
    let bins = Workspace::load()?.krate("mtgdrcopy-tests")?.bins.clone();
    let pages = [(Package::Lib, "usr/share/man/man3/gdrapi.3.gz".to_owned())]
        .into_iter()
        .chain(
            bins.iter()
                .map(|b| (Package::Tests, format!("usr/share/man/man1/{b}.1.gz"))),
        );
    for (package, page) in pages {
        let path = find(debs, package)?.package.tree().join(&page);
        ensure!(path.is_file(), "{} lacks {page}", package.deb_name());
    }
    let lib = find(debs, Package::Lib)?;
    let arch = host_arch()?;
    let archive = lib
        .package
        .tree()
        .join(format!("usr/lib/{}/libgdrapi.a", arch.multiarch));
    crate::staticlib::check(sh, &archive, None)
}
