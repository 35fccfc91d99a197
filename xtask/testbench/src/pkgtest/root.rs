//! Debian root file systems for the package tests, as overlayfs layers made with debootstrap
//! and apt, cached in `cache_dir()/roots/<suite>/`: bookworm's (below), and bullseye's (the
//! oldest Debian this machine's archive serves: glibc 2.31, kernel 5.10), a minbase and one
//! layer of [`BULLSEYE_PACKAGES`] on it. Bookworm's:
//!
//! - `minbase`: made by xtask-base's `chroot::bootstrap`, as the build chroots are
//!   (`debootstrap --variant=minbase`, this machine's apt sources for the suite, no mirror named
//!   in the repository). Alone, it stands in for a container image.
//! - `dkms-<kernel>-<headers version>`, on top of minbase: what a host running the packages has
//!   (dkms, the headers of the VM's kernel, udev, openssl for DKMS's module signing) and what
//!   the test itself uses (libc6-dev and pkgconf, for a consumer built against libgdrapi).
//!
//! Each layer is built once into a temporary directory and renamed into place when complete;
//! rebuilding minbase drops the layers above it. A test never changes them: its root is an
//! overlay of the cached layers with a fresh upper directory in build/pkgtest/<name>/, kept
//! after the run for inspection (the upper directory holds exactly what the test changed) and
//! cleared by the next one.
//!
//! Commands run through `chroot` with a clean environment, inside a private mount namespace
//! (`unshare --mount`) where the overlay and /proc (dkms needs it) are mounted for them; the
//! mounts vanish with the namespace, so none outlives a run, even a killed one. That needs root
//! with CAP_SYS_ADMIN: in a container, run it privileged. Device nodes come from debootstrap.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;

use crate::kernel::Kernel;

const SUITE: &str = "bookworm";

/// A root file system we run commands in: read-only `layers` (top first) under `upper`.
pub struct Root {
    layers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
    merged: PathBuf,
    log: PathBuf,
}

impl Root {
    /// A root of `layers` (top first) with an empty upper directory at build/pkgtest/<name>/;
    /// commands log to build/pkgtest/<name>.log.
    pub fn fresh(layers: Vec<PathBuf>, name: &str) -> Result<Root> {
        let base = paths::build_dir().join("pkgtest");
        let dir = base.join(name);
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Root::with_upper(
            layers,
            dir.join("upper"),
            &dir,
            base.join(format!("{name}.log")),
        )
    }

    /// A root writing into `upper` (a layer being built), its overlay bookkeeping in `scratch`.
    fn with_upper(
        layers: Vec<PathBuf>,
        upper: PathBuf,
        scratch: &Path,
        log: PathBuf,
    ) -> Result<Root> {
        let root = Root {
            layers,
            upper,
            work: scratch.join("work"),
            merged: scratch.join("merged"),
            log,
        };
        for dir in [&root.upper, &root.work, &root.merged] {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if let Some(dir) = root.log.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(&root.log, "").with_context(|| format!("creating {}", root.log.display()))?;
        Ok(root)
    }

    /// Where a new file for `path` (absolute, inside the root) goes: the upper directory.
    pub fn new_file(&self, path: &str) -> PathBuf {
        self.upper.join(path.trim_start_matches('/'))
    }

    /// Runs `args` inside the root as root with a clean environment; fails on a non-zero exit
    /// with the end of its output. Returns stdout. Output is also appended to the log.
    pub fn run(&self, sh: &Shell, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.output(sh, args)?;
        if !ok {
            let all = format!("{stdout}{stderr}");
            let lines: Vec<&str> = all.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            bail!(
                "`{}` failed in the root {}:\n{tail}\n(all output: {})",
                args.join(" "),
                self.upper.display(),
                self.log.display()
            );
        }
        Ok(stdout)
    }

    /// `apt-get install` of `packages` (names, or paths of .debs inside the root) without
    /// recommends, as [`run`](Self::run) runs it.
    pub fn apt_install(&self, sh: &Shell, packages: &[&str]) -> Result<String> {
        let mut args = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
        args.extend_from_slice(packages);
        self.run(sh, &args)
    }

    /// Like `run` but returns (success, stdout, stderr) whatever the exit status.
    pub fn output(&self, sh: &Shell, args: &[&str]) -> Result<(bool, String, String)> {
        let env = xtask_base::chroot::CHROOT_ENV;
        let command: Vec<&str> = ["/usr/bin/env", "-i"]
            .into_iter()
            .chain(env.iter().copied())
            .chain(args.iter().copied())
            .collect();
        let out = in_root(
            sh,
            "chroot",
            &self.layers,
            [&self.upper, &self.work, &self.merged],
            &command,
        )?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        writeln!(
            log,
            "### {} (exit {:?})\n{stdout}{stderr}",
            args.join(" "),
            out.status.code()
        )?;
        Ok((out.status.success(), stdout, stderr))
    }

    /// Whether `path` exists in the root (as a file, directory or symlink target).
    pub fn exists(&self, sh: &Shell, path: &str) -> Result<bool> {
        Ok(self.output(sh, &["test", "-e", path])?.0)
    }

    pub fn read(&self, sh: &Shell, path: &str) -> Result<String> {
        self.run(sh, &["cat", path])
    }

    /// Copies `paths` (symlinks followed) into a fresh /tmp/<name>/ inside the root, keeping
    /// their directories, and returns that directory as seen from here.
    pub fn export(&self, sh: &Shell, paths: &[&str], name: &str) -> Result<PathBuf> {
        let dir = format!("/tmp/{name}");
        self.run(sh, &["rm", "-rf", &dir])?;
        self.run(sh, &["mkdir", "-p", &dir])?;
        let mut args = vec!["cp", "-L", "--parents"];
        args.extend(paths);
        args.push(&dir);
        self.run(sh, &args)?;
        Ok(self.new_file(&dir))
    }

    /// The root written as an ext4 file system of `size` (mke2fs's notation, e.g. `2G`) to
    /// `image`, owners and modes kept (`mke2fs -d`): a VM's disk.
    pub fn ext4_image(&self, sh: &Shell, image: &Path, size: &str) -> Result<()> {
        if image.exists() {
            fs::remove_file(image).with_context(|| format!("removing {}", image.display()))?;
        }
        let (merged, target) = (self.merged.display(), image.display());
        let args: Vec<String> = ["mke2fs", "-q", "-t", "ext4", "-L", "testbed", "-d"]
            .iter()
            .map(|a| a.to_string())
            .chain([merged.to_string(), target.to_string(), size.to_owned()])
            .collect();
        let dirs = [&self.upper, &self.work, &self.merged];
        let out = in_root(sh, "host-no-proc", &self.layers, dirs, &args)?;
        if !out.status.success() {
            bail!(
                "mke2fs -d {merged} {target} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Every file, directory and symlink, skipping what changes on its own or belongs to dpkg
    /// and apt's bookkeeping: what a package could leave behind.
    pub fn file_list(&self, sh: &Shell) -> Result<Vec<String>> {
        let mut args = vec!["find", "/", "-xdev", "("];
        for (i, dir) in [
            "/proc",
            "/sys",
            "/dev",
            "/tmp",
            "/run",
            "/root",
            "/var/lib/dpkg",
            "/var/lib/apt",
            "/var/cache",
            "/var/log",
        ]
        .iter()
        .enumerate()
        {
            if i > 0 {
                args.push("-o");
            }
            args.extend(["-path", dir]);
        }
        args.extend([")", "-prune", "-o", "-print"]);
        let out = self.run(sh, &args)?;
        let mut files: Vec<String> = out.lines().map(String::from).collect();
        files.sort();
        Ok(files)
    }
}

/// The minbase layer (a container image's stand-in), built on first use.
pub fn minbase(sh: &Shell) -> Result<PathBuf> {
    minbase_of(sh, SUITE)
}

/// The minbase layer of `suite` (bookworm, or an older one: bullseye), with its package lists.
/// The layers differ from the build chroots in how they are used, not made: read-only, under
/// an overlay of each test's own (the chroots are written by their builds, and locked).
pub fn minbase_of(sh: &Shell, suite: &str) -> Result<PathBuf> {
    let dir = roots_dir(suite).join("minbase");
    if dir.join(STAMP).exists() {
        return Ok(dir);
    }
    // Layers built on an older minbase do not fit a new one.
    if let Ok(entries) = fs::read_dir(roots_dir(suite)) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("dkms-") || name.starts_with("upgrade-") {
                fs::remove_dir_all(entry.path())?;
            }
        }
    }
    build_layer(&dir, |tmp, scratch| {
        eprintln!(
            "xtask: debootstrap --variant=minbase {suite} (once; cached in {})",
            dir.display()
        );
        let t = Instant::now();
        xtask_base::chroot::bootstrap(sh, suite, tmp, &[], &scratch.join("debootstrap.log"))?;
        let root = Root::with_upper(
            Vec::new(),
            tmp.to_path_buf(),
            scratch,
            scratch.join("apt.log"),
        )?;
        root.run(sh, &["apt-get", "update", "-q"])?;
        root.run(sh, &["apt-get", "clean"])?;
        eprintln!("    minbase ready ({:.0} s)", t.elapsed().as_secs_f64());
        Ok(())
    })?;
    Ok(dir)
}

/// The layers of the host root, top first: dkms and the headers of `kernel` on minbase.
pub fn dkms_layers(sh: &Shell, kernel: &Kernel) -> Result<Vec<PathBuf>> {
    let release = &kernel.release;
    let format = "${Version}";
    let version = cmd!(sh, "dpkg-query -W -f {format} linux-headers-{release}")
        .quiet()
        .read()
        .with_context(|| format!("reading the version of linux-headers-{release}"))?;
    let minbase = minbase(sh)?;
    let dir = roots_dir(SUITE).join(format!("dkms-{release}-{version}-{DKMS_LAYER_RECIPE}"));
    if dir.join(STAMP).exists() {
        return Ok(vec![dir, minbase]);
    }
    let headers = format!("linux-headers-{release}={version}");
    let packages = ["dkms", &headers, "udev", "openssl", "libc6-dev", "pkgconf"];
    build_package_layer(sh, &dir, &minbase, &packages, |root| {
        // The module indexes every host with this kernel has (here only the headers are
        // installed), so that depmod's runs during the test create nothing new.
        root.run(sh, &["depmod", "-a", release]).map(drop)
    })
    .with_context(|| {
        format!(
            "adding dkms and {headers} to the root; the mirror must still carry the headers \
             of the kernel the VM boots (this machine's)"
        )
    })?;
    Ok(vec![dir, minbase])
}

/// `layers` (top first) as they would be after `apt-get dist-upgrade` from this machine's
/// archive: the cached layers are made once and fall behind it (security updates), and
/// piuparts dist-upgrades every root it is given first, so each of its sets downloaded and
/// installed the same updates on every run (up to two minutes a set). A layer on top,
/// `upgrade-<top layer>`, holds the upgrade; it is made again when the archive moved on since.
/// Costs an `apt-get update` and a simulated upgrade while nothing changed.
pub fn up_to_date(sh: &Shell, layers: Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    let top = layers.first().context("a root has layers")?;
    let suite_dir = top.parent().context("a layer directory has a parent")?;
    let name = top
        .file_name()
        .context("a layer directory has a name")?
        .to_string_lossy();
    let dir = suite_dir.join(format!("upgrade-{name}"));
    if dir.join(STAMP).exists() {
        let with_upgrade = [vec![dir.clone()], layers.clone()].concat();
        if upgrades(sh, &with_upgrade, &name)?.is_empty() {
            return Ok(with_upgrade);
        }
    }
    let pending = upgrades(sh, &layers, &name)?;
    if pending.is_empty() {
        return Ok(layers);
    }
    build_layer(&dir, |tmp, scratch| {
        eprintln!(
            "xtask: {} packages of {name} are behind the archive: upgrading them in a layer \
             of their own ({})",
            pending.len(),
            dir.display()
        );
        let root = Root::with_upper(
            layers.clone(),
            tmp.to_path_buf(),
            scratch,
            scratch.join("apt.log"),
        )?;
        root.run(sh, &["apt-get", "update", "-q"])?;
        root.run(sh, &["apt-get", "dist-upgrade", "-y", "-q"])?;
        root.run(sh, &["apt-get", "clean"]).map(drop)
    })?;
    Ok([vec![dir], layers].concat())
}

/// The packages `apt-get dist-upgrade` would change in a root of `layers` (apt's `Inst` lines).
fn upgrades(sh: &Shell, layers: &[PathBuf], name: &str) -> Result<Vec<String>> {
    let root = Root::fresh(layers.to_vec(), &format!("upgrade-check-{name}"))?;
    root.run(sh, &["apt-get", "update", "-q"])?;
    let plan = root.run(sh, &["apt-get", "dist-upgrade", "-s", "-q"])?;
    Ok(plan
        .lines()
        .filter(|l| l.starts_with("Inst "))
        .map(str::to_owned)
        .collect())
}

/// Changes whenever `dkms_layers` installs something else, so that cached layers are rebuilt.
const DKMS_LAYER_RECIPE: &str = "r4";

/// Marks a complete layer.
const STAMP: &str = ".mtgdrcopy-layer-complete";

fn roots_dir(suite: &str) -> PathBuf {
    paths::cache_dir().join("roots").join(suite)
}

/// What the bullseye root adds to its minbase: DKMS with bullseye's own kernel headers
/// (linux-headers-amd64: 5.10, built with its gcc 10), and what the README's commands and
/// `apt-get source` run. Part of the recipe: a change rebuilds the layer.
const BULLSEYE_PACKAGES: &[&str] = &[
    "dkms",
    "linux-headers-amd64",
    "udev",
    "openssl",
    "libc6-dev",
    "pkgconf",
    "curl",
    "gpg",
    "sudo",
    "dpkg-dev",
];
const BULLSEYE_RECIPE: &str = "r3";

/// The layers of the Debian 11 (bullseye, glibc 2.31) root, top first: [`BULLSEYE_PACKAGES`]
/// on bullseye's minbase. Made once from the machine's archive, then cached.
pub fn bullseye_layers(sh: &Shell) -> Result<Vec<PathBuf>> {
    const BULLSEYE: &str = "bullseye";
    let minbase = minbase_of(sh, BULLSEYE)?;
    let dir = roots_dir(BULLSEYE).join(format!("dkms-{BULLSEYE_RECIPE}"));
    if dir.join(STAMP).exists() {
        return Ok(vec![dir, minbase]);
    }
    build_package_layer(sh, &dir, &minbase, BULLSEYE_PACKAGES, |_| Ok(()))?;
    Ok(vec![dir, minbase])
}

/// Makes `dir` (`dkms-…` beside minbase), once: `packages` installed over `minbase` from the
/// host's apt sources, then `finish` run in the root, then apt's cache cleaned out of the
/// layer. The suite's other `dkms-…` layers (another kernel or recipe) go: nothing uses them.
fn build_package_layer(
    sh: &Shell,
    dir: &Path,
    minbase: &Path,
    packages: &[&str],
    finish: impl FnOnce(&Root) -> Result<()>,
) -> Result<()> {
    let suite_dir = dir.parent().context("a layer directory has a parent")?;
    for entry in fs::read_dir(suite_dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale_layer = name.starts_with("dkms-") && entry.path() != dir;
        // An upgrade layer on a dkms- layer was made on that layer as it was (minbase's stays).
        if stale_layer || name.starts_with("upgrade-dkms-") {
            fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    build_layer(dir, |tmp, scratch| {
        eprintln!(
            "xtask: installing {} in a root layer (once; cached in {})",
            packages.join(" "),
            dir.display()
        );
        let t = Instant::now();
        let root = Root::with_upper(
            vec![minbase.to_path_buf()],
            tmp.to_path_buf(),
            scratch,
            scratch.join("apt.log"),
        )?;
        root.run(sh, &["apt-get", "update", "-q"])?;
        root.apt_install(sh, packages)?;
        finish(&root)?;
        root.run(sh, &["apt-get", "clean"])?;
        eprintln!("    layer ready ({:.0} s)", t.elapsed().as_secs_f64());
        Ok(())
    })
}

/// Builds a layer into `.<name>.tmp-<pid>/layer` (overlay scratch next to it) and renames it to
/// `dir` when `build` succeeded.
fn build_layer(dir: &Path, build: impl FnOnce(&Path, &Path) -> Result<()>) -> Result<()> {
    let parent = dir.parent().context("a layer directory has a parent")?;
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("layer directory name")?;
    let scratch = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if scratch.exists() {
        fs::remove_dir_all(&scratch)?;
    }
    let layer = scratch.join("layer");
    fs::create_dir_all(&layer).with_context(|| format!("creating {}", layer.display()))?;
    if let Err(e) = build(&layer, &scratch) {
        // Kept for diagnosis (logs inside); the next attempt uses another name.
        return Err(e.context(format!(
            "the partial layer is left in {}",
            scratch.display()
        )));
    }
    fs::write(layer.join(STAMP), "")?;
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&layer, dir)
        .with_context(|| format!("moving {} to {}", layer.display(), dir.display()))?;
    // Overlay's work directory is root-only and may hold whiteouts; it goes with the scratch.
    fs::remove_dir_all(&scratch).with_context(|| format!("removing {}", scratch.display()))
}

/// For the tools that take a root directory themselves (autopkgtest's and piuparts' `chroot`):
/// a fresh overlay of `layers` (top first) in `base` (upper/, work/, merged/, emptied first),
/// and `command(merged)` run on this machine by the same mount script as [`Root::output`]'s,
/// with /proc in the root if `with_proc`. The mounts end with the command, even a killed one.
pub fn run_on_overlay(
    sh: &Shell,
    layers: &[PathBuf],
    base: &Path,
    with_proc: bool,
    command: impl FnOnce(&Path) -> Vec<String>,
) -> Result<std::process::Output> {
    xtask_base::files::fresh_dir(base)?;
    let (upper, work, merged) = (base.join("upper"), base.join("work"), base.join("merged"));
    for d in [&upper, &work, &merged] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let args = command(&merged);
    let mode = if with_proc { "host" } else { "host-no-proc" };
    in_root(sh, mode, layers, [&upper, &work, &merged], &args)
}

/// `in-root.sh MODE` over `layers` (top first; none: the upper directory alone) with the
/// overlay's `[upper, work, merged]` directories, running `args`, in a private mount namespace
/// (`unshare --mount`). A mount the script could not make is an error that says so.
fn in_root<S: AsRef<std::ffi::OsStr>>(
    sh: &Shell,
    mode: &str,
    layers: &[PathBuf],
    [upper, work, merged]: [&PathBuf; 3],
    args: &[S],
) -> Result<std::process::Output> {
    let wrapper = in_root_script()?;
    let lower = if layers.is_empty() {
        "-".to_owned()
    } else {
        layers
            .iter()
            .map(|l| l.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    let program = args
        .first()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = cmd!(
        sh,
        "unshare --mount --propagation private --fork -- sh {wrapper} {mode} {lower} {upper} {work} {merged} {args...}"
    )
    .quiet()
    .ignore_status()
    .output()
    .with_context(|| format!("running {program} in a root (unshare, util-linux)"))?;
    if out.status.code() == Some(125) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("in-root.sh:") {
            bail!("{}", stderr.trim());
        }
    }
    Ok(out)
}

/// The script that mounts a root and runs a command chrooted in it; run inside `unshare
/// --mount`, so the mounts end with the namespace.
fn in_root_script() -> Result<PathBuf> {
    let path = paths::build_dir().join("pkgtest/in-root.sh");
    let text = r#"#!/bin/sh
# Written by cargo xtask test.
#   sh in-root.sh MODE LOWER UPPER WORK MERGED COMMAND...
# mounts the overlay LOWER (colon-separated layers, top first; "-": UPPER alone) + UPPER at
# MERGED and runs COMMAND: MODE chroot, chrooted in MERGED with /proc mounted there; host, on
# this machine with the same /proc; host-no-proc, on this machine without it (for a tool that
# copies the root and mounts its own). Run inside `unshare --mount`.
set -e
mode=$1 lower=$2 upper=$3 work=$4 merged=$5
shift 5
fail() {
	echo "in-root.sh: cannot mount $1 (root with CAP_SYS_ADMIN is needed; in a container, run it privileged)" >&2
	exit 125
}
if [ "$lower" = - ]; then
	mount --bind "$upper" "$merged" || fail "$upper"
else
	mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$merged" ||
		fail "the overlay of $lower"
fi
[ "$mode" = host-no-proc ] || mount -t proc proc "$merged/proc" || fail /proc
[ "$mode" = chroot ] || exec "$@"
exec chroot "$merged" "$@"
"#;
    if fs::read_to_string(&path).ok().as_deref() != Some(text) {
        xtask_base::files::put_text(&path, text, 0o755)?;
    }
    Ok(path)
}
