//! `cargo xtask install [all|lib|exes|drv]... [--prefix DIR] [--destdir DIR]`: the from-source
//! install upstream's `make lib_install exes_install drv_install` did. Packages are the better
//! way on Debian and Ubuntu (README, "Host install with DKMS"); this is for other systems and
//! for staging (`--destdir`).
//!
//! - `lib`: `<libdir>/libgdrapi.so.<version>` with the links `.so.<major>` and `.so`,
//!   `libgdrapi.a`, `<prefix>/include/gdrapi.h`, `<libdir>/pkgconfig/gdrapi.pc`; then
//!   `ldconfig` when installing into the live system as root.
//! - `exes`: the mtgdrcopy-tests programs into `<prefix>/bin`.
//! - `drv`: mtgdrdrv.ko for the running kernel (or `--kver`) into
//!   `<destdir>/lib/modules/<kver>/extra`, `depmod`, the udev rule into
//!   `<prefix>/lib/udev/rules.d` and the modules-load.d file into `<prefix>/lib/modules-load.d`
//!   (udev and systemd read both under /usr/local/lib too). Without `--destdir` it needs a
//!   kernel that can load modules.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::build::{self, KernelArgs};
use crate::paths;
use crate::stage::{self, LibNames};
use crate::workspace::Workspace;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Component {
    /// lib, exes and drv.
    All,
    Lib,
    Exes,
    Drv,
}

#[derive(clap::Args)]
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
    ensure!(
        args.prefix.is_absolute(),
        "--prefix must be absolute, not {}",
        args.prefix.display()
    );
    let ws = Workspace::load(&sh)?;
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
        let (major, _) = krate.major_minor()?;
        let names = LibNames::new(&krate.version, major);
        let target = dest(&libdir);
        stage::install_lib(&sh, &ws, &ws.release_dir(), &target, &names)?;
        let prefix = args.prefix.to_string_lossy();
        let pc_libdir = match libdir.strip_prefix(&args.prefix) {
            Ok(rel) => format!("${{prefix}}/{}", rel.display()),
            Err(_) => libdir.display().to_string(),
        };
        let pc = stage::pkg_config(&prefix, &pc_libdir, &krate.version)?;
        stage::put_text(&target.join("pkgconfig/gdrapi.pc"), &pc, 0o644)?;
        stage::put_file(
            &paths::root().join("libgdrapi/include/gdrapi.h"),
            &dest(&args.prefix.join("include/gdrapi.h")),
            0o644,
        )?;
        report(&target.join(&names.real));
        if live {
            refresh_linker_cache(&sh);
        }
    }
    if wants(Component::Exes) {
        build::exes(&sh)?;
        let bins = &ws.krate("mtgdrcopy-tests")?.bins;
        let bindir = dest(&args.prefix.join("bin"));
        stage::install_exes(&sh, &ws, &ws.release_dir(), bins, &bindir)?;
        for bin in bins {
            report(&bindir.join(bin));
        }
    }
    if wants(Component::Drv) {
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
    stage::put_file(&ko, &modules.join("mtgdrdrv.ko"), 0o644)?;
    report(&modules.join("mtgdrdrv.ko"));
    let debian = paths::root().join("debian");
    let rules = dest(&args.prefix.join("lib/udev/rules.d/60-mtgdrdrv.rules"));
    stage::put_file(&debian.join("60-mtgdrdrv.rules"), &rules, 0o644)?;
    report(&rules);
    let load = dest(&args.prefix.join("lib/modules-load.d/mtgdrdrv.conf"));
    stage::put_file(&debian.join("mtgdrdrv.modules-load.conf"), &load, 0o644)?;
    report(&load);
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
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|u| u.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("xtask: not root, so ld.so.cache was not refreshed; run `ldconfig` as root");
        return;
    }
    if let Err(e) = cmd!(sh, "ldconfig").run() {
        eprintln!("xtask: ldconfig failed ({e}); run it by hand");
    }
}

fn report(path: &Path) {
    println!("{}", path.display());
}
