//! Debian chroots of other suites, for building against their kernels with their compilers.
//!
//! A kernel's headers want the gcc its kernel was built with, and only that suite ships it: the
//! kernel matrix builds inside a `debootstrap --variant=minbase` chroot of each suite (and the
//! arm64 cross toolchain in one of its own, cross.rs). Chroots live in
//! `cache_dir()/chroots/<name>/` (the suite's name unless given another), created once (in a
//! staging directory renamed into place when complete, with a stamp naming the recipe) and then
//! reused offline. The apt sources are the machine's own, as apt lists them, with the suite
//! renamed: no mirror is named in the project. [`bootstrap`] makes every Debian root of
//! cargo xtask: these chroots and the package tests' root layers.
//!
//! One process at a time uses a chroot: [`Chroot`] holds an exclusive lock on
//! `chroots/<name>.lock`, since its build directory and DKMS registrations are shared state.

use fs_err as fs;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Cmd, Shell};

use crate::{files, host, paths};

/// The environment of every command run in a Debian root of cargo xtask (these chroots and
/// the package tests' roots): nothing of the caller's leaks in (cargo's variables, a host-only
/// PATH, a locale the root lacks).
pub const CHROOT_ENV: &[&str] = &[
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LC_ALL=C",
    "DEBIAN_FRONTEND=noninteractive",
];

/// apt configuration written into every root [`bootstrap`] makes: the registry serves
/// snapshots whose Release files are past their Valid-Until date (refused otherwise).
const APT_CONF: &str = "// Written by cargo xtask (chroot.rs).\n\
                        Acquire::Check-Valid-Until \"false\";\n";

/// Added in the build chroots only: recommends would only add size. (The package tests' roots
/// keep apt's default, as a user's host has it.)
const NO_RECOMMENDS: &str = "// Written by cargo xtask (chroot.rs).\n\
                             APT::Install-Recommends \"false\";\n";

/// Makes no service start in a root (policy-rc.d(8)).
const POLICY_RC_D: &str =
    "#!/bin/sh\n# Installed by cargo xtask: no services in this root.\nexit 101\n";

/// Marks a complete chroot; its first line is the recipe it was made with.
const STAMP: &str = ".mtgdrcopy-chroot";

/// A prepared chroot of one suite, locked for this process.
#[derive(Debug)]
pub struct Chroot {
    pub root: PathBuf,
    /// What `prepare`'s setup returned when the chroot was made (e.g. the kernel release).
    pub info: String,
    _lock: fs::File,
}

impl Chroot {
    /// `program args…` inside the chroot, with a fixed environment, cwd `/`.
    pub fn cmd<'a>(&self, sh: &'a Shell, program: &str) -> Cmd<'a> {
        command(sh, &self.root, &Options::default(), program)
    }

    /// The host path of `inside`, an absolute path in the chroot.
    pub fn host_path(&self, inside: &Path) -> PathBuf {
        host_path(&self.root, inside)
    }
}

/// How [`command`] runs its program, beyond what every command gets.
#[derive(Debug, Default)]
pub struct Options<'a> {
    /// The working directory, an absolute path inside (default `/`).
    pub cwd: Option<&'a Path>,
    /// `(host, inside)` directories bind-mounted into the chroot for the command.
    pub binds: &'a [(PathBuf, PathBuf)],
    /// `NAME=value` added to the fixed environment.
    pub env: &'a [String],
    /// No network: a network namespace of its own, with only a loopback interface. What a
    /// build that must not download anything runs in.
    pub offline: bool,
}

/// `program` inside the chroot at `root`, run by bubblewrap in a mount namespace of its own:
/// the chroot's tree (writable: apt and dkms change it), a /proc, which objtool (7.x kernels
/// read their stack limit there), dkms (/proc/cpuinfo) and ischroot need, a minimal /dev
/// (dkms needs /dev/fd) and the `opts.binds`. The mounts are private to the command and end
/// with it, even when xtask is killed: none ever outlives a run, shows on the host or stays in
/// the cached chroot (only the bind targets' empty directories do).
pub fn command<'a>(sh: &'a Shell, root: &Path, opts: &Options, program: &str) -> Cmd<'a> {
    let mut args: Vec<&OsStr> = vec!["--bind".as_ref(), root.as_os_str(), "/".as_ref()];
    args.extend(["--proc", "/proc", "--dev", "/dev"].map(OsStr::new));
    if opts.offline {
        args.push("--unshare-net".as_ref());
    }
    for (host, inside) in opts.binds {
        args.extend(["--bind".as_ref(), host.as_os_str(), inside.as_os_str()]);
    }
    if let Some(dir) = opts.cwd {
        args.extend(["--chdir".as_ref(), dir.as_os_str()]);
    }
    // `env -i` (not bwrap's inherited environment) makes the build independent of who runs it.
    let env = opts.env;
    cmd!(
        sh,
        "bwrap {args...} /usr/bin/env -i {CHROOT_ENV...} {env...} {program}"
    )
}

/// The host path of `inside`, an absolute path in the chroot at `root`.
pub fn host_path(root: &Path, inside: &Path) -> PathBuf {
    root.join(inside.strip_prefix("/").unwrap_or(inside))
}

/// The chroot of `suite` named `name` (the suite's own name, or another for a purpose of its
/// own: e.g. the cross toolchain's sid chroot next to the kernel matrix's), made on first use:
/// debootstrap (minbase), the host's apt sources for that suite, then `setup`, whose result is
/// kept in the stamp and handed back as [`Chroot::info`] on later runs. A chroot made with
/// another `recipe`, or any chroot when `refresh`, is made again. Output of the slow steps goes
/// to `log`.
pub fn prepare(
    sh: &Shell,
    name: &str,
    suite: &str,
    recipe: &str,
    refresh: bool,
    log: &Path,
    setup: impl FnOnce(&Shell, &Path, &Path) -> Result<String>,
) -> Result<Chroot> {
    host::ensure_host_packages(&["bubblewrap"])?;
    let dir = paths::cache_dir().join("chroots");
    let lock = files::lock_file(
        &dir.join(format!("{name}.lock")),
        &format!("using the {name} chroot"),
    )?;
    let root = dir.join(name);
    if !refresh {
        if let Some(info) = stamp_info(&root, recipe) {
            return Ok(Chroot {
                root,
                info,
                _lock: lock,
            });
        }
    }

    eprintln!(
        "xtask: creating the {name} chroot (once; cached in {}, log {})",
        root.display(),
        log.display()
    );
    let staging = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    remove_tree(&staging)?;
    let made = make(sh, suite, &staging, log, setup).and_then(|info| {
        fs::write(staging.join(STAMP), format!("{recipe}\n{info}"))
            .context("writing the chroot's stamp")?;
        remove_tree(&root)?;
        fs::rename(&staging, &root)?;
        Ok(info)
    });
    if made.is_err() {
        // Best effort: a leftover staging tree only wastes space, and is removed next time.
        let _ = remove_tree(&staging);
    }
    Ok(Chroot {
        root,
        info: made?,
        _lock: lock,
    })
}

/// The setup result recorded in a complete chroot made with `recipe`.
fn stamp_info(root: &Path, recipe: &str) -> Option<String> {
    let stamp = fs::read_to_string(root.join(STAMP)).ok()?;
    let (first, info) = stamp.split_once('\n')?;
    (first == recipe).then(|| info.to_owned())
}

fn make(
    sh: &Shell,
    suite: &str,
    root: &Path,
    log: &Path,
    setup: impl FnOnce(&Shell, &Path, &Path) -> Result<String>,
) -> Result<String> {
    files::put_text(log, "", 0o644)?;
    bootstrap(sh, suite, root, &["ca-certificates"], log)?;
    fs::write(
        root.join("etc/apt/apt.conf.d/99mtgdrcopy-no-recommends"),
        NO_RECOMMENDS,
    )
    .context("writing the chroot's apt configuration")?;
    let info = setup(sh, root, log)?;
    // The downloaded .debs are no use once installed (the lists stay: the kernel image is
    // fetched through them later).
    crate::host::run_logged(
        command(sh, root, &Options::default(), "apt-get").arg("clean"),
        log,
        "apt-get clean",
    )?;
    Ok(info)
}

/// Every Debian root of cargo xtask starts here, the build chroots above and the package
/// tests' layers alike: `debootstrap --variant=minbase` of `suite` (plus `include`) into `root`
/// from the archive of this machine that serves its own suite, this machine's apt sources for
/// `suite` (renamed when it is another suite: no mirror is named in the project), [`APT_CONF`],
/// and no service starting. Only what apt itself needs comes from debootstrap; the rest through
/// apt, whose dependency resolution is the real one. debootstrap's output is appended to `log`.
pub fn bootstrap(sh: &Shell, suite: &str, root: &Path, include: &[&str], log: &Path) -> Result<()> {
    host::ensure_host_packages(&["debootstrap"])?;
    let sources = HostSources::read(sh)?;
    let lines = sources.for_suite(suite);
    let mirror = sources.mirror(&sources.codename)?;
    let include: Vec<String> = include.iter().map(|p| format!("--include={p}")).collect();
    crate::host::run_logged(
        cmd!(
            sh,
            "debootstrap --variant=minbase {include...} {suite} {root} {mirror}"
        ),
        log,
        &format!("debootstrap {suite}"),
    )?;
    let etc = root.join("etc/apt");
    fs::write(etc.join("sources.list"), lines.join("\n") + "\n")
        .context("writing the root's sources.list")?;
    fs::write(etc.join("apt.conf.d/99mtgdrcopy"), APT_CONF)
        .context("writing the root's apt configuration")?;
    files::put_text(&root.join("usr/sbin/policy-rc.d"), POLICY_RC_D, 0o755)
}

/// Removes `dir` (if present) unless something is mounted below it: `rm -r` through a /proc
/// mount would try to delete the live kernel's files. (Our own mounts never show here: see
/// [`command`].)
pub fn remove_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    if let Some(mount) = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .find(|p| Path::new(p).starts_with(dir))
    {
        bail!(
            "not removing {}: {mount} is mounted below it (umount it first)",
            dir.display()
        );
    }
    Ok(fs::remove_dir_all(dir)?)
}

/// The `deb` sources of the machine's apt configuration, as apt itself reads them (one-line
/// and deb822 files, `Enabled: no`, options): `apt-get indextargets`, which needs no
/// downloaded lists with `--no-release-info`.
#[derive(Debug, PartialEq)]
struct HostSources {
    /// The machine's own suite (`VERSION_CODENAME`), e.g. `bookworm`.
    codename: String,
    sources: Vec<Source>,
}

#[derive(Debug, PartialEq)]
struct Source {
    uri: String,
    suite: String,
    components: Vec<String>,
}

/// One line per package index apt would fetch: archive, suite, component.
const INDEX_FORMAT: &str = "$(REPO_URI)\t$(RELEASE)\t$(COMPONENT)";

impl HostSources {
    fn read(sh: &Shell) -> Result<HostSources> {
        let os_release = fs::read_to_string("/etc/os-release")?;
        let codename = os_release
            .lines()
            .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
            .map(|c| c.trim_matches('"').to_owned())
            .filter(|c| !c.is_empty())
            .context("/etc/os-release has no VERSION_CODENAME; is this a Debian host?")?;
        let listing = cmd!(
            sh,
            "apt-get indextargets --no-release-info --format {INDEX_FORMAT} 'Identifier: Packages'"
        )
        .quiet()
        .read()
        .context("listing the machine's apt sources")?;
        Ok(HostSources {
            codename,
            sources: parse_index_targets(&listing),
        })
    }

    /// The archive of the machine's sources that serves `suite`: debootstrap's mirror.
    fn mirror(&self, suite: &str) -> Result<&str> {
        let source = self.sources.iter().find(|s| s.suite == suite);
        source.map(|s| s.uri.as_str()).with_context(|| {
            format!("no apt source of this machine serves {suite} (apt-get indextargets)")
        })
    }

    /// One-line sources for `suite`: each of the machine's sources for its own suite and that
    /// suite's `-updates`/`-security`, renamed. Unstable has neither.
    fn for_suite(&self, suite: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for source in &self.sources {
            let Some(suffix) = source.suite.strip_prefix(&self.codename) else {
                continue;
            };
            if !(suffix.is_empty() || suffix.starts_with('-')) {
                continue;
            }
            if matches!(suite, "sid" | "unstable") && !suffix.is_empty() {
                continue;
            }
            let line = format!(
                "deb {} {suite}{suffix} {}",
                source.uri,
                source.components.join(" ")
            );
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        lines
    }
}

/// [`INDEX_FORMAT`] lines (one per architecture too) gathered into one source per archive
/// and suite, components in apt's order.
fn parse_index_targets(listing: &str) -> Vec<Source> {
    let mut sources: Vec<Source> = Vec::new();
    for line in listing.lines() {
        let mut fields = line.split('\t');
        let (Some(uri), Some(suite), Some(component)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let index = sources
            .iter()
            .position(|s| s.uri == uri && s.suite == suite);
        let source = match index {
            Some(i) => &mut sources[i],
            None => {
                sources.push(Source {
                    uri: uri.to_owned(),
                    suite: suite.to_owned(),
                    components: Vec::new(),
                });
                sources.last_mut().expect("just pushed")
            }
        };
        if !source.components.iter().any(|c| c == component) {
            source.components.push(component.to_owned());
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "http://archive.example/debian/\tbookworm\tmain\n\
                           http://archive.example/debian/\tbookworm\tcontrib\n\
                           http://archive.example/debian/\tbookworm\tmain\n\
                           http://archive.example/debian/\tbookworm-updates\tmain\n\
                           http://archive.example/debian-security/\tbookworm-security\tmain\n";

    fn host() -> HostSources {
        HostSources {
            codename: "bookworm".into(),
            sources: parse_index_targets(LISTING),
        }
    }

    #[test]
    fn index_targets_are_gathered_per_archive_and_suite() {
        let sources = parse_index_targets(LISTING);
        assert_eq!(sources.len(), 3);
        assert_eq!(sources[0].uri, "http://archive.example/debian/");
        assert_eq!(sources[0].components, ["main", "contrib"]);
        assert_eq!(sources[2].suite, "bookworm-security");
    }

    /// apt on this machine answers in the format parsed here.
    #[test]
    fn the_machines_sources_are_read() {
        let sh = Shell::new().unwrap();
        if cmd!(sh, "apt-get --version").quiet().read().is_err() {
            eprintln!("skipped: no apt-get");
            return;
        }
        let host = HostSources::read(&sh).unwrap();
        assert!(
            host.sources.iter().all(|s| s.uri.contains("://")),
            "{host:?}"
        );
        assert!(host.mirror(&host.codename).is_ok(), "{host:?}");
    }

    #[test]
    fn suites_are_renamed() {
        let host = host();
        assert_eq!(
            host.mirror("bookworm").ok(),
            Some("http://archive.example/debian/")
        );
        assert_eq!(
            host.for_suite("bullseye"),
            [
                "deb http://archive.example/debian/ bullseye main contrib",
                "deb http://archive.example/debian/ bullseye-updates main",
                "deb http://archive.example/debian-security/ bullseye-security main",
            ]
        );
        assert_eq!(
            host.for_suite("sid"),
            ["deb http://archive.example/debian/ sid main contrib"]
        );
    }

    #[test]
    fn commands_run_in_bubblewrap() {
        let sh = Shell::new().unwrap();
        let root = Path::new("/c/sid");
        let binds = [(PathBuf::from("/w"), PathBuf::from("/in"))];
        let env = ["A=b".to_owned()];
        let opts = Options {
            cwd: Some(Path::new("/in")),
            binds: &binds,
            env: &env,
            offline: true,
        };
        let fixed = CHROOT_ENV.join(" ");
        assert_eq!(
            command(&sh, root, &opts, "make").to_string(),
            format!(
                "bwrap --bind /c/sid / --proc /proc --dev /dev --unshare-net --bind /w /in \
                 --chdir /in /usr/bin/env -i {fixed} A=b make"
            )
        );
        assert_eq!(
            command(&sh, root, &Options::default(), "true").to_string(),
            format!("bwrap --bind /c/sid / --proc /proc --dev /dev /usr/bin/env -i {fixed} true")
        );
    }

    #[test]
    fn host_paths() {
        assert_eq!(
            host_path(Path::new("/c/sid"), Path::new("/usr/src/x")),
            Path::new("/c/sid/usr/src/x")
        );
    }
}
