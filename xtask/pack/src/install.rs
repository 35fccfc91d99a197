//! `cargo xtask install [all|lib|exes|drv]... [--prefix DIR] [--destdir DIR]`: the from-source
//! install upstream's `make lib_install exes_install drv_install` did. Packages are the better
//! way on Debian and Ubuntu (README, "On a host (DKMS)"); this is for other systems and
//! for staging (`--destdir`).
//!
//! - `lib`: `<libdir>/libgdrapi.so.<version>` with the links `.so.<major>` and `.so`,
//!   `libgdrapi.a`, `<prefix>/include/gdrapi.h`, `<libdir>/pkgconfig/gdrapi.pc`, gdrapi(3) into
//!   `<prefix>/share/man/man3`; then `ldconfig` when installing into the live system as root.
//! - `exes`: the mtgdrcopy-tests programs into `<prefix>/bin`, their manual pages into
//!   `<prefix>/share/man/man1`.
//! - `drv`: mtgdrdrv.ko for the running kernel (or `--kver`) into
//!   `<destdir>/lib/modules/<kver>/extra`, `depmod`, the udev rule into
//!   `<prefix>/lib/udev/rules.d` and the modprobe.d softdep (mtgdrdrv loads when mtgpu does)
//!   into `<prefix>/lib/modprobe.d` (udev, and kmod from Debian 12 on, read both under /usr/local/lib
//!   too). Without `--destdir` it needs a kernel that can load modules.
//!
//! Run it as yourself, not under sudo: where the destination is not writable (the default
//! prefix, for a user), it builds and stages everything as the user in build/install-stage/,
//! then copies that tree into place, and runs ldconfig and depmod, through `sudo`. Under sudo
//! itself it would need cargo on root's PATH (and a rustup toolchain of root's), which a
//! rustup install does not give, and it would leave root-owned files in target/.

use fs_err as fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::build::{self, KernelArgs};
use xtask_base::workspace::Workspace;
use xtask_base::{files, paths};

use crate::stage;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Component {
    /// lib, exes and driver.
    All,
    Lib,
    Exes,
    /// The kernel module (`drv` too, the old `drv_install`'s name).
    #[value(alias = "drv")]
    Driver,
}

#[derive(clap::Args, Clone)]
pub struct Args {
    /// What to install; several may be given.
    #[arg(value_enum, default_value = "all")]
    what: Vec<Component>,
    /// Installation prefix.
    #[arg(long, default_value = "/usr/local", value_name = "DIR")]
    prefix: PathBuf,
    /// Library directory (default: <prefix>/lib).
    #[arg(long, value_name = "DIR")]
    libdir: Option<PathBuf>,
    /// Staging root prepended to every path (packaging); nothing is run against the live system.
    #[arg(long, value_name = "DIR")]
    destdir: Option<PathBuf>,
    #[command(flatten)]
    kernel: KernelArgs,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    if args.destdir.is_none() {
        let targets = live_targets(&args);
        if let Some(dir) = targets.iter().find(|d| !writable(&sh, d)) {
            eprintln!(
                "xtask: {} is not writable by you: building and staging as you, then \
                 installing with sudo",
                dir.display()
            );
            return install_with_sudo(&sh, args);
        }
    }
    install(&sh, args)
}

/// The live directories an install writes to.
fn live_targets(args: &Args) -> Vec<PathBuf> {
    let all = args.what.contains(&Component::All);
    let mut dirs = vec![args.prefix.clone()];
    if all || args.what.contains(&Component::Lib) {
        dirs.extend(args.libdir.clone());
    }
    if all || args.what.contains(&Component::Driver) {
        dirs.push("/lib/modules".into());
    }
    dirs
}

/// Whether this user may create files in `dir`, or in its nearest existing ancestor.
fn writable(sh: &Shell, dir: &Path) -> bool {
    let existing = dir
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    cmd!(sh, "test -w {existing}").quiet().run().is_ok()
}

/// The install staged under build/install-stage as this user, then copied into / by sudo,
/// with ldconfig and depmod after it as a live install runs them.
fn install_with_sudo(sh: &Shell, args: Args) -> Result<()> {
    let stage = paths::build_dir().join("install-stage");
    files::fresh_dir(&stage)?;
    let staged = Args {
        destdir: Some(stage.clone()),
        ..args.clone()
    };
    install(sh, staged)?;
    copy_staged(sh, &stage, Path::new("/"), true)?;
    let all = args.what.contains(&Component::All);
    if all || args.what.contains(&Component::Lib) {
        cmd!(sh, "sudo -- ldconfig")
            .run()
            .context("running ldconfig")?;
    }
    if all || args.what.contains(&Component::Driver) {
        let release = args.kernel.release()?;
        cmd!(sh, "sudo -- depmod -a {release}")
            .run()
            .context("running depmod (package kmod)")?;
    }
    Ok(())
}

/// Copies the staged tree `stage` into `root`, through sudo if `sudo`: links as links, each
/// file's mode as staged; the directories it creates are 0755 whatever this user's umask, and
/// existing ones keep theirs.
fn copy_staged(sh: &Shell, stage: &Path, root: &Path, sudo: bool) -> Result<()> {
    set_dir_modes(stage)?;
    let from = stage.join(".");
    let copy = cmd!(sh, "cp -RP --preserve=links {from} {root}");
    let copy = if sudo {
        cmd!(sh, "sudo -- cp -RP --preserve=links {from} {root}")
    } else {
        copy
    };
    copy.run()
        .with_context(|| format!("copying {} into {}", stage.display(), root.display()))
}

fn set_dir_modes(dir: &Path) -> Result<()> {
    files::set_mode(dir, 0o755)?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            set_dir_modes(&entry.path())?;
        }
    }
    Ok(())
}

fn install(sh: &Shell, args: Args) -> Result<()> {
    let sh = sh.clone();
    ensure!(
        args.prefix.is_absolute(),
        "--prefix must be absolute, not {}",
        args.prefix.display()
    );
    let ws = Workspace::load()?;
    let all = args.what.contains(&Component::All);
    let wants = |c: Component| all || args.what.contains(&c);
    let live = args.destdir.is_none();
    // DESTDIR + absolute path, as make does it.
    let dest = |path: &Path| -> PathBuf {
        match &args.destdir {
            Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    };
    let libdir = args
        .libdir
        .clone()
        .unwrap_or_else(|| args.prefix.join("lib"));
    if wants(Component::Lib) {
        build::lib(&sh)?;
        let krate = ws.krate("libgdrapi")?;
        let target = dest(&libdir);
        let real = install_lib(&sh, &ws, &target, &krate.version, krate.major_minor()?.0)?;
        let prefix = args.prefix.to_string_lossy();
        let pc_libdir = match libdir.strip_prefix(&args.prefix) {
            Ok(rel) => format!("${{prefix}}/{}", rel.display()),
            Err(_) => libdir.display().to_string(),
        };
        let pc = stage::template(
            &paths::root().join("libgdrapi/gdrapi.pc.in"),
            &[
                ("PREFIX", &prefix),
                ("LIBDIR", &pc_libdir),
                ("INCLUDEDIR", "${prefix}/include"),
                ("VERSION", &krate.version),
            ],
        )?;
        files::put_text(&target.join("pkgconfig/gdrapi.pc"), &pc, 0o644)?;
        files::put_file(
            &paths::root().join("libgdrapi/include/gdrapi.h"),
            &dest(&args.prefix.join("include/gdrapi.h")),
            0o644,
        )?;
        files::put_file(
            &paths::root().join("libgdrapi/man/gdrapi.3"),
            &dest(&args.prefix.join("share/man/man3/gdrapi.3")),
            0o644,
        )?;
        println!("{}", real.display());
        if live {
            refresh_linker_cache(&sh);
        }
    }
    if wants(Component::Exes) {
        build::exes(&sh)?;
        let bins = &ws.krate("mtgdrcopy-tests")?.bins;
        let bindir = dest(&args.prefix.join("bin"));
        install_exes(&sh, &ws, bins, &bindir)?;
        let man1 = dest(&args.prefix.join("share/man/man1"));
        for bin in bins {
            let page = format!("{bin}.1");
            let source = paths::root().join("mtgdrcopy-tests/man").join(&page);
            files::put_file(&source, &man1.join(&page), 0o644)?;
        }
        for bin in bins {
            println!("{}", bindir.join(bin).display());
        }
    }
    if wants(Component::Driver) {
        install_driver(&sh, &args, &dest)?;
    }
    Ok(())
}

fn install_driver(sh: &Shell, args: &Args, dest: &dyn Fn(&Path) -> PathBuf) -> Result<()> {
    let live = args.destdir.is_none();
    if live {
        let disabled = std::fs::read_to_string("/proc/sys/kernel/modules_disabled")
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        ensure!(
            Path::new("/proc/modules").exists() && !disabled,
            "this kernel cannot load modules (no /proc/modules, or kernel.modules_disabled=1): \
             build the packages instead (cargo xtask deb-all) or pass --destdir"
        );
    }
    let release = args.kernel.release()?;
    let ko = build::driver(sh, &args.kernel)?;
    let modules = dest(Path::new("/lib/modules")).join(&release).join("extra");
    files::put_file(&ko, &modules.join("mtgdrdrv.ko"), 0o644)?;
    println!("{}", modules.join("mtgdrdrv.ko").display());
    let debian = paths::root().join("debian");
    let rules = dest(&args.prefix.join("lib/udev/rules.d/60-mtgdrdrv.rules"));
    files::put_file(&debian.join("60-mtgdrdrv.rules"), &rules, 0o644)?;
    println!("{}", rules.display());
    let softdep = dest(&args.prefix.join("lib/modprobe.d/mtgdrdrv.conf"));
    files::put_file(&debian.join("mtgdrdrv.modprobe.conf"), &softdep, 0o644)?;
    println!("{}", softdep.display());
    if live {
        cmd!(sh, "depmod -a {release}")
            .run()
            .context("running depmod (package kmod)")?;
        eprintln!(
            "xtask: installed; load it with `modprobe mtgdrdrv` once mtgpu is loaded \
             (./insmod.sh does the same from the build tree)"
        );
    }
    Ok(())
}

fn refresh_linker_cache(sh: &Shell) {
    // ldconfig fails unless run as root, which its message says.
    if let Err(e) = cmd!(sh, "ldconfig").quiet().run() {
        eprintln!("xtask: ld.so.cache was not refreshed ({e}); run `ldconfig` as root");
    }
}

/// The shared library (stripped like dh_strip does, mode 0644 as Debian policy wants), its two
/// links and the static library (debug info stripped) into `libdir`.
fn install_lib(
    sh: &Shell,
    ws: &Workspace,
    libdir: &Path,
    version: &str,
    major: u32,
) -> Result<PathBuf> {
    let release = ws.release_dir();
    let real = format!("libgdrapi.so.{version}");
    let soname = format!("libgdrapi.so.{major}");
    let (built, installed) = (release.join("libgdrapi.so"), libdir.join(&real));
    files::parent_of(&installed)?;
    strip(sh, &["--strip-unneeded"], &built, &installed, 0o644)?;
    files::put_symlink(&real, &libdir.join(&soname))?;
    files::put_symlink(&soname, &libdir.join("libgdrapi.so"))?;
    // The static library as the package has it: only the gdr_* symbols global.
    let archive = libdir.join("libgdrapi.a");
    let reduced = xtask_base::paths::build_dir().join("libgdrapi.a.reduced");
    let script = paths::root().join("debian/scripts/static-archive");
    let built = release.join("libgdrapi.a");
    cmd!(sh, "{script} {built} {reduced}")
        .quiet()
        .run()
        .context("reducing libgdrapi.a to the gdr_* symbols")?;
    let deterministic = ["--strip-debug", "--enable-deterministic-archives"];
    strip(sh, &deterministic, &reduced, &archive, 0o644)?;
    Ok(installed)
}

/// The programs of mtgdrcopy-tests, stripped, into `bindir`.
fn install_exes(sh: &Shell, ws: &Workspace, bins: &[String], bindir: &Path) -> Result<()> {
    fs::create_dir_all(bindir)?;
    for name in bins {
        strip(
            sh,
            &[],
            &ws.release_dir().join(name),
            &bindir.join(name),
            0o755,
        )?;
    }
    Ok(())
}

/// `from` stripped of the compiler's notes and `options` into `to`, which gets `mode`.
fn strip(sh: &Shell, options: &[&str], from: &Path, to: &Path, mode: u32) -> Result<()> {
    cmd!(
        sh,
        "strip --remove-section=.comment --remove-section=.note {options...} -o {to} {from}"
    )
    .quiet()
    .run()
    .with_context(|| format!("stripping {} (binutils)", from.display()))?;
    files::set_mode(to, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_staged_tree_is_copied_with_links_modes_and_0755_directories() {
        let base = std::env::temp_dir().join(format!("xtask-copy-staged-{}", std::process::id()));
        let (stage, root) = (base.join("stage"), base.join("root"));
        let lib = stage.join("usr/local/lib");
        fs::create_dir_all(&lib).unwrap();
        fs::create_dir_all(root.join("usr/local")).unwrap();
        files::set_mode(&root.join("usr/local"), 0o775).unwrap();
        files::set_mode(&lib, 0o700).unwrap();
        files::put_text(&lib.join("libgdrapi.so.1.0.0"), "elf", 0o644).unwrap();
        files::put_symlink("libgdrapi.so.1.0.0", &lib.join("libgdrapi.so.1")).unwrap();
        files::put_text(&stage.join("usr/local/bin/tool"), "elf", 0o755).unwrap();
        let sh = Shell::new().unwrap();
        copy_staged(&sh, &stage, &root, false).unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        let installed = root.join("usr/local/lib");
        assert_eq!(
            fs::read_link(installed.join("libgdrapi.so.1")).unwrap(),
            Path::new("libgdrapi.so.1.0.0")
        );
        assert_eq!(mode(&installed.join("libgdrapi.so.1.0.0")), 0o644);
        assert_eq!(mode(&root.join("usr/local/bin/tool")), 0o755);
        assert_eq!(mode(&installed), 0o755);
        // An existing directory keeps its mode.
        assert_eq!(mode(&root.join("usr/local")), 0o775);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_directory_is_writable_through_its_nearest_existing_ancestor() {
        let sh = Shell::new().unwrap();
        let tmp = std::env::temp_dir();
        assert!(writable(&sh, &tmp.join("no/such/dir")));
        assert!(!writable(&sh, Path::new("/proc/1/no/such/dir")));
    }
}
