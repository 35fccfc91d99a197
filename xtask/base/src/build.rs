//! `cargo xtask build [all|driver|lib|exes]...` and `cargo xtask clean`: what upstream GDRCopy's
//! Makefile did (`make all`, `make driver lib exes`, `make clean`).
//!
//! - `lib`: `libgdrapi.so`, its soname link `libgdrapi.so.1` and `libgdrapi.a` (release) in
//!   target/release.
//! - `exes`: the mtgdrcopy-tests programs (release) in target/release.
//! - `driver`: `mtgdrdrv.ko` for one kernel (default: the running one), built from a copy of
//!   mtgdrdrv/kmod in build/driver/<release>/ so the source tree stays clean; `insmod.sh` loads
//!   it from there.
//!
//! The packages' library and programs are a build of their own ([`packaged`]): reproducible,
//! in target/packaged/release.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::cargo::{encode_rustflags, packaged_target_dir, reproducible_rustflags};
use crate::library::soname;
use crate::workspace::Workspace;
use crate::zigbuild::{self, Zig};
use crate::{cross, files, paths, targets};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Component {
    /// driver, lib and exes.
    All,
    /// The kernel module (`drv` too, as `cargo xtask install` and the old `drv_install`).
    #[value(alias = "drv")]
    Driver,
    Lib,
    Exes,
}

#[derive(clap::Args)]
pub struct Args {
    /// What to build; several may be given.
    #[arg(value_enum, default_value = "all")]
    what: Vec<Component>,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Rust target triple of the library and tools: the machine's own (default) or
    /// aarch64-unknown-linux-gnu, cross-built with Debian's toolchain in a cached chroot.
    #[arg(long, value_name = "TRIPLE")]
    target: Option<String>,
}

/// The kernel the driver is built for.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KernelArgs {
    /// Kernel release to build the driver for (default: the running kernel, `uname -r`).
    #[arg(long, value_name = "RELEASE")]
    pub kver: Option<String>,
    /// Kernel build directory (default: /lib/modules/<kver>/build).
    #[arg(long, value_name = "DIR")]
    pub kdir: Option<PathBuf>,
}

impl KernelArgs {
    pub fn release(&self) -> Result<String> {
        match &self.kver {
            Some(k) => Ok(k.clone()),
            None => {
                let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .context("reading /proc/sys/kernel/osrelease")?;
                Ok(release.trim().to_owned())
            }
        }
    }

    pub fn build_dir(&self) -> Result<PathBuf> {
        match &self.kdir {
            Some(d) => Ok(d.clone()),
            None => Ok(PathBuf::from(format!(
                "/lib/modules/{}/build",
                self.release()?
            ))),
        }
    }
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let all = args.what.contains(&Component::All);
    let wants = |c: Component| all || args.what.contains(&c);
    if let Some(target) = targets::parse(args.target.as_deref())? {
        ensure!(
            !args.what.contains(&Component::Driver),
            "the driver is built by DKMS on the target machine (mtgdrdrv-dkms); \
             --target builds only the library and the tools"
        );
        crate::cross::build(&sh, target, wants(Component::Lib), wants(Component::Exes))?;
        let release = targets::release_dir(target);
        if wants(Component::Lib) {
            println!("{}", release.join("libgdrapi.so").display());
        }
        return Ok(());
    }
    if wants(Component::Lib) {
        println!("{}", lib(&sh)?.display());
    }
    if wants(Component::Exes) {
        exes(&sh)?;
    }
    if wants(Component::Driver) {
        let ko = driver(&sh, &args.kernel)?;
        println!("{}", ko.display());
    }
    Ok(())
}

/// What the packages of `ws` hold, in one cargo invocation: the library (cdylib, staticlib)
/// and the tools, release profile, for the machine or for `ws.target` (with the cross
/// toolchain). Building them together keeps their dependencies' features unified, so that
/// alternating between the two does not rebuild them each time. Once per process and target.
///
/// Linked by zig against glibc 2.28's symbol versions ([`zigbuild`]: the glibc floor), for
/// `<triple>.2.28`, so the products land in `<dir>/<triple>/release` ([`Workspace::packaged_dir`]).
///
/// Reproducible: built with [`reproducible_rustflags`] in a target directory of its own
/// ([`packaged_target_dir`]), so that the other release builds (tests, `cargo xtask build`),
/// whose flags differ, neither rebuild it nor are rebuilt by it. A cross build is remapped the
/// same way from the chroot's paths: the workspace and the target directory are mounted at
/// their host paths, the registry under its cargo home (mount points, not links, so what
/// reproducible_rustflags resolves on the host adds nothing that matters inside).
pub fn packaged(sh: &Shell, ws: &Workspace) -> Result<()> {
    static DONE: Mutex<Vec<Option<&str>>> = Mutex::new(Vec::new());
    let mut done = DONE
        .lock()
        .map_err(|_| anyhow::anyhow!("the packaged build's lock is poisoned"))?;
    if done.contains(&ws.target.map(|t| t.triple)) {
        return Ok(());
    }
    let _cwd = sh.push_dir(paths::root());
    let (dir, home) = match ws.target {
        None => (packaged_target_dir(&ws.target_dir), paths::cargo_home()),
        Some(_) => (targets::packaged_dir(), cross::CHROOT_CARGO_HOME.into()),
    };
    let mut flags = reproducible_rustflags(&paths::root(), &dir, &home);
    flags.extend(zigbuild::LINK_FLAGS.iter().map(|f| f.to_string()));
    let flags = encode_rustflags(&flags);
    let zig = zigbuild::tools(sh)?;
    let zig_path = format!("CARGO_ZIGBUILD_ZIG_PATH={}", zig.zig.display());
    let (build, what) = match ws.target {
        None => {
            let target = Zig::target(targets::host_triple());
            let cargo_zigbuild = &zig.cargo_zigbuild;
            let build = cmd!(sh, "{cargo_zigbuild} zigbuild --target {target}")
                .env("CARGO_ENCODED_RUSTFLAGS", flags)
                .env("CARGO_ZIGBUILD_ZIG_PATH", &zig.zig);
            (build.env_remove("RUSTFLAGS"), format!(" for {target}"))
        }
        Some(target) => {
            let toolchain = cross::toolchain(sh)?;
            // zig's and cargo-zigbuild's caches in the mounted target directory, not in the
            // cached chroot.
            let caches = targets::target_dir().join("zig-cache");
            let env = [
                format!("CARGO_ENCODED_RUSTFLAGS={flags}"),
                zig_path,
                format!(
                    "CARGO_ZIGBUILD_CACHE_DIR={}",
                    caches.join("cargo-zigbuild").display()
                ),
                format!("ZIG_GLOBAL_CACHE_DIR={}", caches.join("zig").display()),
            ];
            let program = zig.cargo_zigbuild.to_string_lossy();
            let triple = Zig::target(target.triple);
            let build = toolchain.zig_cmd(sh, target, &env, &zig.dir, &program);
            let what = format!(" for {triple} ({})", toolchain.rustc);
            (build.args(["zigbuild", "--target", &triple]), what)
        }
    };
    build
        .arg("--target-dir")
        .arg(&dir)
        .args(["--locked", "--quiet", "--release", "-p", "libgdrapi"])
        .args(["-p", "mtgdrcopy-tests", "--lib", "--bins"])
        .run()
        .with_context(|| {
            format!("building libgdrapi and the mtgdrcopy-tests programs{what} (cargo-zigbuild)")
        })?;
    done.push(ws.target.map(|t| t.triple));
    Ok(())
}

/// libgdrapi: cdylib (soname libgdrapi.so.1) and staticlib, release profile, with the soname
/// link beside the library (what `ldconfig -n` made in upstream's Makefile): the tools load
/// `libgdrapi.so.1`, so `LD_LIBRARY_PATH=target/release` is all a source tree needs. Returns
/// the link's path.
pub fn lib(sh: &Shell) -> Result<PathBuf> {
    let _cwd = sh.push_dir(paths::root());
    cmd!(sh, "cargo build --quiet --release -p libgdrapi")
        .run()
        .context("building libgdrapi")?;
    let release = paths::release_dir();
    let link = release.join(soname());
    files::put_symlink("libgdrapi.so", &link)?;
    Ok(link)
}

/// The mtgdrcopy-tests programs, release profile.
pub fn exes(sh: &Shell) -> Result<()> {
    let _cwd = sh.push_dir(paths::root());
    cmd!(
        sh,
        "cargo build --quiet --release -p mtgdrcopy-tests --bins"
    )
    .run()
    .context("building the mtgdrcopy-tests programs")
}

/// The test suite's emulated libmusa (crate mtgpu-emu-musa), release profile, built in a target
/// directory of its own so that it never lies in target/release beside the product, where a
/// loader path pointing at the build tree would take it for the MUSA driver's library. Returns
/// the library (install it as `libmusa.so.1`, its soname).
pub fn emulated_musa(sh: &Shell) -> Result<PathBuf> {
    let _cwd = sh.push_dir(paths::root());
    let dir = paths::emulated_musa_target_dir();
    cmd!(
        sh,
        "cargo build --quiet --release -p mtgpu-emu-musa --lib --target-dir {dir}"
    )
    .run()
    .context("building the emulated libmusa")?;
    Ok(dir.join("release").join("libmtgpu_emu_musa.so"))
}

/// Builds mtgdrdrv.ko for `kernel` in build/driver/<release>/ and returns its path. mtgpu's
/// Module.symvers is used when the module's Makefile finds it, else the CRC stub.
pub fn driver(sh: &Shell, kernel: &KernelArgs) -> Result<PathBuf> {
    let release = kernel.release()?;
    let kdir = kernel.build_dir()?;
    ensure!(
        kdir.join("Makefile").is_file(),
        "no kernel build directory at {} (install linux-headers-{release}, or pass --kver/--kdir)",
        kdir.display()
    );
    let out = driver_dir(&release);
    files::copy_module_sources(&paths::root().join("mtgdrdrv/kmod"), &out)?;
    cmd!(sh, "make -s -C {out} KVER={release} KDIR={kdir} modules")
        .run()
        .with_context(|| format!("building mtgdrdrv for {release}"))?;
    Ok(out.join("mtgdrdrv.ko"))
}

/// Where `driver` builds for `release`.
pub fn driver_dir(release: &str) -> PathBuf {
    paths::build_dir().join("driver").join(release)
}

/// `cargo xtask clean`: build/ (staged trees, debs, module objects, test roots) and cargo's
/// target directory. Downloads and cached roots in ~/.cache/mtgdrcopy stay.
pub fn clean() -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let build = paths::build_dir();
    if build.exists() {
        fs_err::remove_dir_all(&build)?;
    }
    cmd!(sh, "cargo clean --quiet").run()?;
    Ok(())
}
