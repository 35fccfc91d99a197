//! The upgrade paths of README's "Upgrades", proven with a next release really built from this
//! tree (a step of `cargo xtask test` with the VM; alone: `cargo xtask test-packages
//! --upgrade-only`):
//!
//! 1. **Next release.** The source files (`git ls-files`: tracked and not ignored, as they are
//!    in the working tree) are copied to build/upgrade/next/, where the driver's patch version
//!    and the library line's minor are bumped (crates, workspace pins, `GDR_API_MINOR_VERSION`;
//!    the copy's `cargo xtask codegen` regenerates gdrapi.h and the manual pages), every
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

use std::fs;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use super::dkms::{check_dkms_installed, KEPT_BY_DKMS};
use super::guest::{package_files, root_files};
use super::root::{self, Root};
use super::timed;
use crate::deb::Built;
use crate::kernel::{self, Kernel};
use crate::stage::{self, Package};
use crate::test::Step;
use crate::workspace::Workspace;
use crate::{aptrepo, paths, vm, vmtest};

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
        Box::new(move |sh: &Shell| test(sh, &super::built(sh, &debs)?)),
    )
}

/// `--upgrade-only`: this release's four .debs, then the test.
pub fn cli(sh: &Shell) -> Result<()> {
    let ws = Workspace::load(sh)?;
    let mut debs = Vec::new();
    for package in Package::SPLIT {
        debs.push(crate::deb::build(sh, &ws, package)?);
    }
    test(sh, &debs)
}

/// A .deb as apt sees it.
#[derive(Clone, Debug)]
struct Deb {
    package: String,
    version: String,
    path: PathBuf,
}

impl Deb {
    fn read(sh: &Shell, path: &Path) -> Result<Deb> {
        let format = "${Package}\t${Version}";
        let fields = cmd!(sh, "dpkg-deb --show --showformat {format} {path}")
            .quiet()
            .read()
            .with_context(|| format!("reading {}", path.display()))?;
        let (package, version) = fields
            .split_once('\t')
            .with_context(|| format!("{}: no package and version", path.display()))?;
        Ok(Deb {
            package: package.to_owned(),
            version: version.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// The .deb of `package` in `release`.
fn deb(release: &[Deb], package: Package) -> Result<&Deb> {
    release
        .iter()
        .find(|d| d.package == package.deb_name())
        .with_context(|| format!("no {} .deb in the release", package.deb_name()))
}

fn version(release: &[Deb], package: Package) -> Result<&str> {
    Ok(&deb(release, package)?.version)
}

/// The upstream part of a Debian version.
fn upstream(version: &str) -> &str {
    version.rsplit_once('-').map_or(version, |(u, _)| u)
}

pub fn test(sh: &Shell, debs: &[Built]) -> Result<()> {
    kernel::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    // The roots in build/pkgtest/ are one run's at a time (the install test's lock).
    let _lock = stage::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running a package install test",
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

/// Installs this release, upgrades to `next`, checks what is left. Returns the srcversion of
/// the installed module.
fn full_upgrade(
    sh: &Shell,
    repo: &Repo,
    release: &str,
    this: &[Deb],
    next: &[Deb],
) -> Result<String> {
    let root = repo.root;
    let t = Instant::now();
    repo.publish(sh, this)?;
    let before = root.file_list(sh)?;
    let output = repo.apt(sh, &["install", "mtgdrcopy"])?;
    expect_installed(sh, root, this, "after apt-get install mtgdrcopy")?;
    let old_kmod = upstream(version(this, Package::Kmod)?);
    check_dkms_installed(sh, root, release, old_kmod, &output)?;
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    let old_module = srcversion(sh, root, &ko)?;
    timed("full upgrade: this release installed (DKMS)", t);

    let t = Instant::now();
    repo.publish(sh, &[this, next].concat())?;
    let output = repo.apt(sh, &["upgrade"])?;
    expect_installed(sh, root, next, "after apt-get upgrade")?;
    ensure!(
        output.contains(&format!(
            "{} upgraded, 0 newly installed, 0 to remove",
            next.len()
        )),
        "apt-get upgrade did not upgrade exactly the {} packages:\n{output}",
        next.len()
    );
    let new_kmod = upstream(version(next, Package::Kmod)?);
    check_dkms_installed(sh, root, release, new_kmod, &output)?;
    let status = root.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.trim().lines().count() == 1,
        "dkms status should show mtgdrdrv {new_kmod} only, it shows:\n{status}"
    );
    for gone in [
        format!("/var/lib/dkms/mtgdrdrv/{old_kmod}"),
        format!("/usr/src/mtgdrdrv-{old_kmod}"),
    ] {
        ensure!(
            !root.exists(sh, &gone)?,
            "{gone} is still there after the upgrade"
        );
    }
    let new_module = srcversion(sh, root, &ko)?;
    let marker = root.run(sh, &["modinfo", "-F", "upgrade_test_release", &ko])?;
    ensure!(
        marker.trim() == new_kmod && new_module != old_module,
        "{ko} is not the build of mtgdrdrv {new_kmod}: its upgrade_test_release is {:?} \
         (expected {new_kmod:?}) and its srcversion {new_module} ({old_kmod}'s: {old_module})",
        marker.trim()
    );
    check_nothing_left(sh, root, release, &before, old_kmod, new_kmod)?;
    timed(
        &format!(
            "full upgrade: apt-get upgrade to the next release; DKMS rebuilt mtgdrdrv \
             {new_kmod} (srcversion {new_module}, was {old_module}), nothing of {old_kmod} left"
        ),
        t,
    );
    Ok(new_module)
}

/// Installs this release, then the next release's library and tools alone; the next major of
/// the library (`major`, a .deb) is refused. Returns the srcversion of the installed module.
fn library_upgrade(
    sh: &Shell,
    repo: &Repo,
    release: &str,
    this: &[Deb],
    next: &[Deb],
    major: &Deb,
) -> Result<String> {
    let root = repo.root;
    let t = Instant::now();
    repo.publish(sh, this)?;
    let output = repo.apt(sh, &["install", "mtgdrcopy"])?;
    expect_installed(sh, root, this, "after apt-get install mtgdrcopy")?;
    let kmod = upstream(version(this, Package::Kmod)?);
    check_dkms_installed(sh, root, release, kmod, &output)?;
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    let module = srcversion(sh, root, &ko)?;
    timed("library only: this release installed (DKMS)", t);

    let t = Instant::now();
    repo.publish(sh, &[this, next, std::slice::from_ref(major)].concat())?;
    let lib_pin = format!("libgdrapi={}", version(next, Package::Lib)?);
    // The relations let the library be upgraded alone: so apt does with its grouping by source
    // package off...
    let alone = planned(&repo.apt(
        sh,
        &[
            "install",
            "--simulate",
            "-o",
            "APT::Get::Upgrade-By-Source-Package=false",
            &lib_pin,
        ],
    )?);
    ensure!(
        alone == ["libgdrapi"],
        "apt-get install {lib_pin} (no grouping by source package) should upgrade libgdrapi \
         alone; it would install {alone:?}"
    );
    // ...but by default (apt 2.5.2 and later), installing one package by name upgrades the
    // other installed packages of its source version too, the module included: README says so.
    let grouped = planned(&repo.apt(sh, &["install", "--simulate", &lib_pin])?);
    ensure!(
        grouped.iter().any(|p| p == "mtgdrdrv-dkms"),
        "README says that apt-get install {lib_pin} upgrades mtgdrdrv-dkms too (apt's grouping \
         by source package), but apt would install only {grouped:?}: update README's \"Upgrades\""
    );
    // README's way to keep the module: hold it.
    repo.root.run(sh, &["apt-mark", "hold", "mtgdrdrv-dkms"])?;
    let tests_pin = format!("mtgdrcopy-tests={}", version(next, Package::Tests)?);
    let output = repo.apt(sh, &["install", &lib_pin, &tests_pin])?;
    ensure!(
        output.contains("2 upgraded, 0 newly installed, 0 to remove"),
        "with mtgdrdrv-dkms held, apt-get install {lib_pin} {tests_pin} did more than upgrading \
         those two:\n{output}"
    );
    let expected = [
        deb(this, Package::Kmod)?,
        deb(next, Package::Lib)?,
        deb(next, Package::Tests)?,
        deb(this, Package::Meta)?,
    ]
    .map(Deb::clone);
    expect_installed(
        sh,
        root,
        &expected,
        &format!("with mtgdrdrv-dkms held, after apt-get install {lib_pin} {tests_pin}"),
    )?;
    ensure!(
        srcversion(sh, root, &ko)? == module,
        "{ko} changed while only the library and the tools were upgraded"
    );
    timed(
        &format!(
            "library only: with mtgdrdrv-dkms held, libgdrapi and mtgdrcopy-tests {} beside \
             mtgdrdrv-dkms {} and mtgdrcopy {}; without the hold apt would upgrade {}",
            version(next, Package::Lib)?,
            version(this, Package::Kmod)?,
            version(this, Package::Meta)?,
            grouped.join(" ")
        ),
        t,
    );

    let t = Instant::now();
    let pin = format!("libgdrapi={}", major.version);
    let (ok, out, err) = repo.apt_output(sh, &["install", "--simulate", "--no-remove", &pin])?;
    ensure!(
        !ok,
        "apt-get would install {pin} while mtgdrcopy-tests {} (libgdrapi << 2~) is installed:\n\
         {out}{err}",
        version(next, Package::Tests)?
    );
    let (_, out, _) = repo.apt_output(sh, &["install", "--simulate", &pin])?;
    for package in [Package::Tests, Package::Meta] {
        ensure!(
            out.lines()
                .any(|l| l.starts_with(&format!("Remv {} ", package.deb_name()))),
            "apt-get install {pin} should be possible only by removing {}; apt's plan:\n{out}",
            package.deb_name()
        );
    }
    let (_, upgrade, _) = repo.apt_output(sh, &["upgrade", "--simulate"])?;
    ensure!(
        !upgrade.lines().any(|l| l.starts_with("Inst libgdrapi ")),
        "apt-get upgrade would install libgdrapi {}:\n{upgrade}",
        major.version
    );
    let refusal = err
        .lines()
        .find(|l| l.starts_with("E: "))
        .unwrap_or("(no E: line)")
        .to_owned();
    timed(
        &format!(
            "library only: libgdrapi {} refused while mtgdrcopy-tests {} is installed \
             (apt: {refusal}); apt-get upgrade keeps it back",
            major.version,
            version(next, Package::Tests)?
        ),
        t,
    );
    Ok(module)
}

/// The packages apt-get's output says it installs (`Inst` lines of --simulate).
fn planned(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("Inst ")?.split_whitespace().next())
        .map(String::from)
        .collect()
}

/// Each package of `release` is installed at its version.
fn expect_installed(sh: &Shell, root: &Root, release: &[Deb], when: &str) -> Result<()> {
    let mut found = Vec::new();
    let mut wrong = Vec::new();
    for deb in release {
        let (_, out, _) = root.output(
            sh,
            &[
                "dpkg-query",
                "-W",
                "-f",
                "${db:Status-Status} ${Version}",
                &deb.package,
            ],
        )?;
        let want = format!("installed {}", deb.version);
        if out.trim() != want {
            wrong.push(format!(
                "{} is {:?}, expected {want:?}",
                deb.package,
                out.trim()
            ));
        }
        found.push(format!("{} {}", deb.package, out.trim()));
    }
    ensure!(
        wrong.is_empty(),
        "{when}: {}\n(dpkg: {})",
        wrong.join("; "),
        found.join(", ")
    );
    Ok(())
}

fn srcversion(sh: &Shell, root: &Root, ko: &str) -> Result<String> {
    let out = root.run(sh, &["modinfo", "-F", "srcversion", ko])?;
    let out = out.trim();
    ensure!(!out.is_empty(), "{ko} has no srcversion");
    Ok(out.to_owned())
}

/// Nothing of the old release is left: every file the install and the upgrade added to the
/// root (compared with `before`) belongs to an installed package or is DKMS's state of the new
/// module version, and DKMS's per-kernel link names that version.
fn check_nothing_left(
    sh: &Shell,
    root: &Root,
    release: &str,
    before: &[String],
    old_kmod: &str,
    new_kmod: &str,
) -> Result<()> {
    let names: Vec<&str> = Package::SPLIT.iter().map(|p| p.deb_name()).collect();
    let owned = package_files(sh, root, &names)?;
    let after = root.file_list(sh)?;
    let left = leftovers(before, &after, &owned, release, old_kmod);
    ensure!(
        left.is_empty(),
        "after the upgrade to mtgdrdrv {new_kmod}, these files are neither the new packages' \
         nor DKMS's for {new_kmod} (left by the old release?):\n  {}",
        left.join("\n  ")
    );
    let links = root.run(
        sh,
        &[
            "find",
            "/var/lib/dkms/mtgdrdrv",
            "-maxdepth",
            "1",
            "-type",
            "l",
            "-printf",
            "%f -> %l\n",
        ],
    )?;
    ensure!(
        !links.contains(&format!("{old_kmod}/")),
        "DKMS still links to {old_kmod}:\n{links}"
    );
    Ok(())
}

/// The files of `after` that are not in `before` (sorted), not `owned` by a package and not
/// DKMS's: its tree of a module version other than `old_kmod` under /var/lib/dkms/mtgdrdrv, the
/// module it installed for `release`, its signing key.
fn leftovers(
    before: &[String],
    after: &[String],
    owned: &[String],
    release: &str,
    old_kmod: &str,
) -> Vec<String> {
    // /lib is /usr/lib in bookworm: find lists the latter, dpkg may list either.
    let merged = |p: &str| match p.strip_prefix("/lib/") {
        Some(rest) => format!("/usr/lib/{rest}"),
        None => p.to_owned(),
    };
    let owned: std::collections::BTreeSet<String> = owned.iter().map(|p| merged(p)).collect();
    let updates = format!("/usr/lib/modules/{release}/updates");
    let dkms = |p: &str| match p.strip_prefix("/var/lib/dkms/mtgdrdrv") {
        Some("") => true,
        Some(rest) => rest.strip_prefix('/').and_then(|r| r.split('/').next()) != Some(old_kmod),
        None => {
            [
                updates.clone(),
                format!("{updates}/dkms"),
                format!("{updates}/dkms/mtgdrdrv.ko"),
            ]
            .contains(&p.to_owned())
                || KEPT_BY_DKMS.contains(&p)
        }
    };
    after
        .iter()
        .filter(|f| before.binary_search(f).is_err() && !owned.contains(&merged(f)) && !dkms(f))
        .cloned()
        .collect()
}

/// A signed repository inside a root, published again as releases come out; apt in the root
/// sees only it.
#[derive(Clone, Copy)]
struct Repo<'a> {
    root: &'a Root,
    key: &'a aptrepo::TestKey,
    scratch: &'a Path,
}

const REPO: &str = "/tmp/mtgdrcopy-apt";
const LIST: &str = "/etc/apt/sources.list.d/mtgdrcopy.list";
const KEYRING: &str = "/etc/apt/keyrings/mtgdrcopy.gpg";

impl Repo<'_> {
    /// The repository of `debs` replaces the root's, then `apt-get update`.
    fn publish(&self, sh: &Shell, debs: &[Deb]) -> Result<()> {
        let files: Vec<PathBuf> = debs.iter().map(|d| d.path.clone()).collect();
        let repo = aptrepo::build(
            sh,
            &files,
            &self.scratch.join("apt"),
            "stable",
            Some(&self.key.signer()),
        )?;
        let keyring = repo
            .keyring
            .clone()
            .context("the signed repository has no keyring")?;
        let into = self.root.new_file(REPO);
        stage::fresh_dir(&into)?;
        // Made in the upper directory, /tmp would have its mode: apt's unprivileged user
        // writes its temporary files there while checking signatures.
        stage::set_mode(&self.root.new_file("/tmp"), 0o1777)?;
        let from = repo.dir.join(".");
        cmd!(sh, "cp -a {from} {into}").quiet().run()?;
        stage::put_file(&keyring, &self.root.new_file(KEYRING), 0o644)?;
        stage::put_text(
            &self.root.new_file(LIST),
            &format!(
                "{}\n",
                repo.sources_line(&format!("file:{REPO}"), "main", KEYRING)
            ),
            0o644,
        )?;
        self.apt(sh, &["update"]).map(drop)
    }

    /// `apt-get <args>` with only the repository's source; fails on a non-zero exit.
    fn apt(&self, sh: &Shell, args: &[&str]) -> Result<String> {
        let (ok, out, err) = self.apt_output(sh, args)?;
        if !ok {
            bail!(
                "`apt-get {}` failed:\n{}{}",
                args.join(" "),
                vmtest::tail(&out, 30),
                err
            );
        }
        Ok(out)
    }

    fn apt_output(&self, sh: &Shell, args: &[&str]) -> Result<(bool, String, String)> {
        let mut all = vec![
            "apt-get",
            "-q",
            "-y",
            "--no-install-recommends",
            "-o",
            "Dir::Etc::SourceParts=-",
            "-o",
            "APT::Get::List-Cleanup=0",
        ];
        let list = format!("Dir::Etc::SourceList={LIST}");
        all.extend(["-o", &list]);
        all.extend(args);
        self.root.output(sh, &all)
    }
}

/// The next release: this tree's tracked files in build/upgrade/next/ with the driver's patch
/// and the library line's minor bumped and a changelog entry each, built by that copy's own
/// `cargo xtask deb-all`. Returns its four .debs.
fn build_next(sh: &Shell) -> Result<Vec<Deb>> {
    let ws = Workspace::load(sh)?;
    let dir = paths::build_dir().join("upgrade/next");
    stage::fresh_dir(&dir)?;
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
            stage::put_symlink(&target.to_string_lossy(), &to)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            stage::put_file(&from, &to, meta.permissions().mode() & 0o7777)?;
            keep_mtime(&to, meta.modified()?)?;
        }
    }

    let drv_old = ws.krate(Package::Kmod.crate_name())?.version.clone();
    let lib_old = ws.krate(Package::Lib.crate_name())?.version.clone();
    let drv = bump(&drv_old, 2)?;
    let lib = bump(&lib_old, 1)?;
    let (_, lib_minor) = major_minor(&lib)?;
    let (_, old_minor) = major_minor(&lib_old)?;
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
    // The Rust API's constant and the C API's, which a compile-time assertion keeps equal.
    for file in ["libgdrapi/src/lib.rs", "libgdrapi/src/capi.rs"] {
        edit(
            file,
            "pub const GDR_API_MINOR_VERSION",
            &format!("= {old_minor};"),
            &format!("= {lib_minor};"),
        )?;
    }
    // Sources that differ from this release's, as every release's do: srcversion tells them apart.
    rewrite(&dir.join("mtgdrdrv/kmod/mtgdrdrv_main.c"), |text| {
        Ok(format!(
            "{text}MODULE_INFO(upgrade_test_release, \"{drv}\");\n"
        ))
    })?;

    let revision = crate::debian::revision()?;
    let source = format!("mtgdrcopy ({lib}-{revision})");
    let entries = [
        ("changelog", source.clone()),
        (
            "mtgdrdrv-dkms.changelog",
            format!("mtgdrdrv-dkms ({drv}-{revision})"),
        ),
        (
            "libgdrapi.changelog",
            format!("libgdrapi ({lib}-{revision})"),
        ),
        (
            "mtgdrcopy-tests.changelog",
            format!("mtgdrcopy-tests ({lib}-{revision})"),
        ),
        (
            "mtgdrcopy.changelog",
            format!("mtgdrcopy ({lib}-{revision})"),
        ),
        (
            "mtgdrcopy-bundle.changelog",
            format!("mtgdrcopy ({lib}-{revision}+bundle)"),
        ),
    ];
    for (file, head) in entries {
        let path = dir.join("debian").join(file);
        rewrite(&path, |old| {
            let trailer = old
                .lines()
                .find(|l| l.starts_with(" -- "))
                .with_context(|| format!("{}: no trailer line", path.display()))?;
            Ok(format!(
                "{head} unstable; urgency=medium\n\n  * The next release of the upgrade test \
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
            got == format!("{}-{revision}", crate::deb::upstream_version(want)),
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

fn major_minor(version: &str) -> Result<(u64, u64)> {
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
fn fake_next_major(sh: &Shell, lib_version: &str) -> Result<Deb> {
    let (major, _) = major_minor(lib_version)?;
    let version = format!("{}.0.0-1", major + 1);
    let arch = stage::host_arch()?.debian;
    let dir = paths::build_dir().join("upgrade/next-major");
    let tree = dir.join("tree");
    stage::fresh_dir(&tree)?;
    stage::put_text(
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

/// A root whose installed module, library and tools the guest runs, in `dir`.
struct Guest<'a> {
    root: &'a Root,
    dir: &'a str,
    /// What /sys/module/mtgdrdrv/srcversion must say once the root's module is loaded.
    srcversion: String,
    /// The library version gdr_runtime_get_version must report (major.minor.patch).
    library: &'a str,
    what: &'a str,
}

const GUEST_SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
fail() { echo "MTGDRCOPY-FAIL $*"; exit 1; }
export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy/emu
KO=lib/modules/$(uname -r)/updates/dkms/mtgdrdrv.ko

step provider
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
for i in $(seq 50); do [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done

# check DIR SRCVERSION LIBRARY WHAT: DIR's module loads, is the build expected, and DIR's
# mtgdrcopy_sanity passes against it, chrooted in DIR.
check() {
	dir=$1
	step "$dir"
	insmod "$dir/$KO" || fail "$dir: insmod mtgdrdrv ($4)"
	got=$(cat /sys/module/mtgdrdrv/srcversion)
	echo "MTGDRCOPY-UPGRADE $dir: mtgdrdrv $(cat /sys/module/mtgdrdrv/version) srcversion $got"
	[ "$got" = "$2" ] || fail "$dir: the loaded mtgdrdrv has srcversion $got, expected $2 ($4)"
	for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && break; sleep 0.1; done
	mkdir -p "$dir/dev" "$dir/proc" "$dir/tmp"
	for node in mtgdrdrv mtgpu_emu; do
		major=$((0x$(stat -c %t /dev/$node))); minor=$((0x$(stat -c %T /dev/$node)))
		rm -f "$dir/dev/$node"
		mknod "$dir/dev/$node" c $major $minor || fail "mknod $dir/dev/$node"
	done
	[ -e "$dir/dev/null" ] || mknod -m 666 "$dir/dev/null" c 1 3
	mount -t proc proc "$dir/proc" || fail "mounting /proc in $dir"
	rc=0
	out=$(chroot "$dir" /usr/bin/mtgdrcopy_sanity -v 2>&1) || rc=$?
	umount "$dir/proc"
	versions=$(echo "$out" | grep -o 'libgdrapi [0-9.]*, mtgdrdrv [0-9.]*' | head -n 1)
	echo "MTGDRCOPY-UPGRADE $dir: $versions"
	echo "$out" | tail -n 3
	[ "$rc" = 0 ] || { echo "$out" | grep -v '^&&&& PASSED' | tail -n 40; fail "$dir: mtgdrcopy_sanity failed ($4)"; }
	case "$versions" in
	"libgdrapi $3, "*) ;;
	*) fail "$dir: mtgdrcopy_sanity reported '$versions', expected libgdrapi $3 ($4)" ;;
	esac
	rmmod mtgdrdrv || fail "$dir: rmmod mtgdrdrv"
}
@CHECKS@
step unload
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"
step done
"#;

fn run_vm(sh: &Shell, kernel: &Kernel, guests: &[Guest]) -> Result<()> {
    let t = Instant::now();
    let (_, emu) = vmtest::build_modules(sh, kernel)?;
    cmd!(sh, "cargo build --quiet --release -p mtgpu-emu-musa --lib")
        .run()
        .context("building the emulated libmusa")?;
    let libmusa = paths::root().join("target/release/libmusa.so");
    timed("emulated provider and libmusa built", t);

    let release = &kernel.release;
    let mut files = vec![(emu, "/lib/mtgdrcopy/mtgpu_emu.ko".to_owned())];
    let mut checks = String::new();
    for guest in guests {
        let mut paths = package_files(sh, guest.root, &["libgdrapi", "mtgdrcopy-tests"])?;
        paths.retain(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"));
        paths.push(format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko"));
        files.extend(root_files(sh, guest.root, &paths, guest.dir, "vm-files")?);
        files.push((
            libmusa.clone(),
            format!("{}/usr/lib/mtgdrcopy/emu/libmusa.so.1", guest.dir),
        ));
        let (major, minor) = major_minor(guest.library)?;
        checks.push_str(&format!(
            "check {} {} {major}.{minor} \"{}\"\n",
            guest.dir, guest.srcversion, guest.what
        ));
    }
    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = files;
    spec.script = GUEST_SCRIPT.replace("@CHECKS@", &checks);
    spec.ivshmem_mb = 256;
    spec.timeout = Duration::from_secs(600);
    let log = paths::build_dir()
        .join("pkgtest")
        .join(format!("vm-upgrade-{release}.log"));
    let outcome = vm::run(&spec, &log)?;
    let console = outcome.console.replace('\r', "");
    vmtest::print_guest_steps(&console);
    for line in console.lines() {
        if let Some(rest) = line.strip_prefix("MTGDRCOPY-UPGRADE ") {
            eprintln!("      {rest}");
        }
    }
    outcome.ensure_no_kernel_problems(&log)?;
    if outcome.exit_code != Some(0) {
        bail!(
            "the VM part of the upgrade test failed (exit {:?}):\n{}\nfull log: {}",
            outcome.exit_code,
            vmtest::tail(&console, 50),
            log.display()
        );
    }
    Ok(())
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
        stage::fresh_dir(&dir).unwrap();
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

    #[test]
    fn finds_what_the_old_release_left() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let before = strings(&["/usr", "/usr/lib", "/var/lib/dkms"]);
        let owned = strings(&[
            "/lib/x86_64-linux-gnu/libgdrapi.so.1.1.0",
            "/usr/src/m-0.1.1",
        ]);
        let after = strings(&[
            "/usr",
            "/usr/lib",
            "/usr/lib/modules/6.1/updates/dkms/mtgdrdrv.ko",
            "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.0.0",
            "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.1.0",
            "/usr/src/m-0.1.1",
            "/var/lib/dkms",
            "/var/lib/dkms/mok.key",
            "/var/lib/dkms/mtgdrdrv",
            "/var/lib/dkms/mtgdrdrv/0.1.0/6.1/x86_64/module/mtgdrdrv.ko",
            "/var/lib/dkms/mtgdrdrv/0.1.1/6.1/x86_64/module/mtgdrdrv.ko",
            "/var/lib/dkms/mtgdrdrv/kernel-6.1-x86_64",
        ]);
        assert_eq!(
            leftovers(&before, &after, &owned, "6.1", "0.1.0"),
            [
                "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1.0.0",
                "/var/lib/dkms/mtgdrdrv/0.1.0/6.1/x86_64/module/mtgdrdrv.ko"
            ]
        );
    }
}
