//! Who makes the packages and where the project lives, written in ONE place: debian/control's
//! Source paragraph (`Maintainer:`, `Homepage:`). `cargo xtask codegen` copies them to
//! debian/copyright (`Upstream-Contact:` = Maintainer, `Source:` = Homepage) and the
//! workspace's `repository` (= Homepage), so `codegen --check` catches a copy edited by hand.
//! `release-check` refuses a placeholder (example.org, *.invalid, ...) in debian/control, the
//! crates' manifests and the changelogs' newest trailers.

use fs_err as fs;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use toml_edit::{DocumentMut, Value};

use xtask_base::generated::Generated;
use xtask_base::{debian, paths};

use crate::versions::Tree;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `Name <address>`.
    pub maintainer: String,
    pub homepage: String,
}

/// The project's identity, from debian/control's Source paragraph.
pub fn identity() -> Result<Identity> {
    let path = paths::root().join("debian/control");
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (its Source paragraph is the one place of Maintainer and Homepage)",
            path.display()
        )
    })?;
    parse(&text).with_context(|| path.display().to_string())
}

fn parse(control: &str) -> Result<Identity> {
    let paragraphs = debian::parse(control)?;
    let source = paragraphs
        .first()
        .filter(|p| p.get("Source").is_some())
        .context("the first paragraph is not the Source paragraph")?;
    let field = |name: &str| -> Result<String> {
        match source.get(name) {
            Some(v) if !v.is_empty() && !v.contains('\n') => Ok(v.to_string()),
            _ => bail!("the Source paragraph needs a one-line {name} field"),
        }
    };
    let maintainer = field("Maintainer")?;
    let homepage = field("Homepage")?;
    let address = maintainer
        .strip_suffix('>')
        .and_then(|m| m.rsplit_once('<'))
        .map(|(_, address)| address);
    ensure!(
        address.and_then(host).is_some(),
        "Maintainer {maintainer:?} is not `Name <address>`"
    );
    ensure!(
        homepage.starts_with("https://") && host(&homepage).is_some(),
        "Homepage {homepage:?} is not an https:// URL"
    );
    Ok(Identity {
        maintainer,
        homepage,
    })
}

/// The host of a word that is a URL (`scheme://[user@]host[:port]/...`) or an address
/// (`user@host`), lower-case.
fn host(word: &str) -> Option<String> {
    let host = match word.split_once("://") {
        Some((_, rest)) => {
            let authority = rest.split(['/', '?', '#']).next()?;
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host)
        }
        None => word.rsplit_once('@')?.1,
    };
    let host = host.split(':').next()?.trim_end_matches('.');
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Reserved for examples and tests (RFC 2606, RFC 6761): never a real maintainer or homepage.
fn is_placeholder_host(host: &str) -> bool {
    let tld = host.rsplit('.').next().unwrap_or(host);
    let example = ["example.org", "example.com", "example.net"]
        .iter()
        .any(|d| host == *d || host.ends_with(&format!(".{d}")));
    example || ["example", "invalid", "test", "localhost"].contains(&tld)
}

/// The addresses and URLs in `text` that are on a placeholder host, with that host. A word ends
/// at a space, a comma, a quote or an angle bracket (`Name <user@host>, Other <...>`).
fn placeholders(text: &str) -> Vec<(&str, String)> {
    text.split(|c: char| c.is_whitespace() || ",<>\"'".contains(c))
        .filter_map(|word| Some((word, host(word).filter(|h| is_placeholder_host(h))?)))
        .collect()
}

/// Every maintainer address and homepage of the tree that is a placeholder, as findings:
/// debian/control's, the workspace crates' `repository` and `homepage`, and the newest trailer
/// of each changelog. debian/copyright's header needs no look: it is a copy of debian/control
/// that release-check's freshness check holds equal to it.
pub fn placeholder_findings(tree: &Tree) -> Result<Vec<String>> {
    let root = paths::root();
    let control = fs::read_to_string(root.join("debian/control"))?;
    let mut texts = vec![("debian/control".to_string(), control)];
    let changelogs = tree
        .packages
        .iter()
        .map(|(package, _, entry)| (format!("the {} changelog", package.deb_name()), entry))
        .chain([("debian/changelog".to_string(), &tree.source)]);
    for (place, entry) in changelogs {
        texts.push((format!("{place}, newest trailer"), entry.maintainer.clone()));
    }
    for p in xtask_base::cargo::metadata(&root, &["--no-deps"])?.packages {
        let values = [p.repository, p.homepage].map(Option::unwrap_or_default);
        texts.push((
            format!("{}'s repository and homepage", p.name),
            values.join(" "),
        ));
    }
    Ok(texts
        .iter()
        .flat_map(|(place, text)| {
            placeholders(text).into_iter().map(move |(word, host)| {
                format!("{place}: {word} is on the placeholder host {host}")
            })
        })
        .collect())
}

/// The workspace manifest with the identity filled in from debian/control: its `repository`
/// is the homepage.
pub fn cargo_manifest(root: &Path, identity: &Identity) -> Result<Generated> {
    let path = root.join("Cargo.toml");
    let text = fs::read_to_string(&path)?;
    let contents = set_repository(&text, &identity.homepage).context("Cargo.toml")?;
    Ok(Generated { path, contents })
}

/// `text` with `[workspace.package]`'s `repository` set to `url`, every other byte kept
/// (comments, order, the value's own spacing and trailing comment): toml_edit's format-preserving
/// document, not a line editor of our own.
fn set_repository(text: &str, url: &str) -> Result<String> {
    let mut doc: DocumentMut = text.parse().context("not valid TOML")?;
    let slot = doc
        .get_mut("workspace")
        .and_then(|w| w.get_mut("package"))
        .and_then(|p| p.get_mut("repository"))
        .context("[workspace.package] needs a `repository = \"...\"`")?;
    let old = slot
        .as_value_mut()
        .filter(|v| v.is_str())
        .context("[workspace.package] `repository` is not a string")?;
    let decor = old.decor().clone();
    *old = Value::from(url);
    *old.decor_mut() = decor;
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_recognised() {
        for value in [
            "mtgdrcopy developers <packaging@mtgdrcopy.example.org>",
            "a@example.com",
            "Dev <dev@EXAMPLE.NET.>",
            "https://example.org/x",
            "https://www.example.com:8443/repo",
            "https://user@mirror.example.net/",
            "Me <me@host.example>",
            "Me <me@pkg.invalid>",
            "http://build.test/",
            "http://localhost:8080/",
            "Me <me@localhost>",
            "https://repo.localhost",
            "Uploaders: A <a@b.org>,\n B <b@pkg.invalid>",
        ] {
            assert!(!placeholders(value).is_empty(), "{value} passed");
        }
    }

    #[test]
    fn real_addresses_pass() {
        for value in [
            "mtgdrcopy developers <mtgdrcopy@users.noreply.github.com>",
            "https://github.com/mtgdrcopy/mtgdrcopy",
            "Me <me@example.org.uk>",
            "Me <me@notexample.org>",
            "https://examples.com/",
            "https://example.organic/",
            "https://latest.testing.io/",
            "https://example.com.evil.io/",
            "Me <test@debian.org>",
            "Uploaders: A <a@b.org>,\n B <b@c.org>",
            "https://localhost.dev/",
            "not an address",
            "",
        ] {
            assert_eq!(placeholders(value), [], "{value} refused");
        }
    }

    #[test]
    fn identity_comes_from_the_source_paragraph() {
        let control = "Source: mtgdrcopy\nMaintainer: A B <a@b.org>\nHomepage: https://b.org/a\n\n\
                       Package: x\nMaintainer: other <o@o.org>\n";
        assert_eq!(
            parse(control).unwrap(),
            Identity {
                maintainer: "A B <a@b.org>".into(),
                homepage: "https://b.org/a".into()
            }
        );
        for bad in [
            "Package: x\nMaintainer: A <a@b.org>\nHomepage: https://b.org\n",
            "Source: x\nHomepage: https://b.org\n",
            "Source: x\nMaintainer: A <a@b.org>\n",
            "Source: x\nMaintainer: nobody\nHomepage: https://b.org\n",
            "Source: x\nMaintainer: A <a@b.org>\nHomepage: ftp://b.org\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_tree_reads_its_identity_from_debian_control() {
        let id = identity().unwrap();
        assert_eq!(placeholders(&id.maintainer), []);
        assert_eq!(placeholders(&id.homepage), []);
    }

    #[test]
    fn the_tree_has_no_placeholder_and_a_changelog_placeholder_is_found() {
        let ws = xtask_base::workspace::Workspace::load().unwrap();
        let mut tree = Tree::load(&ws).unwrap();
        assert_eq!(placeholder_findings(&tree).unwrap(), Vec::<String>::new());
        let name = tree.packages[0].0.deb_name();
        tree.packages[0].2.maintainer = "Packager <packaging@mtgdrcopy.example.org>".into();
        let findings = placeholder_findings(&tree).unwrap();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains(name), "{findings:?}");
        assert!(findings[0].contains("example.org"), "{findings:?}");
    }

    #[test]
    fn the_repository_is_set_in_place() {
        let text = "# top\n[workspace]\nmembers = [\"a\"]\n\n[workspace.package]\n\
                    edition = \"2021\"\nrepository   =  \"https://old.org/x\" # who\n\
                    license = \"MIT\"\n\n[package]\nrepository = \"no\"\n";
        assert_eq!(
            set_repository(text, "https://n.org/y").unwrap(),
            "# top\n[workspace]\nmembers = [\"a\"]\n\n[workspace.package]\n\
             edition = \"2021\"\nrepository   =  \"https://n.org/y\" # who\n\
             license = \"MIT\"\n\n[package]\nrepository = \"no\"\n"
        );
        // A value TOML must escape is written escaped, and reads back as given.
        let odd = "https://n.org/a\"b\\c";
        let out: DocumentMut = set_repository(text, odd).unwrap().parse().unwrap();
        assert_eq!(
            out["workspace"]["package"]["repository"].as_str(),
            Some(odd)
        );
        // No [workspace.package] repository (only another table's), or not a string: refused.
        let elsewhere =
            "[workspace.package]\nedition = \"2021\"\n\n[package]\nrepository = \"x\"\n";
        assert!(set_repository(elsewhere, "https://n.org").is_err());
        assert!(set_repository("[workspace.package]\nrepository = 1\n", "https://n.org").is_err());
        assert!(set_repository("[workspace.package\n", "https://n.org").is_err());
    }
}
