//! The machine xtask runs on: its Debian packages, and its commands run with their output kept
//! in a log.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use fs_err as fs;
use xshell::{cmd, Cmd, Shell};

/// Installs those of `pkgs` that are not installed yet. Checking is local and fast; apt's package
/// lists are refreshed only when something must be installed, since that is the slow,
/// network-bound step.
pub fn ensure_host_packages(pkgs: &[&str]) -> Result<()> {
    let sh = Shell::new()?;
    // One xtask at a time (the test lanes run two): dpkg's lock would fail the second apt-get.
    let _lock = super::files::lock_file(
        &crate::paths::build_dir().join("host-packages.lock"),
        "installing host packages",
    )?;
    let mut missing = Vec::new();
    for &pkg in pkgs {
        // Exit status 1 means "unknown package": not installed either.
        let out = cmd!(sh, "dpkg-query -W -f '${Status}' {pkg}")
            .quiet()
            .ignore_status()
            .ignore_stderr()
            .read()
            .context("running dpkg-query; is this a Debian host?")?;
        if out.trim() != "install ok installed" {
            missing.push(pkg);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {} with apt-get", missing.join(" "));
    apt(&sh, &["update"])?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    apt(&sh, &args)
}

/// Runs apt-get non-interactively, showing its output only when it fails. It waits for dpkg's
/// lock rather than failing at once: an apt run of the host's own (unattended-upgrades, an admin,
/// another tool) must not fail a test step; the xtask lock above only orders xtask processes.
pub fn apt(sh: &Shell, args: &[&str]) -> Result<()> {
    let out = cmd!(sh, "apt-get -o DPkg::Lock::Timeout=600 {args...}")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .quiet()
        .ignore_status()
        .output()
        .context("running apt-get")?;
    ensure!(
        out.status.success(),
        "`apt-get {}` failed ({}); installing packages needs root and dpkg's lock\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Runs `cmd`, appending its output to `log`; a failure carries the output's last lines.
pub fn run_logged(cmd: Cmd<'_>, log: &Path, what: &str) -> Result<String> {
    let out = cmd
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running {what}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    let mut file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    writeln!(file, "==> {what}\n{text}")?;
    if !out.status.success() {
        let lines: Vec<&str> = text.lines().collect();
        bail!(
            "{what} failed ({}); last lines (all in {}):\n{}",
            out.status,
            log.display(),
            lines[lines.len().saturating_sub(25)..].join("\n")
        );
    }
    Ok(text)
}
