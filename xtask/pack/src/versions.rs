//! One version source: the crates' versions. The driver's and the library's version constants
//! are computed from them at compile time (`CARGO_PKG_VERSION_MAJOR`/`_MINOR`, see
//! mtgdrdrv/src/version.rs and libgdrapi/src/version.rs) and generated into the headers (whose
//! freshness is the codegen check), and libgdrapi asserts at compile time that the release's
//! driver and library accept each other. What is left to reconcile is checked here, and
//! [`check`] lists every disagreement at once (a `cargo xtask test` step and the first check of
//! `cargo xtask release-check`):
//!
//! - `mtgdrcopy-tests` and the `mtgdrcopy` metapackage (and bundle) are released with the
//!   library and carry its version;
//! - dkms.conf's `PACKAGE_VERSION` is `@VERSION@` (filled in from mtgdrdrv/Cargo.toml at
//!   staging), never a number;
//! - the root Cargo.toml's `[workspace.dependencies]` pin the path crates' exact versions;
//! - each package's `debian/<package>.changelog` starts with an entry for the package's Debian
//!   version (`deb-*` refuses otherwise, through [`changelog_entry`]), and debian/changelog
//!   with the release's;
//! - CHANGELOG.md has the Debian changelogs' releases (crate::changelog);
//! - README.md and docs/releasing.md state the compatibility promise in the same words, once
//!   each (libgdrapi/src/version.rs enforces it).

use fs_err as fs;

use anyhow::{ensure, Result};

use xtask_base::debian::Entry;
use xtask_base::paths;
use xtask_base::workspace::Workspace;

use crate::stage::Package;

/// Everything in a tree that states a version, read once so that the checks are pure functions
/// (and the unit tests can feed them a tree that disagrees).
#[derive(Clone, Debug)]
pub struct Tree {
    /// (crate, version) of the four crates that are packaged.
    pub crates: Vec<(String, String)>,
    /// (package, its Debian version (deb.rs), its changelog's newest entry).
    pub packages: Vec<(Package, String, Entry)>,
    /// debian/changelog's newest entry: the source package's, at the release's version.
    pub source: Entry,
    pub dkms_template: String,
    /// The root Cargo.toml, whose `[workspace.dependencies]` pin the two path crates' versions.
    pub workspace_manifest: String,
    /// CHANGELOG.md, and every entry of debian/changelog, of the library line's package
    /// changelogs (file, entries) and of mtgdrdrv-dkms's.
    pub changelog_md: String,
    pub source_entries: Vec<Entry>,
    pub library_entries: crate::changelog::Changelogs,
    pub driver_entries: Vec<Entry>,
    /// README.md and docs/releasing.md, which both state the compatibility promise.
    pub readme: String,
    pub releasing: String,
}

impl Tree {
    pub fn load(ws: &Workspace) -> Result<Tree> {
        let root = paths::root();
        let mut crates = Vec::new();
        for name in ["mtgdrdrv", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy-meta"] {
            crates.push((name.to_owned(), ws.krate(name)?.version.clone()));
        }
        let source = Entry::read(&root.join("debian/changelog"))?;
        let revision = source.revision()?;
        let mut packages = Vec::new();
        let mut library_entries = Vec::new();
        let mut driver_entries = Vec::new();
        for package in Package::SPLIT.into_iter().chain([Package::Bundle]) {
            let version = package_version(ws, package, revision)?;
            packages.push((package, version, Entry::read(&package.changelog())?));
            let all = Entry::read_all(&package.changelog())?;
            if package == Package::Kmod {
                driver_entries = all;
            } else {
                let file = format!("debian/{}.changelog", package.stage_name());
                library_entries.push((file, all));
            }
        }
        Ok(Tree {
            crates,
            packages,
            source,
            dkms_template: fs::read_to_string(root.join("dkms/dkms.conf.in"))?,
            workspace_manifest: fs::read_to_string(root.join("Cargo.toml"))?,
            changelog_md: fs::read_to_string(root.join("CHANGELOG.md"))?,
            source_entries: Entry::read_all(&root.join("debian/changelog"))?,
            library_entries,
            driver_entries,
            readme: fs::read_to_string(root.join("README.md"))?,
            releasing: fs::read_to_string(root.join("docs/releasing.md"))?,
        })
    }

    fn crate_version(&self, name: &str) -> &str {
        self.crates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    }
}

/// The source package's name (debian/control).
const SOURCE: &str = "mtgdrcopy";

/// Checks the newest entry of a package's changelog: the source package's name (dpkg-gencontrol
/// reads debian/<package>.changelog and refuses another) and the package's version.
pub fn changelog_entry(package: Package, version: &str, entry: &Entry) -> Result<(), String> {
    if entry.source == SOURCE && entry.version == version {
        return Ok(());
    }
    Err(format!(
        "debian/{}.changelog: the newest entry is {} {}, but the package is {} {version}: add \
         an entry for this version (source {SOURCE})",
        package.stage_name(),
        entry.source,
        entry.version,
        package.deb_name()
    ))
}

/// The package's Debian version: its crate's version and the source package's `revision`
/// (`debian::revision`).
pub fn package_version(ws: &Workspace, package: Package, revision: &str) -> Result<String> {
    let krate = ws.krate(package.crate_name())?;
    let bundle = if package == Package::Bundle {
        "+bundle"
    } else {
        ""
    };
    Ok(format!(
        "{}-{revision}{bundle}",
        upstream_version(&krate.version)
    ))
}

/// A crate version as a Debian upstream version: a semver pre-release (`1.1.0-beta.1`) sorts
/// before its release only written with `~` (`1.1.0~beta.1`).
pub fn upstream_version(version: &str) -> String {
    match version.split_once('-') {
        Some((main, pre)) => format!("{main}~{pre}"),
        None => version.to_owned(),
    }
}

/// Every disagreement in `tree`, each a sentence saying which files disagree and how.
pub fn disagreements(tree: &Tree) -> Vec<String> {
    let mut findings = Vec::new();
    let driver_version = tree.crate_version("mtgdrdrv");
    let library_version = tree.crate_version("libgdrapi");

    for name in ["mtgdrcopy-tests", "mtgdrcopy-meta"] {
        let version = tree.crate_version(name);
        if version != library_version {
            findings.push(format!(
                "{name} is {version}, but it is released with libgdrapi {library_version}: \
                 give it the library's version"
            ));
        }
    }

    // dkms.conf must take its version from the crate, never state one.
    let package_version: Vec<&str> = tree
        .dkms_template
        .lines()
        .filter(|l| l.trim_start().starts_with("PACKAGE_VERSION="))
        .collect();
    if package_version != ["PACKAGE_VERSION=\"@VERSION@\""] {
        findings.push(format!(
            "dkms/dkms.conf.in: PACKAGE_VERSION must be exactly \"@VERSION@\" (filled in from \
             mtgdrdrv/Cargo.toml), found {package_version:?}"
        ));
    }

    for (name, version) in [("mtgdrdrv", driver_version), ("libgdrapi", library_version)] {
        let line = tree
            .workspace_manifest
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} = {{")));
        let pinned = line.and_then(|l| {
            let (_, rest) = l.split_once("version = \"")?;
            rest.split('"').next()
        });
        if pinned != Some(version) {
            findings.push(format!(
                "Cargo.toml: [workspace.dependencies] {name} has version {pinned:?}, but the \
                 crate is {version}"
            ));
        }
    }

    for (package, version, entry) in &tree.packages {
        findings.extend(changelog_entry(*package, version, entry).err());
    }
    let release = tree.crate_version("mtgdrcopy-meta");
    let source = tree.source.version.as_str();
    let upstream = source.rsplit_once('-').map_or(source, |(u, _)| u);
    if upstream != upstream_version(release) {
        findings.push(format!(
            "debian/changelog: the newest entry is {source:?}, but the release (mtgdrcopy-meta) \
             is {release}: add an entry for {release}-1"
        ));
    }

    findings.extend(crate::changelog::findings(
        &tree.changelog_md,
        &tree.source_entries,
        &tree.library_entries,
        &tree.driver_entries,
    ));
    findings.extend(promise_findings(&tree.readme, &tree.releasing));
    findings
}

/// How the paragraph stating the compatibility promise begins, in README.md and
/// docs/releasing.md alike.
pub const PROMISE: &str = "**Compatibility promise.**";

/// The promise's paragraph in `text`, its lines joined with spaces; an error unless there is
/// exactly one.
fn promise_paragraph(file: &str, text: &str) -> Result<String, String> {
    let paragraphs: Vec<String> = text
        .split("\n\n")
        .filter(|p| p.trim_start().starts_with(PROMISE))
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    match paragraphs.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "{file} must state the compatibility promise once, in a paragraph beginning \
             {PROMISE:?}; found {}",
            paragraphs.len()
        )),
    }
}

/// The promise: once in each file, in the same words, and the one libgdrapi/src/version.rs
/// enforces (every driver 0.x from 0.1.0 on).
pub fn promise_findings(readme: &str, releasing: &str) -> Vec<String> {
    let (readme, releasing) = match (
        promise_paragraph("README.md", readme),
        promise_paragraph("docs/releasing.md", releasing),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => return [a.err(), b.err()].into_iter().flatten().collect(),
    };
    let mut findings = Vec::new();
    if readme != releasing {
        findings.push(format!(
            "README.md and docs/releasing.md state the compatibility promise differently:\n    \
             {readme}\n    {releasing}"
        ));
    }
    if !readme.contains("every driver 0.x from 0.1.0 on") {
        findings.push(format!(
            "the compatibility promise no longer says \"every driver 0.x from 0.1.0 on\", which \
             libgdrapi/src/version.rs enforces: {readme}"
        ));
    }
    findings
}

/// Loads the tree and fails with every disagreement.
pub fn check(ws: &Workspace) -> Result<()> {
    let tree = Tree::load(ws)?;
    let findings = disagreements(&tree);
    ensure!(
        findings.is_empty(),
        "versions disagree:\n  {}",
        findings.join("\n  ")
    );
    eprintln!(
        "    versions agree: driver {} (mtgdrdrv-dkms {}), library {} ({} packages)",
        tree.crate_version("mtgdrdrv"),
        tree.packages[0].1,
        tree.crate_version("libgdrapi"),
        tree.packages.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changelog(name: &str, version: &str) -> Entry {
        Entry {
            source: name.into(),
            version: version.into(),
            distribution: "unstable".into(),
            maintainer: "Dev <dev@example.org>".into(),
            // 1970-01-01, CHANGELOG.md's date in `agreeing`.
            timestamp: "0".into(),
            ..Entry::default()
        }
    }

    /// A tree where everything agrees: driver 0.3.1, library 1.2.0.
    fn agreeing() -> Tree {
        let packages = [
            (Package::Kmod, "0.3.1-1"),
            (Package::Lib, "1.2.0-1"),
            (Package::Tests, "1.2.0-1"),
            (Package::Meta, "1.2.0-1"),
            (Package::Bundle, "1.2.0-1+bundle"),
        ]
        .into_iter()
        .map(|(p, v)| (p, v.to_owned(), changelog(SOURCE, v)))
        .collect();
        Tree {
            crates: [
                ("mtgdrdrv", "0.3.1"),
                ("libgdrapi", "1.2.0"),
                ("mtgdrcopy-tests", "1.2.0"),
                ("mtgdrcopy-meta", "1.2.0"),
            ]
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
            packages,
            source: changelog("mtgdrcopy", "1.2.0-1"),
            dkms_template: "PACKAGE_NAME=\"mtgdrdrv\"\nPACKAGE_VERSION=\"@VERSION@\"\n".into(),
            workspace_manifest: "[workspace.dependencies]\n\
                                 mtgdrdrv = { path = \"mtgdrdrv\", version = \"0.3.1\" }\n\
                                 libgdrapi = { path = \"libgdrapi\", version = \"1.2.0\" }\n"
                .into(),
            changelog_md: "## [1.2.0] - 1970-01-01\n\nWith mtgdrdrv 0.3.1.\n\n[1.2.0]: u\n".into(),
            source_entries: vec![changelog("mtgdrcopy", "1.2.0-1")],
            library_entries: vec![(
                "debian/libgdrapi.changelog".into(),
                vec![changelog(SOURCE, "1.2.0-1")],
            )],
            driver_entries: vec![changelog(SOURCE, "0.3.1-1")],
            readme: format!(
                "# R\n\n{PROMISE} Library 1.x works with\nevery driver 0.x from 0.1.0 on.\n"
            ),
            releasing: format!(
                "x\n\n{PROMISE} Library 1.x works\nwith every driver 0.x from 0.1.0 on.\n\ny"
            ),
        }
    }

    /// `change` must produce a finding mentioning `needle`.
    fn disagrees(change: impl FnOnce(&mut Tree), needle: &str) {
        let mut tree = agreeing();
        change(&mut tree);
        let findings = disagreements(&tree);
        assert!(
            findings.iter().any(|f| f.contains(needle)),
            "no finding mentions {needle:?}: {findings:#?}"
        );
    }

    fn set_crate(tree: &mut Tree, name: &str, version: &str) {
        for (n, v) in &mut tree.crates {
            if n == name {
                *v = version.to_owned();
            }
        }
    }

    #[test]
    fn an_agreeing_tree_has_no_findings() {
        assert_eq!(disagreements(&agreeing()), Vec::<String>::new());
    }

    #[test]
    fn the_real_tree_agrees() {
        let ws = Workspace::load().unwrap();
        let tree = Tree::load(&ws).unwrap();
        assert_eq!(disagreements(&tree), Vec::<String>::new());
    }

    #[test]
    fn each_disagreement_is_found() {
        disagrees(
            |t| set_crate(t, "mtgdrcopy-tests", "1.2.1"),
            "mtgdrcopy-tests is 1.2.1",
        );
        disagrees(
            |t| set_crate(t, "mtgdrcopy-meta", "1.3.0"),
            "mtgdrcopy-meta is 1.3.0",
        );
        disagrees(
            |t| t.dkms_template = t.dkms_template.replace("@VERSION@", "0.3.1"),
            "dkms/dkms.conf.in",
        );
        disagrees(
            |t| t.workspace_manifest = t.workspace_manifest.replace("\"0.3.1\"", "\"0.3.0\""),
            "[workspace.dependencies] mtgdrdrv",
        );
        disagrees(
            |t| t.packages[1].2 = changelog("mtgdrcopy", "1.1.0-1"),
            "debian/libgdrapi.changelog: the newest entry is mtgdrcopy 1.1.0-1,",
        );
        disagrees(
            |t| t.packages[4].2 = changelog("mtgdrcopy", "1.2.0-1"),
            "debian/mtgdrcopy-bundle.changelog",
        );
        disagrees(
            |t| t.packages[0].2 = changelog("mtgdrdrv-dkms", "0.3.1-1"),
            "debian/mtgdrdrv-dkms.changelog",
        );
        disagrees(
            |t| t.changelog_md = t.changelog_md.replace("1.2.0]", "1.1.0]"),
            "CHANGELOG.md's releases",
        );
        disagrees(
            |t| t.releasing = t.releasing.replace("works\nwith", "works only with"),
            "state the compatibility promise differently",
        );
        disagrees(
            |t| t.readme = t.readme.replace(PROMISE, "Promise:"),
            "README.md must state the compatibility promise once",
        );
        disagrees(
            |t| t.readme.push_str(&format!("\n{PROMISE} again\n")),
            "README.md must state the compatibility promise once",
        );
        disagrees(
            |t| {
                t.readme = t.readme.replace("0.1.0 on", "0.2.0 on");
                t.releasing = t.releasing.replace("0.1.0 on", "0.2.0 on");
            },
            "no longer says",
        );
    }
}
