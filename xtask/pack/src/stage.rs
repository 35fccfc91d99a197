//! `cargo xtask build-kmod|build-lib|build-tests|build-meta`: stage each package's file tree
//! under `build/pkg/<package>/`, with its `DEBIAN/` control files, exactly what its .deb holds;
//! `build/pkg/<package>-dbgsym/` holds the debug symbols split off its ELF files.
//!
//! The same steps as `dpkg-buildpackage` with debian/rules, from the same files:
//! debian/scripts/install-tree installs every file into `build/pkg/tmp` (debian/tmp), the
//! `debian/<package>.install` lists split it; then what dh_installdocs, dh_installchangelogs,
//! dh_lintian, dh_compress, dh_strip, dh_installdeb and dh_makeshlibs do, here in Rust, and
//! deb.rs does dh_md5sums, dh_gencontrol (from debian/control) and dh_builddeb. Versions come
//! from the crates only.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::elf::{self, ElfKind};
use xtask_base::files::{
    copy_path, files, fresh_dir, lock, parent_of, put_file, put_gzip, put_symlink, put_text,
    set_mode,
};
use xtask_base::workspace::Workspace;
use xtask_base::{build, debian, paths};

/// The packages `cargo xtask deb-*` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Package {
    /// `mtgdrdrv-dkms`: module sources for DKMS, udev rule, modprobe.d softdep.
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

    /// Unique name of the staging directories and of the package's directory in `debian/`.
    pub fn stage_name(self) -> &'static str {
        match self {
            Package::Bundle => "mtgdrcopy-bundle",
            p => p.deb_name(),
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

    /// The debug symbols split off its ELF files: `build/pkg/<stage name>-dbgsym/`.
    pub fn dbgsym_tree(self) -> PathBuf {
        paths::build_dir()
            .join("pkg")
            .join(format!("{}-dbgsym", self.stage_name()))
    }

    /// The package's own changelog, installed as changelog.Debian (dh_installchangelogs takes
    /// debian/<package>.changelog over the source package's debian/changelog).
    pub fn changelog(self) -> PathBuf {
        paths::root()
            .join("debian")
            .join(format!("{}.changelog", self.stage_name()))
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
        Some(target) => xtask_base::cross::packaged(sh, target),
        None => build::packaged(sh, &ws.target_dir),
    }
}

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
    let ws = Workspace::load(sh)?;
    let _lock = lock()?;
    packages.iter().map(|&p| stage(sh, &ws, p)).collect()
}

/// The test step of `cargo xtask build-all` (the old `make build`): every package's tree is
/// staged, with its `DEBIAN/` (the control file itself is written by deb.rs, last) and the
/// documentation every package carries.
pub fn build_all_test_step(sh: &Shell) -> Result<()> {
    let trees = stage_all(sh, &Package::SPLIT)?;
    anyhow::ensure!(trees.len() == Package::SPLIT.len(), "staged {trees:?}");
    for (tree, package) in trees.iter().zip(Package::SPLIT) {
        let doc = tree.join("usr/share/doc").join(package.deb_name());
        anyhow::ensure!(
            *tree == package.tree() && tree.join("DEBIAN").is_dir() && doc.is_dir(),
            "build-all did not stage {} (with DEBIAN/ and {})",
            package.tree().display(),
            doc.display()
        );
    }
    Ok(())
}

/// Stages `package` (building what it needs) and returns its tree. Callers hold [`lock`].
pub fn stage(sh: &Shell, ws: &Workspace, package: Package) -> Result<PathBuf> {
    let tmp = install_tree(sh, ws)?;
    let arch = package_arch(ws)?;
    let tree = package.tree();
    fresh_dir(&tree)?;
    fresh_dir(&package.dbgsym_tree())?;
    match package {
        Package::Bundle => {
            for part in [Package::Kmod, Package::Lib, Package::Tests] {
                install_files(part, &tmp, &tree, arch.multiarch)?;
            }
            // The module's README stays documentation of the bundle, under its own name.
            let readme = tree.join("usr/share/doc/mtgdrdrv-dkms/README.md");
            put_file(
                &readme,
                &tree.join("usr/share/doc/mtgdrcopy/README.mtgdrdrv.md"),
                0o644,
            )?;
            fs::remove_dir_all(tree.join("usr/share/doc/mtgdrdrv-dkms"))?;
        }
        p => install_files(p, &tmp, &tree, arch.multiarch)?,
    }
    install_docs(package, &tree)?;
    compress(&tree)?;
    let dbgsym = package.dbgsym_tree();
    strip(sh, ws, &tree, &dbgsym)?;
    if dbgsym.join("usr/lib/debug").exists() {
        // As dh_strip does: the debug package's documentation is its package's.
        put_symlink(
            package.deb_name(),
            &dbgsym.join(format!("usr/share/doc/{}-dbgsym", package.deb_name())),
        )?;
    }
    control_files(sh, ws, package, &tree)?;
    Ok(tree)
}

/// Every package's files, installed by debian/scripts/install-tree into `build/pkg/tmp` (what
/// `debian/tmp` is to dpkg-buildpackage).
fn install_tree(sh: &Shell, ws: &Workspace) -> Result<PathBuf> {
    packaged(sh, ws)?;
    let tmp = paths::build_dir().join("pkg/tmp");
    fresh_dir(&tmp)?;
    let arch = package_arch(ws)?;
    let release = ws.packaged_dir();
    let script = paths::root().join("debian/scripts/install-tree");
    let multiarch = format!("DEB_HOST_MULTIARCH={}", arch.multiarch);
    let command = match ws.target {
        // The target's binutils live in the toolchain chroot, with the tree on the same path.
        Some(target) => {
            let mut env = vec![multiarch];
            for tool in ["ld", "objcopy", "ar", "nm", "readelf"] {
                env.push(format!(
                    "{}={}-{tool}",
                    tool.to_uppercase(),
                    target.multiarch
                ));
            }
            xtask_base::cross::toolchain(sh)?
                .cmd(sh, target, &env, &script.to_string_lossy())
                .args([&tmp, &release])
        }
        None => cmd!(sh, "{script} {tmp} {release}").env("DEB_HOST_MULTIARCH", arch.multiarch),
    };
    command
        .quiet()
        .run()
        .context("debian/scripts/install-tree failed")?;
    Ok(tmp)
}

/// What dh_install does with `debian/<package>.install`: each path the patterns match in `tmp`
/// goes to the same place in `tree`. A pattern that matches nothing is an error (dh_install's
/// too), so the lists cannot fall behind install-tree.
fn install_files(package: Package, tmp: &Path, tree: &Path, multiarch: &str) -> Result<()> {
    for pattern in debian::install_patterns(package.deb_name(), multiarch)? {
        let found = debian::glob(tmp, &pattern)?;
        ensure!(
            !found.is_empty(),
            "debian/{}.install: {pattern} matches nothing that debian/scripts/install-tree \
             installed",
            package.deb_name()
        );
        for rel in found {
            copy_path(&tmp.join(&rel), &tree.join(&rel))?;
        }
    }
    Ok(())
}

/// What dh_installdocs, dh_installchangelogs and dh_lintian add to every package: copyright,
/// the package's changelog (debian/<package>.changelog), the lintian overrides.
fn install_docs(package: Package, tree: &Path) -> Result<()> {
    let deb = package.deb_name();
    let debian = paths::root().join("debian");
    let doc = tree.join("usr/share/doc").join(deb);
    put_file(&debian.join("copyright"), &doc.join("copyright"), 0o644)?;
    let changelog = package.changelog();
    put_file(&changelog, &doc.join("changelog.Debian"), 0o644)?;
    let overrides = debian.join(format!("{}.lintian-overrides", package.stage_name()));
    if overrides.exists() {
        put_file(
            &overrides,
            &tree.join("usr/share/lintian/overrides").join(deb),
            0o644,
        )?;
    }
    Ok(())
}

/// dh_compress's rule: manual pages, changelogs, and documentation bigger than 4 KiB (not
/// copyright), gzip -9n.
fn compress(tree: &Path) -> Result<()> {
    for file in files(tree)? {
        let rel = file.strip_prefix(tree)?.to_string_lossy().into_owned();
        let wanted = if rel.starts_with("usr/share/man/") {
            true
        } else if let Some(doc) = rel.strip_prefix("usr/share/doc/") {
            let name = doc.rsplit('/').next().unwrap_or_default();
            name != "copyright"
                && (name.starts_with("changelog") || fs::metadata(&file)?.len() > 4096)
        } else {
            false
        };
        if wanted && !rel.ends_with(".gz") {
            let data = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            put_gzip(&PathBuf::from(format!("{}.gz", file.display())), &data)?;
            fs::remove_file(&file)?;
        }
    }
    Ok(())
}

/// What dh_strip does: the debug information of each ELF file goes to
/// `<dbgsym>/usr/lib/debug/.build-id/xx/yyyy.debug` (the -dbgsym package), the file is
/// stripped and points to it with a debug link; static libraries lose their debug sections.
fn strip(sh: &Shell, ws: &Workspace, tree: &Path, dbgsym: &Path) -> Result<()> {
    let tool = |name: &str| -> Result<xshell::Cmd<'_>> {
        match ws.target {
            Some(target) => xtask_base::cross::binutil(sh, target, name),
            None => Ok(cmd!(sh, "{name}")),
        }
    };
    for file in files(tree)? {
        let name = file.to_string_lossy().into_owned();
        if name.ends_with(".a") {
            tool("strip")?
                .args([
                    "--strip-debug",
                    "--remove-section=.comment",
                    "--remove-section=.note",
                    "--enable-deterministic-archives",
                ])
                .arg(&file)
                .quiet()
                .run()
                .with_context(|| format!("stripping {name}"))?;
            continue;
        }
        let Some(kind) = elf::elf_kind(&file)? else {
            continue;
        };
        let notes = tool("readelf")?
            .args(["-n", &name])
            .quiet()
            .read()
            .with_context(|| format!("reading the notes of {name}"))?;
        let id = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .map(|s| s.trim().to_owned())
            .with_context(|| format!("{name} has no build ID (the linker's --build-id)"))?;
        ensure!(id.len() > 2, "{name}: build ID {id:?} is too short");
        let debug = dbgsym.join(format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &id[..2],
            &id[2..]
        ));
        parent_of(&debug)?;
        tool("objcopy")?
            .args(["--only-keep-debug", "--compress-debug-sections"])
            .arg(&file)
            .arg(&debug)
            .quiet()
            .run()
            .with_context(|| format!("extracting the debug information of {name}"))?;
        set_mode(&debug, 0o644)?;
        let mut command =
            tool("strip")?.args(["--remove-section=.comment", "--remove-section=.note"]);
        if kind == ElfKind::SharedObject {
            command = command.arg("--strip-unneeded");
        }
        command
            .arg(&file)
            .quiet()
            .run()
            .with_context(|| format!("stripping {name}"))?;
        tool("objcopy")?
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&file)
            .quiet()
            .run()
            .with_context(|| format!("adding the debug link to {name}"))?;
    }
    Ok(())
}

/// The build IDs a -dbgsym tree holds (its `Build-Ids` field), sorted.
pub fn build_ids(dbgsym: &Path) -> Result<Vec<String>> {
    let dir = dbgsym.join("usr/lib/debug/.build-id");
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::new();
    for file in files(&dir)? {
        let rel = file.strip_prefix(&dir)?.to_string_lossy().replace('/', "");
        if let Some(id) = rel.strip_suffix(".debug") {
            ids.push(id.to_owned());
        }
    }
    ids.sort();
    Ok(ids)
}

/// Where mtgdrdrv-dkms installs debian/scripts/mtgdrdrv-load, which decides whether mtgdrdrv
/// may be loaded and loads it; the postinst runs it from there (`@LOAD_SCRIPT@`).
pub const LOAD_SCRIPT: &str = "/usr/lib/mtgdrdrv/mtgdrdrv-load";

/// `DEBIAN/` of the package but its control file and md5sums (deb.rs writes those, last):
/// maintainer scripts (what debian/rules generates from the .in templates, with no debhelper
/// snippet: none applies), and for the library shlibs, symbols and the ldconfig trigger (what
/// dh_makeshlibs writes).
fn control_files(sh: &Shell, ws: &Workspace, package: Package, tree: &Path) -> Result<()> {
    let control = tree.join("DEBIAN");
    fresh_dir(&control)?;
    if matches!(package, Package::Kmod | Package::Bundle) {
        let version = &ws.krate(Package::Kmod.crate_name())?.version;
        for script in ["postinst", "prerm"] {
            let text = maintainer_script(script, version, LOAD_SCRIPT)?;
            put_text(&control.join(script), &text, 0o755)?;
        }
    }
    if matches!(package, Package::Lib | Package::Bundle) {
        let krate = ws.krate(Package::Lib.crate_name())?;
        let (major, _) = krate.major_minor()?;
        let arch = package_arch(ws)?;
        let so = tree.join(format!(
            "usr/lib/{}/libgdrapi.so.{}",
            arch.multiarch, krate.version
        ));
        put_text(
            &control.join("shlibs"),
            &shlibs(&krate.version, major)?,
            0o644,
        )?;
        put_text(&control.join("symbols"), &symbols_file(sh, ws, &so)?, 0o644)?;
        put_text(
            &control.join("triggers"),
            "activate-noawait ldconfig\n",
            0o644,
        )?;
    }
    Ok(())
}

/// mtgdrdrv-dkms's `script` (postinst, prerm) from debian/mtgdrdrv-dkms.<script>.in, as
/// debian/rules makes it: the module's version and mtgdrdrv-load's path filled in; then what
/// dh_installdeb does with the `#DEBHELPER#` line when no debhelper snippet applies (none does
/// here): it goes.
pub fn maintainer_script(script: &str, version: &str, load: &str) -> Result<String> {
    let text = template(
        &paths::root().join(format!("debian/mtgdrdrv-dkms.{script}.in")),
        &[("VERSION", version), ("LOAD_SCRIPT", load)],
    )?;
    Ok(text
        .lines()
        .filter(|l| l.trim() != "#DEBHELPER#")
        .map(|l| format!("{l}\n"))
        .collect())
}

/// `DEBIAN/shlibs`: programs linked against libgdrapi.so.<major> need this version or newer,
/// and below the next major, whose package no longer has libgdrapi.so.<major> (what
/// debian/rules passes to dh_makeshlibs -V).
fn shlibs(version: &str, major: u32) -> Result<String> {
    Ok(format!(
        "libgdrapi {major} libgdrapi (>= {version}), libgdrapi (<< {})\n",
        debian::next_major(version)?
    ))
}

/// debian/libgdrapi.symbols, after checking that it lists exactly the library's exports: each
/// symbol carries the version that introduced it, which only a person can say, so the file is
/// maintained by hand (the one list of the exports) and this check fails when an export is
/// added or removed.
fn symbols_file(sh: &Shell, _ws: &Workspace, so: &Path) -> Result<String> {
    let (path, text, listed) = listed_symbols()?;
    let exported = exported_symbols(sh, so)?;
    ensure!(
        listed == exported,
        "{} does not list exactly the exports of libgdrapi.so: add each new symbol with the \
         version that introduces it, remove those that are gone (and bump the soname)\n  \
         listed:   {listed:?}\n  exported: {exported:?}",
        path.display()
    );
    Ok(text)
}

/// debian/libgdrapi.symbols: its path, its text and the symbols it lists, sorted.
pub fn listed_symbols() -> Result<(PathBuf, String, Vec<String>)> {
    let path = paths::root().join("debian/libgdrapi.symbols");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let listed = symbols_listed(&text);
    Ok((path, text, listed))
}

/// The symbols a Debian symbols file lists (` name@Base version` lines), sorted.
fn symbols_listed(symbols_file: &str) -> Vec<String> {
    let mut names: Vec<String> = symbols_file
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.strip_suffix("@Base"))
        .map(str::to_owned)
        .collect();
    names.sort_unstable();
    names
}

/// The symbols a shared library defines and exports (`nm -D --defined-only`), sorted.
pub fn exported_symbols(sh: &Shell, so: &Path) -> Result<Vec<String>> {
    let nm = cmd!(sh, "nm -D --defined-only {so}")
        .quiet()
        .read()
        .context("running nm (binutils)")?;
    let mut exported: Vec<String> = nm
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "T" | "D" | "B" | "R").then(|| name.to_string())
        })
        .collect();
    exported.sort_unstable();
    Ok(exported)
}

/// `path` with every `@KEY@` replaced; fails if a placeholder is left.
pub fn template(path: &Path, values: &[(&str, &str)]) -> Result<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_from_a_symbols_file() {
        let file = "libgdrapi.so.1 libgdrapi #MINVER#\n\
                    * Build-Depends-Package: libgdrapi\n \
                    gdr_open@Base 1.0.0\n \
                    gdr_close@Base 1.0.0\n";
        assert_eq!(symbols_listed(file), ["gdr_close", "gdr_open"]);
    }
}
