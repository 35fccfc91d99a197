//! The crates to cover, from `cargo metadata --locked`: what the product crates reach on every
//! platform, which of them each binary package links, and who holds their copyright.

use fs_err as fs;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

use anyhow::{Context, Result};
use cargo_metadata::camino::Utf8Path;
use cargo_metadata::{DependencyKind, Metadata, Node, PackageId};

use super::{Dep, Usage};
use xtask_base::paths::PRODUCTS;

/// The crates whose code the binary packages carry; each package is named after its crate.
const LINKED: [&str; 2] = ["libgdrapi", "mtgdrcopy-tests"];

/// The architectures the packages are built for: which platform-specific dependencies they link.
pub(super) const TARGETS: [&str; 2] = [
    "x86_64-unknown-linux-gnu",
    xtask_base::targets::AARCH64.triple,
];

pub(super) fn metadata(root: &Path, target: Option<&str>) -> Result<Metadata> {
    let filter = target.map(|t| format!("--filter-platform={t}"));
    let mut options = vec!["--locked", "--offline"];
    options.extend(filter.as_deref());
    xtask_base::cargo::metadata(root, &options).context("is Cargo.lock up to date?")
}

/// The packages that the workspace crates `roots` reach in `meta`'s resolve graph; `linked`:
/// only what ends up in their binaries (normal dependencies, not into procedural macros, which
/// run in the compiler).
fn reach(meta: &Metadata, roots: &[&str], linked: bool) -> Result<BTreeSet<PackageId>> {
    let resolve = meta
        .resolve
        .as_ref()
        .context("cargo metadata: no resolve graph")?;
    let nodes: HashMap<&PackageId, &Node> = resolve.nodes.iter().map(|n| (&n.id, n)).collect();
    let proc_macros: HashSet<&PackageId> = meta
        .packages
        .iter()
        .filter(|p| p.targets.iter().any(|t| t.is_proc_macro()))
        .map(|p| &p.id)
        .collect();
    let members = meta.workspace_packages();
    let mut todo = Vec::new();
    for name in roots {
        let member = members.iter().find(|p| p.name == *name);
        let member = member.with_context(|| format!("the workspace has no crate {name}"))?;
        todo.push(&member.id);
    }
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if (linked && proc_macros.contains(id)) || !seen.insert(id.clone()) {
            continue;
        }
        for dep in nodes.get(id).into_iter().flat_map(|n| &n.deps) {
            let normal = dep
                .dep_kinds
                .iter()
                .any(|k| k.kind == DependencyKind::Normal);
            if normal || !linked {
                todo.push(&dep.pkg);
            }
        }
    }
    Ok(seen)
}

/// The crates to cover, sorted by name and version. `all`: metadata for every platform;
/// `per_target`: for each of [`TARGETS`].
pub(super) fn dependencies(all: &Metadata, per_target: &[Metadata]) -> Result<Vec<Dep>> {
    let mut built = BTreeSet::new();
    let mut linked: BTreeMap<PackageId, BTreeSet<&'static str>> = BTreeMap::new();
    for meta in per_target {
        built.extend(reach(meta, &PRODUCTS, false)?);
        for package in LINKED {
            for id in reach(meta, &[package], true)? {
                linked.entry(id).or_default().insert(package);
            }
        }
    }
    let vendored = reach(all, &PRODUCTS, false)?;
    let mut deps = Vec::new();
    // Path crates (the workspace's own) are not vendored: the hand-written part covers them.
    for p in &all.packages {
        if !vendored.contains(&p.id) || p.source.is_none() {
            continue;
        }
        let usage = match linked.get(&p.id) {
            Some(packages) => Usage::Linked(packages.iter().copied().collect()),
            None if built.contains(&p.id) => Usage::Build,
            None => Usage::Vendored,
        };
        let dir = p
            .manifest_path
            .parent()
            .context("a manifest path without parent")?;
        let mut holders = notices(dir.as_std_path(), p.license_file.as_deref())
            .with_context(|| format!("crate {} {} ({dir})", p.name, p.version))?;
        for author in &p.authors {
            if !holders.contains(author) {
                holders.push(author.clone());
            }
        }
        if holders.is_empty() {
            holders.push(format!("the {} authors", p.name));
        }
        deps.push(Dep {
            name: p.name.to_string(),
            version: p.version.to_string(),
            license: p.license.clone(),
            license_file: p.license_file.as_ref().map(ToString::to_string),
            holders,
            usage,
        });
    }
    deps.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(deps)
}

/// The copyright lines of a crate's licence files (LICENSE*, LICENCE*, COPYING*, COPYRIGHT*,
/// NOTICE*, UNLICENSE* at its top and its `license-file`), in file name order: the notices its
/// licence says to keep.
fn notices(dir: &Path, license_file: Option<&Utf8Path>) -> Result<Vec<String>> {
    let prefixes = [
        "license",
        "licence",
        "copying",
        "copyright",
        "notice",
        "unlicense",
    ];
    let mut paths = BTreeSet::new();
    if dir.is_dir() {
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_file() && prefixes.iter().any(|p| name.to_lowercase().starts_with(p)) {
                paths.insert(path);
            }
        }
    }
    paths.extend(license_file.map(|f| dir.join(f)));
    let mut found = Vec::new();
    for path in paths {
        let text = fs::read_to_string(&path)?;
        for line in copyright_lines(&text) {
            if !found.iter().any(|f| f == line) {
                found.push(line.to_string());
            }
        }
    }
    Ok(found)
}

/// The lines of a licence file that are copyright notices, not a template's placeholder
/// (Apache-2.0's appendix: `Copyright [yyyy] [name of copyright owner]`) or prose.
fn copyright_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(str::trim).filter(|line| {
        ["Copyright ", "Copyright©", "©"]
            .iter()
            .any(|p| line.starts_with(p))
            && !["Copyright and", "Copyright notice", "Copyright holder"]
                .iter()
                .any(|p| line.starts_with(p))
            && !["[yyyy]", "<year>", "[year]", "{yyyy}"]
                .iter()
                .any(|p| line.contains(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{json, Value};

    /// cargo metadata of a toy workspace: `(name, proc-macro)` packages, `(from, to, kind)`
    /// edges (kind: None normal, "build", "dev").
    fn metadata(packages: &[(&str, bool)], edges: &[(&str, &str, Option<&str>)]) -> Metadata {
        let members = [
            "mtgdrdrv",
            "libgdrapi",
            "mtgdrcopy-tests",
            "mtgdrcopy-meta",
            "xtask",
        ];
        let packages: Vec<Value> = members
            .iter()
            .map(|m| (*m, false))
            .chain(packages.iter().copied())
            .map(|(name, proc_macro)| {
                let member = members.contains(&name);
                json!({
                    "id": name, "name": name, "version": "1.0.0", "license": "MIT",
                    "license_file": null, "authors": [], "dependencies": [], "features": {},
                    "source": if member { Value::Null } else { json!("registry+x") },
                    "manifest_path": format!("/r/{name}/Cargo.toml"),
                    "targets": [{
                        "name": name, "src_path": format!("/r/{name}/src/lib.rs"),
                        "kind": [if proc_macro { "proc-macro" } else { "lib" }],
                    }],
                })
            })
            .collect();
        let nodes: Vec<Value> = packages
            .iter()
            .map(|p| {
                let id = p["id"].as_str().unwrap();
                let deps: Vec<Value> = edges
                    .iter()
                    .filter(|(from, _, _)| *from == id)
                    .map(|(_, to, kind)| {
                        json!({"name": to, "pkg": to, "dep_kinds": [{"kind": kind}]})
                    })
                    .collect();
                json!({"id": id, "deps": deps, "dependencies": []})
            })
            .collect();
        serde_json::from_value(json!({
            "packages": packages, "resolve": {"nodes": nodes}, "workspace_members": members,
            "workspace_root": "/r", "target_directory": "/r/target", "version": 1,
        }))
        .unwrap()
    }

    #[test]
    fn the_product_crates_dependencies_are_classified() {
        let packages = [
            ("linked", false),
            ("toolsonly", false),
            ("buildscript", false),
            ("derive", true),
            ("derivedep", false),
            ("devonly", false),
            ("windows", false),
            ("xtaskonly", false),
        ];
        let common = [
            ("libgdrapi", "mtgdrdrv", None),
            ("libgdrapi", "linked", None),
            ("mtgdrcopy-tests", "libgdrapi", None),
            ("mtgdrcopy-tests", "toolsonly", None),
            ("mtgdrcopy-tests", "derive", None),
            ("derive", "derivedep", None),
            ("linked", "buildscript", Some("build")),
            ("libgdrapi", "devonly", Some("dev")),
            ("xtask", "xtaskonly", None),
        ];
        let mut all_edges = common.to_vec();
        all_edges.push(("toolsonly", "windows", None));
        let all = metadata(&packages, &all_edges);
        let linux = metadata(&packages, &common);
        let deps = dependencies(&all, &[linux.clone(), linux]).unwrap();
        let got: Vec<(&str, &Usage)> = deps.iter().map(|d| (d.name.as_str(), &d.usage)).collect();
        let both = Usage::Linked(vec!["libgdrapi", "mtgdrcopy-tests"]);
        let tools = Usage::Linked(vec!["mtgdrcopy-tests"]);
        assert_eq!(
            got,
            [
                ("buildscript", &Usage::Build),
                ("derive", &Usage::Build),
                ("derivedep", &Usage::Build),
                ("devonly", &Usage::Build),
                ("linked", &both),
                ("toolsonly", &tools),
                ("windows", &Usage::Vendored),
            ]
        );
        // No licence files, no authors.
        assert_eq!(deps[0].holders, ["the buildscript authors"]);
    }

    #[test]
    fn copyright_lines_are_the_notices_not_templates() {
        let text = "MIT License\n\nCopyright (c) 2020 A\n  Copyright 2021 B <b@b>\n\
                    Copyright [yyyy] [name of copyright owner]\nCopyright notice: keep it\n\
                    (c) You must retain, in the Source form of any Derivative Works\n";
        let lines: Vec<&str> = copyright_lines(text).collect();
        assert_eq!(lines, ["Copyright (c) 2020 A", "Copyright 2021 B <b@b>"]);
    }
}
