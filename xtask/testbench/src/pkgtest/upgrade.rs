//! The upgrade paths of README.md's "Versions" and docs/packaging.md's **Upgrades**, proven
//! with a next release really built from this tree (a step of `cargo xtask test` with the VM;
//! alone: `cargo xtask test-packages --upgrade-only`):
//!
//! 1. **Next release.** The source files (`git ls-files`: tracked and not ignored, as they are
//!    in the working tree) are copied to build/upgrade/next/, where the driver's patch version
//!    and the library line's minor are bumped (crates and workspace pins, which the version
//!    constants follow; the copy's `cargo xtask codegen` regenerates the headers), every
//!    changelog gets a new entry, and the copy's own `cargo xtask deb-all` builds the four .debs
//!    (its cargo target directory is build/upgrade/target, kept only as cargo's cache). The
//!    module's sources get one line more, `MODULE_INFO(upgrade_test_release, "<version>")`, as
//!    any release's sources differ: so its srcversion tells the two builds apart
//!    (MODULE_VERSION is the ABI's major.minor, the same for both).
//! 2. **Full upgrade.** A bookworm root (root.rs) gets this release with `apt-get install
//!    mtgdrcopy` from a signed repository; then the repository also carries the next release
//!    and `apt-get upgrade` must upgrade the four: DKMS knows only the new version, built and
//!    installed for the kernel; the old version's DKMS tree and /usr/src directory are gone;
//!    the installed module is the new sources' build; no file of the old release is left (every
//!    file the install and upgrade added is the new packages' or DKMS's state of the new
//!    version).
//! 3. **Library only.** A fresh root gets this release the same way; then the relations let
//!    `apt-get install libgdrapi=<next>` upgrade the library alone (with apt's grouping by
//!    source package off). By default, apt 2.5.2 and later (bookworm's 2.6) upgrade every
//!    installed package of the source version along (the module too), as README says; with the
//!    module held (`apt-mark hold mtgdrdrv-dkms`, README's way), `apt-get install
//!    libgdrapi=<next> mtgdrcopy-tests=<next>` upgrades those two and leaves the module package,
//!    its module and the metapackage as they were. A libgdrapi of the next major (a package
//!    with no files, made here: only its version matters) is refused while those 1.x tools are
//!    installed (`libgdrapi (<< 2~)`): apt cannot install it without removing them and the
//!    metapackage, and `apt-get upgrade` keeps it back.
//! 4. **VM.** One boot of the test kernel with the emulated provider: each root's installed
//!    module (checked by srcversion) and tools and library, in a chroot as in the install
//!    test's container step, run mtgdrcopy_sanity; the library-only root's is the version
//!    handshake of a 0.1.0 module with a 1.1 library.
//!
//! apt sees only the test's repository (the cached layers' Debian lists may be older than the
//! archive, and the test downloads nothing).

mod full;
mod guest;
mod library;
mod next;
mod release;
mod repo;

use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};
use xshell::Shell;

use super::debs::built;
use super::root::{self, Root};
use crate::step::timed;
use crate::step::Step;
use xtask_base::workspace::Workspace;
use xtask_base::{files, host, paths};
use xtask_pack::deb::Built;
use xtask_pack::stage::Package;

use crate::{kernel, vmtest};
use xtask_pack::aptrepo;

use full::full_upgrade;
use guest::{run_vm, Guest};
use library::library_upgrade;
use next::{build_next, fake_next_major};
use release::{upstream, version, Deb};
use repo::Repo;

/// `cargo xtask test-packages` options for this test.
#[derive(clap::Args)]
pub struct Options {
    /// Run only the upgrade test (builds this release's four .debs and the next release's).
    #[arg(long)]
    pub upgrade_only: bool,
    /// Skip the upgrade test (so does --no-install).
    #[arg(long, conflicts_with = "upgrade_only")]
    pub no_upgrade: bool,
}

/// The step of `cargo xtask test`; `debs` are built on first use (pkgtest's shared cache).
pub fn test_step(debs: Rc<std::cell::RefCell<Option<Vec<Built>>>>) -> Step<'static> {
    (
        "packages: upgrades to a next release built from this tree (full, library only), VM",
        Box::new(move |sh: &Shell| test(sh, &built(sh, &debs)?)),
    )
}

/// `--upgrade-only`: this release's four .debs, then the test.
pub fn cli(sh: &Shell) -> Result<()> {
    let ws = Workspace::load()?;
    let mut debs = Vec::new();
    for package in Package::SPLIT {
        debs.extend(xtask_pack::deb::build(sh, &ws, &[package])?);
    }
    test(sh, &debs)
}

pub fn test(sh: &Shell, debs: &[Built]) -> Result<()> {
    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    // The roots in build/pkgtest/ are one run's at a time (the package tests' lock).
    let _lock = files::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running a package test",
    )?;
    let kernel = kernel::bookworm_kernel()?;
    let mut this = Vec::new();
    for package in Package::SPLIT {
        let built = debs
            .iter()
            .find(|d| d.package == package)
            .with_context(|| format!("no .deb was built for {package:?}"))?;
        this.push(Deb::read(sh, &built.path)?);
    }
    let t = Instant::now();
    let next = build_next(sh)?;
    timed(
        &format!(
            "next release built from this tree: {}",
            next.iter()
                .map(|d| format!("{} {}", d.package, d.version))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        t,
    );
    let major = fake_next_major(sh, version(&this, Package::Lib)?)?;

    let t = Instant::now();
    let layers = root::dkms_layers(sh, &kernel)?;
    let scratch = paths::build_dir().join("pkgtest/upgrade");
    let key = aptrepo::TestKey::generate(sh, &scratch.join("gnupg"), "mtgdrcopy-upgrade-test")?;
    timed("cached root layers ready, key generated", t);

    let full = Root::fresh(layers.clone(), "upgrade-full")?;
    let repo = Repo {
        root: &full,
        key: &key,
        scratch: &scratch,
    };
    let full_module = full_upgrade(sh, &repo, &kernel.release, &this, &next)?;

    let library = Root::fresh(layers, "upgrade-library")?;
    let repo = Repo {
        root: &library,
        ..repo
    };
    let library_module = library_upgrade(sh, &repo, &kernel.release, &this, &next, &major)?;

    let t = Instant::now();
    let lib = upstream(version(&next, Package::Lib)?);
    run_vm(
        sh,
        &kernel,
        &[
            Guest {
                root: &full,
                dir: "/upgraded",
                srcversion: full_module,
                library: lib,
                what: "after apt-get upgrade to the next release",
            },
            Guest {
                root: &library,
                dir: "/library-only",
                srcversion: library_module,
                library: lib,
                what: "the module of this release, the library and tools of the next",
            },
        ],
    )?;
    timed("VM: mtgdrcopy_sanity in both roots", t);
    Ok(())
}
