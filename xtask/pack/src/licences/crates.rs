//! The crates to cover, from `cargo metadata --locked`: what the product crates reach on every
//! platform, and which of them each binary package links.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use cargo_metadata::{DependencyKind, Metadata, Node, Package, PackageId};

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

/// `cargo metadata`'s resolve graph.
struct Graph<'a> {
    packages: HashMap<&'a PackageId, &'a Package>,
    nodes: HashMap<&'a PackageId, &'a Node>,
    members: Vec<&'a Package>,
}

impl<'a> Graph<'a> {
    fn new(meta: &'a Metadata) -> Result<Graph<'a>> {
        let resolve = meta
            .resolve
            .as_ref()
            .context("cargo metadata has no resolve graph")?;
        Ok(Graph {
            packages: meta.packages.iter().map(|p| (&p.id, p)).collect(),
            nodes: resolve.nodes.iter().map(|n| (&n.id, n)).collect(),
            members: meta.workspace_packages(),
        })
    }

    fn member(&self, name: &str) -> Result<&'a PackageId> {
        self.members
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.id)
            .with_context(|| format!("the workspace has no crate {name}"))
    }

    fn is_proc_macro(&self, id: &PackageId) -> bool {
        self.packages
            .get(id)
            .is_some_and(|p| p.targets.iter().any(|t| t.is_proc_macro()))
    }

    /// What `roots` reach; `linked`: only what ends up in their binaries (normal
    /// dependencies, not into procedural macros, which run in the compiler).
    fn reach(&self, roots: &[&'a PackageId], linked: bool) -> BTreeSet<&'a PackageId> {
        let mut seen = BTreeSet::new();
        let mut todo = roots.to_vec();
        while let Some(id) = todo.pop() {
            if (linked && self.is_proc_macro(id)) || !seen.insert(id) {
                continue;
            }
            for dep in self.nodes.get(id).into_iter().flat_map(|n| &n.deps) {
                let normal = dep
                    .dep_kinds
                    .iter()
                    .any(|k| k.kind == DependencyKind::Normal);
                if normal || !linked {
                    todo.push(&dep.pkg);
                }
            }
        }
        seen
    }
}

/// The crates to cover, sorted by name and version. `all`: metadata for every platform;
/// `per_target`: for each of [`TARGETS`].
pub(super) fn dependencies(all: &Metadata, per_target: &[Metadata]) -> Result<Vec<Dep>> {
    let graph = Graph::new(all)?;
    let roots = PRODUCTS
        .iter()
        .map(|n| graph.member(n))
        .collect::<Result<Vec<_>>>()?;
    let mut built = BTreeSet::new();
    let mut linked: BTreeMap<PackageId, BTreeSet<&'static str>> = BTreeMap::new();
    for meta in per_target {
        let g = Graph::new(meta)?;
        let roots = PRODUCTS
            .iter()
            .map(|n| g.member(n))
            .collect::<Result<Vec<_>>>()?;
        built.extend(g.reach(&roots, false).into_iter().cloned());
        for package in LINKED {
            for id in g.reach(&[g.member(package)?], true) {
                linked.entry(id.clone()).or_default().insert(package);
            }
        }
    }
    let mut deps = Vec::new();
    for id in graph.reach(&roots, false) {
        let p = graph
            .packages
            .get(id)
            .with_context(|| format!("cargo metadata: no package {id}"))?;
        // Path crates (the workspace's own) are not vendored: the hand-written part covers them.
        if p.source.is_none() {
            continue;
        }
        let usage = match linked.get(id) {
            Some(packages) => Usage::Linked(packages.iter().copied().collect()),
            None if built.contains(id) => Usage::Build,
            None => Usage::Vendored,
        };
        deps.push(Dep {
            name: p.name.to_string(),
            version: p.version.to_string(),
            license: p.license.clone(),
            license_file: p.license_file.as_ref().map(ToString::to_string),
            authors: p.authors.clone(),
            usage,
            dir: p
                .manifest_path
                .parent()
                .with_context(|| format!("{}: manifest path {}", p.name, p.manifest_path))?
                .into(),
        });
    }
    deps.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(deps)
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
        assert_eq!(deps[0].dir, Path::new("/r/buildscript"));
    }
}
