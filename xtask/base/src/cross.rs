//! Cross builds for arm64 (`aarch64-unknown-linux-gnu`), and their tests under qemu-user.
//!
//! rustup here has only the x86-64 standard library and cannot fetch another, so the toolchain
//! is Debian's: a sid chroot (`cache_dir()/chroots/sid-cross-arm64`, made once by chroot.rs, kept
//! apart from the kernel matrix's sid chroot) with rustc, cargo, `libstd-rust-dev:arm64`, the
//! aarch64 cross gcc/g++/binutils, `qemu-user` as cargo's runner, and `libc6:arm64` with
//! `dpkg-dev` and debhelper, so that the arm64 packages are built here by dpkg-buildpackage,
//! whose dh_shlibdeps resolves the arm64 binaries' libraries.
//!
//! Every command runs in that chroot with the workspace bind-mounted at its own path (so paths
//! are the same inside and out) and the host's crate registry at `/root/.cargo/registry`. The
//! chroot has no trust store for the crate registry: the host fetches (`cargo fetch --locked`)
//! and the chroot builds `--offline --locked`. Products go to `<target dir>/cross/<triple>/`,
//! apart from the host toolchain's, whose fingerprints differ (another rustc); the packages'
//! reproducible build to `<target dir>/cross/packaged/<triple>/`.

use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use xshell::{cmd, Cmd, Shell};

use crate::chroot::{self, Chroot};
use crate::paths;
use crate::targets::{target_dir, Target, AARCH64};

const CHROOT: &str = "sid-cross-arm64";

/// What the chroot holds beyond minbase. Part of the recipe: a change remakes the chroot.
const PACKAGES: &[&str] = &[
    "rustc",
    "cargo",
    "libstd-rust-dev:arm64",
    "gcc-aarch64-linux-gnu",
    "g++-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
    // dpkg-shlibdeps resolves NEEDED libraries through the dpkg database: the arm64 libc and
    // libgcc must be installed packages, not only the cross sysroot.
    "libc6:arm64",
    "libgcc-s1:arm64",
    "dpkg-dev",
    // `cargo xtask deb-* --target`: dpkg-buildpackage runs debian/rules here.
    "debhelper",
];

/// The chroot's recipe: the architecture and the package list.
fn recipe() -> String {
    format!("cross v1: arm64; {}", PACKAGES.join(" "))
}

/// Cargo's home in the toolchain chroot; the host's crate registry is mounted in it.
pub(crate) const CHROOT_CARGO_HOME: &str = "/root/.cargo";

/// Debian's cross toolchain, in its chroot (locked for this process once made).
pub struct Toolchain {
    chroot: Chroot,
    /// `rustc --version` in the chroot.
    pub rustc: String,
}

static TOOLCHAIN: Mutex<Option<&'static Toolchain>> = Mutex::new(None);

/// The toolchain chroot, made on first use (debootstrap and apt: 4 min on a loaded 2-core
/// machine, 2.3 GB), then cached; and the crates the lock file names, downloaded by the host's
/// cargo (the chroot cannot). One per process: the chroot's lock is held until the process ends.
pub fn toolchain(sh: &Shell) -> Result<&'static Toolchain> {
    let mut slot = TOOLCHAIN
        .lock()
        .map_err(|_| anyhow::anyhow!("the toolchain lock is poisoned"))?;
    if let Some(t) = *slot {
        return Ok(t);
    }
    let _cwd = sh.push_dir(paths::root());
    cmd!(sh, "cargo fetch --quiet --locked")
        .run()
        .context("fetching the crates for the cross build (cargo fetch --locked)")?;
    let log = paths::build_dir().join("logs/cross-chroot.log");
    let chroot = chroot::prepare(sh, CHROOT, "sid", &recipe(), false, &log, setup)?;
    let rustc = chroot.info.trim().to_owned();
    let toolchain: &'static Toolchain = Box::leak(Box::new(Toolchain { chroot, rustc }));
    *slot = Some(toolchain);
    Ok(toolchain)
}

/// Adds arm64 to dpkg and installs [`PACKAGES`]; returns rustc's version for the stamp.
fn setup(sh: &Shell, root: &Path, log: &Path) -> Result<String> {
    let run = |program: &str, args: &[&str], what: &str| {
        crate::host::run_logged(
            chroot::command(sh, root, &Default::default(), program).args(args),
            log,
            what,
        )
    };
    run(
        "dpkg",
        &["--add-architecture", AARCH64.debian],
        "dpkg --add-architecture",
    )?;
    run("apt-get", &["update"], "apt-get update")?;
    let mut install = vec!["install", "-y"];
    install.extend_from_slice(PACKAGES);
    run("apt-get", &install, "apt-get install (cross toolchain)")?;
    run("rustc", &["--version"], "rustc --version")
}

impl Toolchain {
    /// `program` in the chroot, in `cwd` (a path under the workspace; default: the workspace),
    /// with the workspace and the crate registry mounted and cargo's target settings in the
    /// environment, plus `env`.
    pub fn cmd<'a>(
        &self,
        sh: &'a Shell,
        target: &Target,
        env: &[String],
        cwd: Option<&Path>,
        program: &str,
    ) -> Cmd<'a> {
        self.command(sh, target, env, cwd, None, program)
    }

    /// `program` (cargo-zigbuild) as [`Toolchain::cmd`] runs it, with the zig tools' directory
    /// `zig` mounted at its host path, and without the cross gcc as cargo's linker: zig links
    /// (against the glibc floor, zigbuild.rs).
    pub fn zig_cmd<'a>(
        &self,
        sh: &'a Shell,
        target: &Target,
        env: &[String],
        zig: &Path,
        program: &str,
    ) -> Cmd<'a> {
        self.command(sh, target, env, None, Some(zig), program)
    }

    fn command<'a>(
        &self,
        sh: &'a Shell,
        target: &Target,
        env: &[String],
        cwd: Option<&Path>,
        zig: Option<&Path>,
        program: &str,
    ) -> Cmd<'a> {
        let root = paths::root();
        let mut binds = vec![(root.clone(), root.clone())];
        binds.extend(zig.map(|dir| (dir.to_path_buf(), dir.to_path_buf())));
        let target_dir = target_dir();
        if !target_dir.starts_with(&root) {
            binds.push((target_dir.clone(), target_dir.clone()));
        }
        binds.push((
            paths::cargo_home().join("registry"),
            Path::new(CHROOT_CARGO_HOME).join("registry"),
        ));
        let upper = target.triple.to_uppercase().replace('-', "_");
        let mut vars = vec![
            format!("CARGO_TARGET_DIR={}", target_dir.display()),
            format!("CARGO_HOME={CHROOT_CARGO_HOME}"),
            "CARGO_NET_OFFLINE=true".to_owned(),
            format!("CARGO_TARGET_{upper}_RUNNER={}", runner(target)),
        ];
        if zig.is_none() {
            vars.push(format!(
                "CARGO_TARGET_{upper}_LINKER={}-gcc",
                target.multiarch
            ));
        }
        vars.extend_from_slice(env);
        let opts = chroot::Options {
            cwd: Some(cwd.unwrap_or(&root)),
            binds: &binds,
            env: &vars,
            ..Default::default()
        };
        // Quiet: the full bwrap line would bury what runs; callers say it.
        chroot::command(sh, &self.chroot.root, &opts, program).quiet()
    }

    /// `cargo SUBCOMMAND --target TRIPLE --locked …` in the chroot (offline: see `cmd`).
    pub fn cargo<'a>(&self, sh: &'a Shell, target: &Target, subcommand: &str) -> Cmd<'a> {
        let args = [subcommand, "--target", target.triple, "--locked"];
        self.cmd(sh, target, &[], None, "cargo").args(args)
    }
}

/// cargo's runner for `target`: the emulator, with the cross sysroot's dynamic loader.
fn runner(target: &Target) -> String {
    format!("{} -L /usr/{}", target.qemu, target.multiarch)
}

/// `cargo xtask build --target`: the library and/or the tools for `target`, release.
pub fn build(sh: &Shell, target: &Target, lib: bool, exes: bool) -> Result<()> {
    let toolchain = toolchain(sh)?;
    let mut args = vec!["--quiet", "--release"];
    if lib {
        args.extend(["-p", "libgdrapi", "--lib"]);
    }
    if exes {
        args.extend(["-p", "mtgdrcopy-tests", "--bins"]);
    }
    toolchain
        .cargo(sh, target, "build")
        .args(args)
        .run()
        .with_context(|| format!("cross-building for {} ({})", target.triple, toolchain.rustc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_uses_the_cross_sysroot() {
        assert_eq!(runner(&AARCH64), "qemu-aarch64 -L /usr/aarch64-linux-gnu");
    }
}
