//! The manual pages are written by hand, but the version in each page's `.TH` line ("libgdrapi
//! 1.0.0") follows its crate's, so that a version bump (a release's, or the next-release
//! package test's) updates the pages with the headers, and a stale page fails the freshness check.

use fs_err as fs;
use std::path::Path;

use anyhow::{Context, Result};

use xtask_base::generated::Generated;
use xtask_base::workspace::Workspace;

/// (crate, its pages' directory, their section).
const PAGES: &[(&str, &str, &str)] = &[
    ("mtgdrcopy-tests", "mtgdrcopy-tests/man", "1"),
    ("libgdrapi", "libgdrapi/man", "3"),
];

pub fn versions(root: &Path) -> Result<Vec<Generated>> {
    let ws = Workspace::load()?;
    let mut out = Vec::new();
    for &(krate, dir, section) in PAGES {
        let version = &ws.krate(krate)?.version;
        let mut pages: Vec<_> = fs::read_dir(root.join(dir))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        pages.retain(|p| p.extension().is_some_and(|e| e == section));
        pages.sort();
        for path in pages {
            let text = fs::read_to_string(&path)?;
            let contents = with_version(&text, krate, version)
                .with_context(|| format!("{}: the .TH line", path.display()))?;
            out.push(Generated { path, contents });
        }
    }
    Ok(out)
}

/// `text` with the `"<krate> <version>"` field of its `.TH` line set to `version`.
fn with_version(text: &str, krate: &str, version: &str) -> Result<String> {
    let title = text
        .lines()
        .find(|l| l.starts_with(".TH "))
        .context("no .TH line")?;
    let open = format!("\"{krate} ");
    let start = title
        .find(&open)
        .with_context(|| format!("no \"{krate} <version>\" field in {title:?}"))?;
    let end = title[start + 1..]
        .find('"')
        .map(|i| start + 1 + i)
        .with_context(|| format!("an unclosed field in {title:?}"))?;
    let retitled = format!("{}\"{krate} {version}{}", &title[..start], &title[end..]);
    Ok(text.replacen(title, &retitled, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_title_names_the_version() {
        let page = ".\\\" c\n.TH GDRAPI 3 2026-12-04 \"libgdrapi 1.0.0\" \"Library Functions Manual\"\n.SH NAME\n";
        let got = with_version(page, "libgdrapi", "1.1.0").unwrap();
        assert!(got.contains(".TH GDRAPI 3 2026-12-04 \"libgdrapi 1.1.0\" \"Library"));
        assert_eq!(with_version(&got, "libgdrapi", "1.0.0").unwrap(), page);
        assert!(with_version(page, "mtgdrcopy-tests", "1.0.0").is_err());
        assert!(with_version(".SH NAME\n", "libgdrapi", "1.0.0").is_err());
    }
}
