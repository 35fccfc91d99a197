//! What xtask reads of Debian's formats: deb822 paragraphs (debian/control, the DEP-5
//! copyright, dpkg's output) and changelog entries (the revision, versions, release notes).

use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::paths;

pub use deb822_fast::Paragraph;

/// The paragraphs of a deb822 text (fields by name, case-insensitively; continuation lines
/// joined with `\n`, their indentation dropped; `#` comments skipped).
pub fn parse(text: &str) -> Result<Vec<Paragraph>> {
    Ok(text.parse::<deb822_fast::Deb822>()?.into_iter().collect())
}

/// The newest entry of a changelog, as dpkg-parsechangelog reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub source: String,
    pub version: String,
    /// `unstable`, or `UNRELEASED` while a release is being prepared.
    pub distribution: String,
    /// The trailer's `Name <address>`; empty when the entry has no trailer.
    pub maintainer: String,
    /// The trailer's date, in seconds since the epoch (SOURCE_DATE_EPOCH).
    pub timestamp: String,
    /// The entry's text up to its trailer, head line first.
    pub changes: String,
}

impl Entry {
    pub fn read(path: &Path) -> Result<Entry> {
        let out = std::process::Command::new("dpkg-parsechangelog")
            .arg("-l")
            .arg(path)
            .output()
            .context("running dpkg-parsechangelog (package dpkg-dev)")?;
        ensure!(
            out.status.success(),
            "dpkg-parsechangelog -l {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let entry = parse(&text)?.into_iter().next();
        let entry = entry.with_context(|| format!("{}: no changelog entry", path.display()))?;
        let field = |name: &str| entry.get(name).unwrap_or_default().to_owned();
        // The parser drops continuation lines' indentation; the changes keep theirs.
        let changes = text.split_once("\nChanges:\n").map_or("", |(_, c)| c);
        let changes = changes.lines().map(|l| l.strip_prefix(' ').unwrap_or(l));
        Ok(Entry {
            source: field("Source"),
            version: field("Version"),
            distribution: field("Distribution"),
            maintainer: field("Maintainer"),
            timestamp: field("Timestamp"),
            changes: changes
                .map(|l| if l == "." { "" } else { l })
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }
}

impl Entry {
    /// Every entry of a changelog, newest first (`dpkg-parsechangelog --all`, one paragraph
    /// each). Their `changes` keep the text with its indentation dropped.
    pub fn read_all(path: &Path) -> Result<Vec<Entry>> {
        let out = std::process::Command::new("dpkg-parsechangelog")
            .args(["--format", "rfc822", "--all", "-l"])
            .arg(path)
            .output()
            .context("running dpkg-parsechangelog (package dpkg-dev)")?;
        ensure!(
            out.status.success(),
            "dpkg-parsechangelog --all -l {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let entries: Vec<Entry> = parse(&String::from_utf8_lossy(&out.stdout))?
            .into_iter()
            .map(|p| {
                let field = |name: &str| p.get(name).unwrap_or_default().to_owned();
                Entry {
                    source: field("Source"),
                    version: field("Version"),
                    distribution: field("Distribution"),
                    maintainer: field("Maintainer"),
                    timestamp: field("Timestamp"),
                    changes: field("Changes"),
                }
            })
            .collect();
        ensure!(
            !entries.is_empty(),
            "{}: no changelog entry",
            path.display()
        );
        Ok(entries)
    }

    /// The Debian revision of the version (`1` of `1.0.0-1`).
    pub fn revision(&self) -> Result<&str> {
        let (_, revision) = self
            .version
            .rsplit_once('-')
            .with_context(|| format!("{} {}: no Debian revision", self.source, self.version))?;
        Ok(revision)
    }
}

/// The Debian revision of the source package (debian/changelog's newest entry): every binary
/// package's version is its crate's version with this revision.
pub fn revision() -> Result<String> {
    let entry = Entry::read(&paths::root().join("debian/changelog"))?;
    Ok(entry.revision()?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fs_err as fs;

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

    /// The fields of a changelog's newest entry.
    #[test]
    fn changelog_entries() -> Result<()> {
        let path = std::env::temp_dir().join(format!("xtask-changelog-{}", std::process::id()));
        let trailer = " -- Dev <dev@example.org>  Mon, 30 Nov 2026 10:30:00 +0000\n";
        let newer = "mtgdrcopy (1.1.0-1) UNRELEASED; urgency=medium\n\n  * New.\n\n  * More.\n\n";
        let older = "mtgdrcopy (1.0.0-1) unstable; urgency=medium\n\n  * Old.\n\n";
        fs::write(&path, format!("{newer}{trailer}\n{older}{trailer}"))?;
        let entry = Entry::read(&path)?;
        assert_eq!(
            (entry.source.as_str(), entry.version.as_str()),
            ("mtgdrcopy", "1.1.0-1")
        );
        assert_eq!(entry.distribution, "UNRELEASED");
        assert_eq!(entry.maintainer, "Dev <dev@example.org>");
        assert_eq!(entry.timestamp, "1796034600");
        assert_eq!(
            entry.changes,
            "mtgdrcopy (1.1.0-1) UNRELEASED; urgency=medium\n\n  * New.\n\n  * More."
        );
        let all = Entry::read_all(&path)?;
        let versions: Vec<(&str, &str, &str)> = all
            .iter()
            .map(|e| {
                (
                    e.version.as_str(),
                    e.distribution.as_str(),
                    e.timestamp.as_str(),
                )
            })
            .collect();
        assert_eq!(
            versions,
            [
                ("1.1.0-1", "UNRELEASED", "1796034600"),
                ("1.0.0-1", "unstable", "1796034600")
            ]
        );
        fs::remove_file(&path)?;
        Ok(())
    }

    #[test]
    fn an_entry_without_its_trailer_has_no_maintainer() -> Result<()> {
        let path = std::env::temp_dir().join(format!("xtask-trailer-{}", std::process::id()));
        fs::write(
            &path,
            "mtgdrcopy (1.0) unstable; urgency=medium\n\n  * No trailer.\n",
        )?;
        let entry = Entry::read(&path)?;
        fs::remove_file(&path)?;
        assert_eq!(
            (entry.version.as_str(), entry.maintainer.as_str()),
            ("1.0", "")
        );
        Ok(())
    }

    #[test]
    fn the_real_control_file_parses() -> Result<()> {
        let control = parse(&fs::read_to_string(paths::root().join("debian/control"))?)?;
        assert_eq!(control[0].get("Source"), Some("mtgdrcopy"));
        let packages: Vec<&str> = control[1..]
            .iter()
            .filter_map(|p| p.get("Package"))
            .collect();
        assert_eq!(
            packages,
            ["mtgdrdrv-dkms", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy"]
        );
        Ok(())
    }
}
