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

use crate::pkgtest::root;
use crate::step::timed;
use xtask_base::{debian, host, paths, workspace::Workspace};
use xtask_pack::stage::Package;
use xtask_pack::versions;

/// The test that needs a testbed of its own (without DKMS).
const CONTAINER_TEST: &str = "container-layout";

/// The step of `cargo xtask test`.
pub const STEP: &str =
    "packages: debian/tests under autopkgtest (bookworm roots: host with DKMS, container)";

pub fn test_step(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(&["autopkgtest"])?;
    let debs = release_debs(sh)?;
    let dir = paths::build_dir().join("autopkgtest");
    let _lock = xtask_base::files::lock_file(&dir.join(".lock"), "running autopkgtest")?;
    let source = source_tree(sh, &dir, &debs)?;
    let tests = test_names(&source.join("debian/tests/control"))?;
    // The tests are POSIX sh scripts (autopkgtest runs them as executables).
    let scripts: Vec<PathBuf> = tests
        .iter()
        .map(|t| paths::root().join("debian/tests").join(t))
        .collect();
    cmd!(sh, "shellcheck --shell=sh {scripts...}")
        .quiet()
        .run()
        .context("ShellCheck on debian/tests")?;
    ensure!(
        tests.iter().any(|t| t == CONTAINER_TEST),
        "debian/tests/control has no {CONTAINER_TEST} test"
    );

    let [host, container] = test_roots(sh, &debs)?;
    let on_host: Vec<String> = tests
        .iter()
        .filter(|t| *t != CONTAINER_TEST)
        .cloned()
        .collect();
    let runs = [
        (host, on_host),
        (container, vec![CONTAINER_TEST.to_owned()]),
    ];
    let mut results = Vec::new();
    for (root, tests) in runs {
        let t = Instant::now();
        let testbed = Testbed { root, tests };
        results.push(testbed.run(sh, &dir, &source));
        timed(&format!("{}: autopkgtest", testbed.root.what), t);
    }
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
    let host_layers = root::dkms_layers(sh, &kernel)?;
    let minbase = root::minbase(sh)?;
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
            debs: paths(|_| true),
        },
        TestRoot {
            name: "container",
            what: "container root (minbase)",
            layers: vec![minbase],
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
        let name = self.root.name;
        let base = dir.join(name);
        let out = base.join("out");
        let summary = base.join("summary");
        // /proc in the root is DKMS's need; the rest of /dev is what debootstrap made.
        let output = root::run_on_overlay(sh, &self.root.layers, &base, true, |merged| {
            let mut args: Vec<String> = vec![
                "autopkgtest".into(),
                "--no-built-binaries".into(),
                format!("--output-dir={}", out.display()),
                format!("--summary-file={}", summary.display()),
            ];
            for test in &self.tests {
                args.push(format!("--test-name={test}"));
            }
            args.extend(self.root.debs.iter().map(|d| d.display().to_string()));
            args.push(format!("{}/", source.display()));
            args.extend(["--".into(), "chroot".into(), merged.display().to_string()]);
            args
        })?;
        let log = base.join("autopkgtest.log");
        fs::write(&log, [&output.stdout[..], &output.stderr[..]].concat())?;
        let status = output.status.code();
        let summary_text = fs::read_to_string(&summary).unwrap_or_default();
        let verdicts = parse_summary(&summary_text);
        for (test, verdict, rest) in &verdicts {
            eprintln!("    {name}: {test} {verdict} {rest}");
        }
        let missing: Vec<&String> = self
            .tests
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
            "autopkgtest on the {} root exited {} ({}); not passed: {missing:?}\n{}\n\
             (all output: {}; per test: {})",
            name,
            status.map_or("by a signal".into(), |c| c.to_string()),
            meaning(status),
            tail(&output.stderr),
            log.display(),
            out.display()
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

/// The names in debian/tests/control's `Tests:` fields (one paragraph may name several).
fn test_names(control: &Path) -> Result<Vec<String>> {
    let text =
        fs::read_to_string(control).with_context(|| format!("reading {}", control.display()))?;
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Tests:"))
        .flat_map(|v| v.split([',', ' ']).filter(|n| !n.is_empty()))
        .map(String::from)
        .collect();
    ensure!(!names.is_empty(), "{} names no test", control.display());
    Ok(names)
}

/// A tree holding only debian/ (what autopkgtest reads: control, changelog, tests), so that it
/// does not copy the whole checkout into the testbed; marked built (debian/files lists the
/// .debs, as dpkg-buildpackage leaves it), since an unbuilt tree makes autopkgtest install
/// dpkg-dev in the testbed to run `dpkg-source --before-build` (minutes, for nothing here).
fn source_tree(sh: &Shell, dir: &Path, debs: &[(Package, PathBuf)]) -> Result<PathBuf> {
    let tree = dir.join("source");
    if tree.exists() {
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    fs::create_dir_all(&tree)?;
    let debian_dir = paths::root().join("debian");
    cmd!(sh, "cp -a {debian_dir} {tree}").quiet().run()?;
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

/// The split packages' .debs of this release for this machine's architecture in build/, as
/// deb-all left them; built only when one is missing or of another version.
pub(crate) fn release_debs(sh: &Shell) -> Result<Vec<(Package, PathBuf)>> {
    let ws = Workspace::load()?;
    let revision = debian::revision()?;
    // build/ also holds the arm64 step's .debs, which the testbed cannot install.
    let host_arch = cmd!(sh, "dpkg --print-architecture")
        .quiet()
        .read()
        .context("asking dpkg for this machine's architecture")?;
    let mut found = Vec::new();
    for package in Package::SPLIT {
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
                .filter(|b| b.package != Package::Bundle)
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
