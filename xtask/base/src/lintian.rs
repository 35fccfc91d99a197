//! lintian, as every package check runs it.

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use crate::host::ensure_host_packages;

/// lintian, pedantic, failing on anything but overridden tags, on .debs and .dsc files.
pub fn lintian_files(sh: &Shell, files: &[PathBuf]) -> Result<()> {
    ensure_host_packages(&["lintian"])?;
    let debs = files;
    let out = cmd!(
        sh,
        "lintian --fail-on error,warning,info --display-info --pedantic {files...}"
    )
    .quiet()
    .ignore_status()
    .output()
    .context("running lintian")?;
    // (--show-overrides would list the overridden tags, but makes lintian exit 2.)
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reported: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("N:")).collect();
    eprintln!(
        "    lintian: {} files, {} tags besides those overridden in debian/*.lintian-overrides",
        debs.len(),
        reported.len()
    );
    for line in &reported {
        eprintln!("      {line}");
    }
    ensure!(
        out.status.success(),
        "lintian failed ({}):\n{}{}",
        out.status,
        reported
            .iter()
            .map(|l| format!("  {l}\n"))
            .collect::<String>(),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.contains("root privileges"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}
