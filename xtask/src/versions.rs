//! One version source: the crates' versions. Everything else that states a version is either
//! generated from them or checked against them here, and [`check`] lists every disagreement at
//! once (a `cargo xtask test` step and the first check of `cargo xtask release-check`).
//!
//! Two release lines, each fed by one crate:
//! - the driver, `mtgdrdrv/Cargo.toml` (0.x): its major.minor is the version the module reports
//!   through `GDRDRV_IOC_GET_VERSION` (`mtgdrdrv/src/version.rs`, generated into
//!   `mtgdrdrv_ioctl.h`), dkms.conf's `PACKAGE_VERSION` (`@VERSION@` in `dkms/dkms.conf.in`,
//!   filled in at staging) and the `mtgdrdrv-dkms` package's version;
//! - the library, `libgdrapi/Cargo.toml` (1.x): its major.minor is `GDR_API_MAJOR_VERSION` and
//!   `GDR_API_MINOR_VERSION` (`libgdrapi/src/lib.rs`, generated into `gdrapi.h`), its major the
//!   soname (`libgdrapi/build.rs`); `mtgdrcopy-tests` and the `mtgdrcopy` metapackage (and
//!   bundle) are released with it and carry the same version.
//!
//! Each package's `debian/<package>.changelog` must start with an entry for the package's
//! Debian version (staging refuses otherwise, through [`changelog_entry`]), and the two lines
//! must accept each other (the compatibility promise of README's "For release engineers").

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::paths;
use crate::stage::Package;
use crate::workspace::Workspace;

/// Everything in a tree that states a version, read once so that the checks are pure functions
/// (and the unit tests can feed them a tree that disagrees).
#[derive(Clone, Debug)]
pub struct Tree {
    /// (crate, version) of the four crates that are packaged.
    pub crates: Vec<(String, String)>,
    /// (package, its Debian version (deb.rs), its changelog's text).
    pub packages: Vec<(Package, String, String)>,
    /// debian/changelog: the source package's, at the release's (mtgdrcopy-meta's) version.
    pub source_changelog: String,
    /// `mtgdrdrv/src/version.rs`: the driver's major.minor and the oldest library it accepts.
    pub driver: (u32, u32),
    pub driver_minimum_library: (u32, u32),
    /// `libgdrapi/src/lib.rs`: the API's major.minor and the oldest driver it accepts.
    pub library: (u32, u32),
    pub library_minimum_driver: (u32, u32),
    /// The generated headers as they are on disk (codegen freshness is its own check).
    pub kmod_header: String,
    pub gdrapi_header: String,
    pub dkms_template: String,
    /// The root Cargo.toml, whose `[workspace.dependencies]` pin the two path crates' versions.
    pub workspace_manifest: String,
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

impl Tree {
    pub fn load(ws: &Workspace) -> Result<Tree> {
        let root = paths::root();
        let mut crates = Vec::new();
        for name in ["mtgdrdrv", "libgdrapi", "mtgdrcopy-tests", "mtgdrcopy-meta"] {
            crates.push((name.to_owned(), ws.krate(name)?.version.clone()));
        }
        let mut packages = Vec::new();
        for package in Package::SPLIT.into_iter().chain([Package::Bundle]) {
            let version = crate::deb::package_version(ws, package)?;
            let changelog = read(&package.changelog())?;
            packages.push((package, version, changelog));
        }
        Ok(Tree {
            crates,
            packages,
            source_changelog: read(&root.join("debian/changelog"))?,
            driver: (
                mtgdrdrv::MTGDRDRV_MAJOR_VERSION,
                mtgdrdrv::MTGDRDRV_MINOR_VERSION,
            ),
            driver_minimum_library: (
                mtgdrdrv::MINIMUM_GDR_API_MAJOR_VERSION,
                mtgdrdrv::MINIMUM_GDR_API_MINOR_VERSION,
            ),
            library: (gdrapi::GDR_API_MAJOR_VERSION, gdrapi::GDR_API_MINOR_VERSION),
            library_minimum_driver: (
                gdrapi::MINIMUM_GDRDRV_MAJOR_VERSION,
                gdrapi::MINIMUM_GDRDRV_MINOR_VERSION,
            ),
            kmod_header: read(&root.join("mtgdrdrv/kmod/mtgdrdrv_ioctl.h"))?,
            gdrapi_header: read(&root.join("libgdrapi/include/gdrapi.h"))?,
            dkms_template: read(&root.join("dkms/dkms.conf.in"))?,
            workspace_manifest: read(&root.join("Cargo.toml"))?,
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

/// `major.minor` of a semver version, if it has them.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The value of `#define NAME value` in a C header.
fn define<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| l.split_once(name).map(|(_, v)| v.trim()))
            .flatten()
    })
}

/// A header's `#define`s of a major and a minor, compared with what the Rust constants say.
fn header_pair(
    findings: &mut Vec<String>,
    file: &str,
    header: &str,
    names: (&str, &str),
    want: (u32, u32),
) {
    let got = (define(header, names.0), define(header, names.1));
    let want_text = (want.0.to_string(), want.1.to_string());
    if got != (Some(want_text.0.as_str()), Some(want_text.1.as_str())) {
        findings.push(format!(
            "{file}: {} {:?} and {} {:?}, but the Rust constants say {}.{} \
             (run `cargo xtask codegen`)",
            names.0, got.0, names.1, got.1, want.0, want.1
        ));
    }
}

/// Checks the newest entry of a package's changelog: `<package> (<version>) <dist>; ...`.
/// Used by staging too, so no .deb is built without its changelog entry.
/// The source package's name (debian/control).
const SOURCE: &str = "mtgdrcopy";

pub fn changelog_entry(package: Package, version: &str, changelog: &str) -> Result<(), String> {
    let head = changelog.lines().next().unwrap_or_default();
    // Entries carry the source package's name, whatever the binary package: dpkg-gencontrol
    // reads debian/<package>.changelog and refuses another source name.
    let expected = format!("{SOURCE} ({version}) ");
    if head.starts_with(&expected) {
        Ok(())
    } else {
        Err(format!(
            "debian/{}.changelog: the newest entry is `{head}`, but the package is {} {version}: \
             add an entry for this version",
            package.stage_name(),
            package.deb_name()
        ))
    }
}

/// The distribution of a changelog's newest entry (`unstable`, or `UNRELEASED` while a
/// release is being prepared).
pub fn changelog_distribution(changelog: &str) -> Option<&str> {
    let head = changelog.lines().next()?;
    let (_, rest) = head.split_once(") ")?;
    rest.split(';').next().map(str::trim)
}

/// The newest entry of a changelog: its head line up to and including its trailer line.
pub fn changelog_section(changelog: &str) -> Option<String> {
    let mut lines = Vec::new();
    for line in changelog.lines() {
        lines.push(line);
        if line.starts_with(" -- ") {
            return Some(lines.join("\n"));
        }
    }
    None
}

/// The driver crate's version against what the module reports.
pub fn driver_agrees(crate_version: &str, driver: (u32, u32)) -> Result<(), String> {
    if major_minor(crate_version) == Some(driver) {
        return Ok(());
    }
    Err(format!(
        "mtgdrdrv/Cargo.toml says {crate_version} but the module reports {}.{} \
         (mtgdrdrv/src/version.rs): make them agree",
        driver.0, driver.1
    ))
}

/// The library crate's version against the API version of gdrapi.h.
pub fn library_agrees(crate_version: &str, library: (u32, u32)) -> Result<(), String> {
    if major_minor(crate_version) == Some(library) {
        return Ok(());
    }
    Err(format!(
        "libgdrapi/Cargo.toml says {crate_version} but gdrapi.h's API version is {}.{} \
         (libgdrapi/src/lib.rs): make them agree",
        library.0, library.1
    ))
}

/// Whether `have` satisfies a minimum under the promise: same major, minor at least.
fn accepts(minimum: (u32, u32), have: (u32, u32)) -> bool {
    have.0 == minimum.0 && have.1 >= minimum.1
}

/// Every disagreement in `tree`, each a sentence saying which files disagree and how.
pub fn disagreements(tree: &Tree) -> Vec<String> {
    let mut findings = Vec::new();
    let driver_version = tree.crate_version("mtgdrdrv");
    let library_version = tree.crate_version("libgdrapi");

    findings.extend(driver_agrees(driver_version, tree.driver).err());
    findings.extend(library_agrees(library_version, tree.library).err());
    for name in ["mtgdrcopy-tests", "mtgdrcopy-meta"] {
        let version = tree.crate_version(name);
        if version != library_version {
            findings.push(format!(
                "{name} is {version}, but it is released with libgdrapi {library_version}: \
                 give it the library's version"
            ));
        }
    }

    header_pair(
        &mut findings,
        "mtgdrdrv/kmod/mtgdrdrv_ioctl.h",
        &tree.kmod_header,
        ("MTGDRDRV_MAJOR_VERSION", "MTGDRDRV_MINOR_VERSION"),
        tree.driver,
    );
    let string = format!("\"{}.{}\"", tree.driver.0, tree.driver.1);
    let got = define(&tree.kmod_header, "MTGDRDRV_VERSION_STRING");
    if got != Some(string.as_str()) {
        findings.push(format!(
            "mtgdrdrv/kmod/mtgdrdrv_ioctl.h: MTGDRDRV_VERSION_STRING (MODULE_VERSION) is \
             {got:?}, expected {string} (run `cargo xtask codegen`)"
        ));
    }
    header_pair(
        &mut findings,
        "libgdrapi/include/gdrapi.h",
        &tree.gdrapi_header,
        ("GDR_API_MAJOR_VERSION", "GDR_API_MINOR_VERSION"),
        tree.library,
    );
    header_pair(
        &mut findings,
        "libgdrapi/include/gdrapi.h",
        &tree.gdrapi_header,
        (
            "MINIMUM_GDRDRV_MAJOR_VERSION",
            "MINIMUM_GDRDRV_MINOR_VERSION",
        ),
        tree.library_minimum_driver,
    );

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

    for (package, version, changelog) in &tree.packages {
        findings.extend(changelog_entry(*package, version, changelog).err());
    }
    let release = tree.crate_version("mtgdrcopy-meta");
    let source = crate::debian::changelog_version(&tree.source_changelog).unwrap_or_default();
    let upstream = source.rsplit_once('-').map_or(source, |(u, _)| u);
    if upstream != crate::deb::upstream_version(release) {
        findings.push(format!(
            "debian/changelog: the newest entry is {source:?}, but the release (mtgdrcopy-meta)              is {release}: add an entry for {release}-1"
        ));
    }

    // The promise: this release's library accepts this release's driver and the reverse.
    if !accepts(tree.library_minimum_driver, tree.driver) {
        findings.push(format!(
            "libgdrapi needs a driver {}.{} or newer within its major, but this release's \
             driver is {}.{}",
            tree.library_minimum_driver.0,
            tree.library_minimum_driver.1,
            tree.driver.0,
            tree.driver.1
        ));
    }
    if !accepts(tree.driver_minimum_library, tree.library) {
        findings.push(format!(
            "mtgdrdrv accepts libraries {}.{} or newer within their major, but this release's \
             library is {}.{}",
            tree.driver_minimum_library.0,
            tree.driver_minimum_library.1,
            tree.library.0,
            tree.library.1
        ));
    }
    findings
}

/// Loads the tree and fails with every disagreement.
pub fn check(ws: &Workspace) -> Result<()> {
    let tree = Tree::load(ws)?;
    let findings = disagreements(&tree);
    if !findings.is_empty() {
        bail!("versions disagree:\n  {}", findings.join("\n  "));
    }
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

    fn changelog(name: &str, version: &str) -> String {
        format!(
            "{name} ({version}) unstable; urgency=medium\n\n  * Release.\n\n \
             -- Dev <dev@example.org>  Mon, 30 Nov 2026 10:30:00 +0000\n\n\
             {name} (0.0.1-1) unstable; urgency=medium\n\n  * Old.\n\n \
             -- Dev <dev@example.org>  Sun, 29 Nov 2026 10:30:00 +0000\n"
        )
    }

    /// A tree where everything agrees: driver 0.3, library 1.2.
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
            source_changelog: changelog("mtgdrcopy", "1.2.0-1"),
            driver: (0, 3),
            driver_minimum_library: (1, 0),
            library: (1, 2),
            library_minimum_driver: (0, 2),
            kmod_header: "#define MTGDRDRV_MAJOR_VERSION 0\n#define MTGDRDRV_MINOR_VERSION 3\n\
                          #define MTGDRDRV_VERSION_STRING \"0.3\"\n"
                .into(),
            gdrapi_header: "#define GDR_API_MAJOR_VERSION 1\n#define GDR_API_MINOR_VERSION 2\n\
                            #define MINIMUM_GDRDRV_MAJOR_VERSION 0\n\
                            #define MINIMUM_GDRDRV_MINOR_VERSION 2\n"
                .into(),
            dkms_template: "PACKAGE_NAME=\"mtgdrdrv\"\nPACKAGE_VERSION=\"@VERSION@\"\n".into(),
            workspace_manifest: "[workspace.dependencies]\n\
                                 mtgdrdrv = { path = \"mtgdrdrv\", version = \"0.3.1\" }\n\
                                 libgdrapi = { path = \"libgdrapi\", version = \"1.2.0\" }\n"
                .into(),
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
        let sh = xshell::Shell::new().unwrap();
        let ws = Workspace::load(&sh).unwrap();
        let tree = Tree::load(&ws).unwrap();
        assert_eq!(disagreements(&tree), Vec::<String>::new());
    }

    #[test]
    fn each_disagreement_is_found() {
        disagrees(|t| t.driver = (0, 4), "mtgdrdrv/Cargo.toml says 0.3.1");
        disagrees(|t| t.library = (1, 3), "libgdrapi/Cargo.toml says 1.2.0");
        disagrees(
            |t| set_crate(t, "mtgdrcopy-tests", "1.2.1"),
            "mtgdrcopy-tests is 1.2.1",
        );
        disagrees(
            |t| set_crate(t, "mtgdrcopy-meta", "1.3.0"),
            "mtgdrcopy-meta is 1.3.0",
        );
        disagrees(
            |t| t.kmod_header = t.kmod_header.replace("MINOR_VERSION 3", "MINOR_VERSION 2"),
            "MTGDRDRV_MINOR_VERSION Some(\"2\")",
        );
        disagrees(
            |t| t.kmod_header = t.kmod_header.replace("\"0.3\"", "\"0.2\""),
            "MTGDRDRV_VERSION_STRING",
        );
        disagrees(
            |t| {
                t.gdrapi_header = t
                    .gdrapi_header
                    .replace("API_MINOR_VERSION 2", "API_MINOR_VERSION 1")
            },
            "GDR_API_MINOR_VERSION Some(\"1\")",
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
            "debian/libgdrapi.changelog: the newest entry is `mtgdrcopy (1.1.0-1)",
        );
        disagrees(
            |t| t.packages[4].2 = changelog("mtgdrcopy", "1.2.0-1"),
            "debian/mtgdrcopy-bundle.changelog",
        );
        disagrees(
            |t| t.packages[0].2 = changelog("mtgdrdrv-dkms", "0.3.1-1"),
            "debian/mtgdrdrv-dkms.changelog",
        );
    }

    #[test]
    fn the_compatibility_promise_is_checked() {
        // A library that needs a newer driver than the release ships.
        disagrees(
            |t| {
                t.library_minimum_driver = (0, 4);
                t.gdrapi_header = t.gdrapi_header.replace(
                    "MINIMUM_GDRDRV_MINOR_VERSION 2",
                    "MINIMUM_GDRDRV_MINOR_VERSION 4",
                );
            },
            "libgdrapi needs a driver 0.4",
        );
        // A driver of another major.
        disagrees(
            |t| t.driver_minimum_library = (2, 0),
            "mtgdrdrv accepts libraries 2.0",
        );
    }

    #[test]
    fn changelog_sections_and_distributions() {
        let text = changelog("libgdrapi", "1.2.0-1");
        let section = changelog_section(&text).unwrap();
        assert!(section.starts_with("libgdrapi (1.2.0-1) unstable;"));
        assert!(section.ends_with("+0000"));
        assert!(!section.contains("Old."));
        assert_eq!(changelog_distribution(&text), Some("unstable"));
        let unreleased = text.replacen("unstable", "UNRELEASED", 1);
        assert_eq!(changelog_distribution(&unreleased), Some("UNRELEASED"));
        assert_eq!(
            changelog_section("libgdrapi (1.0) unstable\n  * no trailer\n"),
            None
        );
    }
}
