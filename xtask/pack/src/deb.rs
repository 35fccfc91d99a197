//! `cargo xtask deb-kmod|deb-lib|deb-tests|deb-meta|deb-all|deb-bundle|deb`: the .debs, in
//! build/, named `<package>_<version>_<arch>.deb`, with a `<package>-dbgsym` .deb beside each
//! package that holds ELF files.
//!
//! The fast path to the packages `dpkg-buildpackage` builds from debian/ (the packager's path),
//! from the same truth: stage.rs installs the files as debian/rules does, and this module writes
//! the control file from debian/control as dpkg-gencontrol does (substitution variables, the
//! source paragraph's defaults, the package's version and size), md5sums as dh_md5sums does,
//! and the archive with dpkg-deb (xz, root-owned, timestamps clamped to the changelog's date
//! through SOURCE_DATE_EPOCH), as dh_builddeb does. `cargo xtask test` builds the packages both
//! ways and compares them (xtask-bench's pkgtest/source.rs).
//!
//! Versions: each package's is its crate's (a semver pre-release `-beta.1` becomes `~beta.1`)
//! with the source package's Debian revision (debian/changelog); the bundle's revision is
//! `<revision>+bundle`. The packages:
//! - `mtgdrdrv-dkms` (all): module sources for DKMS in /usr/src/mtgdrdrv-<version>, udev rule,
//!   modprobe.d softdep, mtgdrdrv-load (/usr/lib/mtgdrdrv/); the postinst builds the module with
//!   DKMS and loads it through mtgdrdrv-load.
//! - `libgdrapi` (amd64/arm64, Multi-Arch: same): libgdrapi.so.1 and its links, libgdrapi.a,
//!   gdrapi.h, gdrapi.pc; shlibs, symbols, ldconfig trigger.
//! - `mtgdrcopy-tests`: the programs; no MUSA dependency (dlopen).
//! - `mtgdrcopy` (all): metapackage on the three, any 0.x module and any 1.x library and tools
//!   from this release on.
//! - `mtgdrcopy` as a bundle (`deb-bundle`, `deb`): the three in one package, which conflicts
//!   with, replaces and provides them (debian/mtgdrcopy-bundle.control: the bundle is not part
//!   of the source package). It shares the metapackage's name (the historical single-package
//!   name, like upstream's `gdrcopy`), so its revision is `<revision>+bundle`: an upgrade from
//!   the split install, and a distinct file in build/.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use md5::{Digest, Md5};
use xshell::{cmd, Shell};

use xtask_base::debian::{self, Control, GenControl, Paragraph};
use xtask_base::elf::elf_files;
use xtask_base::workspace::Workspace;
use xtask_base::{files, host, lintian, paths, targets};

use crate::stage::{self, Package};

/// Which packages a `deb-*` command builds.
#[derive(Clone, Copy, Debug)]
pub enum Which {
    One(Package),
    /// The four packages of a release (`deb-all`).
    All,
}

/// A .deb written to build/.
#[derive(Clone, Debug)]
pub struct Built {
    pub package: Package,
    pub path: PathBuf,
    /// The final control file.
    pub control: String,
    /// The package's -dbgsym .deb, if it has ELF files.
    pub dbgsym: Option<PathBuf>,
}

impl Built {
    pub fn version(&self) -> &str {
        field(&self.control, "Version").unwrap_or_default()
    }
}

/// Options of the `deb-*` commands.
#[derive(clap::Args)]
pub struct Args {
    /// Rust target triple of the architecture-dependent packages: the machine's own (default)
    /// or aarch64-unknown-linux-gnu (arm64, cross-built with Debian's toolchain in a chroot).
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
}

/// What the `deb-*` commands run besides cargo: dpkg-deb, dpkg-shlibdeps (dpkg-dev), strip,
/// objcopy, ld and ar (binutils), xz. Installed with apt when missing, as `cargo xtask test`
/// installs its own.
pub const HOST_PACKAGES: [&str; 3] = ["binutils", "dpkg-dev", "xz-utils"];

pub fn cli(which: Which, args: Args) -> Result<()> {
    host::ensure_host_packages(&HOST_PACKAGES)?;
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load(&sh)?.for_target(targets::parse(args.target.as_deref())?);
    let packages: Vec<Package> = match which {
        Which::One(p) => vec![p],
        Which::All => Package::SPLIT.to_vec(),
    };
    for package in packages {
        let built = build(&sh, &ws, package)?;
        println!("{}", built.path.display());
        if let Some(dbgsym) = &built.dbgsym {
            println!("{}", dbgsym.display());
        }
    }
    Ok(())
}

/// The four packages of a release and the bundle, in that order.
pub fn build_everything(sh: &Shell, ws: &Workspace) -> Result<Vec<Built>> {
    let mut all = Vec::new();
    for package in Package::SPLIT.into_iter().chain([Package::Bundle]) {
        all.push(build(sh, ws, package)?);
    }
    Ok(all)
}

/// The control paragraphs the packages come from: debian/control, and the bundle's own file.
fn paragraph(control: &Control, package: Package) -> Result<Paragraph> {
    if package != Package::Bundle {
        return control.binary(package.deb_name()).cloned();
    }
    let path = paths::root().join("debian/mtgdrcopy-bundle.control");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut paragraphs = debian::parse(&text)?;
    ensure!(
        paragraphs.len() == 1,
        "{}: expected one paragraph",
        path.display()
    );
    Ok(paragraphs.remove(0))
}

/// Stages `package` and writes its .deb (and -dbgsym .deb) into build/.
pub fn build(sh: &Shell, ws: &Workspace, package: Package) -> Result<Built> {
    let _lock = files::lock()?;
    let tree = stage::stage(sh, ws, package)?;
    let control = Control::load()?;
    let binary = paragraph(&control, package)?;
    let arch = stage::package_arch(ws)?;
    let version = package_version(ws, package)?;
    let source_version = package_version(ws, Package::Meta)?;
    let vars = substvars(sh, ws, package, &tree)?;
    let text = debian::gencontrol(
        &control,
        &binary,
        &GenControl {
            version: &version,
            source_version: &source_version,
            host_arch: arch.debian,
            installed_size_kib: installed_size(&tree)?,
            substvars: &vars,
        },
    )
    .with_context(|| format!("the control file of {}", package.deb_name()))?;
    let architecture = field(&text, "Architecture").unwrap_or_default().to_owned();
    let deb = deb_path(package.deb_name(), &version, &architecture);
    remove_old_debs(package.deb_name(), &architecture, &deb)?;
    write_deb(sh, &tree, &text, &deb)?;

    let dbgsym = package.dbgsym_tree();
    let ids = stage::build_ids(&dbgsym)?;
    let dbgsym_name = format!("{}-dbgsym", package.deb_name());
    let dbgsym_deb = deb_path(&dbgsym_name, &version, &architecture);
    remove_old_debs(&dbgsym_name, &architecture, &dbgsym_deb)?;
    let dbgsym = if ids.is_empty() {
        None
    } else {
        let paragraph = dbgsym_paragraph(&binary, &version, &ids);
        let text = debian::gencontrol(
            &control,
            &paragraph,
            &GenControl {
                version: &version,
                source_version: &source_version,
                host_arch: arch.debian,
                installed_size_kib: installed_size(&dbgsym)?,
                substvars: &vars,
            },
        )?;
        // dh_gencontrol gives a debug symbol package no Homepage of the source's.
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with("Homepage:"))
            .map(|l| format!("{l}\n"))
            .collect();
        write_deb(sh, &dbgsym, &text, &dbgsym_deb)?;
        Some(dbgsym_deb)
    };
    Ok(Built {
        package,
        path: deb,
        control: text,
        dbgsym,
    })
}

/// What dh_strip and dh_gencontrol give an automatic debug symbol package.
fn dbgsym_paragraph(binary: &Paragraph, version: &str, ids: &[String]) -> Paragraph {
    let name = binary.get("Package").unwrap_or_default();
    let mut fields: Vec<(String, String)> = vec![
        ("Package".to_owned(), format!("{name}-dbgsym")),
        ("Auto-Built-Package".to_owned(), "debug-symbols".to_owned()),
        (
            "Architecture".to_owned(),
            binary.get("Architecture").unwrap_or_default().to_owned(),
        ),
        ("Depends".to_owned(), format!("{name} (= {version})")),
        ("Section".to_owned(), "debug".to_owned()),
        ("Priority".to_owned(), "optional".to_owned()),
    ];
    if let Some(ma) = binary.get("Multi-Arch") {
        if ma == "same" {
            fields.push(("Multi-Arch".to_owned(), ma.to_owned()));
        }
    }
    fields.push((
        "Description".to_owned(),
        format!("debug symbols for {name}"),
    ));
    fields.push(("Build-Ids".to_owned(), ids.join(" ")));
    Paragraph { line: 0, fields }
}

/// `<package>_<version>_<arch>.deb` in build/ (the epoch-free version, as dpkg names files).
fn deb_path(name: &str, version: &str, architecture: &str) -> PathBuf {
    paths::build_dir().join(format!("{name}_{version}_{architecture}.deb"))
}

/// The package's Debian version: its crate's version and the source package's revision.
pub fn package_version(ws: &Workspace, package: Package) -> Result<String> {
    let krate = ws.krate(package.crate_name())?;
    let mut revision = debian::revision()?;
    if package == Package::Bundle {
        revision.push_str("+bundle");
    }
    Ok(format!("{}-{revision}", upstream_version(&krate.version)))
}

/// A crate version as a Debian upstream version: a semver pre-release (`1.1.0-beta.1`) sorts
/// before its release only written with `~` (`1.1.0~beta.1`).
pub fn upstream_version(version: &str) -> String {
    match version.split_once('-') {
        Some((main, pre)) => format!("{main}~{pre}"),
        None => version.to_owned(),
    }
}

/// dpkg-gencontrol's Installed-Size: each regular file's size rounded up to KiB, one KiB for
/// every other inode (directories, symlinks); `DEBIAN/` not counted.
fn installed_size(tree: &Path) -> Result<u64> {
    let mut kib = 0;
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            if dir == tree && entry.file_name() == "DEBIAN" {
                continue;
            }
            let meta = entry.metadata()?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
                kib += 1;
            } else if kind.is_file() {
                kib += meta.size().div_ceil(1024);
            } else {
                kib += 1;
            }
        }
    }
    Ok(kib)
}

/// DEBIAN/control and DEBIAN/md5sums, then the archive: dpkg-deb, xz, files owned by root,
/// timestamps clamped to the newest changelog entry's date.
fn write_deb(sh: &Shell, tree: &Path, control: &str, deb: &Path) -> Result<()> {
    let debian_dir = tree.join("DEBIAN");
    fs::create_dir_all(&debian_dir)?;
    files::put_text(&debian_dir.join("control"), control, 0o644)?;
    let md5sums = md5sums(tree)?;
    let path = debian_dir.join("md5sums");
    if md5sums.is_empty() {
        if path.exists() {
            fs::remove_file(&path)?;
        }
    } else {
        files::put_text(&path, &md5sums, 0o644)?;
    }
    let epoch = source_date_epoch(sh)?;
    let tmp = deb.with_extension("deb.tmp");
    cmd!(sh, "dpkg-deb --root-owner-group -Zxz --build {tree} {tmp}")
        .env("SOURCE_DATE_EPOCH", epoch)
        .quiet()
        .ignore_stdout()
        .run()
        .with_context(|| format!("dpkg-deb failed to build {}", deb.display()))?;
    fs::rename(&tmp, deb).with_context(|| format!("writing {}", deb.display()))
}

/// SOURCE_DATE_EPOCH as dpkg-buildpackage sets it: the date of debian/changelog's newest entry.
pub fn source_date_epoch(sh: &Shell) -> Result<String> {
    let changelog = paths::root().join("debian/changelog");
    cmd!(sh, "dpkg-parsechangelog -l {changelog} -STimestamp")
        .quiet()
        .read()
        .context("dpkg-parsechangelog (package dpkg-dev) failed on debian/changelog")
}

/// `md5sums`: one `<md5>  <path>` line per regular file but DEBIAN/, sorted by path.
fn md5sums(tree: &Path) -> Result<String> {
    let mut lines = Vec::new();
    for path in files::files(tree)? {
        let rel = path.strip_prefix(tree)?.to_string_lossy().into_owned();
        if rel.starts_with("DEBIAN/") {
            continue;
        }
        let mut file = fs::File::open(&path)?;
        let mut hasher = Md5::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        lines.push(format!("{hex}  {rel}\n"));
    }
    lines.sort_by(|a, b| a[34..].cmp(&b[34..]));
    Ok(lines.concat())
}

/// Removes other builds of `name` for `architecture` (those of another architecture stay:
/// amd64 and arm64 packages are built side by side).
fn remove_old_debs(name: &str, architecture: &str, keep: &Path) -> Result<()> {
    let dir = paths::build_dir();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let prefix = format!("{name}_");
    let bundle = keep.to_string_lossy().contains("+bundle_");
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // The bundle and the metapackage share a name; their versions tell them apart.
        let is_bundle = file.contains("+bundle_");
        if file.starts_with(&prefix)
            && file.ends_with(&format!("_{architecture}.deb"))
            && is_bundle == bundle
            && path != keep
        {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// `${shlibs:Depends}` from dpkg-shlibdeps over the package's ELF files, `${misc:Depends}`
/// (empty: no debhelper snippet adds one), and `${<package>:Version}` and
/// `${<package>:NextMajor}` of every package (debian/rules passes the same).
fn substvars(
    sh: &Shell,
    ws: &Workspace,
    package: Package,
    tree: &Path,
) -> Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for p in Package::SPLIT {
        let krate = ws.krate(p.crate_name())?;
        vars.insert(format!("{}:Version", p.deb_name()), package_version(ws, p)?);
        vars.insert(
            format!("{}:NextMajor", p.deb_name()),
            debian::next_major(&krate.version)?,
        );
    }
    let elves = elf_files(tree)?;
    let shlibs = if elves.is_empty() {
        String::new()
    } else {
        shlibdeps(sh, ws, package, &elves)?
    };
    vars.insert("shlibs:Depends".into(), shlibs);
    vars.insert("misc:Depends".into(), String::new());
    Ok(vars)
}

/// The value of `field` in a control file.
pub fn field<'a>(control: &'a str, field: &str) -> Option<&'a str> {
    control.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

/// The `shlibs:Depends` value dpkg-shlibdeps computes for `files`.
/// For a cross target it runs in the toolchain chroot, whose dpkg database has that
/// architecture's libc (the host's has only its own).
fn shlibdeps(sh: &Shell, ws: &Workspace, package: Package, files: &[PathBuf]) -> Result<String> {
    // dpkg-shlibdeps wants to run in a source tree: it reads debian/control.
    let dir = paths::build_dir().join("pkg/.shlibdeps");
    files::put_text(
        &dir.join("debian/control"),
        &format!(
            "Source: mtgdrcopy\n\nPackage: {}\nArchitecture: any\n",
            package.deb_name()
        ),
        0o644,
    )?;
    let _cwd = sh.push_dir(&dir);
    let command = match ws.target {
        Some(target) => xtask_base::cross::toolchain(sh)?
            .cmd_in(sh, target, &[], &dir, "dpkg-shlibdeps")
            .arg("-O")
            .args(files),
        None => cmd!(sh, "dpkg-shlibdeps -O {files...}"),
    };
    let out = command.quiet().ignore_status().output().context(
        "running dpkg-shlibdeps: install dpkg-dev, which computes the library dependencies",
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "dpkg-shlibdeps failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(|v| v.trim().to_owned())
        .context("dpkg-shlibdeps printed no shlibs:Depends")
}

/// lintian on every .deb: no error, no warning, no info tag (so also no unused override); the
/// remaining ones are overridden in debian/<package>/lintian-overrides, each with its reason.
pub fn lintian(sh: &Shell, debs: &[Built]) -> Result<()> {
    // No other xtask rewrites the .debs meanwhile.
    let _lock = files::lock()?;
    let mut files: Vec<PathBuf> = Vec::new();
    for d in debs {
        files.push(d.path.clone());
        files.extend(d.dbgsym.clone());
    }
    lintian::lintian_files(sh, &files)
}
