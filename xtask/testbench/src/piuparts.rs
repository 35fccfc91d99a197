//! The packages under piuparts, Debian's install and purge tester: each set is installed into
//! a copy of a package-test root and purged, and piuparts compares the root before and after
//! (files left behind, changed or removed; processes left running; dpkg's state). Three sets, as
//! the packages are used:
//!
//! - `host`: the four packages on the root with DKMS and the VM kernel's headers, so that the
//!   postinst has DKMS build and install the module, and the purge must take both away;
//! - `bundle`: the single-package build on the same root, likewise;
//! - `container`: libgdrapi and mtgdrcopy-tests on the bare minbase.
//!
//! On the DKMS root, piuparts runs scripts of ours: debian/tests/dkms-build and module-files
//! after the install (`post_install`): the module must be built and installed for the kernel
//! with headers, its files where udev and kmod read them (autopkgtest's tests of the split
//! packages; here they also see the bundle); and after the purge
//! scripts/piuparts/post_purge_no-module-left: the module file is gone, which piuparts itself
//! does not check (its default ignores cover all of /lib/modules). DKMS's tree left behind is
//! piuparts' own finding.
//!
//! piuparts copies the root it is given (`--existing-chroot`: here the merged view of a fresh
//! overlay of the cached layers) and keeps its apt sources, which are this machine's
//! (`--keep-sources-list`). Its verdict is its exit status; its log stays in build/piuparts/.
//! The one file allowed to stay is DKMS's signing key pair (without `--ignore` for it, the host
//! set fails: "Package purging left files on system").

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::autopkgtest::{release_debs, test_roots, TestRoot};
use crate::pkgtest::{debian_tests, root};
use crate::step::timed;
use xtask_base::{files, host, paths};
use xtask_pack::stage::Package;

/// DKMS's module signing key pair, generated the first time DKMS signs a module (here, ours):
/// DKMS's state, not the package's, and kept on purpose, since it may be enrolled in the
/// firmware's MOK list by then.
pub(crate) const KEPT_BY_DKMS: &[&str] = &["/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"];

/// debian/tests run after the install on the DKMS root (piuparts runs `post_install*` scripts).
const POST_INSTALL: &[&str] = &["dkms-build", "module-files"];

/// The step of `cargo xtask test`.
pub const STEP: &str = "packages: piuparts install and purge, nothing left (bookworm roots: \
     host with DKMS, the single-package build there too, container)";

pub fn test_step(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(&["piuparts"])?;
    let packages = [Package::SPLIT.as_slice(), &[Package::Bundle]].concat();
    let debs = release_debs(sh, &packages)?;
    let dir = paths::build_dir().join("piuparts");
    let _lock = files::lock_file(&dir.join(".lock"), "running piuparts")?;
    let post_install = post_install_scripts(&dir)?;
    let post_purge = paths::root().join("xtask/testbench/scripts/piuparts");
    cmd!(
        sh,
        "shellcheck --shell=sh {post_purge}/post_purge_no-module-left"
    )
    .quiet()
    .run()?;
    let scripts = [post_install.as_path(), &post_purge];

    let [host, container] = test_roots(sh, &debs)?;
    let bundle = TestRoot {
        name: "bundle",
        what: "host root (DKMS, headers), the single-package build",
        layers: host.layers.clone(),
        debs: debs
            .iter()
            .filter(|(p, _)| *p == Package::Bundle)
            .map(|(_, d)| d.clone())
            .collect(),
    };
    let mut results = Vec::new();
    for (root, scripts) in [(host, &scripts[..]), (bundle, &scripts), (container, &[])] {
        let t = Instant::now();
        results.push(piuparts(sh, &dir, &root, scripts));
        timed(&format!("{}: piuparts", root.what), t);
    }
    results.into_iter().collect()
}

/// A directory of [`POST_INSTALL`]'s debian/tests, named as piuparts looks for them.
fn post_install_scripts(dir: &Path) -> Result<PathBuf> {
    let scripts = dir.join("scripts");
    files::fresh_dir(&scripts)?;
    for test in POST_INSTALL {
        let from = debian_tests::path(test);
        fs::copy(&from, scripts.join(format!("post_install_{test}")))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(scripts)
}

/// piuparts' install and purge test of the root's .debs on a copy of it, with the scripts of
/// the directories `scripts`.
fn piuparts(sh: &Shell, dir: &Path, root: &TestRoot, scripts: &[&Path]) -> Result<()> {
    let name = root.name;
    let log = dir.join(format!("{name}.log"));
    // Where piuparts makes its copy of the root: outside the overlay, on the same disk.
    let copies = dir.join(format!("{name}.tmp"));
    files::fresh_dir(&copies)?;
    let _ = fs::remove_file(&log);
    // No /proc in the root given: piuparts copies it (`cp -ax` of each top directory) and
    // mounts its own in the copy.
    let output = root::run_on_overlay(sh, &root.layers, &dir.join(name), false, |merged| {
        let mut args: Vec<String> = [
            "piuparts",
            "--distribution=bookworm",
            "--keep-sources-list",
            "--no-upgrade-test",
        ]
        .map(String::from)
        .into();
        args.push(format!("--existing-chroot={}", merged.display()));
        args.push(format!("--tmpdir={}", copies.display()));
        args.push(format!("--log-file={}", log.display()));
        for scripts in scripts {
            args.push(format!("--scriptsdir={}", scripts.display()));
        }
        for kept in KEPT_BY_DKMS {
            args.push(format!("--ignore={kept}"));
        }
        args.extend(root.debs.iter().map(|d| d.display().to_string()));
        args
    })?;
    let text = fs::read_to_string(&log).unwrap_or_else(|_| {
        String::from_utf8_lossy(&[&output.stdout[..], &output.stderr[..]].concat()).into_owned()
    });
    let lines: Vec<&str> = text.lines().collect();
    let verdict = lines
        .iter()
        .rev()
        .find(|l| l.contains("PASS:") || l.contains("FAIL:"))
        .copied()
        .unwrap_or("no verdict");
    eprintln!("    {name}: {}", verdict.trim());
    ensure!(
        output.status.success(),
        "piuparts on the {name} root exited {:?}:\n{}\n(all of it: {})",
        output.status.code(),
        lines[lines.len().saturating_sub(40)..].join("\n"),
        log.display()
    );
    files::remove_any(&copies)
}
