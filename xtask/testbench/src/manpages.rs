//! The `cargo xtask test` step that checks the hand-written manual pages as roff: for every
//! page, `groff -ww -z` (all warnings, no output) and `man --warnings` as lintian runs it on
//! installed pages must print nothing. That the pages say what the programs and the library do
//! is checked by their own tests (mtgdrcopy-tests/tests/man_pages.rs,
//! libgdrapi/tests/man_page.rs); lintian checks them again inside the packages.
//!
//! The step also checks a page broken on purpose and fails unless both tools complain about
//! it: a check that passes everything must not pass this step.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::{files, host, paths};

/// groff (its base part has the man macros) and man-db's `man`; lintian depends on both too.
pub const HOST_PACKAGES: &[&str] = &["groff-base", "man-db"];

/// The directories holding the pages, and the section each holds.
const PAGE_DIRS: [(&str, &str); 2] = [("mtgdrcopy-tests/man", "1"), ("libgdrapi/man", "3")];

/// Every manual page in the tree.
pub fn pages() -> Result<Vec<PathBuf>> {
    let mut pages = Vec::new();
    for (dir, section) in PAGE_DIRS {
        let dir = paths::root().join(dir);
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == section) {
                pages.push(path);
            }
        }
    }
    pages.sort();
    Ok(pages)
}

/// What groff and man say about `page` (empty: nothing).
fn complaints(sh: &Shell, page: &Path) -> Result<String> {
    let groff = cmd!(sh, "groff -ww -z -man {page}")
        .quiet()
        .ignore_status()
        .output()
        .context("running groff (groff-base)")?;
    // lintian's invocation (its groff-message check), in a UTF-8 locale of the C library.
    let man = cmd!(sh, "man --warnings -E UTF-8 -l -Tutf8 -Z {page}")
        .env("LC_ALL", "C.UTF-8")
        .env("MANROFFSEQ", "")
        .env("MANWIDTH", "80")
        .quiet()
        .ignore_status()
        .output()
        .context("running man (man-db)")?;
    let mut out = String::new();
    for (tool, output) in [("groff -ww -z", groff), ("man --warnings", man)] {
        let said = String::from_utf8_lossy(&output.stderr);
        if !said.trim().is_empty() || !output.status.success() {
            out += &format!("  {tool} ({}):\n{said}", output.status);
        }
    }
    Ok(out)
}

/// A page with a macro that does not exist and an unknown font: both tools must object.
const BROKEN: &str = ".TH BROKEN 1\n.SH NAME\nbroken \\- a page broken on purpose\n\
                      .SH DESCRIPTION\n.NOSUCHMACRO\n\\f[NOSUCHFONT]text\\fR\n";

pub fn test_step(sh: &Shell) -> Result<()> {
    host::ensure_host_packages(HOST_PACKAGES)?;
    let broken = paths::build_dir().join("manpages-test/broken.1");
    files::put_text(&broken, BROKEN, 0o644)?;
    let said = complaints(sh, &broken)?;
    ensure!(
        said.contains("groff -ww -z") && said.contains("man --warnings"),
        "groff and man must both complain about {} but said:\n{said}",
        broken.display()
    );
    let pages = pages()?;
    ensure!(pages.len() >= 7, "only {} manual pages found", pages.len());
    let mut failures = String::new();
    for page in &pages {
        let said = complaints(sh, page)?;
        if !said.is_empty() {
            failures += &format!("{}:\n{said}", page.display());
        }
    }
    ensure!(
        failures.is_empty(),
        "manual pages with warnings:\n{failures}"
    );
    eprintln!(
        "    {} manual pages: no warning from groff -ww or man --warnings",
        pages.len()
    );
    Ok(())
}
