//! What the shipped crates are without the test infrastructure: the packages link no crate
//! under `testing/`, and the orig tarball, which leaves `testing/` out, gets the product
//! manifests without the optional features that would pull one in (the tools' `emulator`
//! feature and the `vm` feature built on it).

use fs_err as fs;
use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use toml_edit::{DocumentMut, Item, Value};
use xshell::{cmd, Shell};

use xtask_base::{files, paths};

/// The trees only the tests use; no shipped crate may link a crate from one.
pub const TEST_TREES: &[&str] = &["testing/"];

/// The crates from [`TEST_TREES`] that the product crates link as the packages build them
/// (default features; normal and build dependencies), as `cargo tree` names them. Empty, or
/// the packages carry test infrastructure.
pub fn test_crates_linked(sh: &Shell) -> Result<Vec<String>> {
    let root = paths::root();
    let _cwd = sh.push_dir(&root);
    let products = paths::PRODUCTS.iter().flat_map(|p| ["-p", p]);
    let tree = cmd!(
        sh,
        "cargo tree --offline --locked -e normal,build --prefix none {products...}"
    )
    .quiet()
    .read()
    .context("cargo tree of the product crates")?;
    let trees: Vec<String> = TEST_TREES
        .iter()
        .map(|t| format!("({}/{t}", root.display()))
        .collect();
    let linked: BTreeSet<String> = tree
        .lines()
        .filter(|l| trees.iter().any(|t| l.contains(t.as_str())))
        .map(|l| l.trim_end_matches(" (*)").to_owned())
        .collect();
    Ok(linked.into_iter().collect())
}

/// Fails if a product crate links a crate from [`TEST_TREES`].
pub fn check_no_test_crates(sh: &Shell) -> Result<()> {
    let linked = test_crates_linked(sh)?;
    ensure!(
        linked.is_empty(),
        "the packages would link test-only crates: {}; put their use behind a cargo feature \
         the packages do not enable (as mtgdrcopy-tests' `emulator`)",
        linked.join(", ")
    );
    Ok(())
}

/// Rewrites the manifests of the tree at `dir` (the orig tarball's) as the source package
/// builds them: the workspace dependencies on crates under `left_out` go, and with them each
/// product crate's optional dependency on one, the features that enable it (and those built
/// on them) and the targets that need those features. The removed features stay known to
/// rustc (`check-cfg`): the source that tests them builds without a warning.
pub fn prune_test_features(dir: &Path, left_out: &[&str]) -> Result<()> {
    let manifest = dir.join("Cargo.toml");
    let mut doc = read(&manifest)?;
    let deps = doc["workspace"]["dependencies"]
        .as_table_like_mut()
        .context("Cargo.toml: no workspace dependencies")?;
    let gone: BTreeSet<String> = deps
        .iter()
        .filter(|(_, dep)| {
            dep.get("path")
                .and_then(|p| p.as_str())
                .is_some_and(|p| left_out.iter().any(|l| format!("{p}/").starts_with(l)))
        })
        .map(|(name, _)| name.to_owned())
        .collect();
    for name in &gone {
        deps.remove(name);
    }
    files::put_text(&manifest, &doc.to_string(), 0o644)?;
    for product in paths::PRODUCTS {
        prune_crate(&dir.join(product).join("Cargo.toml"), &gone)?;
    }
    Ok(())
}

fn read(manifest: &Path) -> Result<DocumentMut> {
    fs::read_to_string(manifest)?
        .parse()
        .with_context(|| format!("parsing {}", manifest.display()))
}

/// One product crate's manifest without the dependencies in `gone` and what needs them.
fn prune_crate(manifest: &Path, gone: &BTreeSet<String>) -> Result<()> {
    let mut doc = read(manifest)?;
    for table in ["dev-dependencies", "build-dependencies"] {
        if let Some(name) = doc
            .get(table)
            .and_then(|t| t.as_table_like())
            .and_then(|t| {
                t.iter()
                    .map(|(n, _)| n.to_owned())
                    .find(|n| gone.contains(n))
            })
        {
            bail!("{}: [{table}] {name} is test-only", manifest.display());
        }
    }
    let mut dropped_deps = Vec::new();
    if let Some(deps) = doc
        .get_mut("dependencies")
        .and_then(|t| t.as_table_like_mut())
    {
        for name in gone {
            if let Some(dep) = deps.get(name) {
                ensure!(
                    dep.get("optional").and_then(|o| o.as_bool()) == Some(true),
                    "{}: the product links the test-only crate {name}",
                    manifest.display()
                );
                deps.remove(name);
                dropped_deps.push(name.clone());
            }
        }
    }
    if dropped_deps.is_empty() {
        return Ok(());
    }
    let features = removed_features(&doc, &dropped_deps);
    if let Some(table) = doc.get_mut("features").and_then(|t| t.as_table_like_mut()) {
        for f in &features {
            table.remove(f);
        }
        if table.is_empty() {
            doc.remove("features");
        }
    }
    for kind in ["bin", "test", "bench", "example"] {
        if let Some(targets) = doc.get_mut(kind).and_then(Item::as_array_of_tables_mut) {
            targets.retain(|t| {
                !t.get("required-features")
                    .and_then(|r| r.as_array())
                    .is_some_and(|r| {
                        r.iter()
                            .any(|f| f.as_str().is_some_and(|f| features.contains(f)))
                    })
            });
        }
    }
    let values = features
        .iter()
        .map(|f| format!("{f:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut check = toml_edit::Array::new();
    check.push(format!("cfg(feature, values({values}))"));
    let mut rust = toml_edit::Table::new();
    rust["unexpected_cfgs"] = toml_edit::value(inline([
        ("level", Value::from("warn")),
        ("check-cfg", Value::Array(check)),
    ]));
    let mut lints = toml_edit::Table::new();
    lints.set_implicit(true);
    lints["rust"] = Item::Table(rust);
    ensure!(
        doc.get("lints").is_none(),
        "{}: has [lints] already",
        manifest.display()
    );
    doc["lints"] = Item::Table(lints);
    files::put_text(manifest, &doc.to_string(), 0o644)
}

fn inline<const N: usize>(pairs: [(&str, Value); N]) -> toml_edit::InlineTable {
    pairs.into_iter().collect()
}

/// The features that enable one of `deps` (`dep:name`, `name/feature`, `name?/feature`) and,
/// to a fixed point, those that enable a removed feature.
fn removed_features(doc: &DocumentMut, deps: &[String]) -> BTreeSet<String> {
    let Some(table) = doc.get("features").and_then(|t| t.as_table_like()) else {
        return BTreeSet::new();
    };
    let needs = |value: &str, removed: &BTreeSet<String>| {
        removed.contains(value)
            || deps.iter().any(|d| {
                value == format!("dep:{d}")
                    || value.starts_with(&format!("{d}/"))
                    || value.starts_with(&format!("{d}?/"))
            })
    };
    let mut removed = BTreeSet::new();
    loop {
        let more: Vec<String> = table
            .iter()
            .filter(|(name, _)| !removed.contains(*name))
            .filter(|(_, v)| {
                v.as_array().is_some_and(|a| {
                    a.iter()
                        .any(|x| x.as_str().is_some_and(|x| needs(x, &removed)))
                })
            })
            .map(|(name, _)| name.to_owned())
            .collect();
        if more.is_empty() {
            return removed;
        }
        removed.extend(more);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard: the packages' tools link no test crate (they did, mtgpu-emu-abi, until its
    /// use moved behind mtgdrcopy-tests' `emulator` feature).
    #[test]
    fn the_shipped_crates_link_no_test_crate() -> Result<()> {
        let sh = Shell::new()?;
        let linked = test_crates_linked(&sh)?;
        assert!(linked.is_empty(), "shipped crates link {linked:?}");
        Ok(())
    }

    /// The tarball's manifests, from this tree's: the tools lose the emulator plumbing and keep
    /// everything else; the workspace loses the test-only dependency.
    #[test]
    fn the_tarball_manifests_lose_the_test_only_features() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-shipped-{}", std::process::id()));
        for file in paths::PRODUCTS
            .iter()
            .map(|p| format!("{p}/Cargo.toml"))
            .chain(["Cargo.toml".to_owned()])
        {
            let to = dir.join(&file);
            fs::create_dir_all(to.parent().context("no parent")?)?;
            fs::copy(paths::root().join(&file), &to)?;
        }
        prune_test_features(&dir, TEST_TREES)?;
        let tools = read(&dir.join("mtgdrcopy-tests/Cargo.toml"))?;
        let workspace = fs::read_to_string(dir.join("Cargo.toml"))?;
        fs::remove_dir_all(&dir)?;
        assert!(tools.get("features").is_none(), "{tools}");
        assert!(tools["dependencies"].get("mtgpu-emu-abi").is_none());
        assert!(tools["dependencies"].get("libgdrapi").is_some());
        assert!(tools.get("test").is_none(), "{tools}");
        assert!(
            tools
                .to_string()
                .contains("\n[lints.rust]\nunexpected_cfgs = "),
            "{tools}"
        );
        let check = tools["lints"]["rust"]["unexpected_cfgs"]["check-cfg"].to_string();
        assert!(check.contains(r#"values("emulator", "vm")"#), "{check}");
        assert!(!workspace.contains("mtgpu-emu-abi ="), "{workspace}");
        Ok(())
    }

    #[test]
    fn a_test_only_feature_goes_with_what_builds_on_it() -> Result<()> {
        let doc: DocumentMut = "[features]\nemulator = [\"dep:emu\"]\nvm = [\"emulator\"]\n\
                                other = []\nwith = [\"emu?/x\"]\n"
            .parse()?;
        let removed = removed_features(&doc, &["emu".to_owned()]);
        assert_eq!(
            removed.into_iter().collect::<Vec<_>>(),
            ["emulator", "vm", "with"]
        );
        Ok(())
    }
}
