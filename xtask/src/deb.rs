//! `cargo xtask deb-kmod|deb-lib|deb-tests|deb-meta|deb-all|deb-bundle|deb`: the .debs, in
//! build/, named `<package>_<version>_<arch>.deb`.
//!
//! Each package is its crate's `[package.metadata.deb]` (names, relations, descriptions) applied
//! by cargo-deb, used as a library, to the tree `stage.rs` staged; [`finish`] then adds what
//! cargo-deb cannot express (see there). Versions come from the crates: the package version is
//! the crate version plus the `revision` (default 1).
//!
//! The packages:
//! - `mtgdrdrv-dkms` (all): module sources for DKMS in /usr/src/mtgdrdrv-<version>, udev rule,
//!   modprobe.d softdep, mtgdrdrv-load (/usr/lib/mtgdrdrv/); postinst builds the module for
//!   the running and the newest kernel (a failure blocks apt only for the running one) and
//!   loads it through mtgdrdrv-load.
//! - `libgdrapi` (amd64/arm64, Multi-Arch: same): libgdrapi.so.1 and its links, libgdrapi.a,
//!   gdrapi.h, gdrapi.pc; shlibs, symbols, ldconfig trigger.
//! - `mtgdrcopy-tests`: the programs; `libgdrapi (= version)`; no MUSA dependency (dlopen).
//! - `mtgdrcopy` (all): metapackage on the three, each `(= version)`.
//! - `mtgdrcopy` as a bundle (`deb-bundle`, `deb`): the three in one package, which conflicts
//!   with, replaces and provides them. It shares the metapackage's name (the historical
//!   single-package name, like upstream's `gdrcopy`), so its version is the metapackage's with
//!   the revision `1+bundle`: an upgrade from the split install, and a distinct file in build/.

pub mod finish;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, ensure, Context, Result};
use cargo_deb::config::{BuildOptions, Multiarch};
use xshell::{cmd, Shell};

use crate::paths;
use crate::stage::{self, Package};
use crate::workspace::Workspace;

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
}

impl Built {
    pub fn version(&self) -> &str {
        finish::field(&self.control, "Version").unwrap_or_default()
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

pub fn cli(which: Which, args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load(&sh)?.for_target(crate::cross::parse(args.target.as_deref())?);
    let packages: Vec<Package> = match which {
        Which::One(p) => vec![p],
        Which::All => Package::SPLIT.to_vec(),
    };
    for package in packages {
        let built = build(&sh, &ws, package)?;
        println!("{}", built.path.display());
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

/// Stages `package` and writes its .deb into build/.
pub fn build(sh: &Shell, ws: &Workspace, package: Package) -> Result<Built> {
    let _lock = stage::lock()?;
    let tree = stage::stage(sh, ws, package)?;
    let krate = ws.krate(package.crate_name())?;
    let version = krate.debian_version(package.variant());
    let arch = stage::package_arch(ws)?;
    let architecture = if package.arch_all() {
        "all"
    } else {
        arch.debian
    };
    let deb = paths::build_dir().join(format!(
        "{}_{version}_{architecture}.deb",
        package.deb_name()
    ));
    // An old build of the same package (any version) would only confuse `ls build/*.deb`.
    remove_old_debs(package, architecture, &deb)?;
    let triple = ws.target.map(|t| t.triple);
    run_cargo_deb(package, &krate.manifest_path, triple, &deb)
        .with_context(|| format!("cargo-deb failed for {}", package.deb_name()))?;

    let substvars = substvars(sh, ws, package, &tree)?;
    let mut control_files = Vec::new();
    for name in ["shlibs", "symbols"] {
        let path = package.control_dir().join(name);
        if path.exists() {
            let data = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            control_files.push((name.to_owned(), data));
        }
    }
    let extended = krate
        .deb_key(package.variant(), "extended-description")
        .with_context(|| {
            format!(
                "{}: [package.metadata.deb] has no extended-description",
                package.crate_name()
            )
        })?;
    let control = finish::finish(
        &deb,
        &finish::Finish {
            architecture: package.arch_all().then_some("all"),
            description: Some((package.synopsis(), extended)),
            substvars: &substvars,
            control_files,
        },
    )
    .with_context(|| format!("finishing {}", deb.display()))?;
    let name = finish::field(&control, "Package").unwrap_or_default();
    ensure!(
        name == package.deb_name(),
        "{}: Package is {name:?}, expected {}",
        deb.display(),
        package.deb_name()
    );
    let written = finish::field(&control, "Version").unwrap_or_default();
    ensure!(
        written == version,
        "cargo-deb wrote version {written} for {}, xtask expected {version} \
         (workspace.rs follows cargo-deb's rule; did it change?)",
        package.deb_name()
    );
    Ok(Built {
        package,
        path: deb,
        control,
    })
}

/// Removes other builds of `package` for `architecture` (those of another architecture stay:
/// amd64 and arm64 packages are built side by side).
fn remove_old_debs(package: Package, architecture: &str, keep: &Path) -> Result<()> {
    let dir = paths::build_dir();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let prefix = format!("{}_", package.deb_name());
    let bundle = package == Package::Bundle;
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // The bundle and the metapackage share a name; their versions tell them apart.
        let is_bundle = name.contains("+bundle_");
        if name.starts_with(&prefix)
            && name.ends_with(&format!("_{architecture}.deb"))
            && is_bundle == bundle
            && path != keep
        {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Collects cargo-deb's warnings: any of them fails the build, so that metadata mistakes
/// (a missing field, an asset glob that matches nothing) do not slip into a package.
struct Listener {
    warnings: Mutex<Vec<String>>,
}

impl cargo_deb::listener::Listener for Listener {
    fn warning(&self, s: String) {
        if let Ok(mut w) = self.warnings.lock() {
            w.push(s);
        }
    }
    fn info(&self, _: String) {}
    fn progress(&self, _: &str, _: String) {}
    fn generated_archive(&self, _: &Path) {}
}

fn run_cargo_deb(
    package: Package,
    manifest: &Path,
    triple: Option<&str>,
    deb: &Path,
) -> Result<()> {
    let listener = Listener {
        warnings: Mutex::new(Vec::new()),
    };
    let options = BuildOptions {
        manifest_path: Some(manifest),
        selected_package_name: Some(package.crate_name()),
        // The architecture cargo-deb writes (arm64 for aarch64); none: the machine's.
        rust_target_triples: triple.into_iter().collect(),
        config_variant: package.variant(),
        multiarch: if package == Package::Lib {
            Multiarch::Same
        } else {
            Multiarch::None
        },
        ..Default::default()
    };
    cargo_deb::CargoDeb {
        options,
        // stage.rs built and staged everything; the assets are that tree.
        no_build: true,
        deb_output: Some(cargo_deb::OutputPath {
            path: deb,
            is_dir: false,
        }),
        // gzip in pure Rust. `fast` is flate2 at level 1; the alternative, zopfli, is far slower
        // on the 14 MB static library, and xz would need liblzma or the xz program.
        compress_config: cargo_deb::compress::CompressConfig {
            fast: true,
            compress_type: cargo_deb::compress::Format::Gzip,
            compress_system: false,
            rsyncable: false,
        },
        ..Default::default()
    }
    .process(&listener)
    .map_err(|e| anyhow!("{e}"))?;
    let warnings = listener
        .warnings
        .into_inner()
        .map_err(|_| anyhow!("cargo-deb's listener lock is poisoned"))?;
    if !warnings.is_empty() {
        bail!("cargo-deb warned:\n  {}", warnings.join("\n  "));
    }
    Ok(())
}

/// `${shlibs:Depends}` from dpkg-shlibdeps over the package's ELF files, and
/// `${<package>:Version}` of every package.
fn substvars(
    sh: &Shell,
    ws: &Workspace,
    package: Package,
    tree: &Path,
) -> Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for p in Package::SPLIT {
        let version = ws.krate(p.crate_name())?.debian_version(p.variant());
        vars.insert(format!("{}:Version", p.deb_name()), version);
    }
    let elves = elf_files(tree)?;
    let shlibs = if elves.is_empty() {
        String::new()
    } else {
        shlibdeps(sh, ws, package, &elves)?
    };
    vars.insert("shlibs:Depends".into(), shlibs);
    Ok(vars)
}

/// Executables and shared libraries (not archives, not kernel objects) in `tree`.
pub fn elf_files(tree: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() && is_loadable_elf(&entry.path())? {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

fn is_loadable_elf(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut header = [0u8; 18];
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut n = 0;
    while n < header.len() {
        match file.read(&mut header[n..])? {
            0 => return Ok(false),
            k => n += k,
        }
    }
    // ET_EXEC (2) or ET_DYN (3), little-endian (amd64, arm64).
    Ok(&header[..4] == b"\x7fELF" && matches!(u16::from_le_bytes([header[16], header[17]]), 2 | 3))
}

/// The `shlibs:Depends` value dpkg-shlibdeps computes for `files`.
/// For a cross target it runs in the toolchain chroot, whose dpkg database has that
/// architecture's libc (the host's has only its own).
fn shlibdeps(sh: &Shell, ws: &Workspace, package: Package, files: &[PathBuf]) -> Result<String> {
    // dpkg-shlibdeps wants to run in a source tree: it reads debian/control.
    let dir = paths::build_dir().join("pkg/.shlibdeps");
    stage::put_text(
        &dir.join("debian/control"),
        &format!(
            "Source: mtgdrcopy\n\nPackage: {}\nArchitecture: any\n",
            package.deb_name()
        ),
        0o644,
    )?;
    let _cwd = sh.push_dir(&dir);
    let command = match ws.target {
        Some(target) => crate::cross::toolchain(sh)?
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
