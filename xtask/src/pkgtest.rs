//! The packaging steps of `cargo xtask test`: build every .deb, run lintian on them, and prove
//! them by installing them.
//!
//! The install test, in order:
//! 1. **Host.** A bookworm root with dkms and the VM kernel's headers (root.rs: cached layers
//!    under a fresh overlay) gets the four packages through `apt-get install mtgdrcopy` from
//!    a signed repository that `cargo xtask apt-repo` made of the .debs (a `file:` source with
//!    `signed-by=` a throwaway key; the same entry naming another key must be refused). Checked:
//!    DKMS built and installed mtgdrdrv.ko for that kernel (and only it: the CRC stub is not
//!    installed), dkms.conf's version is the source directory's, the udev rule and
//!    modprobe.d softdep are in /usr/lib (and no modules-load.d file), and a C program built
//!    against libgdrapi with pkg-config (shared and static) gets `libgdrapi (>= <version>), libgdrapi (<< 2~)`
//!    from dpkg-shlibdeps, i.e. shlibs and symbols work. Then, in a root of its own that believes it
//!    runs the VM's kernel, mtgdrdrv-dkms alone with the real DKMS where builds fail
//!    ([`dkms_failures`]): a newer kernel's failure is a warning, the running kernel's fails
//!    configure until fixed, /etc/dkms/no-autoinstall builds nothing, a kernel
//!    BUILD_EXCLUSIVE_KERNEL excludes is skipped.
//! 2. **Container.** A bare minbase root gets only libgdrapi and mtgdrcopy-tests: apt must not
//!    pull in dkms or anything of the module.
//! 3. **VM** (the host of both). The Debian kernel boots with the files the packages installed:
//!    the DKMS-built module, udevd and the rule from the host root, the tools and libgdrapi.so.1
//!    from the host root, and the container root's files under /container. udevd runs, so
//!    /dev/mtgdrdrv must get the rule's group and mode; insmod.sh must refuse to load without
//!    the provider; with the emulated provider loaded with disable_driver=1 (as Moore Threads'
//!    DKMS post_install leaves mtgpu), the installed mtgdrdrv-load, run as the postinst runs
//!    it, must not load mtgdrdrv and say why in one line, and insmod.sh must refuse; with the
//!    provider loaded normally, mtgdrdrv-load must load the DKMS-built module (modprobe) and
//!    insmod.sh reload it; the installed mtgdrcopy_sanity must pass; then in
//!    `chroot /container`, with only the two device nodes (what `docker run --device` gives),
//!    sanity and copybw run against the host's module. Before all that, right after boot with
//!    no provider, mtgdrdrv must not be loaded nor named in the kernel log; after it, with the
//!    packaged softdep renamed for the emulated provider (`softdep mtgpu_emu post: mtgdrdrv`)
//!    and kmod's modprobe, `modprobe mtgpu_emu` must load mtgdrdrv, and still load the provider
//!    when mtgdrdrv is not built or fails to load.
//!    The emulated libmusa.so.1 stands in for the MUSA driver's (/usr/lib/mtgdrcopy/emu, on
//!    LD_LIBRARY_PATH); libgdrapi is found where the package put it.
//! 4. **Purge.** `apt-get purge` of the four: DKMS no longer knows mtgdrdrv, the module is gone
//!    and no file is left that was not there before the install.
//! 5. **Bundle.** The single-package build on the same root: DKMS installs the module again,
//!    then its purge leaves the root as clean.

mod root;
mod upgrade;

use std::cell::RefCell;
use std::fs;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::deb::{self, Built};
use crate::kernel::{self, Kernel};
use crate::stage::{self, Package};
use crate::test::Step;
use crate::workspace::Workspace;
use crate::{aptrepo, paths, vm, vmtest};

use root::Root;

/// The packaging steps; the install test only with `vm` (it boots QEMU).
pub fn test_steps(vm: bool) -> Vec<Step<'static>> {
    let debs: Rc<RefCell<Option<Vec<Built>>>> = Rc::default();
    let upgrade = upgrade::test_step(debs.clone());
    let (d1, d2, d3, d4, d5) = (debs.clone(), debs.clone(), debs.clone(), debs.clone(), debs);
    let mut steps: Vec<Step<'static>> = vec![
        (
            "packages: build every .deb (deb-all, deb-bundle); xz, -dbgsym, libgdrapi.a",
            Box::new(move |sh: &Shell| contents_check(sh, &built(sh, &d1)?)),
        ),
        (
            "packages: build-all stages every package tree (make build)",
            Box::new(crate::stage::build_all_test_step),
        ),
        (
            "packages: lintian on every .deb",
            Box::new(move |sh: &Shell| lintian(sh, &built(sh, &d2)?)),
        ),
        (
            "source package: dpkg-buildpackage in trixie offline, lintian, same as deb-all",
            Box::new(move |sh: &Shell| crate::dsc::test_step(sh, &built(sh, &d4)?)),
        ),
        (
            "packages: reproducible (deb-all again from a copy at another path)",
            Box::new(move |sh: &Shell| crate::repro::test_step(sh, &built(sh, &d5)?)),
        ),
    ];
    if vm {
        steps.push((
            "packages: install on bookworm (DKMS, VM, container), purge",
            Box::new(move |sh: &Shell| install_test(sh, &built(sh, &d3)?)),
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
    /// Skip the install test.
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
    let ws = Workspace::load(&sh)?;
    let debs = deb::build_everything(&sh, &ws)?;
    if !args.no_lintian {
        lintian(&sh, &debs)?;
    }
    if !args.no_install {
        install_test(&sh, &debs)?;
    }
    if !args.no_install && !args.upgrade.no_upgrade {
        upgrade::test(&sh, &debs)?;
    }
    Ok(())
}

/// The .debs, built on first use.
fn built(sh: &Shell, cache: &Rc<RefCell<Option<Vec<Built>>>>) -> Result<Vec<Built>> {
    if let Some(debs) = cache.borrow().as_ref() {
        return Ok(debs.clone());
    }
    let ws = Workspace::load(sh)?;
    let debs = deb::build_everything(sh, &ws)?;
    for d in &debs {
        eprintln!("    {}", d.path.display());
    }
    *cache.borrow_mut() = Some(debs.clone());
    Ok(debs)
}

/// What the archives must be: xz members; a -dbgsym package beside each package with ELF
/// files; a libgdrapi.a without bitcode whose only global symbols are the API, linking beside
/// another Rust staticlib (staticlib.rs). Prints the sizes.
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
        let has_elf = !deb::elf_files(&b.package.tree())?.is_empty();
        ensure!(
            has_elf == b.dbgsym.is_some(),
            "{}: {} ELF files, but {} -dbgsym package",
            b.package.deb_name(),
            if has_elf { "has" } else { "no" },
            if b.dbgsym.is_some() { "a" } else { "no" }
        );
    }
    let lib = find(debs, Package::Lib)?;
    let arch = stage::host_arch()?;
    let archive = lib
        .package
        .tree()
        .join(format!("usr/lib/{}/libgdrapi.a", arch.multiarch));
    crate::staticlib::check(sh, &archive, None)
}

fn timed(what: &str, start: Instant) {
    eprintln!("    {what}: {:.1} s", start.elapsed().as_secs_f64());
}

/// lintian on every .deb: no error, no warning, no info tag (so also no unused override); the
/// remaining ones are overridden in debian/<package>/lintian-overrides, each with its reason.
pub fn lintian(sh: &Shell, debs: &[Built]) -> Result<()> {
    // No other xtask rewrites the .debs meanwhile.
    let _lock = crate::stage::lock()?;
    let mut files: Vec<PathBuf> = Vec::new();
    for d in debs {
        files.push(d.path.clone());
        files.extend(d.dbgsym.clone());
    }
    lintian_files(sh, &files)
}

/// lintian, pedantic, failing on anything but overridden tags, on .debs and .dsc files.
pub fn lintian_files(sh: &Shell, files: &[PathBuf]) -> Result<()> {
    kernel::ensure_host_packages(&["lintian"])?;
    let debs = files;
    let out = cmd!(
        sh,
        "lintian --fail-on error,warning,info --display-info --pedantic {files...}"
    )
    .quiet()
    .ignore_status()
    .output()
    .context("running lintian")?;
    // (--show-overrides would list the overridden tags, but makes lintian exit 2.)
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reported: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("N:")).collect();
    eprintln!(
        "    lintian: {} files, {} tags besides those overridden in debian/*.lintian-overrides",
        debs.len(),
        reported.len()
    );
    for line in &reported {
        eprintln!("      {line}");
    }
    if !out.status.success() {
        bail!(
            "lintian failed ({}):\n{}{}",
            out.status,
            reported
                .iter()
                .map(|l| format!("  {l}\n"))
                .collect::<String>(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.contains("root privileges"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

fn find(debs: &[Built], package: Package) -> Result<&Built> {
    debs.iter()
        .find(|d| d.package == package)
        .with_context(|| format!("no .deb was built for {package:?}"))
}

/// Copies the .debs into the root's /tmp/debs; returns their paths there.
fn put_debs(root: &Root, debs: &[&Built]) -> Result<Vec<String>> {
    let _lock = crate::stage::lock()?;
    let dir = root.new_file("/tmp/debs");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut inside = Vec::new();
    for d in debs {
        let name = d
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .context("deb file name")?;
        fs::copy(&d.path, dir.join(name)).with_context(|| format!("copying {name}"))?;
        inside.push(format!("/tmp/debs/{name}"));
    }
    Ok(inside)
}

fn apt_install(sh: &Shell, root: &Root, debs: &[String]) -> Result<String> {
    let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
    args.extend(debs.iter().map(String::as_str));
    root.run(sh, &args)
}

fn install_test(sh: &Shell, debs: &[Built]) -> Result<()> {
    kernel::ensure_host_packages(vmtest::HOST_PACKAGES)?;
    // The roots in build/pkgtest/ are one run's at a time.
    let _lock = crate::stage::lock_file(
        &paths::build_dir().join("pkgtest/.lock"),
        "running the package install test",
    )?;
    let kernel = kernel::bookworm_kernel()?;
    let release = kernel.release.clone();
    let t = Instant::now();
    let host_layers = root::dkms_layers(sh, &kernel)?;
    let minbase = root::minbase(sh)?;
    timed("cached root layers ready", t);

    let host = Root::fresh(host_layers.clone(), "host")?;
    let container = Root::fresh(vec![minbase], "container")?;
    let before = host.file_list(sh)?;

    // 1. Host: the four packages.
    let t = Instant::now();
    let output = install_from_repo(sh, &host, debs)?;
    timed(
        "host: apt-get install mtgdrcopy from the signed repository (DKMS build)",
        t,
    );
    let kmod_version = &find(debs, Package::Kmod)?
        .version()
        .split('-')
        .next()
        .unwrap_or_default()
        .to_owned();
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    let t = Instant::now();
    let lib = find(debs, Package::Lib)?;
    check_consumer(sh, &host, lib)?;
    timed("host: consumer built with pkg-config, dpkg-shlibdeps", t);
    let t = Instant::now();
    dkms_failures(
        sh,
        host_layers.clone(),
        find(debs, Package::Kmod)?,
        &release,
        kmod_version,
    )?;
    timed(
        "host: DKMS failures for another kernel and the running one, no-autoinstall",
        t,
    );

    // 2. Container: library and tools only.
    let t = Instant::now();
    let inside = put_debs(
        &container,
        &[find(debs, Package::Lib)?, find(debs, Package::Tests)?],
    )?;
    apt_install(sh, &container, &inside)?;
    for absent in ["dkms", "mtgdrdrv-dkms", "linux-headers-amd64"] {
        let (_, status, _) =
            container.output(sh, &["dpkg-query", "-W", "-f", "${Status}", absent])?;
        ensure!(
            status.trim() != "install ok installed",
            "installing libgdrapi and mtgdrcopy-tests pulled in {absent}"
        );
    }
    ensure!(
        !container.exists(sh, &format!("/usr/src/mtgdrdrv-{kmod_version}"))?,
        "the container root got the module sources"
    );
    timed("container: apt-get install libgdrapi mtgdrcopy-tests", t);

    // 3. The VM.
    let t = Instant::now();
    run_vm(sh, &kernel, &host, &container)?;
    timed(
        "VM: udev, insmod.sh, sanity on the host and in the container",
        t,
    );

    // 4. Purge.
    let t = Instant::now();
    host.run(
        sh,
        &[
            "apt-get",
            "purge",
            "-y",
            "-q",
            "mtgdrcopy",
            "mtgdrcopy-tests",
            "libgdrapi",
            "mtgdrdrv-dkms",
        ],
    )?;
    check_purged(sh, &host, &release, &before)?;
    timed("host: purge, nothing left behind", t);

    // 5. The bundle.
    let t = Instant::now();
    let bundle = find(debs, Package::Bundle)?;
    let inside = put_debs(&host, &[bundle])?;
    let output = apt_install(sh, &host, &inside)?;
    check_dkms_installed(sh, &host, &release, kmod_version, &output)?;
    let status = host.run(sh, &["dpkg-query", "-W", "-f", "${Version}", "mtgdrcopy"])?;
    ensure!(
        status == bundle.version(),
        "mtgdrcopy {status} is installed, expected the bundle's {}",
        bundle.version()
    );
    host.run(sh, &["apt-get", "purge", "-y", "-q", "mtgdrcopy"])?;
    check_purged(sh, &host, &release, &before)?;
    timed(
        "host: the single-package build installs (DKMS) and purges clean",
        t,
    );
    Ok(())
}

/// Step 1: the release as a fleet gets it. `cargo xtask apt-repo`'s repository of every .deb,
/// signed with a throwaway key, is put in the root as a `file:` source with `signed-by=`. First
/// the entry names another key: `apt-get update` must refuse the repository (so apt really
/// checks the signature); then the right key, and `apt-get install mtgdrcopy` must bring the
/// four split packages (component main), not the bundle. Returns apt-get's output. The
/// sources entry and keyrings are removed afterwards, so the purge leaves the root as found.
fn install_from_repo(sh: &Shell, host: &Root, debs: &[Built]) -> Result<String> {
    const REPO: &str = "/tmp/mtgdrcopy-apt";
    const LIST: &str = "/etc/apt/sources.list.d/mtgdrcopy.list";
    const KEYRINGS: &str = "/etc/apt/keyrings";
    let scratch = paths::build_dir().join("pkgtest");
    let key = aptrepo::TestKey::generate(sh, &scratch.join("gnupg"), "mtgdrcopy-test-archive")?;
    let stranger = aptrepo::TestKey::generate(sh, &scratch.join("gnupg-stranger"), "stranger")?;
    let files: Vec<PathBuf> = debs.iter().map(|d| d.path.clone()).collect();
    let repo = aptrepo::build(
        sh,
        &files,
        &scratch.join("apt"),
        "stable",
        Some(&key.signer()),
    )?;
    let keyring = repo
        .keyring
        .clone()
        .context("the signed repository has no keyring")?;
    let had_keyrings = host.exists(sh, KEYRINGS)?;
    let into = host.new_file(REPO);
    fs::create_dir_all(&into)?;
    // Made in the upper directory, /tmp takes that directory's mode: keep it /tmp's, since
    // apt's unprivileged user writes its temporary files there while checking signatures.
    crate::stage::set_mode(&host.new_file("/tmp"), 0o1777)?;
    let from = repo.dir.join(".");
    cmd!(sh, "cp -a {from} {into}").quiet().run()?;
    let keyrings = host.new_file(KEYRINGS);
    fs::create_dir_all(&keyrings)?;
    fs::copy(&keyring, keyrings.join("mtgdrcopy.gpg"))?;
    fs::write(keyrings.join("stranger.gpg"), stranger.public_key(sh)?)?;
    // Only this source is fetched: the root's Debian lists stay as the layer has them.
    let update = [
        "apt-get",
        "update",
        "-q",
        "-o",
        &format!("Dir::Etc::SourceList={LIST}"),
        "-o",
        "Dir::Etc::SourceParts=-",
        "-o",
        "APT::Get::List-Cleanup=0",
    ];
    let uri = format!("file:{REPO}");
    let list = host.new_file(LIST);
    // The upper directory has only what the test wrote: make the entry's directory there.
    if let Some(dir) = list.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(
        &list,
        format!(
            "{}\n",
            repo.sources_line(&uri, "main", &format!("{KEYRINGS}/stranger.gpg"))
        ),
    )?;
    let (ok, stdout, stderr) = host.output(sh, &update)?;
    ensure!(
        !ok && format!("{stdout}{stderr}").contains("NO_PUBKEY"),
        "apt-get update accepted the repository with a sources entry naming another key \
         (exit ok: {ok}):\n{stdout}{stderr}"
    );
    fs::write(
        &list,
        format!(
            "{}\n",
            repo.sources_line(&uri, "main", &format!("{KEYRINGS}/mtgdrcopy.gpg"))
        ),
    )?;
    host.run(sh, &update)?;
    let output = host.run(
        sh,
        &[
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "mtgdrcopy",
        ],
    )?;
    for package in Package::SPLIT {
        let built = find(debs, package)?;
        let installed = host.run(
            sh,
            &["dpkg-query", "-W", "-f", "${Version}", package.deb_name()],
        )?;
        ensure!(
            installed == built.version(),
            "{} {installed} is installed from the repository, expected {}",
            package.deb_name(),
            built.version()
        );
    }
    eprintln!(
        "    repository: {} ({}), signed; a sources entry naming another key is refused",
        repo.components.join(" + "),
        repo.architectures.join(" ")
    );
    let mut remove = vec![
        "rm".to_owned(),
        "-f".to_owned(),
        LIST.to_owned(),
        format!("{KEYRINGS}/mtgdrcopy.gpg"),
        format!("{KEYRINGS}/stranger.gpg"),
    ];
    if !had_keyrings {
        remove = vec!["rm".into(), "-rf".into(), LIST.into(), KEYRINGS.into()];
    }
    let remove: Vec<&str> = remove.iter().map(String::as_str).collect();
    host.run(sh, &remove)?;
    Ok(output)
}

/// DKMS built and installed mtgdrdrv for `release`: its status, the module file, no stub, the
/// generated dkms.conf. Reports whether DKMS signed the module.
fn check_dkms_installed(
    sh: &Shell,
    host: &Root,
    release: &str,
    version: &str,
    apt_output: &str,
) -> Result<()> {
    let status = host.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.lines().any(
            |l| l.starts_with(&format!("mtgdrdrv/{version}, {release},"))
                && l.ends_with(": installed")
        ),
        "dkms status does not show mtgdrdrv {version} installed for {release}:\n{status}\n\
         apt-get said:\n{apt_output}"
    );
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    ensure!(host.exists(sh, &ko)?, "{ko} is missing");
    let modules = host.run(
        sh,
        &["find", &format!("/lib/modules/{release}"), "-name", "*.ko*"],
    )?;
    ensure!(
        !modules.contains("mtgpu_p2p_stub"),
        "the CRC stub was installed:\n{modules}"
    );
    let conf = host.read(sh, &format!("/usr/src/mtgdrdrv-{version}/dkms.conf"))?;
    ensure!(
        conf.contains(&format!("PACKAGE_VERSION=\"{version}\"")),
        "dkms.conf's PACKAGE_VERSION is not {version}, the source directory's version"
    );
    for file in [
        "/usr/lib/udev/rules.d/60-mtgdrdrv.rules",
        SOFTDEP,
        stage::LOAD_SCRIPT,
    ] {
        ensure!(host.exists(sh, file)?, "{file} is missing");
    }
    // mtgdrdrv loads with mtgpu (the softdep), not at every boot whatever is there.
    let ours = host.run(
        sh,
        &[
            "find",
            "/usr/lib",
            "/etc",
            "-path",
            "*/modules-load.d/*mtgdrdrv*",
        ],
    )?;
    ensure!(
        ours.trim().is_empty(),
        "a modules-load.d file of ours is installed: {ours}"
    );
    let signed = host.run(sh, &["tail", "-c", "28", &ko])? == "~Module signature appended~\n";
    let size: u64 = host
        .run(sh, &["stat", "-c", "%s", &ko])?
        .trim()
        .parse()
        .context("the module's size")?;
    eprintln!(
        "    DKMS: mtgdrdrv {version} installed for {release} ({}, {} KiB)",
        if signed {
            "signed with DKMS's MOK key"
        } else {
            "not signed"
        },
        size / 1024
    );
    Ok(())
}

/// Where mtgdrdrv-dkms installs debian/mtgdrdrv.modprobe.conf, the softdep on mtgpu.
const SOFTDEP: &str = "/usr/lib/modprobe.d/mtgdrdrv.conf";

/// A kernel newer than the VM's whose module build fails (its build/ has headers, include/, and
/// a Makefile that fails), and one older than BUILD_EXCLUSIVE_KERNEL allows.
const BROKEN_KERNEL: &str = "6.1.0-9999-amd64";
const EXCLUDED_KERNEL: &str = "5.3.0-1-amd64";
const BROKEN_MAKEFILE: &str =
    "modules clean:\n\t@echo 'broken on purpose by the package install test' >&2; exit 1\n";

/// What mtgdrdrv-load, or the postinst around it, prints when it tries to load the module.
const LOAD_LINES: &[&str] = &[
    "could not load the module now",
    "driver is not loaded",
    "loaded with disable_driver=1",
];

/// Step 1b: the postinst with the real DKMS where builds fail, in a root of its own that
/// believes it runs the VM's kernel (a `uname` printing its release for -r; in /usr/sbin, since
/// apt runs dpkg with PATH=/usr/sbin:/usr/bin:/sbin:/bin, DPkg::Path, so /usr/local/bin is not
/// seen), with BROKEN_KERNEL and EXCLUDED_KERNEL beside it. mtgdrdrv-dkms alone is installed
/// and purged three times:
/// - /etc/dkms/no-autoinstall: installs, builds nothing (DKMS: added), says so.
/// - The newest kernel's build fails: apt succeeds with one warning naming it and its kept
///   make.log, nothing is left half-configured (`dpkg --audit`), the module is installed for the
///   running kernel, `apt-get -f install` has nothing to fix. EXCLUDED_KERNEL is not built.
/// - autoinstall_all_kernels, and the running kernel's build fails too: configure fails saying
///   so, EXCLUDED_KERNEL is skipped as not supported (DKMS's exit 77); with the build fixed,
///   `dpkg --configure -a` succeeds and installs the module.
///
/// No case tries to load the module (a chroot; mtgpu is absent anyway). The purges leave the root
/// as it was.
fn dkms_failures(
    sh: &Shell,
    layers: Vec<PathBuf>,
    kmod: &Built,
    release: &str,
    version: &str,
) -> Result<()> {
    let root = Root::fresh(layers, "dkms")?;
    stage::put_text(
        &root.new_file("/usr/sbin/uname"),
        &format!(
            "#!/bin/sh\n# The package install test: this root runs the VM's kernel.\n\
             if [ \"$1\" = -r ]; then echo {release}; else exec /usr/bin/uname \"$@\"; fi\n"
        ),
        0o755,
    )?;
    let running = root.run(sh, &["uname", "-r"])?;
    ensure!(
        running.trim() == release,
        "uname -r in the root says {running:?}, not {release}"
    );
    let broken = format!("/lib/modules/{BROKEN_KERNEL}/build");
    root.run(
        sh,
        &[
            "mkdir",
            "-p",
            &format!("{broken}/include"),
            &format!("/lib/modules/{EXCLUDED_KERNEL}/build/include"),
        ],
    )?;
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "printf '%s' \"$2\" >\"$1\"",
            "-",
            &format!("{broken}/Makefile"),
            BROKEN_MAKEFILE,
        ],
    )?;
    let before = root.file_list(sh)?;
    let deb = put_debs(&root, &[kmod])?;
    let install = |what: &str| -> Result<(bool, String)> {
        let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
        args.extend(deb.iter().map(String::as_str));
        let (ok, out, err) = root.output(sh, &args)?;
        let all = format!("{out}{err}");
        for line in LOAD_LINES {
            ensure!(
                !all.contains(line),
                "{what}: the postinst tried to load mtgdrdrv in a chroot without mtgpu:\n{all}"
            );
        }
        Ok((ok, all))
    };
    let status = |root: &Root| root.run(sh, &["dkms", "status", "-m", "mtgdrdrv"]);
    let audit = |root: &Root| root.run(sh, &["dpkg", "--audit"]);
    let purge = |root: &Root| {
        root.run(sh, &["apt-get", "purge", "-y", "-q", "mtgdrdrv-dkms"])
            .map(drop)
    };
    let kept_log = format!("/var/lib/dkms/mtgdrdrv/{version}/make-{BROKEN_KERNEL}.log");
    let warning = format!(
        "mtgdrdrv: warning: the DKMS build failed for kernel {BROKEN_KERNEL} (not the running \
         one; dkms exit 10), which stays without mtgdrdrv: see {kept_log}"
    );

    // /etc/dkms/no-autoinstall.
    root.run(sh, &["touch", "/etc/dkms/no-autoinstall"])?;
    let (ok, out) = install("no-autoinstall")?;
    ensure!(
        ok,
        "with /etc/dkms/no-autoinstall, the install failed:\n{out}"
    );
    ensure!(
        out.contains(&format!(
            "mtgdrdrv: DKMS autoinstall is disabled (/etc/dkms/no-autoinstall), so the module is \
             not built; build it by hand: dkms install mtgdrdrv/{version} -k <kernel>"
        )) && !out.contains("Building module"),
        "with /etc/dkms/no-autoinstall, apt-get said:\n{out}"
    );
    let st = status(&root)?;
    ensure!(
        st.trim() == format!("mtgdrdrv/{version}: added"),
        "with /etc/dkms/no-autoinstall, dkms status says:\n{st}"
    );
    purge(&root)?;
    root.run(sh, &["rm", "/etc/dkms/no-autoinstall"])?;
    eprintln!("    no-autoinstall: registered, nothing built, said so");

    // The newest kernel's build fails; the running kernel's works.
    let (ok, out) = install("newest kernel broken")?;
    ensure!(
        ok,
        "a failed build for {BROKEN_KERNEL}, which is not running, failed the install:\n{out}"
    );
    for line in [
        format!(
            "mtgdrdrv: building for kernel(s) {BROKEN_KERNEL} {release} (the newest installed \
             kernel and the running one)"
        ),
        warning.clone(),
    ] {
        ensure!(
            out.lines().any(|l| l == line),
            "apt-get did not say\n{line}\nbut:\n{out}"
        );
    }
    ensure!(
        !out.contains(EXCLUDED_KERNEL),
        "the postinst built for {EXCLUDED_KERNEL}, neither running nor newest:\n{out}"
    );
    let left = audit(&root)?;
    ensure!(
        left.trim().is_empty(),
        "dpkg --audit after the install:\n{left}"
    );
    check_dkms_installed(sh, &root, release, version, &out)?;
    let log = root.read(sh, &kept_log)?;
    ensure!(
        log.contains("broken on purpose"),
        "{kept_log} is not {BROKEN_KERNEL}'s make.log:\n{log}"
    );
    root.run(sh, &["apt-get", "-f", "install", "-y", "-q"])?;
    purge(&root)?;
    eprintln!(
        "    a newer kernel's build fails: a warning, apt goes on, the running kernel has it"
    );

    // Every kernel, and the running kernel's build fails.
    let conf = "/etc/dkms/framework.conf.d/mtgdrcopy-test.conf";
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "echo autoinstall_all_kernels=yes >\"$1\"",
            "-",
            conf,
        ],
    )?;
    let build = format!("/lib/modules/{release}/build");
    let real = format!("/lib/modules/{release}/build.real");
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "mv \"$1\" \"$2\" && mkdir -p \"$1/include\" && printf '%s' \"$3\" >\"$1/Makefile\"",
            "-",
            &build,
            &real,
            BROKEN_MAKEFILE,
        ],
    )?;
    let (ok, out) = install("running kernel broken")?;
    ensure!(
        !ok,
        "a failed build for the running kernel {release} did not fail the install:\n{out}"
    );
    for line in [
        format!(
            "mtgdrdrv: not supported by kernel {EXCLUDED_KERNEL} (BUILD_EXCLUSIVE_* in \
             dkms.conf), skipped"
        ),
        warning,
        format!(
            "mtgdrdrv: the DKMS build failed for the running kernel {release} (dkms exit 10): \
             see /var/lib/dkms/mtgdrdrv/{version}/build/make.log; once the cause is fixed, \
             retry with: dpkg --configure -a"
        ),
    ] {
        ensure!(
            out.lines().any(|l| l == line),
            "apt-get did not say\n{line}\nbut:\n{out}"
        );
    }
    let left = audit(&root)?;
    ensure!(
        left.contains("mtgdrdrv-dkms"),
        "after the failed configure, dpkg --audit does not list mtgdrdrv-dkms:\n{left}"
    );
    root.run(
        sh,
        &[
            "sh",
            "-c",
            "rm -r \"$1\" && mv \"$2\" \"$1\"",
            "-",
            &build,
            &real,
        ],
    )?;
    let (ok, out, err) = root.output(sh, &["dpkg", "--configure", "-a"])?;
    ensure!(
        ok,
        "dpkg --configure -a failed once the running kernel's build was fixed:\n{out}{err}"
    );
    let left = audit(&root)?;
    ensure!(
        left.trim().is_empty(),
        "dpkg --audit after the retry:\n{left}"
    );
    check_dkms_installed(sh, &root, release, version, &format!("{out}{err}"))?;
    purge(&root)?;
    root.run(sh, &["rm", conf])?;
    eprintln!(
        "    the running kernel's build fails: configure fails and says so; \
         dpkg --configure -a once fixed; {EXCLUDED_KERNEL} skipped (DKMS exit 77)"
    );
    check_purged(sh, &root, release, &before)
}

/// A C program against the installed libgdrapi: compiled and linked through pkg-config (shared
/// and static), and dpkg-shlibdeps gives it `libgdrapi (>= <upstream version>), libgdrapi (<<
/// <next major>~)`: a 2.x package, which has no libgdrapi.so.1, must not satisfy it.
fn check_consumer(sh: &Shell, host: &Root, lib: &Built) -> Result<()> {
    let dir = host.new_file("/tmp/consumer");
    fs::create_dir_all(dir.join("debian"))?;
    fs::write(
        dir.join("consumer.c"),
        "#include <gdrapi.h>\n#include <stdio.h>\n\
         int main(void) {\n\
         \tint major = 0, minor = 0;\n\
         \tgdr_runtime_get_version(&major, &minor);\n\
         \tprintf(\"libgdrapi %d.%d\\n\", major, minor);\n\
         \tgdr_t g = gdr_open();\n\
         \tprintf(\"gdr_open: %s\\n\", g ? \"ok\" : \"failed\");\n\
         \tif (g)\n\
         \t\tgdr_close(g);\n\
         \treturn 0;\n}\n",
    )?;
    fs::write(
        dir.join("debian/control"),
        "Source: consumer\n\nPackage: consumer\nArchitecture: any\n",
    )?;
    let sh_in = |script: &str| -> Result<String> { host.run(sh, &["sh", "-euc", script]) };
    let shared = sh_in(
        "cd /tmp/consumer && cc -Wall -Werror consumer.c $(pkg-config --cflags --libs gdrapi) \
         -o consumer && ./consumer",
    )?;
    // libgdrapi.a linked in, the rest (Libs.private: what Rust's std needs) dynamically.
    let stat = sh_in(
        "cd /tmp/consumer && cc -Wall -Werror consumer.c \
         $(pkg-config --static --cflags --libs gdrapi | sed 's/-lgdrapi /-l:libgdrapi.a /') \
         -o consumer-static && ./consumer-static",
    )?;
    let upstream = lib.version().split('-').next().unwrap_or_default();
    let (major, minor) = {
        let mut v = upstream.split('.');
        (v.next().unwrap_or(""), v.next().unwrap_or(""))
    };
    // No /dev/mtgdrdrv in the root: gdr_open fails, quietly (logging is off by default).
    let expected = format!("libgdrapi {major}.{minor}\ngdr_open: failed");
    ensure!(
        shared.trim() == expected && stat.trim() == expected,
        "the consumer printed {shared:?} (shared) and {stat:?} (static), expected {expected:?}"
    );
    let deps = sh_in("cd /tmp/consumer && dpkg-shlibdeps -O consumer 2>/dev/null")?;
    let want = format!(
        "libgdrapi (>= {upstream}), libgdrapi (<< {})",
        crate::debian::next_major(upstream)?
    );
    ensure!(
        deps.contains(&want),
        "dpkg-shlibdeps gave a consumer {deps:?}, which lacks {want}"
    );
    eprintln!("    consumer: {}", deps.trim());
    Ok(())
}

/// The messages README.md's troubleshooting section quotes, as the guest printed them: the
/// library's (logging on), insmod.sh's and mtgdrdrv-load's (with mtgpu for the emulated
/// provider's name) and the kernel's. Each must be there word for word.
fn check_readme_quotes(console: &str) -> Result<()> {
    let readme =
        fs::read_to_string(paths::root().join("README.md")).context("reading README.md")?;
    let mut quoted = 0;
    for line in console.lines() {
        // Kernel lines carry a `[   4.5]` timestamp first.
        let text = match line.split_once("] ") {
            Some((stamp, rest)) if stamp.starts_with('[') => rest,
            _ => line,
        };
        let text = text.trim_end();
        let wanted = text.starts_with("ERR:  ")
            || (text.starts_with("DBG:  ") && text.contains("mmap"))
            || text.starts_with("insmod.sh: ")
            || text.starts_with("mtgdrdrv: Unknown symbol")
            || (text.starts_with("mtgdrdrv: ")
                && (text.contains("driver is not loaded")
                    || text.contains("loaded with disable_driver=1")));
        if !wanted {
            continue;
        }
        // mtgdrdrv-load names the provider, the emulated one here; README.md names mtgpu.
        let text = &text.replace("mtgpu_emu", "mtgpu");
        ensure!(
            readme.lines().any(|l| l.trim() == text),
            "README.md's troubleshooting does not quote this message the guest printed:\n{text}"
        );
        quoted += 1;
    }
    ensure!(
        quoted >= 7,
        "the guest printed only {quoted} of the messages README.md quotes"
    );
    Ok(())
}

/// DKMS's module signing key pair, generated the first time DKMS signs a module (here, ours):
/// DKMS's state, not the package's, and kept on purpose, since it may be enrolled in the
/// firmware's MOK list by then.
const KEPT_BY_DKMS: &[&str] = &["/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"];

/// After purging: DKMS forgot mtgdrdrv, the module is gone, and the root has no file that was
/// not there before the install.
fn check_purged(sh: &Shell, host: &Root, release: &str, before: &[String]) -> Result<()> {
    let status = host.run(sh, &["dkms", "status", "-m", "mtgdrdrv"])?;
    ensure!(
        status.trim().is_empty(),
        "DKMS still knows mtgdrdrv after the purge:\n{status}"
    );
    let ko = format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko");
    ensure!(!host.exists(sh, &ko)?, "{ko} is still there");
    let after = host.file_list(sh)?;
    let left: Vec<&String> = after
        .iter()
        .filter(|f| before.binary_search(f).is_err() && !KEPT_BY_DKMS.contains(&f.as_str()))
        .collect();
    ensure!(
        left.is_empty(),
        "the purge left files behind:\n  {}",
        left.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    Ok(())
}

/// Host files for the guest: `paths` of `root` (symlinks followed), each at `prefix` + its
/// path, plus the shared libraries they need, taken from the root itself (ldd inside it).
fn root_files(
    sh: &Shell,
    root: &Root,
    paths: &[String],
    prefix: &str,
    export: &str,
) -> Result<Vec<(PathBuf, String)>> {
    let mut all: Vec<String> = paths.to_vec();
    let mut args = vec!["ldd"];
    args.extend(paths.iter().map(String::as_str));
    // ldd fails for the files that are not dynamic ELF objects; it still lists the others.
    let (_, out, _) = root.output(sh, &args)?;
    for line in out.lines() {
        let line = line.trim();
        // With several files, ldd heads each one's list with `<file>:`.
        if line.ends_with(':') {
            continue;
        }
        let lib = match line.split_once(" => ") {
            Some((_, rest)) => rest.split(" (").next().unwrap_or_default().trim(),
            None if line.starts_with('/') => line.split(" (").next().unwrap_or_default().trim(),
            None => continue,
        };
        // A library among `paths` under another directory name (/lib is /usr/lib here) is
        // the same file: cp would skip it, and the guest's loader searches both.
        let name = lib.rsplit('/').next().unwrap_or(lib);
        if lib.starts_with('/') && !all.iter().any(|p| p.rsplit('/').next() == Some(name)) {
            all.push(lib.to_owned());
        }
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let dir = root.export(sh, &refs, export)?;
    Ok(all
        .iter()
        .map(|p| (dir.join(p.trim_start_matches('/')), format!("{prefix}{p}")))
        .collect())
}

/// What `packages` installed in `root` (dpkg -L: files, links and directories).
fn package_files(sh: &Shell, root: &Root, packages: &[&str]) -> Result<Vec<String>> {
    let mut args = vec!["dpkg", "-L"];
    args.extend(packages);
    let out = root.run(sh, &args)?;
    Ok(out.lines().map(String::from).collect())
}

const GUEST_SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
fail() { echo "MTGDRCOPY-FAIL $*"; exit 1; }
KO=/lib/modules/$(uname -r)/updates/dkms/mtgdrdrv.ko
export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy/emu

step udev
mkdir -p /run/udev
@UDEVD@ --daemon || fail "systemd-udevd did not start"

step boot
# Booted with the package's files and no provider: nothing loaded mtgdrdrv, the kernel never
# heard of it, and no modules-load.d file of ours would have it loaded at boot.
[ -d /sys/module/mtgdrdrv ] && fail "mtgdrdrv is loaded after boot without its provider"
dmesg | grep mtgdrdrv && fail "the kernel log mentions mtgdrdrv after boot without its provider"
ls /usr/lib/modules-load.d /lib/modules-load.d /etc/modules-load.d 2>/dev/null | grep mtgdrdrv && fail "a modules-load.d file of ours is installed"
grep -qx 'softdep mtgpu post: mtgdrdrv' @SOFTDEP@ || fail "@SOFTDEP@ has no softdep on mtgpu"

step messages
# What libgdrapi says without the module (a consumer built against the package's library).
GDRCOPY_ENABLE_LOGGING=1 /opt/mtgdrcopy/consumer 2>&1

step insmod.sh
out=$(sh /opt/mtgdrcopy/insmod.sh "$KO" 2>&1) && fail "insmod.sh loaded mtgdrdrv without mtgpu: $out"
echo "$out"
echo "$out" | grep -q "driver is not loaded" || fail "insmod.sh did not say that mtgpu is missing"
insmod "$KO" 2>/dev/null && fail "mtgdrdrv loaded without a provider of mtgpu_p2p_get_pages"

step disable_driver
# The state Moore Threads' DKMS post_install leaves until reboot: the provider loaded with
# disable_driver=1, its symbols exported but its PCI driver not registered (mtgpu_p2p_get_pages
# would oops). mtgdrdrv-load, as the postinst runs it, must not load mtgdrdrv and must say why
# in one line; insmod.sh, which runs the same script, must refuse.
insmod /lib/mtgdrcopy/mtgpu_emu.ko disable_driver=1 || fail "insmod mtgpu_emu disable_driver=1"
[ "$(cat /sys/module/mtgpu_emu/parameters/disable_driver)" = Y ] || fail "mtgpu_emu's disable_driver does not read Y"
[ -e /sys/bus/pci/drivers/mtgpu ] && fail "mtgpu_emu registered its PCI driver (mtgpu) with disable_driver=1"
rc=0
out=$(MTGDRDRV_PROVIDER=mtgpu_emu @LOAD_SCRIPT@ --if-provider 2>&1) || rc=$?
echo "$out"
[ "$rc" = 3 ] || fail "the postinst's mtgdrdrv-load exited $rc, not 3, with mtgpu_emu's driver disabled"
[ -d /sys/module/mtgdrdrv ] && fail "the postinst's mtgdrdrv-load loaded mtgdrdrv with mtgpu_emu's driver disabled"
lines=$(echo "$out" | wc -l)
[ "$lines" = 1 ] || fail "the postinst's mtgdrdrv-load printed $lines lines, not one"
echo "$out" | grep -q "loaded with disable_driver=1" || fail "the postinst's mtgdrdrv-load did not say why"
rc=0
out=$(MTGDRDRV_PROVIDER=mtgpu_emu sh /opt/mtgdrcopy/insmod.sh "$KO" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 3 ] || fail "insmod.sh exited $rc, not 3, with mtgpu_emu's driver disabled"
[ -d /sys/module/mtgdrdrv ] && fail "insmod.sh loaded mtgdrdrv with mtgpu_emu's driver disabled"
echo "$out" | grep -q "loaded with disable_driver=1" || fail "insmod.sh did not say that mtgpu_emu's driver is disabled"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (loaded with disable_driver=1)"

step postinst-load
# The provider loaded normally: mtgdrdrv-load as the postinst runs it loads mtgdrdrv (modprobe,
# with the modules.dep DKMS's depmod wrote); insmod.sh, through the same script, reloads it.
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
[ "$(cat /sys/module/mtgpu_emu/parameters/disable_driver)" = N ] || fail "mtgpu_emu's disable_driver does not read N"
[ -d /sys/bus/pci/drivers/mtgpu ] || fail "mtgpu_emu did not register its PCI driver (mtgpu)"
MTGDRDRV_PROVIDER=mtgpu_emu @LOAD_SCRIPT@ --if-provider || fail "the postinst's mtgdrdrv-load failed with mtgpu_emu loaded"
[ -d /sys/module/mtgdrdrv ] || fail "the postinst's mtgdrdrv-load did not load mtgdrdrv with mtgpu_emu loaded"
MTGDRDRV_PROVIDER=mtgpu_emu sh /opt/mtgdrcopy/insmod.sh "$KO" || fail "insmod.sh with the provider loaded"
udevadm settle --timeout=10
node=$(stat -c '%a %G' /dev/mtgdrdrv)
echo "MTGDRCOPY-NODE $node"
[ "$node" = "660 render" ] || fail "/dev/mtgdrdrv is '$node'; the udev rule says 660 render"
for i in $(seq 50); do [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done

step permissions
# The rule's policy: the render group may open the device, others may not.
render=$(grep '^render:' /etc/group | cut -d: -f3)
# Without libmusa for that user, as without GPU access: else the dma-buf backend would serve it
# (the emulator's node is open to all).
out=$(/opt/mtgdrcopy/setpriv --reuid=65534 --regid=65534 --clear-groups env -u LD_LIBRARY_PATH GDRCOPY_ENABLE_LOGGING=1 /opt/mtgdrcopy/consumer 2>&1)
echo "$out"
echo "$out" | grep -q "gdr_open: failed" || fail "a user outside the render group opened /dev/mtgdrdrv"
out=$(/opt/mtgdrcopy/setpriv --reuid=65534 --regid=65534 --groups="$render" /opt/mtgdrcopy/consumer 2>&1)
echo "$out" | grep -q "gdr_open: ok" || fail "a user of the render group could not open /dev/mtgdrdrv: $out"

step sanity
mtgdrcopy_sanity || fail "mtgdrcopy_sanity of the installed package failed"
GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=1 mtgdrcopy_sanity -t basic_unaligned_mapping 2>&1 | grep -i "map" || true

step container
mkdir -p /container/dev /container/proc /container/tmp
for node in mtgdrdrv mtgpu_emu; do
	major=$((0x$(stat -c %t /dev/$node))); minor=$((0x$(stat -c %T /dev/$node)))
	mknod /container/dev/$node c $major $minor || fail "mknod $node"
	chown "$(stat -c %u:%g /dev/$node)" /container/dev/$node
	chmod "$(stat -c %a /dev/$node)" /container/dev/$node
done
mknod -m 666 /container/dev/null c 1 3
mount -t proc proc /container/proc || fail "mounting /proc in the container"
chroot /container /usr/bin/mtgdrcopy_sanity || fail "mtgdrcopy_sanity in the container failed"
chroot /container /usr/bin/mtgdrcopy_copybw -s 64K -w 100 -r 10 || fail "mtgdrcopy_copybw in the container failed"
umount /container/proc

step unload
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

step softdep
# The packaged softdep, with kmod's modprobe as on a host: loading the provider loads mtgdrdrv.
# The provider is the emulated one here, so the softdep is the packaged line with mtgpu renamed,
# and the emulator goes where modprobe finds it. kmod 30 reads /lib/modprobe.d, which merged /usr
# makes /usr/lib/modprobe.d: so the packaged file goes there too, and modprobe -c must show it.
kmod=/opt/mtgdrcopy/kmod
mkdir -p $kmod && for tool in modprobe depmod; do ln -s /usr/bin/kmod $kmod/$tool; done
mods=/lib/modules/$(uname -r)
mkdir -p $mods/extra /lib/modprobe.d /etc/modprobe.d
cp /lib/mtgdrcopy/mtgpu_emu.ko $mods/extra/
touch $mods/modules.order $mods/modules.builtin $mods/modules.builtin.modinfo
$kmod/depmod -a || fail "depmod (kmod)"
cp @SOFTDEP@ /lib/modprobe.d/
$kmod/modprobe -c | grep -qx 'softdep mtgpu post: mtgdrdrv' || fail "kmod does not read the packaged softdep"
sed -n 's/^softdep mtgpu post: /softdep mtgpu_emu post: /p' @SOFTDEP@ >/etc/modprobe.d/mtgdrdrv-emu.conf
grep -qx 'softdep mtgpu_emu post: mtgdrdrv' /etc/modprobe.d/mtgdrdrv-emu.conf || fail "no softdep for mtgpu_emu"
# What kmod does, as debian/mtgdrdrv.modprobe.conf says: each MTGDRCOPY-KMOD line is printed
# by the test (the module state after each command) and checked.
loaded() { for m in mtgpu_emu mtgdrdrv; do [ -d /sys/module/$m ] && printf ' %s' $m; done; }
try() {
	what=$1; shift
	rc=0; out=$("$@" 2>&1) || rc=$?
	echo "MTGDRCOPY-KMOD $what: exit $rc, loaded after:$(loaded)${out:+; $out}"
}
try "modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)" = "0  mtgpu_emu mtgdrdrv" ] || fail "modprobe mtgpu_emu did not load mtgdrdrv (softdep)"
# Unloading the provider unloads mtgdrdrv first (kmod removes post softdeps), then kmod 30
# tries mtgpu_emu again, which the removal of mtgdrdrv's unused dependency already took: exit 1.
try "modprobe -r mtgpu_emu, mtgdrdrv loaded" $kmod/modprobe -r mtgpu_emu
[ "$rc$(loaded)" = 1 ] || fail "modprobe -r mtgpu_emu: exit $rc (kmod 30 says 1), left:$(loaded)"
echo "$out" | grep -q "could not remove 'mtgpu_emu'" || fail "modprobe -r mtgpu_emu said: $out"
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
try "modprobe -r mtgdrdrv, mtgpu_emu loaded by modprobe" $kmod/modprobe -r mtgdrdrv
rmmod mtgdrdrv 2>/dev/null; rmmod mtgpu_emu 2>/dev/null
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
try "modprobe -r mtgdrdrv mtgpu_emu" $kmod/modprobe -r mtgdrdrv mtgpu_emu
[ "$rc$(loaded)" = 0 ] || fail "modprobe -r mtgdrdrv mtgpu_emu: exit $rc, left:$(loaded)"
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
try "modprobe -r mtgpu_emu, mtgdrdrv not loaded" $kmod/modprobe -r mtgpu_emu
[ "$rc$(loaded)" = 0 ] || fail "modprobe -r mtgpu_emu without mtgdrdrv loaded failed"

# mtgdrdrv not built for this kernel: the provider loads, modprobe succeeds and says nothing.
mv $mods/updates/dkms/mtgdrdrv.ko /tmp/mtgdrdrv.ko && $kmod/depmod -a || fail "depmod without mtgdrdrv"
try "mtgdrdrv not built: modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)${out}" = "0  mtgpu_emu" ] || fail "a softdep on a missing mtgdrdrv changed modprobe mtgpu_emu"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

# mtgdrdrv there but its load fails (an invalid parameter stands in for any failure, e.g. a
# symbol version mtgpu disagrees with): the same, the kernel log says why.
mv /tmp/mtgdrdrv.ko $mods/updates/dkms/mtgdrdrv.ko && $kmod/depmod -a || fail "depmod with mtgdrdrv"
echo "options mtgdrdrv max_pins_per_file=bogus" >/etc/modprobe.d/mtgdrdrv-bogus.conf
try "mtgdrdrv fails to load: modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)${out}" = "0  mtgpu_emu" ] || fail "a failing mtgdrdrv changed modprobe mtgpu_emu"
dmesg | grep -q "mtgdrdrv: .bogus' invalid for parameter .max_pins_per_file'" || fail "the kernel did not say why mtgdrdrv failed"
rm /etc/modprobe.d/mtgdrdrv-bogus.conf
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

# The provider loaded with disable_driver=1 through modprobe: the softdep loads mtgdrdrv anyway
# (mtgdrdrv-load's check is not on that path); mtgdrdrv says it refuses every pin.
try "modprobe mtgpu_emu disable_driver=1" $kmod/modprobe mtgpu_emu disable_driver=1
[ "$rc $(loaded)" = "0  mtgpu_emu mtgdrdrv" ] || fail "modprobe mtgpu_emu disable_driver=1: exit $rc, loaded:$(loaded)"
dmesg | grep -q "mtgdrdrv: mtgpu is loaded but not initialised" || fail "mtgdrdrv loaded with its provider disabled, silently"
rmmod mtgdrdrv; rmmod mtgpu_emu || fail "rmmod mtgpu_emu (disable_driver=1)"
step done
"#;

/// GUEST_SCRIPT with the paths filled in.
fn guest_script(udevd: &str) -> String {
    GUEST_SCRIPT
        .replace("@UDEVD@", udevd)
        .replace("@LOAD_SCRIPT@", stage::LOAD_SCRIPT)
        .replace("@SOFTDEP@", SOFTDEP)
}

fn run_vm(sh: &Shell, kernel: &Kernel, host: &Root, container: &Root) -> Result<()> {
    let t = Instant::now();
    let (_, emu) = vmtest::build_modules(sh, kernel)?;
    cmd!(sh, "cargo build --quiet --release -p mtgpu-emu-musa --lib")
        .run()
        .context("building the emulated libmusa")?;
    let libmusa = paths::root().join("target/release/libmusa.so");
    timed("emulated provider and libmusa built", t);

    let release = &kernel.release;
    let mut host_paths = package_files(sh, host, &["libgdrapi", "mtgdrcopy-tests"])?;
    host_paths.retain(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"));
    host_paths.push("/usr/lib/udev/rules.d/60-mtgdrdrv.rules".into());
    let udev = package_files(sh, host, &["udev"])?;
    let udevd = udev
        .iter()
        .find(|p| p.ends_with("/systemd-udevd"))
        .context("the udev package has no systemd-udevd")?
        .clone();
    let udevadm = udev
        .iter()
        .find(|p| p.ends_with("/udevadm"))
        .context("the udev package has no udevadm")?
        .clone();
    host_paths.extend([
        udevd.clone(),
        udevadm,
        "/usr/bin/setpriv".into(),
        "/etc/passwd".into(),
        "/etc/group".into(),
        "/tmp/consumer/consumer".into(),
    ]);
    host_paths.extend([
        format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko"),
        // DKMS's depmod wrote it: the postinst's modprobe (busybox's here) finds mtgdrdrv there.
        format!("/lib/modules/{release}/modules.dep"),
        stage::LOAD_SCRIPT.into(),
        SOFTDEP.into(),
        // kmod's modprobe, for the softdep: busybox's knows no softdep.
        "/usr/bin/kmod".into(),
    ]);
    let mut files = root_files(sh, host, &host_paths, "", "vm-files")?;
    // The guest's /tmp is a fresh tmpfs, and busybox has its own, smaller setpriv.
    for (_, guest) in files.iter_mut() {
        if guest == "/tmp/consumer/consumer" || guest == "/usr/bin/setpriv" {
            let name = guest.rsplit('/').next().unwrap_or_default().to_owned();
            *guest = format!("/opt/mtgdrcopy/{name}");
        }
    }
    // insmod.sh runs debian/scripts/mtgdrdrv-load beside it: there too, the copy the package installed.
    let load = files
        .iter()
        .find(|(_, guest)| guest == stage::LOAD_SCRIPT)
        .context("mtgdrdrv-load is not among the guest's files")?
        .0
        .clone();
    files.push((
        load,
        "/opt/mtgdrcopy/debian/scripts/mtgdrdrv-load".to_owned(),
    ));

    let container_paths = package_files(sh, container, &["libgdrapi", "mtgdrcopy-tests"])?
        .into_iter()
        .filter(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"))
        .collect::<Vec<_>>();
    files.extend(root_files(
        sh,
        container,
        &container_paths,
        "/container",
        "vm-files",
    )?);

    files.extend([
        (emu, "/lib/mtgdrcopy/mtgpu_emu.ko".to_owned()),
        (
            libmusa.clone(),
            "/usr/lib/mtgdrcopy/emu/libmusa.so.1".to_owned(),
        ),
        (
            libmusa,
            "/container/usr/lib/mtgdrcopy/emu/libmusa.so.1".to_owned(),
        ),
        (
            paths::root().join("insmod.sh"),
            "/opt/mtgdrcopy/insmod.sh".to_owned(),
        ),
    ]);
    let group = host.read(sh, "/etc/group")?;
    ensure!(
        group.lines().any(|l| l.starts_with("render:")),
        "the host root has no render group, which the udev rule names"
    );

    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = files;
    spec.script = guest_script(&udevd);
    spec.ivshmem_mb = 256;
    spec.timeout = Duration::from_secs(600);
    let log = paths::build_dir()
        .join("pkgtest")
        .join(format!("vm-{release}.log"));
    let outcome = vm::run(&spec, &log)?;
    let console = outcome.console.replace('\r', "");
    vmtest::print_guest_steps(&console);
    if let Some(node) = console
        .lines()
        .find_map(|l| l.strip_prefix("MTGDRCOPY-NODE "))
    {
        eprintln!("      /dev/mtgdrdrv: mode {node} (udev, debian/60-mtgdrdrv.rules)");
    }
    for line in console.lines() {
        if let Some(seen) = line.strip_prefix("MTGDRCOPY-KMOD ") {
            eprintln!("      kmod: {seen}");
        }
    }
    outcome.ensure_no_kernel_problems(&log)?;
    if outcome.exit_code != Some(0) {
        bail!(
            "the VM part failed (exit {:?}):\n{}\nfull log: {}",
            outcome.exit_code,
            vmtest::tail(&console, 50),
            log.display()
        );
    }
    // Last: a guest that stopped early printed fewer of the messages, which says less than why.
    check_readme_quotes(&console)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VM runs mtgdrdrv-load exactly as the postinst does, and the postinst loads mtgdrdrv
    /// only through it.
    #[test]
    fn guest_runs_mtgdrdrv_load_as_the_postinst_does() {
        let call = "@LOAD_SCRIPT@ --if-provider";
        let postinst =
            fs::read_to_string(paths::root().join("debian/mtgdrdrv-dkms.postinst.in")).unwrap();
        // The code, not the comments.
        let code: String = postinst
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(code.matches(call).count(), 1);
        assert!(
            !code.contains("modprobe"),
            "the postinst loads mtgdrdrv itself"
        );
        assert_eq!(GUEST_SCRIPT.matches(call).count(), 2);
        let script = guest_script("/usr/lib/systemd/systemd-udevd");
        // `"$@"` is shell; `@NAME@` would be a placeholder left.
        let parts: Vec<&str> = script.split('@').collect();
        let left = parts[1..parts.len() - 1].iter().find(|name| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        });
        assert!(left.is_none(), "a placeholder is left: @{left:?}@");
        assert!(script.contains(&format!(
            "grep -qx 'softdep mtgpu post: mtgdrdrv' {SOFTDEP}"
        )));
        assert!(script.contains(&format!("{} --if-provider", stage::LOAD_SCRIPT)));
    }
}
