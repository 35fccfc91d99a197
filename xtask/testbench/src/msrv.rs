//! The minimum supported Rust versions (`rust-version`), kept true without a toolchain of those
//! versions (rustup here cannot fetch one). There are two:
//! - the product's: the workspace's `rust-version` (1.85, Debian trixie's rustc, which the
//!   source package builds with), taken by every member but the xtask crates: the packaged
//!   crates (mtgdrdrv, libgdrapi, mtgdrcopy-tests, mtgdrcopy-meta) and the test-only ones built
//!   next to them (testing/fuzz, testing/musa-emu, testing/emu-abi);
//! - xtask's own (it uses `File::lock`, 1.89), declared by each xtask crate (xtask and the
//!   `xtask-*` layers under it): developer tools, built with the pinned toolchain
//!   (rust-toolchain.toml), never packaged.
//!
//! Each is kept by:
//! - our code: clippy's `incompatible_msrv` lint (on by default, an error under `-D warnings`)
//!   rejects any standard library item stabilised after the crate's `rust-version`; it misses
//!   language features and `target_feature` names, which only a build with that rustc catches
//!   (the Debian package build does);
//! - our dependencies: this check. Every crate the product crates reach through normal and
//!   build dependencies (plus their own dev-dependencies: the package build runs their tests)
//!   declares a `rust-version` no newer than the product's, and every crate an xtask crate
//!   reaches none newer than that crate's (cargo would refuse to build it with that toolchain). All platforms'
//!   dependencies count, as `cargo metadata` lists them.
//! - the newest end: the arm64 steps build with Debian's rustc (cross.rs), the pinned toolchain
//!   builds everything else.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, ensure, Context, Result};
use cargo_metadata::semver::Version;
use cargo_metadata::{DependencyKind, Metadata, Node, Package, PackageId};
use xshell::Shell;

use xtask_base::paths;

/// The workspace members that may declare their own rust-version (each checked against its own
/// deps): xtask, and the crates of its layers (`xtask-base`, ...).
fn own_msrv(name: &str) -> bool {
    name == "xtask" || name.starts_with("xtask-")
}

/// One `rust-version` and the crates held to it.
#[derive(Debug, PartialEq)]
struct Checked<'a> {
    /// Whose it is: "product" or an xtask crate's name.
    whose: &'a str,
    /// As cargo_metadata reads it: `1.85` is 1.85.0, compared as numbers, not text.
    rust_version: &'a Version,
    /// How many crates (members included) it was checked against.
    crates: usize,
}

/// The rule on `cargo metadata` output; what it checked, or every violation in one error.
fn check_metadata(meta: &Metadata) -> Result<Vec<Checked<'_>>> {
    let packages: HashMap<&PackageId, &Package> =
        meta.packages.iter().map(|p| (&p.id, p)).collect();
    let package = |id: &PackageId| -> Result<&Package> {
        packages
            .get(id)
            .copied()
            .with_context(|| format!("cargo metadata: no package {id}"))
    };
    let nodes: HashMap<&PackageId, &Node> = meta
        .resolve
        .as_ref()
        .context("cargo metadata has no resolve graph")?
        .nodes
        .iter()
        .map(|n| (&n.id, n))
        .collect();
    let members = meta
        .workspace_members
        .iter()
        .map(package)
        .collect::<Result<Vec<_>>>()?;

    let (own, product): (Vec<&Package>, Vec<&Package>) =
        members.into_iter().partition(|p| own_msrv(&p.name));
    let product_versions: Vec<(&str, Option<&Version>)> = product
        .iter()
        .map(|p| (p.name.as_str(), p.rust_version.as_ref()))
        .collect();
    let msrv = match product_versions.first() {
        Some((_, Some(v))) if product_versions.iter().all(|(_, w)| *w == Some(*v)) => *v,
        _ => bail!(
            "every workspace crate but the xtask ones must take rust-version from the workspace \
             (got {product_versions:?})"
        ),
    };

    let product: Vec<&PackageId> = product.iter().map(|p| &p.id).collect();
    let mut checked = vec![("product", msrv, reachable(&nodes, &product, true)?)];
    for p in &own {
        let v = p
            .rust_version
            .as_ref()
            .with_context(|| format!("{} declares no rust-version of its own", p.name))?;
        checked.push((p.name.as_str(), v, reachable(&nodes, &[&p.id], false)?));
    }

    let mut problems = Vec::new();
    for (whose, limit, crates) in &checked {
        let mut newer = Vec::new();
        for id in crates {
            let p = package(id)?;
            if let Some(rv) = p.rust_version.as_ref().filter(|rv| rv > limit) {
                newer.push(format!("{} {} (rust-version {rv})", p.name, p.version));
            }
        }
        newer.sort();
        if !newer.is_empty() {
            problems.push(format!(
                "dependencies of the {whose} crates need a newer Rust than their rust-version \
                 {limit}: {}",
                newer.join(", ")
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(checked
        .into_iter()
        .map(|(whose, rust_version, crates)| Checked {
            whose,
            rust_version,
            crates: crates.len(),
        })
        .collect())
}

/// The crates `roots` build with: themselves and what they reach through normal and build
/// dependencies, plus, when `with_dev`, the roots' own dev-dependencies (their tests').
fn reachable<'a>(
    nodes: &HashMap<&'a PackageId, &'a Node>,
    roots: &[&'a PackageId],
    with_dev: bool,
) -> Result<HashSet<&'a PackageId>> {
    let mut seen = HashSet::new();
    let mut todo = roots.to_vec();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = nodes
            .get(id)
            .with_context(|| format!("{id} is not in the resolve graph"))?;
        let is_root = roots.contains(&id);
        for dep in &node.deps {
            let wanted = dep.dep_kinds.iter().any(|k| match k.kind {
                DependencyKind::Normal | DependencyKind::Build => true,
                DependencyKind::Development => with_dev && is_root,
                _ => false,
            });
            if wanted {
                todo.push(&dep.pkg);
            }
        }
    }
    Ok(seen)
}

/// The test step: the product's and xtask's rust-version, and no dependency needing a newer one.
pub fn check(_: &Shell) -> Result<()> {
    let meta = xtask_base::cargo::metadata(&paths::root(), &["--locked", "--offline"])?;
    for c in check_metadata(&meta)? {
        eprintln!(
            "    {} rust-version {}: {} crates, none needs a newer Rust",
            c.whose, c.rust_version, c.crates
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{json, Value};

    /// A package: (id = name, rust_version).
    fn package(name: &str, rust_version: Option<&str>) -> Value {
        json!({
            "id": name, "name": name, "version": "1.0.0", "rust_version": rust_version,
            "dependencies": [], "features": {}, "targets": [],
            "manifest_path": format!("/r/{name}/Cargo.toml"),
        })
    }

    /// Metadata of `packages`, with `members` and `deps` (from, to, kind: None, "build", "dev").
    fn metadata(
        packages: &[(&str, Option<&str>)],
        members: &[&str],
        deps: &[(&str, &str, Option<&str>)],
    ) -> Metadata {
        let nodes: Vec<Value> = packages
            .iter()
            .map(|(id, _)| {
                let deps: Vec<Value> = deps
                    .iter()
                    .filter(|(from, _, _)| from == id)
                    .map(|(_, to, kind)| {
                        json!({"name": to, "pkg": to, "dep_kinds": [{"kind": kind, "target": null}]})
                    })
                    .collect();
                json!({"id": id, "deps": deps, "dependencies": []})
            })
            .collect();
        serde_json::from_value(json!({
            "packages": packages.iter().map(|(n, v)| package(n, *v)).collect::<Vec<_>>(),
            "workspace_members": members,
            "resolve": {"nodes": nodes},
            "workspace_root": "/r", "target_directory": "/r/target", "version": 1,
        }))
        .unwrap()
    }

    /// The workspace's shape: two product crates, xtask on a newer Rust, and their deps.
    fn workspace(extra: &[(&str, Option<&str>)], deps: &[(&str, &str, Option<&str>)]) -> Metadata {
        let mut packages = vec![
            ("libgdrapi", Some("1.85")),
            ("mtgdrcopy-tests", Some("1.85")),
            ("xtask", Some("1.89")),
            ("libc", Some("1.63")),
        ];
        packages.extend_from_slice(extra);
        let mut all_deps = vec![
            ("mtgdrcopy-tests", "libgdrapi", None),
            ("libgdrapi", "libc", None),
            ("xtask", "libgdrapi", None),
        ];
        all_deps.extend_from_slice(deps);
        metadata(
            &packages,
            &["libgdrapi", "mtgdrcopy-tests", "xtask"],
            &all_deps,
        )
    }

    fn error(meta: &Metadata) -> String {
        format!("{:#}", check_metadata(meta).unwrap_err())
    }

    #[test]
    fn versions_compare_numerically() {
        // 1.100 is newer than 1.89, 1.9 older; `1.89` and `1.89.0` are the same version.
        let meta = workspace(
            &[
                ("new", Some("1.100")),
                ("old", Some("1.9")),
                ("same", Some("1.89.0")),
            ],
            &[
                ("xtask", "new", None),
                ("xtask", "old", None),
                ("xtask", "same", None),
            ],
        );
        let e = error(&meta);
        assert!(
            e.ends_with("rust-version 1.89.0: new 1.0.0 (rust-version 1.100.0)"),
            "{e}"
        );
    }

    #[test]
    fn product_and_xtask_are_checked_against_their_own() {
        // xtask needs 1.89 and so may its dependencies; the product's stay at 1.85 or older.
        let meta = workspace(
            &[("cbindgen", Some("1.89")), ("nix", Some("1.69"))],
            &[
                ("xtask", "cbindgen", None),
                ("libgdrapi", "nix", Some("build")),
            ],
        );
        let checked = check_metadata(&meta).unwrap();
        assert_eq!(
            checked,
            [
                Checked {
                    whose: "product",
                    rust_version: &Version::new(1, 85, 0),
                    crates: 4,
                },
                Checked {
                    whose: "xtask",
                    rust_version: &Version::new(1, 89, 0),
                    crates: 5,
                },
            ]
        );
    }

    #[test]
    fn product_dependencies_newer_than_the_product_are_named() {
        // Reached through a normal dependency of a dependency, and through a build dependency.
        let meta = workspace(
            &[("deep", Some("1.88.0")), ("build-tool", Some("1.86"))],
            &[
                ("libc", "deep", None),
                ("mtgdrcopy-tests", "build-tool", Some("build")),
            ],
        );
        let e = error(&meta);
        assert!(
            e.contains("product crates need a newer Rust than their rust-version 1.85.0")
                && e.contains(
                    "build-tool 1.0.0 (rust-version 1.86.0), deep 1.0.0 (rust-version 1.88.0)"
                ),
            "{e}"
        );
        assert!(!e.contains("xtask crates"), "{e}");
    }

    #[test]
    fn the_product_tests_dependencies_count_but_not_those_of_dependencies() {
        let meta = workspace(
            &[("test-helper", Some("1.87"))],
            &[("libgdrapi", "test-helper", Some("dev"))],
        );
        assert!(error(&meta).contains("test-helper 1.0.0 (rust-version 1.87.0)"));
        // A dependency's dev-dependencies are never built here.
        let meta = workspace(
            &[("test-helper", Some("1.87"))],
            &[("libc", "test-helper", Some("dev"))],
        );
        assert_eq!(check_metadata(&meta).unwrap()[0].crates, 3);
    }

    #[test]
    fn xtask_dependencies_are_held_to_xtask_rust_version() {
        let meta = workspace(
            &[("plotters", Some("1.90"))],
            &[("xtask", "plotters", None)],
        );
        let e = error(&meta);
        assert!(
            e.contains("xtask crates need a newer Rust than their rust-version 1.89.0: plotters"),
            "{e}"
        );
        assert!(!e.contains("product crates"), "{e}");
    }

    #[test]
    fn every_xtask_crate_is_checked_against_its_own() {
        // The layers under xtask are developer tools too, each with its own rust-version.
        let meta = metadata(
            &[
                ("libgdrapi", Some("1.85")),
                ("xtask", Some("1.89")),
                ("xtask-base", Some("1.89")),
                ("plotters", Some("1.89")),
            ],
            &["libgdrapi", "xtask", "xtask-base"],
            &[
                ("xtask", "xtask-base", None),
                ("xtask-base", "plotters", None),
            ],
        );
        let checked = check_metadata(&meta).unwrap();
        let whose: Vec<(&str, usize)> = checked.iter().map(|c| (c.whose, c.crates)).collect();
        assert_eq!(whose, [("product", 1), ("xtask", 3), ("xtask-base", 2)]);
    }

    #[test]
    fn crates_without_rust_version_pass() {
        let meta = workspace(&[("old", None)], &[("libgdrapi", "old", None)]);
        assert!(check_metadata(&meta).is_ok());
    }

    #[test]
    fn product_crates_must_share_the_workspace_rust_version() {
        let mut meta = workspace(&[], &[]);
        meta.packages[1].rust_version = Some(Version::new(1, 89, 0));
        assert!(error(&meta).contains("must take rust-version from the workspace"));
        let mut meta = workspace(&[], &[]);
        meta.packages[0].rust_version = None;
        meta.packages[1].rust_version = None;
        assert!(error(&meta).contains("must take rust-version from the workspace"));
    }

    #[test]
    fn xtask_must_declare_its_own() {
        let mut meta = workspace(&[], &[]);
        meta.packages[2].rust_version = None;
        assert!(error(&meta).contains("xtask declares no rust-version"));
    }
}
