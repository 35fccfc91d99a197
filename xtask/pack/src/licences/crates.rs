//! The crates to cover, from `cargo metadata --locked`: what the product crates reach on every
//! platform, and which of them each binary package links.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;
use xshell::{cmd, Shell};

use super::{Dep, Usage};
use xtask_base::paths::PRODUCTS;

/// The crates whose code the binary packages carry; each package is named after its crate.
const LINKED: [&str; 2] = ["libgdrapi", "mtgdrcopy-tests"];

/// The architectures the packages are built for: which platform-specific dependencies they link.
pub(super) const TARGETS: [&str; 2] = [
    "x86_64-unknown-linux-gnu",
    xtask_base::targets::AARCH64.triple,
];

pub(super) fn metadata(sh: &Shell, target: Option<&str>) -> Result<Value> {
    let filter = target.map(|t| format!("--filter-platform={t}"));
    let json = cmd!(
        sh,
        "cargo metadata --format-version 1 --locked --offline {filter...}"
    )
    .quiet()
    .read()
    .context("running cargo metadata --locked (is Cargo.lock up to date?)")?;
    serde_json::from_str(&json).context("parsing cargo metadata")
}

/// `cargo metadata`'s resolve graph.
struct Graph<'a> {
    packages: HashMap<&'a str, &'a Value>,
    /// Package id to (dependency id, whether a normal dependency).
    edges: HashMap<&'a str, Vec<(&'a str, bool)>>,
    members: HashMap<&'a str, &'a str>,
}

impl<'a> Graph<'a> {
    fn new(meta: &'a Value) -> Result<Graph<'a>> {
        let text = |v: &'a Value, key: &str| -> Result<&'a str> {
            v[key]
                .as_str()
                .with_context(|| format!("cargo metadata: an entry without {key}"))
        };
        let mut packages = HashMap::new();
        for p in meta["packages"].as_array().into_iter().flatten() {
            packages.insert(text(p, "id")?, p);
        }
        let mut edges = HashMap::new();
        let nodes = meta["resolve"]["nodes"]
            .as_array()
            .context("cargo metadata has no resolve graph")?;
        for node in nodes {
            let mut deps = Vec::new();
            for d in node["deps"].as_array().into_iter().flatten() {
                let normal = d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null());
                deps.push((text(d, "pkg")?, normal));
            }
            edges.insert(text(node, "id")?, deps);
        }
        let mut members = HashMap::new();
        for id in meta["workspace_members"].as_array().into_iter().flatten() {
            let id = id
                .as_str()
                .context("cargo metadata: bad workspace_members")?;
            let p = packages
                .get(id)
                .context("cargo metadata: a member without package")?;
            members.insert(text(p, "name")?, id);
        }
        Ok(Graph {
            packages,
            edges,
            members,
        })
    }

    fn member(&self, name: &str) -> Result<&'a str> {
        self.members
            .get(name)
            .copied()
            .with_context(|| format!("the workspace has no crate {name}"))
    }

    fn is_proc_macro(&self, id: &str) -> bool {
        self.packages.get(id).is_some_and(|p| {
            p["targets"].as_array().into_iter().flatten().any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "proc-macro"))
            })
        })
    }

    /// What `roots` reach; `linked`: only what ends up in their binaries (normal
    /// dependencies, not into procedural macros, which run in the compiler).
    fn reach(&self, roots: &[&'a str], linked: bool) -> BTreeSet<&'a str> {
        let mut seen = BTreeSet::new();
        let mut todo = roots.to_vec();
        while let Some(id) = todo.pop() {
            if (linked && self.is_proc_macro(id)) || !seen.insert(id) {
                continue;
            }
            for (dep, normal) in self.edges.get(id).into_iter().flatten() {
                if *normal || !linked {
                    todo.push(dep);
                }
            }
        }
        seen
    }
}

/// The crates to cover, sorted by name and version. `all`: metadata for every platform;
/// `per_target`: for each of [`TARGETS`].
pub(super) fn dependencies(all: &Value, per_target: &[Value]) -> Result<Vec<Dep>> {
    let graph = Graph::new(all)?;
    let roots = PRODUCTS
        .iter()
        .map(|n| graph.member(n))
        .collect::<Result<Vec<_>>>()?;
    let mut built = BTreeSet::new();
    let mut linked: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    for meta in per_target {
        let g = Graph::new(meta)?;
        let roots = PRODUCTS
            .iter()
            .map(|n| g.member(n))
            .collect::<Result<Vec<_>>>()?;
        built.extend(g.reach(&roots, false).into_iter().map(String::from));
        for package in LINKED {
            for id in g.reach(&[g.member(package)?], true) {
                linked.entry(id.to_string()).or_default().insert(package);
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
        if p["source"].is_null() {
            continue;
        }
        let text = |key: &str| p[key].as_str().map(String::from);
        let name = text("name").context("cargo metadata: a package without name")?;
        let manifest = text("manifest_path").context("cargo metadata: no manifest_path")?;
        let usage = match linked.get(id) {
            Some(packages) => Usage::Linked(packages.iter().copied().collect()),
            None if built.contains(id) => Usage::Build,
            None => Usage::Vendored,
        };
        deps.push(Dep {
            version: text("version").context("cargo metadata: a package without version")?,
            license: text("license"),
            license_file: text("license_file"),
            authors: p["authors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(String::from))
                .collect(),
            usage,
            dir: Path::new(&manifest)
                .parent()
                .with_context(|| format!("{name}: manifest path {manifest}"))?
                .to_path_buf(),
            name,
        });
    }
    deps.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(deps)
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    /// cargo metadata of a toy workspace: `(name, proc-macro)` packages, `(from, to, kind)`
    /// edges (kind: None normal, "build", "dev").
    fn metadata(packages: &[(&str, bool)], edges: &[(&str, &str, Option<&str>)]) -> Value {
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
                    "license_file": null, "authors": [],
                    "source": if member { Value::Null } else { json!("registry+x") },
                    "manifest_path": format!("/r/{name}/Cargo.toml"),
                    "targets": [{"kind": [if proc_macro { "proc-macro" } else { "lib" }]}],
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
                    .map(|(_, to, kind)| json!({"pkg": to, "dep_kinds": [{"kind": kind}]}))
                    .collect();
                json!({"id": id, "deps": deps})
            })
            .collect();
        json!({"packages": packages, "resolve": {"nodes": nodes}, "workspace_members": members})
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
