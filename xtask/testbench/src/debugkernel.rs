//! The debug kernel: Debian's 6.1 source (`linux-source-6.1`) built with KASAN, lockdep
//! (PROVE_LOCKING), DEBUG_VM, KFENCE and DEBUG_ATOMIC_SLEEP, which Debian's own kernels lack, so
//! that the module's lock order and lifetimes, and the emulator's, are checked by the kernel's
//! own tools (the step in debugvm.rs).
//!
//! The configuration is `make allnoconfig` with the committed fragment
//! (xtask/testbench/debug-kernel.config) forced in: only what the test VM needs, to keep the build
//! short on a 2-core machine. The tree is fetched with `apt-get download` (this machine's apt
//! sources), built in place and kept in `cache_dir()/debug-kernel/<version>-<hash>/`, keyed by
//! the source package's version and a hash of the fragment's settings (not its comments); it
//! is its own kbuild tree, so our modules build against it with `make -C <tree> M=...` like
//! against Debian's headers. A build that stops half-way resumes where it stopped (kbuild is
//! incremental); the `built` file marks a finished one.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::{files, host, paths};

use crate::kernel::{Builder, Kernel};

/// The source package, whose candidate version is part of the cache key.
pub const SOURCE_PACKAGE: &str = "linux-source-6.1";

/// What `make allnoconfig` gets forced in (KCONFIG_ALLCONFIG).
pub const FRAGMENT: &str = include_str!("../debug-kernel.config");

/// What building the kernel needs beyond gcc and make (vmtest's HOST_PACKAGES): kconfig's
/// parser generators, bc for the timer constants, libelf for objtool, xz for the source tarball.
const BUILD_PACKAGES: &[&str] = &[
    "make",
    "gcc",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "xz-utils",
];

/// The name of the file a finished build leaves in its tree, holding the kernel release.
const BUILT: &str = "mtgdrcopy-built";

/// A build started early by [`build_in_background`], collected by [`debug_kernel`].
static BACKGROUND: Mutex<Option<JoinHandle<Result<Kernel>>>> = Mutex::new(None);

/// Starts [`build`] on a thread, so that it overlaps the steps before the one that boots it
/// (the runner calls this when that step is selected). Does nothing if already started.
pub fn build_in_background() {
    if let Ok(mut slot) = BACKGROUND.lock() {
        if slot.is_none() {
            *slot = Some(std::thread::spawn(build));
        }
    }
}

/// Whether a build started by [`build_in_background`] is still going (a step beside it shares
/// the CPU with it).
pub fn building_in_background() -> bool {
    BACKGROUND
        .lock()
        .is_ok_and(|slot| slot.as_ref().is_some_and(|handle| !handle.is_finished()))
}

/// The debug kernel: the background build's result if one was started, else [`build`] now.
pub fn debug_kernel() -> Result<Kernel> {
    let started = BACKGROUND.lock().ok().and_then(|mut slot| slot.take());
    match started {
        Some(handle) => match handle.join() {
            Ok(result) => result,
            Err(_) => bail!("the debug kernel's build thread panicked"),
        },
        None => build(),
    }
}

/// The cached debug kernel, downloaded, configured and built first if it is not there yet.
pub fn build() -> Result<Kernel> {
    host::ensure_host_packages(BUILD_PACKAGES)?;
    let sh = Shell::new()?;
    let version = candidate_version(&sh)?;
    let cache = paths::cache_dir().join("debug-kernel");
    let tree = cache.join(format!(
        "{version}-{:016x}",
        fnv1a(settings(FRAGMENT).as_bytes())
    ));
    // One xtask builds a tree at a time; the other then finds it built.
    let _lock = files::lock_file(&cache.join(".lock"), "building the debug kernel")?;
    if let Ok(release) = fs::read_to_string(tree.join(BUILT)) {
        let kernel = kernel(&tree, release.trim());
        if kernel.vmlinuz.is_file() {
            return Ok(kernel);
        }
    }
    let start = Instant::now();
    eprintln!(
        "xtask: building the debug kernel ({SOURCE_PACKAGE} {version}, KASAN, lockdep) once, \
         in {}; about 9 minutes on 2 cores",
        tree.display()
    );
    if !tree.join("Makefile").is_file() {
        unpack_source(&sh, &version, &tree)?;
    }
    configure(&sh, &tree)?;
    let log = tree.join("mtgdrcopy-build.log");
    let jobs = format!(
        "-j{}",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    // nice: the other lane's steps go on at their pace while this builds.
    host::run_logged(
        cmd!(sh, "nice -n 10 make -C {tree} {jobs} bzImage modules"),
        &log,
        "building the debug kernel",
    )?;
    let release = fs::read_to_string(tree.join("include/config/kernel.release"))?;
    fs::write(tree.join(BUILT), &release)?;
    eprintln!(
        "xtask: debug kernel {} built in {:.0} s",
        release.trim(),
        start.elapsed().as_secs_f64()
    );
    Ok(kernel(&tree, release.trim()))
}

fn kernel(tree: &Path, release: &str) -> Kernel {
    Kernel {
        release: release.to_owned(),
        // The bzImage, not the ELF through its PVH entry as pvh.rs boots Debian's: in 6.1 the
        // PVH entry runs KASAN-instrumented C before KASAN's shadow exists (a triple fault at
        // once). Its gzip'd payload boots through the bzImage path.
        vmlinuz: tree.join("arch/x86/boot/bzImage"),
        headers: tree.to_owned(),
        builder: Builder::Host,
    }
}

/// The version apt would install, from this machine's package lists (refreshed once if they
/// do not know the package: fresh containers ship without lists).
fn candidate_version(sh: &Shell) -> Result<String> {
    for refreshed in [false, true] {
        if refreshed {
            host::apt(sh, &["update"])?;
        }
        let policy = cmd!(sh, "apt-cache policy {SOURCE_PACKAGE}")
            .quiet()
            .ignore_stderr()
            .read()
            .unwrap_or_default();
        if let Some(version) = parse_candidate(&policy) {
            return Ok(version);
        }
    }
    bail!("apt knows no candidate of {SOURCE_PACKAGE}; is this a Debian 12 (bookworm) host?")
}

/// The `Candidate:` of `apt-cache policy` output, if apt has one.
fn parse_candidate(policy: &str) -> Option<String> {
    let version = policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))?
        .trim();
    (!version.is_empty() && version != "(none)").then(|| version.to_owned())
}

/// `apt-get download` of the source package, its tarball unpacked into `tree`.
fn unpack_source(sh: &Shell, version: &str, tree: &Path) -> Result<()> {
    let parent = tree.parent().context("the cache has no parent directory")?;
    let staging = parent.join(format!(".unpack-{}", std::process::id()));
    files::remove_any(&staging)?;
    // One directory per stage: the downloaded .deb is named linux-source-6.1_*.deb, like the
    // tree its tarball unpacks to, so they must not share one.
    let (download, deb_dir, src) = (
        staging.join("download"),
        staging.join("deb"),
        staging.join("src"),
    );
    for dir in [&download, &deb_dir, &src] {
        fs::create_dir_all(dir)?;
    }
    let package = format!("{SOURCE_PACKAGE}={version}");
    let result = (|| -> Result<()> {
        cmd!(sh, "env -C {download} apt-get download {package}")
            .quiet()
            .ignore_stdout()
            .run()
            .with_context(|| format!("apt-get download {package}"))?;
        let deb = find(&download, |n| n.ends_with(".deb"))?;
        cmd!(sh, "dpkg-deb -x {deb} {deb_dir}").quiet().run()?;
        let tarball = find(&deb_dir.join("usr/src"), |n| n.ends_with(".tar.xz"))?;
        cmd!(sh, "tar -C {src} -xJf {tarball}").quiet().run()?;
        let unpacked = find(&src, |n| n.starts_with("linux-source-"))?;
        // Whatever an interrupted or failed unpack left under the tree's name goes.
        files::remove_any(tree)?;
        fs::rename(&unpacked, tree)?;
        Ok(())
    })();
    // Best effort: the .deb and its tarball (~280 MB) are not kept.
    let _ = fs::remove_dir_all(&staging);
    result
}

/// The one entry of `dir` whose name satisfies `want`.
fn find(dir: &Path, want: impl Fn(&str) -> bool) -> Result<PathBuf> {
    fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&want))
        .with_context(|| format!("nothing expected in {}", dir.display()))
}

/// `.config` from allnoconfig and the fragment; fails when a line of the fragment did not make
/// it (a dependency missing from the fragment, or renamed in a newer source).
fn configure(sh: &Shell, tree: &Path) -> Result<()> {
    // A build that stopped half-way keeps its .config: configuring again would make kbuild
    // compile everything again.
    if fs::read_to_string(tree.join(".config"))
        .is_ok_and(|config| missing_lines(FRAGMENT, &config).is_empty())
    {
        return Ok(());
    }
    let fragment = tree.join("mtgdrcopy-debug.config");
    fs::write(&fragment, FRAGMENT)?;
    let allconfig = format!("KCONFIG_ALLCONFIG={}", fragment.display());
    cmd!(sh, "make -s -C {tree} allnoconfig {allconfig}")
        .quiet()
        .run()
        .context("make allnoconfig with the debug kernel's fragment")?;
    let config = fs::read_to_string(tree.join(".config"))?;
    let missing = missing_lines(FRAGMENT, &config);
    if !missing.is_empty() {
        bail!(
            "the debug kernel's .config lacks these lines of xtask/testbench/debug-kernel.config \
             (a dependency not in the fragment?):\n  {}",
            missing.join("\n  ")
        );
    }
    Ok(())
}

/// The fragment's settings that `.config` does not hold as given.
fn missing_lines<'a>(fragment: &'a str, config: &str) -> Vec<&'a str> {
    fragment
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_"))
        .filter(|l| !config.lines().any(|c| c.trim() == *l))
        .collect()
}

/// The fragment's settings, one per line, without its comments: only a change of setting
/// builds a new kernel.
fn settings(fragment: &str) -> String {
    fragment
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// 64-bit FNV-1a: a hash that stays the same across Rust releases (the standard library's does
/// not promise to), for the cache key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate() {
        let policy =
            "linux-source-6.1:\n  Installed: (none)\n  Candidate: 6.1.192-3\n  Version table:\n";
        assert_eq!(parse_candidate(policy).as_deref(), Some("6.1.192-3"));
        assert_eq!(parse_candidate("x:\n  Candidate: (none)\n"), None);
        assert_eq!(parse_candidate(""), None);
    }

    #[test]
    fn lines_that_did_not_stick() {
        let fragment = "# c\nCONFIG_A=y\n\nCONFIG_B=y\n";
        assert!(missing_lines(fragment, "CONFIG_A=y\nCONFIG_B=y\n").is_empty());
        assert_eq!(
            missing_lines(fragment, "CONFIG_A=y\n# CONFIG_B is not set\n"),
            ["CONFIG_B=y"]
        );
    }

    #[test]
    fn the_fragment_asks_for_every_checker() {
        for checker in [
            "CONFIG_KASAN=y",
            "CONFIG_PROVE_LOCKING=y",
            "CONFIG_DEBUG_VM=y",
            "CONFIG_KFENCE=y",
            "CONFIG_DEBUG_ATOMIC_SLEEP=y",
            "CONFIG_PVH=y",
            "CONFIG_MODULES=y",
        ] {
            assert!(FRAGMENT.lines().any(|l| l == checker), "{checker}");
        }
    }

    #[test]
    fn only_settings_key_the_tree() {
        let a = "# KASAN\nCONFIG_KASAN=y\n\nCONFIG_LOCKDEP=y\n";
        let b = "# KASAN, see debugkernel.rs\nCONFIG_KASAN=y\nCONFIG_LOCKDEP=y\n";
        assert_eq!(settings(a), settings(b));
        assert_ne!(settings(a), settings("CONFIG_KASAN=y\n"));
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of the FNV reference.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
