//! The Debian source package in `debian/`, read the way debhelper and dpkg read it, so that
//! `cargo xtask deb-*` builds the packages from the same truth as `dpkg-buildpackage`:
//! `debian/control` (names, relations, descriptions, maintainer, homepage), the
//! `debian/<package>.install` file lists, `debian/changelog` (the revision).
//!
//! [`gencontrol`] is what dpkg-gencontrol does for one binary package: the binary paragraph with
//! the source paragraph's defaults, substitution variables filled in, the version and size added.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use crate::paths;

pub use crate::deb822::{parse, Paragraph};

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
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
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

    pub fn source_name(&self) -> &str {
        self.source.get("Source").unwrap_or_default()
    }

    pub fn binary(&self, package: &str) -> Result<&Paragraph> {
        self.binaries
            .iter()
            .find(|p| p.get("Package") == Some(package))
            .with_context(|| format!("debian/control has no package {package}"))
    }
}

/// Relation fields: comma-separated lists, cleaned after substitution (an empty
/// `${shlibs:Depends}` must not leave `Depends: , foo`).
const RELATIONS: &[&str] = &[
    "Pre-Depends",
    "Depends",
    "Recommends",
    "Suggests",
    "Enhances",
    "Breaks",
    "Conflicts",
    "Provides",
    "Replaces",
];

/// The fields of a binary package's control file, in dpkg-gencontrol's order.
const ORDER: &[&str] = &[
    "Package",
    "Source",
    "Version",
    "Auto-Built-Package",
    "Architecture",
    "Maintainer",
    "Installed-Size",
    "Pre-Depends",
    "Depends",
    "Recommends",
    "Suggests",
    "Enhances",
    "Breaks",
    "Conflicts",
    "Provides",
    "Replaces",
    "Section",
    "Priority",
    "Multi-Arch",
    "Homepage",
    "Description",
    "Build-Ids",
];

/// Fields a binary package takes from the source paragraph when it does not set them.
const INHERITED: &[&str] = &["Section", "Priority", "Maintainer", "Homepage"];

/// What dpkg-gencontrol adds to a binary paragraph.
pub struct GenControl<'a> {
    pub version: &'a str,
    /// The source package's version (`Source: name (version)` when it differs).
    pub source_version: &'a str,
    /// The architecture built for: the paragraph's `Architecture` must be `all` or name it.
    pub host_arch: &'a str,
    pub installed_size_kib: u64,
    pub substvars: &'a BTreeMap<String, String>,
}

/// The control file of `binary` (a paragraph of `control`).
pub fn gencontrol(control: &Control, binary: &Paragraph, gen: &GenControl) -> Result<String> {
    let package = binary.get("Package").unwrap_or_default();
    let mut fields: BTreeMap<&str, String> = BTreeMap::new();
    for name in INHERITED {
        if let Some(v) = control.source.get(name) {
            fields.insert(name, v.to_owned());
        }
    }
    for (name, value) in &binary.fields {
        let Some(known) = ORDER.iter().find(|k| k.eq_ignore_ascii_case(name)) else {
            bail!("{package}: field {name} is not handled by xtask's gencontrol");
        };
        fields.insert(known, substitute(value, gen.substvars)?);
    }
    let architecture = binary.get("Architecture").unwrap_or_default();
    let arch = if architecture == "all" {
        "all"
    } else if architecture
        .split_whitespace()
        .any(|a| a == gen.host_arch || a == "any")
    {
        gen.host_arch
    } else {
        bail!(
            "{package} is not built for {} (Architecture: {architecture})",
            gen.host_arch
        );
    };
    fields.insert("Architecture", arch.to_owned());
    fields.insert("Version", gen.version.to_owned());
    fields.insert("Installed-Size", gen.installed_size_kib.to_string());
    let source = control.source_name();
    if package != source || gen.version != gen.source_version {
        let value = if gen.version == gen.source_version {
            source.to_owned()
        } else {
            format!("{source} ({})", gen.source_version)
        };
        fields.insert("Source", value);
    }
    for name in RELATIONS {
        if let Some(value) = fields.get(name) {
            let cleaned = clean_relations(value);
            if cleaned.is_empty() {
                fields.remove(name);
            } else {
                fields.insert(name, cleaned);
            }
        }
    }
    let mut out = String::new();
    for name in ORDER {
        if let Some(value) = fields.get(name) {
            let mut lines = value.lines();
            let first = lines.next().unwrap_or_default();
            let rest = crate::deb822::continuation(lines);
            out.push_str(&format!("{name}: {first}{rest}\n"));
        }
    }
    Ok(out)
}

/// `value` with every `${name}` replaced; an unknown name is an error.
pub fn substitute(value: &str, vars: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            bail!("an unterminated substitution variable in {value:?}");
        };
        let name = &rest[at + 2..at + end];
        let Some(v) = vars.get(name) else {
            bail!("unknown substitution variable ${{{name}}}");
        };
        out.push_str(v);
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A relation field on one line, its empty members dropped.
fn clean_relations(value: &str) -> String {
    value
        .split(',')
        .map(|r| r.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|r| !r.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `debian/<package>.install` patterns, `${DEB_HOST_MULTIARCH}` filled in (dh_install's
/// one variable we use).
pub fn install_patterns(package: &str, multiarch: &str) -> Result<Vec<String>> {
    let path = paths::root()
        .join("debian")
        .join(format!("{package}.install"));
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut patterns = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        ensure!(
            !line.contains(char::is_whitespace),
            "{}: {line:?}: only one path per line is supported (the file's own place)",
            path.display()
        );
        patterns.push(line.replace("${DEB_HOST_MULTIARCH}", multiarch));
    }
    Ok(patterns)
}

/// The paths under `tree` (relative, sorted) that `pattern` matches: shell globbing per path
/// component, as dh_install does.
pub fn glob(tree: &Path, pattern: &str) -> Result<Vec<PathBuf>> {
    let mut found = vec![PathBuf::new()];
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        let mut next = Vec::new();
        for dir in &found {
            let full = tree.join(dir);
            if !full.is_dir() {
                continue;
            }
            let mut names: Vec<String> = fs::read_dir(&full)
                .with_context(|| format!("reading {}", full.display()))?
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            for name in names {
                if wildcard(part, &name) {
                    next.push(dir.join(&name));
                }
            }
        }
        found = next;
    }
    Ok(found)
}

/// Shell-style match of `name` against `pattern` with `*` and `?`.
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // dp[j]: pattern[..i] matches name[..j].
    let mut dp = vec![false; n.len() + 1];
    dp[0] = true;
    for &pc in &p {
        let mut next = vec![false; n.len() + 1];
        if pc == '*' {
            let mut any = false;
            for j in 0..=n.len() {
                any |= dp[j];
                next[j] = any;
            }
        } else {
            for j in 1..=n.len() {
                next[j] = dp[j - 1] && (pc == '?' || pc == n[j - 1]);
            }
        }
        dp = next;
    }
    dp[n.len()]
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
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let version = changelog_version(&text)
        .with_context(|| format!("{}: no version in the first line", path.display()))?;
    let (_, revision) = version
        .rsplit_once('-')
        .with_context(|| format!("{}: version {version} has no revision", path.display()))?;
    Ok(revision.to_owned())
}

/// `${<package>:NextMajor}`: the lowest version of the next major, `2~` for 1.x (`~` sorts
/// before any release of it).
pub fn next_major(version: &str) -> Result<String> {
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("no major version in {version}"))?;
    Ok(format!("{}~", major + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROL: &str =
        "Source: src\nSection: libs\nPriority: optional\nMaintainer: M <m@x.org>\n\
        Homepage: https://h\n\nPackage: libx\nArchitecture: amd64 arm64\nMulti-Arch: same\n\
        Depends: ${shlibs:Depends}, ${misc:Depends}\nDescription: short\n long\n .\n more\n\n\
        Package: x-meta\nArchitecture: all\nSection: metapackages\n\
        Depends: libx (>= ${libx:Version}), libx (<< ${libx:NextMajor})\nDescription: meta\n";

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("shlibs:Depends".to_owned(), "libc6 (>= 2.34)".to_owned()),
            ("misc:Depends".to_owned(), String::new()),
            ("libx:Version".to_owned(), "1.0.0-1".to_owned()),
            ("libx:NextMajor".to_owned(), "2~".to_owned()),
        ])
    }

    #[test]
    fn gencontrol_inherits_substitutes_and_orders() -> Result<()> {
        let control = Control::parse(CONTROL)?;
        let vars = vars();
        let gen = GenControl {
            version: "1.0.0-1",
            source_version: "1.0.0-1",
            host_arch: "amd64",
            installed_size_kib: 42,
            substvars: &vars,
        };
        let out = gencontrol(&control, control.binary("libx")?, &gen)?;
        assert_eq!(
            out,
            "Package: libx\nSource: src\nVersion: 1.0.0-1\nArchitecture: amd64\n\
             Maintainer: M <m@x.org>\nInstalled-Size: 42\nDepends: libc6 (>= 2.34)\n\
             Section: libs\nPriority: optional\nMulti-Arch: same\nHomepage: https://h\n\
             Description: short\n long\n .\n more\n"
        );
        let meta = gencontrol(
            &control,
            control.binary("x-meta")?,
            &GenControl {
                version: "0.1.0-1",
                ..gen
            },
        )?;
        assert!(meta.contains("Source: src (1.0.0-1)\n"), "{meta}");
        assert!(meta.contains("Architecture: all\n"));
        assert!(meta.contains("Depends: libx (>= 1.0.0-1), libx (<< 2~)\n"));
        assert!(meta.contains("Section: metapackages\n"));
        Ok(())
    }

    #[test]
    fn gencontrol_refuses_what_it_cannot_do() -> Result<()> {
        let control = Control::parse(CONTROL)?;
        let vars = BTreeMap::new();
        let gen = GenControl {
            version: "1",
            source_version: "1",
            host_arch: "amd64",
            installed_size_kib: 1,
            substvars: &vars,
        };
        let err = gencontrol(&control, control.binary("libx")?, &gen).unwrap_err();
        assert!(err.to_string().contains("${shlibs:Depends}"), "{err}");
        let vars = self::vars();
        let riscv = GenControl {
            host_arch: "riscv64",
            substvars: &vars,
            ..gen
        };
        assert!(gencontrol(&control, control.binary("libx")?, &riscv).is_err());
        Ok(())
    }

    #[test]
    fn wildcards_match_like_the_shell() {
        assert!(wildcard("libgdrapi.so*", "libgdrapi.so"));
        assert!(wildcard("libgdrapi.so*", "libgdrapi.so.1.0.0"));
        assert!(!wildcard("libgdrapi.so*", "libgdrapi.a"));
        assert!(wildcard("mtgdrcopy_*.1", "mtgdrcopy_sanity.1"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("a?c", "ac"));
    }

    #[test]
    fn versions_from_changelogs() -> Result<()> {
        assert_eq!(
            changelog_version("mtgdrcopy (1.0.0-1) unstable; urgency=medium\n"),
            Some("1.0.0-1")
        );
        assert_eq!(next_major("1.4.2")?, "2~");
        assert_eq!(next_major("0.1.0")?, "1~");
        Ok(())
    }

    #[test]
    fn the_real_control_file_parses() -> Result<()> {
        let control = Control::load()?;
        assert_eq!(control.source_name(), "mtgdrcopy");
        for package in ["mtgdrdrv-dkms", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy"] {
            control.binary(package)?;
        }
        Ok(())
    }
}
