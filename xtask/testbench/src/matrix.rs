//! `cargo xtask kmod-matrix`: mtgdrdrv and the emulated provider built against Debian's kernels
//! from 5.10 to 7.x, each with the compiler its kernel was built with; the DKMS package built
//! the way users get it; the VM end-to-end run on 6.1 and on the newest kernel.
//!
//! Each suite gets a chroot (chroot.rs) with its own kernel's headers, the gcc those headers
//! depend on, make, kmod and dkms. In it:
//! - module build: a fresh W=1 build of both modules (kbuild::build_modules); a warning located
//!   in our files, or any modpost/objtool warning, fails it (kbuild::Warnings). Warnings are read
//!   from the log rather than turned into errors with KCFLAGS=-Werror: -Werror would also stop
//!   on warnings that W=1 raises inside the kernel's own headers, which we cannot fix, and it
//!   does not cover modpost.
//! - dkms build: the mtgdrdrv-dkms .deb of this tree installed with dpkg (its postinst builds
//!   for every kernel with headers: the suite's; the host's `uname -r` has none in the chroot
//!   and is skipped), debian/tests/dkms-build run in the chroot (installed for the suite's
//!   kernel, vermagic, no stub), the DKMS build log read for warnings in our files, and the
//!   package purged so that the cached chroot stays as it was.
//! - VM e2e: vmtest::run_module_tests, for bookworm with the host's 6.1 kernel (the step of
//!   `cargo xtask test`), for sid with the image of the chroot's kernel and modules built there.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use xshell::Shell;

use crate::step::Step;
use xtask_base::chroot::{self, Chroot};
use xtask_base::{host, paths};

use crate::kernel::{self, Builder, Kernel};
use crate::{kbuild, vmtest};

mod dkms;
use dkms::{dkms_build, dkms_deb};

/// Which kernel's end-to-end run a suite gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum E2e {
    None,
    /// The host's own bookworm kernel and host-built modules, as `cargo xtask test` boots it.
    Host,
    /// The chroot's kernel, with the modules built in the chroot.
    Chroot,
}

struct Suite {
    name: &'static str,
    e2e: E2e,
}

/// Oldest to newest: 5.10, 6.1, 6.12, 7.x at the time of writing. The kernel is whatever the
/// suite's linux-headers-amd64 names when its chroot is made.
const SUITES: &[Suite] = &[
    Suite {
        name: "bullseye",
        e2e: E2e::None,
    },
    Suite {
        name: "bookworm",
        e2e: E2e::Host,
    },
    Suite {
        name: "trixie",
        e2e: E2e::None,
    },
    Suite {
        name: "sid",
        e2e: E2e::Chroot,
    },
];

/// What a chroot holds; changing it makes every chroot again. The headers pull in the compiler
/// their kernel was built with (linux-compiler-gcc-N-x86, or gcc-N-for-host since 7.x); dkms
/// compresses modules with xz where the kernel does.
const PACKAGES: &[&str] = &["make", "libc6-dev", "kmod", "xz-utils", "dkms"];
const RECIPE: &str =
    "kmod-matrix 2: minbase, make libc6-dev kmod xz-utils dkms, headers of linux-headers-amd64";

#[derive(clap::Args)]
pub struct Args {
    /// Only this suite (bullseye, bookworm, trixie, sid); repeatable. Default: all.
    #[arg(long = "suite", value_name = "SUITE")]
    suites: Vec<String>,
    /// Skip the VM end-to-end runs.
    #[arg(long)]
    no_vm: bool,
    /// Skip the DKMS package builds.
    #[arg(long)]
    no_dkms: bool,
    /// Make the chroots again, with the packages the registry serves now.
    #[arg(long)]
    refresh: bool,
}

struct Options {
    suites: Vec<&'static Suite>,
    vm: bool,
    dkms: bool,
    refresh: bool,
    /// bookworm's end-to-end outcome when `cargo xtask test` already booted 6.1.
    bookworm_e2e: Option<Result<(), String>>,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let mut suites = Vec::new();
    for name in &args.suites {
        let suite = SUITES.iter().find(|s| s.name == name).with_context(|| {
            let names: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
            format!("unknown suite {name}; the matrix has {}", names.join(", "))
        })?;
        suites.push(suite);
    }
    if suites.is_empty() {
        suites = SUITES.iter().collect();
    }
    run(
        &sh,
        Options {
            suites,
            vm: !args.no_vm,
            dkms: !args.no_dkms,
            refresh: args.refresh,
            bookworm_e2e: None,
        },
    )
}

/// The matrix as a step of `cargo xtask test`, after its 6.1 VM step (whose outcome it reports
/// instead of booting 6.1 again). Without `vm`, the builds only.
pub fn test_step(vm: bool) -> Step<'static> {
    (
        "kernel matrix: bullseye, bookworm, trixie, sid (build, dkms, VM e2e on sid)",
        Box::new(move |sh: &Shell| {
            run(
                sh,
                Options {
                    suites: SUITES.iter().collect(),
                    vm,
                    dkms: true,
                    refresh: false,
                    bookworm_e2e: vmtest::bookworm_e2e_outcome(),
                },
            )
        }),
    )
}

/// One cell of the table.
#[derive(Clone, Debug)]
enum Cell {
    Pass,
    Fail(String),
    /// Not applicable or not asked for, with the reason.
    Na(&'static str),
}

impl Cell {
    fn of(result: Result<()>) -> Cell {
        match result {
            Ok(()) => Cell::Pass,
            Err(e) => Cell::Fail(format!("{e:#}")),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Cell::Pass => "pass",
            Cell::Fail(_) => "FAIL",
            Cell::Na(_) => "n/a",
        })
    }
}

struct Row {
    suite: &'static str,
    release: String,
    compiler: String,
    build: Cell,
    dkms: Cell,
    e2e: Cell,
    /// `e2e` is another step's outcome (`cargo xtask test`'s 6.1 run), failed there already.
    e2e_elsewhere: bool,
    notes: Vec<String>,
}

fn run(sh: &Shell, opts: Options) -> Result<()> {
    let start = Instant::now();
    let logs = paths::build_dir().join("kmod-matrix");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    // The chroots are independent and, when made, mostly wait for the network: in parallel.
    let t = Instant::now();
    let chroots: Vec<Result<Chroot>> = thread::scope(|scope| {
        let handles: Vec<_> = opts
            .suites
            .iter()
            .map(|suite| {
                let log = logs.join(format!("{}-chroot.log", suite.name));
                scope.spawn(move || {
                    let sh = Shell::new()?;
                    chroot::prepare(
                        &sh,
                        suite.name,
                        suite.name,
                        RECIPE,
                        opts.refresh,
                        &log,
                        setup_suite,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("chroot thread panicked")))
            })
            .collect()
    });
    eprintln!("    chroots ready: {:.1} s", t.elapsed().as_secs_f64());

    let deb = if opts.dkms {
        let t = Instant::now();
        let deb = dkms_deb(sh).map_err(|e| format!("building the mtgdrdrv-dkms .deb: {e:#}"));
        eprintln!(
            "    mtgdrdrv-dkms .deb built: {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Some(deb)
    } else {
        None
    };

    let mut rows = Vec::new();
    for (suite, chroot) in opts.suites.iter().zip(chroots) {
        let row = match chroot {
            Ok(chroot) => suite_row(sh, suite, &chroot, deb.as_ref(), &opts, &logs),
            Err(e) => Row {
                suite: suite.name,
                release: "?".into(),
                compiler: "?".into(),
                build: Cell::Fail(format!("making the chroot: {e:#}")),
                dkms: Cell::Na("no chroot"),
                e2e: Cell::Na("no chroot"),
                e2e_elsewhere: false,
                notes: Vec::new(),
            },
        };
        rows.push(row);
    }
    print_table(&rows);
    eprintln!(
        "    kernel matrix: {:.1} s (logs in {})",
        start.elapsed().as_secs_f64(),
        logs.display()
    );
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            let e2e = if r.e2e_elsewhere { &Cell::Pass } else { &r.e2e };
            [
                ("module build", &r.build),
                ("dkms build", &r.dkms),
                ("VM e2e", e2e),
            ]
            .into_iter()
            .filter(|(_, c)| matches!(c, Cell::Fail(_)))
            .map(move |(what, _)| format!("{} {what}", r.suite))
        })
        .collect();
    if !failed.is_empty() {
        bail!("kernel matrix failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The chroot's setup (chroot::prepare): package lists, the suite's kernel headers, the tools.
fn setup_suite(sh: &Shell, root: &Path, log: &Path) -> Result<String> {
    let apt_get = |args: &[&str], what: &str| {
        xtask_base::host::run_logged(
            chroot::command(sh, root, &Default::default(), "apt-get").args(args),
            log,
            what,
        )
    };
    apt_get(&["update"], "apt-get update")?;
    // The suite's own kernel is the one its linux-headers-amd64 metapackage names (the newest
    // upload of that series, security updates included). Not simply the highest version on
    // offer: -security also carries backported series (6.1 for bullseye, 6.12 for bookworm).
    let depends = chroot::command(sh, root, &Default::default(), "apt-cache")
        .args(["depends", "linux-headers-amd64"])
        .quiet()
        .read()
        .context("apt-cache depends linux-headers-amd64 in the chroot")?;
    let release = default_headers(&depends).with_context(|| {
        format!("linux-headers-amd64 depends on no linux-headers-<release>-amd64:\n{depends}")
    })?;
    let headers = format!("linux-headers-{release}");
    let mut install = vec!["install", "-y"];
    install.extend(PACKAGES);
    install.push(&headers);
    apt_get(
        &install,
        &format!("apt-get install {}", install[2..].join(" ")),
    )?;
    Ok(format!("release={release}"))
}

/// The release whose headers `apt-cache depends linux-headers-amd64` names
/// (`  Depends: linux-headers-6.1.0-57-amd64` → `6.1.0-57-amd64`).
fn default_headers(depends: &str) -> Option<String> {
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .filter_map(|d| d.trim().strip_prefix("linux-headers-"))
        .find(|release| {
            release.ends_with("-amd64") && release.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(str::to_owned)
}

fn suite_row(
    sh: &Shell,
    suite: &Suite,
    chroot: &Chroot,
    deb: Option<&Result<PathBuf, String>>,
    opts: &Options,
    logs: &Path,
) -> Row {
    let release = chroot
        .info
        .lines()
        .find_map(|l| l.strip_prefix("release="))
        .unwrap_or("?")
        .to_owned();
    let mut row = Row {
        suite: suite.name,
        release: release.clone(),
        compiler: "?".into(),
        build: Cell::Na("not run"),
        dkms: Cell::Na("not asked for"),
        e2e: Cell::Na("no VM run for this kernel"),
        e2e_elsewhere: false,
        notes: Vec::new(),
    };
    let step = |what: &str, f: &mut dyn FnMut() -> Result<()>| {
        eprintln!("==> {} {release}: {what}", suite.name);
        let t = Instant::now();
        let cell = Cell::of(f());
        let verdict = match &cell {
            Cell::Pass => "ok".to_owned(),
            Cell::Fail(e) => format!("FAILED: {e}"),
            Cell::Na(why) => why.to_string(),
        };
        eprintln!("    {verdict} ({:.1} s)", t.elapsed().as_secs_f64());
        cell
    };

    let kernel = match compiler(sh, chroot, &release) {
        Ok(cc) => {
            row.compiler = cc;
            headers_kernel(&chroot.root, &release)
        }
        Err(e) => Err(e),
    };
    let kernel = match kernel {
        Ok(kernel) => kernel,
        Err(e) => {
            row.build = Cell::Fail(format!("{e:#}"));
            return row;
        }
    };
    row.build = step("module build (W=1)", &mut || {
        kbuild::clean_modules(&kernel)?;
        kbuild::build_modules(sh, &kernel).map(drop)
    });

    if let Some(deb) = deb {
        row.dkms = match deb {
            Ok(deb) => {
                let log = logs.join(format!("{}-dkms.log", suite.name));
                step("dkms build", &mut || {
                    dkms_build(sh, chroot, deb, &release, &log)
                })
            }
            Err(e) => Cell::Fail(e.clone()),
        };
    }

    row.e2e = match (suite.e2e, opts.vm) {
        (E2e::None, _) => Cell::Na("no VM run for this kernel"),
        (_, false) => Cell::Na("VM runs not asked for"),
        (E2e::Host, true) => match &opts.bookworm_e2e {
            Some(outcome) => {
                row.e2e_elsewhere = true;
                row.notes.push(format!(
                    "{} VM e2e: the host's 6.1 kernel, from the step \"kernel module tests in \
                     QEMU (Debian 6.1)\" above",
                    suite.name
                ));
                match outcome {
                    Ok(()) => Cell::Pass,
                    Err(e) => Cell::Fail(e.clone()),
                }
            }
            None => {
                let mut host_release = None;
                let cell = step("VM e2e (host kernel)", &mut || {
                    host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
                    let kernel = kernel::bookworm_kernel()?;
                    host_release = Some(kernel.release.clone());
                    vmtest::run_module_tests(sh, &kernel)
                });
                if let Some(host) = host_release.filter(|h| *h != release) {
                    row.notes.push(format!(
                        "{} VM e2e: the host's kernel {host}, modules built on the host",
                        suite.name
                    ));
                }
                cell
            }
        },
        (E2e::Chroot, true) if !matches!(row.build, Cell::Pass) => {
            Cell::Fail("the module build failed".into())
        }
        (E2e::Chroot, true) => step("VM e2e", &mut || {
            host::ensure_host_packages(vmtest::HOST_PACKAGES)?;
            let kernel = kernel::chroot_kernel(&chroot.root, &release)?;
            vmtest::run_module_tests(sh, &kernel)
        }),
    };
    row
}

/// A kernel of the chroot for building only: its image is fetched when it is booted
/// (kernel::chroot_kernel).
fn headers_kernel(root: &Path, release: &str) -> Result<Kernel> {
    let builder = Builder::Chroot(root.to_owned());
    let headers = PathBuf::from(format!("/usr/src/linux-headers-{release}"));
    ensure!(
        builder.host_path(&headers).join("Makefile").is_file(),
        "{} has no headers for {release}; make the chroot again with --refresh",
        root.display()
    );
    Ok(Kernel {
        release: release.to_owned(),
        vmlinuz: PathBuf::new(),
        headers,
        builder,
    })
}

/// The compiler the kernel was built with (its headers' CONFIG_CC_VERSION_TEXT), checked to run
/// in the chroot: `gcc-16 16.2.0`.
fn compiler(sh: &Shell, chroot: &Chroot, release: &str) -> Result<String> {
    let config = chroot.host_path(Path::new(&format!(
        "/usr/src/linux-headers-{release}/.config"
    )));
    let text =
        fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let version_text = text
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_CC_VERSION_TEXT="))
        .map(|v| v.trim_matches('"'))
        .with_context(|| format!("{} has no CONFIG_CC_VERSION_TEXT", config.display()))?;
    let program = version_text
        .split_whitespace()
        .next()
        .context("empty CONFIG_CC_VERSION_TEXT")?;
    let out = chroot
        .cmd(sh, program)
        .arg("--version")
        .quiet()
        .read()
        .with_context(|| {
            format!("the kernel was built with {program}, which does not run in the chroot")
        })?;
    // `gcc-10 (Debian 10.2.1-6) 10.2.1 20210110`: the version follows the package's.
    let version = out
        .lines()
        .next()
        .and_then(|l| l.split_once(") "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("?");
    // x86_64-linux-gnu-gcc-16 → gcc-16
    let short = program.rfind("gcc").map_or(program, |at| &program[at..]);
    Ok(format!("{short} {version}"))
}

fn print_table(rows: &[Row]) {
    let header = [
        "suite",
        "kernel",
        "compiler",
        "module build",
        "dkms build",
        "VM e2e",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.suite.to_owned(),
                r.release.clone(),
                r.compiler.clone(),
                r.build.to_string(),
                r.dkms.to_string(),
                r.e2e.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |fields: &[String]| {
        let parts: Vec<String> = fields
            .iter()
            .zip(widths)
            .map(|(f, w)| format!("{f:<w$}"))
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    println!();
    println!("kernel matrix (W=1; warnings in our files are errors)");
    println!("{}", line(&header.map(String::from)));
    for row in &cells {
        println!("{}", line(row));
    }
    for row in rows {
        for (what, cell) in [
            ("module build", &row.build),
            ("dkms build", &row.dkms),
            ("VM e2e", &row.e2e),
        ] {
            match cell {
                Cell::Fail(why) => println!("  {} {what}: {why}", row.suite),
                Cell::Na(why) if !matches!(*why, "no VM run for this kernel") => {
                    println!("  {} {what}: n/a ({why})", row.suite)
                }
                _ => {}
            }
        }
        for note in &row.notes {
            println!("  {note}");
        }
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::default_headers;

    #[test]
    fn headers_of_the_metapackage() {
        let bookworm = "linux-headers-amd64\n  Depends: linux-headers-6.1.0-57-amd64\n";
        assert_eq!(default_headers(bookworm).as_deref(), Some("6.1.0-57-amd64"));
        let sid = "linux-headers-amd64\n  Depends: linux-base-amd64\n  \
                   Depends: linux-headers-7.2.13+deb14-amd64\n";
        assert_eq!(default_headers(sid).as_deref(), Some("7.2.13+deb14-amd64"));
        assert_eq!(default_headers("linux-headers-amd64\n"), None);
    }
}
