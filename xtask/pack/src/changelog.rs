//! CHANGELOG.md (Keep a Changelog, for users) against the Debian changelogs (for apt), which
//! hold the same releases package by package. Checked in the versions step:
//!
//! - CHANGELOG.md's releases, newest first, are debian/changelog's released entries (not
//!   `UNRELEASED`): the same upstream versions in the same order, on the same dates (UTC);
//! - every released version of the library line's package changelogs is one of them;
//! - every released mtgdrdrv-dkms version is named (`mtgdrdrv <version>`) by a release;
//! - while debian/changelog's newest entry is `UNRELEASED`, CHANGELOG.md has `## [Unreleased]`;
//! - every heading's link is defined at the bottom (`[1.0.0]: …`).

use xtask_base::debian::Entry;

use crate::versions::upstream_version;

/// Changelogs by file name (`debian/<package>.changelog`), each with every entry.
pub type Changelogs = Vec<(String, Vec<Entry>)>;

/// One `## [version] - date` section of CHANGELOG.md.
#[derive(Debug, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub date: String,
    /// The section's text up to the next heading.
    pub text: String,
}

/// CHANGELOG.md's sections: whether it has `## [Unreleased]` and its releases, newest first;
/// or what is malformed.
pub fn parse(md: &str) -> Result<(bool, Vec<Release>), String> {
    let mut unreleased = false;
    let mut releases: Vec<Release> = Vec::new();
    let mut in_release = false;
    for line in md.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            in_release = false;
            if heading == "[Unreleased]" {
                if unreleased || !releases.is_empty() {
                    return Err("CHANGELOG.md: `## [Unreleased]` must come once, first".into());
                }
                unreleased = true;
                continue;
            }
            let parsed = heading
                .strip_prefix('[')
                .and_then(|h| h.split_once("] - "))
                .filter(|(_, date)| is_date(date));
            let Some((version, date)) = parsed else {
                return Err(format!(
                    "CHANGELOG.md: {line:?} is neither `## [Unreleased]` nor \
                     `## [<version>] - <YYYY-MM-DD>`"
                ));
            };
            releases.push(Release {
                version: version.to_owned(),
                date: date.to_owned(),
                text: String::new(),
            });
            in_release = true;
        } else if in_release {
            if let Some(release) = releases.last_mut() {
                release.text.push_str(line);
                release.text.push('\n');
            }
        }
    }
    let mut missing: Vec<String> = releases.iter().map(|r| r.version.clone()).collect();
    if unreleased {
        missing.push("Unreleased".into());
    }
    missing.retain(|label| !md.lines().any(|l| l.starts_with(&format!("[{label}]: "))));
    if !missing.is_empty() {
        return Err(format!(
            "CHANGELOG.md: no link defined for the headings {missing:?} (`[<label>]: <url>`)"
        ));
    }
    Ok((unreleased, releases))
}

fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// The UTC date (`YYYY-MM-DD`) of a changelog entry's timestamp (seconds since the epoch).
pub fn utc_date(timestamp: &str) -> Option<String> {
    let days = timestamp.parse::<i64>().ok()?.div_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Some(format!("{year:04}-{month:02}-{day:02}"))
}

/// A Debian version's upstream part (`1.0.0` of `1.0.0-1` and of `1.0.0-1+bundle`).
fn upstream(version: &str) -> &str {
    version.rsplit_once('-').map_or(version, |(u, _)| u)
}

fn released(entries: &[Entry]) -> impl Iterator<Item = &Entry> {
    entries.iter().filter(|e| e.distribution != "UNRELEASED")
}

/// Every disagreement of CHANGELOG.md (`md`) with debian/changelog (`source`), the library
/// line's package changelogs (`library`: file name and entries) and mtgdrdrv-dkms's (`driver`).
pub fn findings(md: &str, source: &[Entry], library: &Changelogs, driver: &[Entry]) -> Vec<String> {
    let (unreleased, releases) = match parse(md) {
        Ok(parsed) => parsed,
        Err(finding) => return vec![finding],
    };
    let mut findings = Vec::new();
    let ours: Vec<(String, String)> = releases
        .iter()
        .map(|r| (upstream_version(&r.version), r.date.clone()))
        .collect();
    let debian: Vec<(String, String)> = released(source)
        .map(|e| {
            let date = utc_date(&e.timestamp).unwrap_or_else(|| e.timestamp.clone());
            (upstream(&e.version).to_owned(), date)
        })
        .collect();
    if ours != debian {
        findings.push(format!(
            "CHANGELOG.md's releases {ours:?} are not debian/changelog's released entries \
             {debian:?} (version, UTC date, newest first): add or fix the release there"
        ));
    }
    for (file, entries) in library {
        for entry in released(entries) {
            let version = upstream(&entry.version);
            if !ours.iter().any(|(v, _)| v == version) {
                findings.push(format!(
                    "{file} has the release {}, which CHANGELOG.md does not: add it",
                    entry.version
                ));
            }
        }
    }
    for entry in released(driver) {
        let named = format!("mtgdrdrv {}", upstream(&entry.version));
        if !releases.iter().any(|r| r.text.contains(&named)) {
            findings.push(format!(
                "debian/mtgdrdrv-dkms.changelog has the release {}, which no release of \
                 CHANGELOG.md names ({named:?})",
                entry.version
            ));
        }
    }
    if source
        .first()
        .is_some_and(|e| e.distribution == "UNRELEASED")
        && !unreleased
    {
        findings.push(
            "debian/changelog's newest entry is UNRELEASED, but CHANGELOG.md has no \
             `## [Unreleased]`"
                .into(),
        );
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: &str, distribution: &str, timestamp: &str) -> Entry {
        Entry {
            source: "mtgdrcopy".into(),
            version: version.into(),
            distribution: distribution.into(),
            timestamp: timestamp.into(),
            ..Entry::default()
        }
    }

    /// 2026-12-01 12:00 UTC and 2026-11-30 10:30 UTC.
    const DEC1: &str = "1796126400";
    const NOV30: &str = "1796034600";

    const MD: &str = "# Changelog\n\n## [Unreleased]\n\n- next\n\n\
                      ## [1.1.0] - 2026-12-01\n\nWith mtgdrdrv 0.2.0.\n\n\
                      ## [1.0.0] - 2026-11-30\n\nWith mtgdrdrv 0.1.0.\n\n\
                      [Unreleased]: u\n[1.1.0]: a\n[1.0.0]: b\n";

    fn agreeing() -> (Vec<Entry>, Changelogs, Vec<Entry>) {
        let source = vec![
            entry("1.2.0-1", "UNRELEASED", DEC1),
            entry("1.1.0-1", "unstable", DEC1),
            entry("1.0.0-1", "unstable", NOV30),
        ];
        let library = vec![(
            "debian/mtgdrcopy-bundle.changelog".to_owned(),
            vec![entry("1.0.0-1+bundle", "unstable", NOV30)],
        )];
        let driver = vec![
            entry("0.2.0-1", "unstable", DEC1),
            entry("0.1.0-1", "unstable", NOV30),
        ];
        (source, library, driver)
    }

    #[test]
    fn dates_are_utc_days() {
        assert_eq!(utc_date(DEC1).as_deref(), Some("2026-12-01"));
        assert_eq!(utc_date(NOV30).as_deref(), Some("2026-11-30"));
        assert_eq!(utc_date("0").as_deref(), Some("1970-01-01"));
        assert_eq!(utc_date("951782400").as_deref(), Some("2000-02-29"));
        assert_eq!(utc_date("x"), None);
    }

    #[test]
    fn an_agreeing_changelog_has_no_findings() {
        let (source, library, driver) = agreeing();
        assert_eq!(
            findings(MD, &source, &library, &driver),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_disagreement_is_found() {
        let (source, library, driver) = agreeing();
        let found = |md: &str, needle: &str| {
            let f = findings(md, &source, &library, &driver);
            assert!(f.iter().any(|f| f.contains(needle)), "{needle}: {f:#?}");
        };
        found(
            &MD.replace("2026-11-30\n", "2026-11-29\n"),
            "CHANGELOG.md's releases",
        );
        found(&MD.replace("[1.1.0]", "[1.1.1]"), "CHANGELOG.md's releases");
        found(
            &MD.replace("## [Unreleased]\n\n- next\n\n", ""),
            "UNRELEASED",
        );
        found(&MD.replace("mtgdrdrv 0.2.0", "the driver"), "0.2.0-1");
        found(&MD.replace("[1.0.0]: b\n", ""), "no link defined");
        found(&MD.replace("## [1.0.0] - ", "## 1.0.0 - "), "neither");

        let mut library = library.clone();
        library[0]
            .1
            .insert(0, entry("1.0.1-1+bundle", "unstable", DEC1));
        let f = findings(MD, &source, &library, &driver);
        assert!(f.iter().any(|f| f.contains("1.0.1-1+bundle")), "{f:#?}");
    }
}
