//! What xtask reads of the Debian source package in `debian/` (debhelper builds the packages
//! from it): `debian/control` (names, Build-Depends, maintainer, homepage) and
//! `debian/changelog` (the revision).

use fs_err as fs;
use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::paths;

pub use deb822_fast::Paragraph;

/// The paragraphs of a deb822 text (fields by name, case-insensitively; continuation lines
/// joined with `\n`, their indentation dropped; `#` comments skipped).
pub fn parse(text: &str) -> Result<Vec<Paragraph>> {
    Ok(text.parse::<deb822_fast::Deb822>()?.into_iter().collect())
}

/// `debian/control`: the source paragraph and the binary packages'.
#[derive(Clone, Debug)]
pub struct Control {
    pub source: Paragraph,
    pub binaries: Vec<Paragraph>,
}

impl Control {
    pub fn load() -> Result<Control> {
        Control::read(&paths::root().join("debian/control"))
    }

    pub fn read(path: &Path) -> Result<Control> {
        let text = fs::read_to_string(path)?;
        Control::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Control> {
        let mut paragraphs = parse(text)?.into_iter();
        let source = paragraphs.next().context("no source paragraph")?;
        ensure!(
            source.get("Source").is_some(),
            "the first paragraph has no Source"
        );
        let binaries: Vec<Paragraph> = paragraphs.collect();
        ensure!(
            binaries.iter().all(|p| p.get("Package").is_some()),
            "a binary paragraph has no Package"
        );
        Ok(Control { source, binaries })
    }

    pub fn binary(&self, package: &str) -> Result<&Paragraph> {
        self.binaries
            .iter()
            .find(|p| p.get("Package") == Some(package))
            .with_context(|| format!("debian/control has no package {package}"))
    }
}

/// The version of the newest entry of a changelog (`name (version) dist; …`).
pub fn changelog_version(changelog: &str) -> Option<&str> {
    let first = changelog.lines().next()?;
    let open = first.find('(')?;
    let close = first[open..].find(')')? + open;
    Some(&first[open + 1..close])
}

/// The Debian revision of the source package (`1` of `1.0.0-1`): every binary package's
/// version is its crate's version with this revision.
pub fn revision() -> Result<String> {
    let path = paths::root().join("debian/changelog");
    let text = fs::read_to_string(&path)?;
    let version = changelog_version(&text)
        .with_context(|| format!("{}: no version in the first line", path.display()))?;
    let (_, revision) = version
        .rsplit_once('-')
        .with_context(|| format!("{}: version {version} has no revision", path.display()))?;
    Ok(revision.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the callers rely on: comments skipped, names case-insensitive, continuation lines
    /// joined, paragraphs split at blank lines.
    #[test]
    fn paragraphs_fields_and_continuations() -> Result<()> {
        let text = "# comment\nSource: x\nMaintainer: A <a@b.c>\n\n\n\
                    License: ISC\n Permission\n .\n THE SOFTWARE\n# inside\nComment: c\n";
        let paragraphs = parse(text)?;
        assert_eq!(paragraphs.len(), 2);
        assert_eq!(paragraphs[0].get("maintainer"), Some("A <a@b.c>"));
        assert_eq!(
            paragraphs[1].get("License"),
            Some("ISC\nPermission\n.\nTHE SOFTWARE")
        );
        assert_eq!(paragraphs[1].get("Comment"), Some("c"));
        Ok(())
    }

    #[test]
    fn syntax_errors_are_refused() {
        assert!(parse(" stray\n").is_err());
        assert!(parse("Files *\n").is_err());
    }

    #[test]
    fn versions_from_changelogs() {
        assert_eq!(
            changelog_version("mtgdrcopy (1.0.0-1) unstable; urgency=medium\n"),
            Some("1.0.0-1")
        );
    }

    #[test]
    fn the_real_control_file_parses() -> Result<()> {
        let control = Control::load()?;
        assert_eq!(control.source.get("Source"), Some("mtgdrcopy"));
        for package in ["mtgdrdrv-dkms", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy"] {
            control.binary(package)?;
        }
        Ok(())
    }
}
