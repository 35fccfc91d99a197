//! debian/tests under Debian's own runner: `autopkgtest --no-built-binaries <the .debs> <a
//! tree with debian/> -- chroot <root>`, with the .debs deb-all left in build/. The testbeds
//! are the package-test roots (pkgtest/root.rs), each under an overlay of its own in
//! build/autopkgtest/<name>/ (kept for inspection, cleared by the next run):
//!
//! - `host`: bookworm with DKMS and the headers of the VM's kernel: every test but
//!   container-layout. The chroot is not the running kernel's system, so dkms-build checks the
//!   kernels whose headers are there, as the postinst builds for them.
//! - `container`: the bare minbase (a container image's stand-in): container-layout, which needs
//!   a testbed where DKMS is not installed beforehand.
//! - `vm`: autopkgtest's `qemu` testbed on the emulated GPU (vm.rs): the tests whose
//!   Restrictions name `isolation-machine` (they load kernel modules), which a chroot testbed
//!   skips.
//!
//! Why `chroot`: bookworm's autopkgtest has no testbed that both runs here (root, no KVM) and
//! reverts between tests but `unshare`, which unpacks a tarball of the root for each test; the
//! overlay over the cached layers is the same fresh root for the cost of a mount. Without revert,
//! the tests of one testbed share it, hence the two testbeds.
//!
//! The result is autopkgtest's: its exit status (0 all passed, 2 some skipped, 4 some failed, 8
//! none ran, 12 erroneous package, 16 testbed failure, ...) and its summary file, which must
//! list every test of debian/tests/control that the testbed runs as PASS.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

mod troubleshooting;
mod vm;

use crate::pkgtest::{debian_tests, root};
use crate::step::timed;
use xtask_base::{debian, host, paths, workspace::Workspace};
use xtask_pack::stage::Package;
use xtask_pack::versions;

/// The test that needs a testbed of its own (without DKMS).
const CONTAINER_TEST: &str = "container-layout";

/// The step of `cargo xtask test`.
pub const STEP: &str = "packages: debian/tests under autopkgtest (bookworm roots: host with DKMS, \
                        container; VM with the emulated GPU)";

pub fn test_step(sh: &Shell, vm: bool) -> Result<()> {
    host::ensure_host_packages(&["autopkgtest", "qemu-utils", "e2fsprogs"])?;
    host::ensure_host_packages(crate::vmtest::HOST_PACKAGES)?;
    let debs = release_debs(sh, &Package::SPLIT)?;
    let dir = paths::build_dir().join("autopkgtest");
    let _lock = xtask_base::files::lock_file(&dir.join(".lock"), "running autopkgtest")?;
    let source = source_tree(sh, &dir, &debs)?;
    let tests = control_tests(&source.join("debian/tests/control"))?;
    // The tests are POSIX sh scripts (autopkgtest runs them as executables).
    let scripts: Vec<PathBuf> = tests.iter().map(|t| debian_tests::path(&t.name)).collect();
    cmd!(sh, "shellcheck --shell=sh {scripts...}")
        .quiet()
        .run()
        .context("ShellCheck on debian/tests")?;
    let names = |keep: &dyn Fn(&ControlTest) -> bool| -> Vec<String> {
        tests
            .iter()
            .filter(|t| keep(t))
            .map(|t| t.name.clone())
            .collect()
    };
    let (in_container, on_machine) = (
        names(&|t| t.name == CONTAINER_TEST),
        names(&|t| t.needs_machine),
    );
    let on_host = names(&|t| t.name != CONTAINER_TEST && !t.needs_machine);
    ensure!(
        !in_container.is_empty() && !on_machine.is_empty(),
        "debian/tests/control lacks the {CONTAINER_TEST} test or one with isolation-machine"
    );

    let [host, container] = test_roots(sh, &debs)?;
    let mut results = Vec::new();
    for (root, tests) in [(host, on_host), (container, in_container)] {
        let t = Instant::now();
        let testbed = Testbed { root, tests };
        results.push(testbed.run(sh, &dir, &source));
        timed(&format!("{}: autopkgtest", testbed.root.what), t);
    }
    if !vm {
        eprintln!("    VM testbed skipped (--no-vm): not run: {on_machine:?}");
        return results.into_iter().collect();
    }
    // README.md quotes what gpu prints.
    let run = Run::new("vm", &dir, &source);
    results.push(
        vm::test_on_vm(sh, &run, &debs, &on_machine)
            .and_then(|()| troubleshooting::check_quotes(&run.test_output(&on_machine)?)),
    );
    results.into_iter().collect()
}

/// A root both Debian tools test the packages on: its `layers` (top first) and the `debs` that
/// go into it.
pub(crate) struct TestRoot {
    pub name: &'static str,
    /// For the log.
    pub what: &'static str,
    pub layers: Vec<PathBuf>,
    pub debs: Vec<PathBuf>,
}

/// The two roots, each tested apart (a chroot testbed is not reverted between tests):
/// `host`, DKMS and the VM kernel's headers on minbase, gets every package; `container`, the
/// bare minbase (a container image's stand-in), gets libgdrapi and mtgdrcopy-tests.
pub(crate) fn test_roots(sh: &Shell, debs: &[(Package, PathBuf)]) -> Result<[TestRoot; 2]> {
    let t = Instant::now();
    let kernel = crate::kernel::bookworm_kernel()?;
    // Up to date with the archive, as piuparts would bring them first on every run.
    let host_layers = root::up_to_date(sh, root::dkms_layers(sh, &kernel)?)?;
    let minbase = root::up_to_date(sh, vec![root::minbase(sh)?])?;
    timed("cached root layers ready", t);
    let paths = |keep: fn(&Package) -> bool| -> Vec<PathBuf> {
        debs.iter()
            .filter(|(p, _)| keep(p))
            .map(|(_, d)| d.clone())
            .collect()
    };
    Ok([
        TestRoot {
            name: "host",
            what: "host root (DKMS, headers)",
            layers: host_layers,
            debs: paths(|p| *p != Package::Bundle),
        },
        TestRoot {
            name: "container",
            what: "container root (minbase)",
            layers: minbase,
            debs: paths(|p| matches!(p, Package::Lib | Package::Tests)),
        },
    ])
}

/// A testbed: a root and the `tests` autopkgtest runs in it.
struct Testbed {
    root: TestRoot,
    tests: Vec<String>,
}

impl Testbed {
    /// Runs autopkgtest on a fresh overlay of the layers; Ok when every test passed.
    fn run(&self, sh: &Shell, dir: &Path, source: &Path) -> Result<()> {
        let run = Run::new(self.root.name, dir, source);
        // /proc in the root is DKMS's need; the rest of /dev is what debootstrap made.
        let output = root::run_on_overlay(sh, &self.root.layers, &run.base, true, |merged| {
            let mut args: Vec<String> = vec!["autopkgtest".into(), "--no-built-binaries".into()];
            args.extend(run.report_args());
            for test in &self.tests {
                args.push(format!("--test-name={test}"));
            }
            args.extend(self.root.debs.iter().map(|d| d.display().to_string()));
            args.push(format!("{}/", source.display()));
            args.extend(["--".into(), "chroot".into(), merged.display().to_string()]);
            args
        })?;
        run.judge(&self.tests, &output)
    }
}

/// One autopkgtest run's files in build/autopkgtest/<name>/: its output directory, summary
/// and log; the source tree it tests.
struct Run {
    name: &'static str,
    base: PathBuf,
    out: PathBuf,
    summary: PathBuf,
    source: PathBuf,
}

impl Run {
    fn new(name: &'static str, dir: &Path, source: &Path) -> Run {
        let base = dir.join(name);
        Run {
            name,
            out: base.join("out"),
            summary: base.join("summary"),
            base,
            source: source.to_owned(),
        }
    }

    /// autopkgtest's options that put its reports here.
    fn report_args(&self) -> [String; 2] {
        [
            format!("--output-dir={}", self.out.display()),
            format!("--summary-file={}", self.summary.display()),
        ]
    }

    /// What `tests` printed (autopkgtest's `<test>-stdout` and `-stderr`).
    fn test_output(&self, tests: &[String]) -> Result<String> {
        let mut text = String::new();
        for test in tests {
            for stream in ["stdout", "stderr"] {
                let path = self.out.join(format!("{test}-{stream}"));
                if path.exists() {
                    text.push_str(&fs::read_to_string(&path)?);
                }
            }
        }
        Ok(text)
    }

    /// Ok when autopkgtest exited 0 and its summary lists every one of `tests` as PASS.
    fn judge(&self, tests: &[String], output: &std::process::Output) -> Result<()> {
        let name = self.name;
        let log = self.base.join("autopkgtest.log");
        fs::write(&log, [&output.stdout[..], &output.stderr[..]].concat())?;
        let status = output.status.code();
        let summary_text = fs::read_to_string(&self.summary).unwrap_or_default();
        let verdicts = parse_summary(&summary_text);
        for (test, verdict, rest) in &verdicts {
            eprintln!("    {name}: {test} {verdict} {rest}");
        }
        let missing: Vec<&String> = tests
            .iter()
            .filter(|t| !verdicts.iter().any(|(n, v, _)| n == *t && v == "PASS"))
            .collect();
        if status == Some(0) && missing.is_empty() {
            return Ok(());
        }
        let tail = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        bail!(
            "autopkgtest on the {name} testbed exited {} ({}); not passed: {missing:?}\n{}\n\
             (all output: {}; per test: {})",
            status.map_or("by a signal".into(), |c| c.to_string()),
            meaning(status),
            tail(&output.stderr),
            log.display(),
            self.out.display()
        )
    }
}

/// What autopkgtest's exit status means (autopkgtest(1), EXIT STATUS).
fn meaning(status: Option<i32>) -> &'static str {
    match status {
        Some(0) => "all tests passed",
        Some(2) => "some test was skipped",
        Some(4) => "some test failed",
        Some(6) => "some test failed and some was skipped",
        Some(8) => "no test ran",
        Some(12) | Some(14) => "erroneous package",
        Some(16) => "testbed failure",
        _ => "unexpected failure",
    }
}

/// The summary file's lines, `<test> <PASS|FAIL|SKIP|FLAKY> [reason]`.
fn parse_summary(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?.to_owned();
            let verdict = words.next()?.to_owned();
            Some((name, verdict, words.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

/// A test of debian/tests/control, and whether its Restrictions ask for a machine of its own.
struct ControlTest {
    name: String,
    needs_machine: bool,
}

/// The tests debian/tests/control names (one paragraph may name several), paragraph by
/// paragraph.
fn control_tests(control: &Path) -> Result<Vec<ControlTest>> {
    let text =
        fs::read_to_string(control).with_context(|| format!("reading {}", control.display()))?;
    let mut tests = Vec::new();
    for paragraph in text.split("\n\n") {
        let field = |name: &str| -> Vec<&str> {
            paragraph
                .lines()
                .filter_map(|l| l.strip_prefix(name))
                .flat_map(|v| v.split([',', ' ']).filter(|n| !n.is_empty()))
                .collect()
        };
        let needs_machine = field("Restrictions:").contains(&"isolation-machine");
        tests.extend(field("Tests:").into_iter().map(|name| ControlTest {
            name: name.to_owned(),
            needs_machine,
        }));
    }
    ensure!(!tests.is_empty(), "{} names no test", control.display());
    Ok(tests)
}

/// A tree holding only debian/ (what autopkgtest reads: control, changelog, tests) and
/// insmod.sh (the gpu test loads the module with it, as a user of the source tree does), so
/// that autopkgtest does not copy the whole checkout into the testbed; marked built (debian/files lists the
/// .debs, as dpkg-buildpackage leaves it), since an unbuilt tree makes autopkgtest install
/// dpkg-dev in the testbed to run `dpkg-source --before-build` (minutes, for nothing here).
fn source_tree(sh: &Shell, dir: &Path, debs: &[(Package, PathBuf)]) -> Result<PathBuf> {
    let tree = dir.join("source");
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    fs::create_dir_all(&tree)?;
    let debian_dir = paths::root().join("debian");
    let insmod = paths::root().join("insmod.sh");
    cmd!(sh, "cp -a {debian_dir} {insmod} {tree}")
        .quiet()
        .run()?;
    let mut files = String::new();
    for (package, deb) in debs {
        let name = deb
            .file_name()
            .and_then(|n| n.to_str())
            .context("a .deb has no name")?;
        let section = if *package == Package::Kmod {
            "kernel"
        } else {
            "libs"
        };
        files.push_str(&format!("{name} {section} optional\n"));
    }
    fs::write(tree.join("debian/files"), files)?;
    Ok(tree)
}

/// The .debs of `packages` of this release for this machine's architecture in build/, as
/// deb-all left them; built only when one is missing or of another version.
pub(crate) fn release_debs(sh: &Shell, packages: &[Package]) -> Result<Vec<(Package, PathBuf)>> {
    let ws = Workspace::load()?;
    let revision = debian::revision()?;
    // build/ also holds the arm64 step's .debs, which the testbed cannot install.
    let host_arch = cmd!(sh, "dpkg --print-architecture")
        .quiet()
        .read()
        .context("asking dpkg for this machine's architecture")?;
    let mut found = Vec::new();
    for &package in packages {
        let version = versions::package_version(&ws, package, &revision)?;
        let arch = if package.arch_all() {
            "all"
        } else {
            &host_arch
        };
        let name = format!("{}_{version}_{arch}.deb", package.deb_name());
        let deb = paths::build_dir().join(&name);
        if !deb.is_file() {
            eprintln!("    no {name} in build/: building the .debs (deb-all)");
            let built = xtask_pack::deb::build_everything(sh, &ws)?;
            return Ok(built
                .into_iter()
                .filter(|b| packages.contains(&b.package))
                .map(|b| (b.package, b.path))
                .collect());
        }
        found.push((package, deb));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_needing_a_machine_are_told_apart() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("control-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let control = dir.join("control");
        fs::write(
            &control,
            "# c\nTests: a, b\nDepends: x\n\nTests: gpu\nRestrictions: needs-root, \
             isolation-machine\n\nTests: c\nRestrictions: isolation-container\n",
        )?;
        let tests = control_tests(&control)?;
        let seen: Vec<(&str, bool)> = tests
            .iter()
            .map(|t| (t.name.as_str(), t.needs_machine))
            .collect();
        assert_eq!(
            seen,
            [("a", false), ("b", false), ("gpu", true), ("c", false)]
        );
        // The packaged control: gpu alone needs a machine.
        let real = control_tests(&paths::root().join("debian/tests/control"))?;
        let machine: Vec<&str> = real
            .iter()
            .filter(|t| t.needs_machine)
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(machine, ["gpu"]);
        fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn the_summary_gives_each_test_its_verdict() {
        let v = parse_summary(
            "doctor PASS\ndkms-build SKIP no kernel headers\nbroken FAIL non-zero exit status 1\n",
        );
        assert_eq!(v[0], ("doctor".into(), "PASS".into(), String::new()));
        assert_eq!(v[1].1, "SKIP");
        assert_eq!(
            v[2],
            (
                "broken".into(),
                "FAIL".into(),
                "non-zero exit status 1".into()
            )
        );
    }
}
