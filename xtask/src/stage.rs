//! `cargo xtask build-kmod|build-lib|build-tests|build-meta`: stage each package's file tree
//! under `build/pkg/<package>/`, exactly what its .deb holds, and `build/pkg/<package>.DEBIAN/`
//! with the control files that are generated here (maintainer scripts with the version filled
//! in, shlibs, symbols). The `[package.metadata.deb]` section of each crate points cargo-deb at
//! these two directories, so the .deb is a snapshot of the staged tree and nothing else.
//!
//! Sources: `mtgdrdrv/kmod/` (module sources), `dkms/dkms.conf.in`, `libgdrapi/` (library,
//! header, `gdrapi.pc.in`), the release binaries of `mtgdrcopy-tests`, and `debian/` (udev
//! rule, modules-load.d file, mtgdrdrv-load, copyright, per-package changelog, maintainer
//! script templates, symbols, lintian overrides). Versions come from the crates only.

mod manpage;
#[cfg(test)]
mod mtgdrdrv_load;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::workspace::Workspace;
use crate::{build, paths, versions};

/// The packages `cargo xtask deb-*` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Package {
    /// `mtgdrdrv-dkms`: module sources for DKMS, udev rule, modules-load.d.
    Kmod,
    /// `libgdrapi`: shared and static library, header, pkg-config file.
    Lib,
    /// `mtgdrcopy-tests`: the test and benchmark programs.
    Tests,
    /// `mtgdrcopy`: the metapackage depending on the three above.
    Meta,
    /// `mtgdrcopy` built as one package holding all three (`cargo xtask deb-bundle`).
    Bundle,
}

impl Package {
    /// The four packages of a release, in install order.
    pub const SPLIT: [Package; 4] = [Package::Kmod, Package::Lib, Package::Tests, Package::Meta];

    pub fn deb_name(self) -> &'static str {
        match self {
            Package::Kmod => "mtgdrdrv-dkms",
            Package::Lib => "libgdrapi",
            Package::Tests => "mtgdrcopy-tests",
            Package::Meta | Package::Bundle => "mtgdrcopy",
        }
    }

    /// The crate whose version and `[package.metadata.deb]` the package takes.
    pub fn crate_name(self) -> &'static str {
        match self {
            Package::Kmod => "mtgdrdrv",
            Package::Lib => "libgdrapi",
            Package::Tests => "mtgdrcopy-tests",
            Package::Meta | Package::Bundle => "mtgdrcopy-meta",
        }
    }

    /// The `[package.metadata.deb.variants.*]` entry, for the bundle.
    pub fn variant(self) -> Option<&'static str> {
        (self == Package::Bundle).then_some("bundle")
    }

    /// Unique name of the staging directories and of the package's directory in `debian/`.
    pub fn stage_name(self) -> &'static str {
        match self {
            Package::Bundle => "mtgdrcopy-bundle",
            p => p.deb_name(),
        }
    }

    /// The synopsis (Debian's one-line description, at most 79 columns). Set here because the
    /// crates' descriptions describe the crates and are longer; the extended description is the
    /// crate's `[package.metadata.deb] extended-description`.
    pub fn synopsis(self) -> &'static str {
        match self {
            Package::Kmod => "GDRCopy kernel module for Moore Threads GPUs (DKMS sources)",
            Package::Lib => "GDRCopy library for Moore Threads GPUs: CPU access to GPU memory",
            Package::Tests => "GDRCopy for Moore Threads GPUs: sanity test and benchmarks",
            Package::Meta => "GDRCopy for Moore Threads GPUs (metapackage)",
            Package::Bundle => "GDRCopy for Moore Threads GPUs: module, library and tools",
        }
    }

    /// Packages without architecture-dependent files: the DKMS sources and the metapackage.
    pub fn arch_all(self) -> bool {
        matches!(self, Package::Kmod | Package::Meta)
    }

    /// The staged file tree: `build/pkg/<stage name>/`.
    pub fn tree(self) -> PathBuf {
        paths::build_dir().join("pkg").join(self.stage_name())
    }

    /// Control files generated at staging: `build/pkg/<stage name>.DEBIAN/`.
    pub fn control_dir(self) -> PathBuf {
        paths::build_dir()
            .join("pkg")
            .join(format!("{}.DEBIAN", self.stage_name()))
    }

    pub fn debian_dir(self) -> PathBuf {
        paths::root().join("debian").join(self.stage_name())
    }
}

/// The Debian architecture and multiarch tuple of the machine we build on (native builds only).
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    pub debian: &'static str,
    pub multiarch: &'static str,
}

pub fn host_arch() -> Result<Arch> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(Arch {
            debian: "amd64",
            multiarch: "x86_64-linux-gnu",
        }),
        "aarch64" => Ok(Arch {
            debian: "arm64",
            multiarch: "aarch64-linux-gnu",
        }),
        other => bail!("packaging for {other} is not set up (amd64 and arm64 are)"),
    }
}

/// The architecture the packages of `ws` are built for: its cross target, else the machine's.
pub fn package_arch(ws: &Workspace) -> Result<Arch> {
    match ws.target {
        Some(t) => Ok(Arch {
            debian: t.debian,
            multiarch: t.multiarch,
        }),
        None => host_arch(),
    }
}

/// The library and the tools, release, for the packages' architecture.
fn packaged(sh: &Shell, ws: &Workspace) -> Result<()> {
    match ws.target {
        Some(target) => crate::cross::packaged(sh, target),
        None => build::packaged(sh, &ws.target_dir),
    }
}

/// `strip` for the packages' architecture: the cross binutils (in the toolchain chroot, on the
/// same paths) when cross-building.
fn strip<'a>(sh: &'a Shell, ws: &Workspace) -> Result<xshell::Cmd<'a>> {
    match ws.target {
        Some(target) => crate::cross::binutil(sh, target, "strip"),
        None => Ok(cmd!(sh, "strip")),
    }
}

/// `cargo xtask build-<package>`.
pub fn cli(package: Package) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load(&sh)?;
    let _lock = lock()?;
    let tree = stage(&sh, &ws, package)?;
    println!("{}", tree.display());
    Ok(())
}

/// Excludes other xtask processes from build/pkg/ and the .debs in build/ while held: the
/// staged trees have fixed paths (cargo-deb reads them from Cargo.toml), so two runs staging at
/// once would pull files from under each other.
pub fn lock() -> Result<fs::File> {
    lock_file(&paths::build_dir().join("pkg/.lock"), "building packages")
}

/// An exclusive lock on `path` (created if needed), held until the file is dropped; says that it
/// waits for another xtask `doing` something when the lock is taken.
pub fn lock_file(path: &Path, doing: &str) -> Result<fs::File> {
    parent_of(path)?;
    let file = fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!("xtask: waiting for another xtask that is {doing}");
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

/// Stages `package` (building what it needs) and returns its tree. Callers hold [`lock`].
pub fn stage(sh: &Shell, ws: &Workspace, package: Package) -> Result<PathBuf> {
    let tree = package.tree();
    fresh_dir(&tree)?;
    fresh_dir(&package.control_dir())?;
    match package {
        Package::Kmod => stage_kmod(ws, &tree)?,
        Package::Lib => stage_lib(sh, ws, &tree)?,
        Package::Tests => stage_tests(sh, ws, &tree)?,
        Package::Meta => {}
        Package::Bundle => stage_bundle(sh, ws, &tree)?,
    }
    stage_docs(ws, package, &tree)?;
    Ok(tree)
}

fn stage_kmod(ws: &Workspace, tree: &Path) -> Result<()> {
    let krate = ws.krate(Package::Kmod.crate_name())?;
    let driver = (
        mtgdrdrv::MTGDRDRV_MAJOR_VERSION,
        mtgdrdrv::MTGDRDRV_MINOR_VERSION,
    );
    versions::driver_agrees(&krate.version, driver).map_err(anyhow::Error::msg)?;
    let version = &krate.version;
    let src = tree.join(format!("usr/src/mtgdrdrv-{version}"));
    let copied = copy_module_sources(&paths::root().join("mtgdrdrv/kmod"), &src)?;
    ensure!(
        copied.iter().any(|f| f == "Kbuild") && copied.iter().any(|f| f == "mtgpu_p2p_stub.c"),
        "mtgdrdrv/kmod lacks Kbuild or the CRC stub; staged only {copied:?}"
    );
    let conf = template(
        &paths::root().join("dkms/dkms.conf.in"),
        &[("VERSION", version)],
    )?;
    put_text(&src.join("dkms.conf"), &conf, 0o644)?;

    let debian = paths::root().join("debian");
    put_file(
        &debian.join("60-mtgdrdrv.rules"),
        &tree.join("usr/lib/udev/rules.d/60-mtgdrdrv.rules"),
        0o644,
    )?;
    put_file(
        &debian.join("mtgdrdrv.modules-load.conf"),
        &tree.join("usr/lib/modules-load.d/mtgdrdrv.conf"),
        0o644,
    )?;
    put_file(
        &debian.join("mtgdrdrv-load"),
        &tree.join(LOAD_SCRIPT.trim_start_matches('/')),
        0o755,
    )?;
    put_file(
        &paths::root().join("mtgdrdrv/kmod/README.md"),
        &tree.join("usr/share/doc/mtgdrdrv-dkms/README.md"),
        0o644,
    )?;
    maintainer_scripts(version, &Package::Kmod.control_dir())
}

/// Where mtgdrdrv-dkms installs debian/mtgdrdrv-load, which decides whether mtgdrdrv may be
/// loaded and loads it; the postinst runs it from there (`@LOAD_SCRIPT@` in postinst.in).
pub const LOAD_SCRIPT: &str = "/usr/lib/mtgdrdrv/mtgdrdrv-load";

/// postinst and prerm from their templates in debian/mtgdrdrv-dkms/, version and the path of
/// mtgdrdrv-load filled in.
fn maintainer_scripts(version: &str, control_dir: &Path) -> Result<()> {
    for script in ["postinst", "prerm"] {
        let text = template(
            &Package::Kmod.debian_dir().join(format!("{script}.in")),
            &[("VERSION", version), ("LOAD_SCRIPT", LOAD_SCRIPT)],
        )?;
        put_text(&control_dir.join(script), &text, 0o755)?;
    }
    Ok(())
}

/// Copies the module's build inputs (Kbuild, Makefile, C sources and headers, scripts, the
/// compile probes) and nothing a build leaves behind; files already there with the same content
/// are left alone. Returns the top-level names copied.
pub fn copy_module_sources(from: &Path, to: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let kind = entry.file_type()?;
        if name.starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            copy_module_sources(&path, &to.join(&name))?;
            copied.push(name);
            continue;
        }
        let source = name == "Kbuild"
            || name == "Makefile"
            || name.ends_with(".c")
            || (name.ends_with(".h") && name != "conftest.h")
            || name.ends_with(".sh");
        if kind.is_file() && source {
            let mode = if name.ends_with(".sh") { 0o755 } else { 0o644 };
            let target = to.join(&name);
            // Unchanged files keep their timestamps, so kbuild does not rebuild for nothing.
            if fs::read(&path)? != fs::read(&target).unwrap_or_default() {
                put_file(&path, &target, mode)?;
            }
            copied.push(name);
        }
    }
    Ok(copied)
}

fn stage_lib(sh: &Shell, ws: &Workspace, tree: &Path) -> Result<()> {
    let krate = ws.krate(Package::Lib.crate_name())?;
    let (major, _) = krate.major_minor()?;
    let library = (gdrapi::GDR_API_MAJOR_VERSION, gdrapi::GDR_API_MINOR_VERSION);
    versions::library_agrees(&krate.version, library).map_err(anyhow::Error::msg)?;
    packaged(sh, ws)?;
    let arch = package_arch(ws)?;
    let libdir_rel = format!("usr/lib/{}", arch.multiarch);
    let libdir = tree.join(&libdir_rel);
    let names = LibNames::new(&krate.version, major);
    install_lib(sh, ws, &ws.packaged_dir(), &libdir, &names)?;
    let pc = pkg_config(
        "/usr",
        &format!("${{prefix}}/lib/{}", arch.multiarch),
        &krate.version,
    )?;
    put_text(&libdir.join("pkgconfig/gdrapi.pc"), &pc, 0o644)?;
    put_file(
        &paths::root().join("libgdrapi/include/gdrapi.h"),
        &tree.join("usr/include/gdrapi.h"),
        0o644,
    )?;
    let control = Package::Lib.control_dir();
    put_text(
        &control.join("shlibs"),
        &shlibs(&krate.version, major),
        0o644,
    )?;
    let symbols = symbols_file(sh, &libdir.join(&names.real))?;
    put_text(&control.join("symbols"), &symbols, 0o644)?;
    Ok(())
}

/// File names of the shared library: real name, soname, link name.
pub struct LibNames {
    pub real: String,
    pub soname: String,
    pub link: String,
}

impl LibNames {
    pub fn new(version: &str, major: u32) -> LibNames {
        LibNames {
            real: format!("libgdrapi.so.{version}"),
            soname: format!("libgdrapi.so.{major}"),
            link: "libgdrapi.so".into(),
        }
    }
}

/// The shared library built in `release` (stripped like dh_strip does, mode 0644 as Debian
/// policy wants), its two links and the static library (debug info stripped) into `libdir`.
pub fn install_lib(
    sh: &Shell,
    ws: &Workspace,
    release: &Path,
    libdir: &Path,
    names: &LibNames,
) -> Result<()> {
    fs::create_dir_all(libdir).with_context(|| format!("creating {}", libdir.display()))?;
    let real = libdir.join(&names.real);
    let built = release.join("libgdrapi.so");
    strip(sh, ws)?
        .args([
            "--remove-section=.comment",
            "--remove-section=.note",
            "--strip-unneeded",
        ])
        .arg("-o")
        .args([&real, &built])
        .quiet()
        .run()
        .context("stripping libgdrapi.so (binutils)")?;
    set_mode(&real, 0o644)?;
    put_symlink(&names.real, &libdir.join(&names.soname))?;
    put_symlink(&names.soname, &libdir.join(&names.link))?;
    let archive = libdir.join("libgdrapi.a");
    let built = release.join("libgdrapi.a");
    strip(sh, ws)?
        .args([
            "--strip-debug",
            "--remove-section=.comment",
            "--remove-section=.note",
            "--enable-deterministic-archives",
            "-o",
        ])
        .args([&archive, &built])
        .quiet()
        .run()
        .context("stripping libgdrapi.a (binutils)")?;
    set_mode(&archive, 0o644)
}

/// gdrapi.pc for a library installed in `libdir` (may use `${prefix}`) with headers in
/// `<prefix>/include`.
pub fn pkg_config(prefix: &str, libdir: &str, version: &str) -> Result<String> {
    template(
        &paths::root().join("libgdrapi/gdrapi.pc.in"),
        &[
            ("PREFIX", prefix),
            ("LIBDIR", libdir),
            ("INCLUDEDIR", "${prefix}/include"),
            ("VERSION", version),
        ],
    )
}

/// `DEBIAN/shlibs`: binaries linked against libgdrapi.so.<major> depend on this upstream
/// version or newer (dh_makeshlibs -V's rule); the symbols file refines it per symbol.
fn shlibs(version: &str, major: u32) -> String {
    format!("libgdrapi {major} libgdrapi (>= {version})\n")
}

/// debian/libgdrapi/symbols, after checking that it lists exactly the library's exports: each
/// symbol carries the version that introduced it, which only a person can say, so the file is
/// maintained by hand and this check fails when an export is added or removed.
fn symbols_file(sh: &Shell, so: &Path) -> Result<String> {
    let path = Package::Lib.debian_dir().join("symbols");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut listed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.strip_suffix("@Base"))
        .collect();
    listed.sort_unstable();
    let nm = cmd!(sh, "nm -D --defined-only {so}")
        .quiet()
        .read()
        .context("running nm (binutils)")?;
    let mut exported: Vec<&str> = nm
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "T" | "D" | "B" | "R").then_some(name)
        })
        .collect();
    exported.sort_unstable();
    ensure!(
        listed == exported,
        "{} does not list exactly the exports of libgdrapi.so: add each new symbol with the \
         version that introduces it, remove those that are gone (and bump the soname)\n  \
         listed:   {listed:?}\n  exported: {exported:?}",
        path.display()
    );
    Ok(text)
}

fn stage_tests(sh: &Shell, ws: &Workspace, tree: &Path) -> Result<()> {
    let krate = ws.krate(Package::Tests.crate_name())?;
    packaged(sh, ws)?;
    let bin = tree.join("usr/bin");
    install_exes(sh, ws, &ws.packaged_dir(), &krate.bins, &bin)?;
    ensure!(
        !krate.bins.is_empty(),
        "mtgdrcopy-tests has no programs to package"
    );
    for name in &krate.bins {
        let exe = bin.join(name);
        let help = match ws.target {
            Some(target) => crate::cross::toolchain(sh)?
                .run_program(sh, target, &[], &exe)
                .arg("--help"),
            None => cmd!(sh, "{exe} --help"),
        };
        let help = help
            .quiet()
            .read()
            .with_context(|| format!("running {name} --help for its manual page"))?;
        let page = manpage::render(name, Package::Tests.deb_name(), &krate.version, &help);
        put_gzip(
            &tree.join(format!("usr/share/man/man1/{name}.1.gz")),
            page.as_bytes(),
        )?;
    }
    Ok(())
}

/// The programs of mtgdrcopy-tests built in `release`, stripped, into `bindir`.
pub fn install_exes(
    sh: &Shell,
    ws: &Workspace,
    release: &Path,
    bins: &[String],
    bindir: &Path,
) -> Result<()> {
    fs::create_dir_all(bindir).with_context(|| format!("creating {}", bindir.display()))?;
    for name in bins {
        let built = release.join(name);
        let to = bindir.join(name);
        strip(sh, ws)?
            .args(["--remove-section=.comment", "--remove-section=.note", "-o"])
            .args([&to, &built])
            .quiet()
            .run()
            .with_context(|| format!("stripping {name} (binutils)"))?;
        set_mode(&to, 0o755)?;
    }
    Ok(())
}

/// The bundle: the trees of mtgdrdrv-dkms, libgdrapi and mtgdrcopy-tests without their own
/// docs (it gets its own), and the control files of the first two.
fn stage_bundle(sh: &Shell, ws: &Workspace, tree: &Path) -> Result<()> {
    let control = Package::Bundle.control_dir();
    for part in [Package::Kmod, Package::Lib, Package::Tests] {
        let from = stage(sh, ws, part)?;
        let skip = [
            format!("usr/share/doc/{}", part.deb_name()),
            format!("usr/share/lintian/overrides/{}", part.deb_name()),
        ];
        copy_tree(&from, tree, Path::new(""), &skip)?;
        copy_tree(&part.control_dir(), &control, Path::new(""), &[])?;
    }
    // The module's README stays documentation of the bundle too.
    put_file(
        &paths::root().join("mtgdrdrv/kmod/README.md"),
        &tree.join("usr/share/doc/mtgdrcopy/README.mtgdrdrv.md"),
        0o644,
    )
}

/// changelog.Debian.gz (checked against the package version) and the lintian overrides, from
/// debian/. (cargo-deb adds debian/copyright itself: `license-file` in Cargo.toml.)
fn stage_docs(ws: &Workspace, package: Package, tree: &Path) -> Result<()> {
    let deb = package.deb_name();
    let doc = tree.join("usr/share/doc").join(deb);
    let changelog_path = package.debian_dir().join("changelog");
    let changelog = fs::read_to_string(&changelog_path)
        .with_context(|| format!("reading {}", changelog_path.display()))?;
    let krate = ws.krate(package.crate_name())?;
    let version = krate.debian_version(package.variant());
    versions::changelog_entry(package, &version, &changelog).map_err(anyhow::Error::msg)?;
    put_gzip(&doc.join("changelog.Debian.gz"), changelog.as_bytes())?;
    let overrides = package.debian_dir().join("lintian-overrides");
    if overrides.exists() {
        put_file(
            &overrides,
            &tree.join("usr/share/lintian/overrides").join(deb),
            0o644,
        )?;
    }
    Ok(())
}

/// `path` with every `@KEY@` replaced; fails if a placeholder is left.
fn template(path: &Path, values: &[(&str, &str)]) -> Result<String> {
    let mut text =
        fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    for (key, value) in values {
        text = text.replace(&format!("@{key}@"), value);
    }
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('@') {
        let key: Vec<u8> = bytes[at + 1..]
            .iter()
            .copied()
            .take_while(|b| b.is_ascii_uppercase() || *b == b'_')
            .collect();
        if !key.is_empty() && bytes.get(at + 1 + key.len()) == Some(&b'@') {
            bail!(
                "{}: no value for @{}@",
                path.display(),
                String::from_utf8_lossy(&key)
            );
        }
    }
    Ok(text)
}

pub fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn parent_of(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

pub fn put_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    parent_of(to)?;
    if to.is_symlink() || to.exists() {
        fs::remove_file(to).with_context(|| format!("replacing {}", to.display()))?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    set_mode(to, mode)
}

/// `data` gzip'd at the best level (what lintian wants for changelogs and manual pages), with no
/// file name or time in the header (GzBuilder's defaults), so that the .deb is reproducible.
fn put_gzip(to: &Path, data: &[u8]) -> Result<()> {
    parent_of(to)?;
    let file = fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let mut encoder = flate2::GzBuilder::new().write(file, flate2::Compression::best());
    encoder.write_all(data)?;
    encoder.finish()?;
    set_mode(to, 0o644)
}

pub fn put_text(to: &Path, text: &str, mode: u32) -> Result<()> {
    parent_of(to)?;
    fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    set_mode(to, mode)
}

pub fn put_symlink(target: &str, link: &Path) -> Result<()> {
    parent_of(link)?;
    if link.is_symlink() || link.exists() {
        fs::remove_file(link).with_context(|| format!("replacing {}", link.display()))?;
    }
    symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

/// Copies the tree `from/rel` into `to/rel`: directories, regular files with their mode,
/// symlinks as symlinks; `skip` lists paths (relative to `from`) left out.
fn copy_tree(from: &Path, to: &Path, rel: &Path, skip: &[String]) -> Result<()> {
    let dir = from.join(rel);
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        if skip.iter().any(|s| Path::new(s) == rel) {
            continue;
        }
        let kind = entry.file_type()?;
        let (src, dst) = (entry.path(), to.join(&rel));
        if kind.is_symlink() {
            let target = fs::read_link(&src)?;
            let target = target
                .to_str()
                .with_context(|| format!("{} is not UTF-8", src.display()))?;
            put_symlink(target, &dst)?;
        } else if kind.is_dir() {
            copy_tree(from, to, &rel, skip)?;
        } else {
            let mode = entry.metadata()?.permissions().mode() & 0o7777;
            put_file(&src, &dst, mode)?;
        }
    }
    Ok(())
}
