//! `cargo xtask release-check`: is this tree releasable? Every check runs, then one report:
//!
//! 1. versions agree (versions.rs: crates, generated headers, dkms.conf, workspace pins,
//!    changelog entries, the driver/library compatibility promise);
//! 2. each package's newest changelog entry is released (not `UNRELEASED`) and complete;
//! 3. with `--tag`, the tag is `v` + the release's version (the library line's, which the
//!    metapackage carries);
//! 4. the working tree has no uncommitted change (what is released is what is tagged);
//! 5. no maintainer address or homepage is a placeholder (example.org, *.invalid, ...:
//!    identity.rs) in debian/control, debian/copyright, the Cargo.toml files or a changelog's
//!    newest trailer;
//! 6. the generated files are fresh (`codegen --check`): the headers, debian/copyright's
//!    third-party part (from Cargo.lock) and the maintainer and homepage copied from
//!    debian/control;
//! 7. tests green: `--tests full` (the default) runs all of `cargo xtask test`, `quick` the
//!    steps without QEMU and the kernel matrix (`test --no-vm --no-matrix`: lints, unit tests,
//!    header tests, fuzz and copy-count steps, actionlint, every .deb built and lintian-clean);
//!    `none` only builds every .deb and runs lintian on them. Lintian runs in all three. The
//!    tests are skipped (and reported so) when an earlier check failed.
//!
//! With `--dist DIR` and everything green, DIR receives what a release publishes: every .deb
//! (and -dbgsym .deb), the source package (.dsc, orig and debian tarballs),
//! SHA256SUMS and RELEASE-NOTES.md (the newest changelog entry of each package); with
//! `--archive-keyring`, the apt repository's public key too, its fingerprint in the notes. The
//! release workflow attaches exactly that directory.

use fs_err as fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::workspace::Workspace;
use xtask_base::{files, paths};
use xtask_pack::stage::Package;
use xtask_pack::versions::{self, Tree};
use xtask_pack::{deb, identity};

use crate::codegen;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Tests {
    /// All of `cargo xtask test`.
    Full,
    /// `cargo xtask test --no-vm --no-matrix`.
    Quick,
    /// Only the .debs and lintian.
    None,
}

#[derive(clap::Args)]
pub struct Args {
    /// The tag being released, e.g. v1.0.0: must be `v` + the metapackage's crate version.
    #[arg(long)]
    tag: Option<String>,
    /// Which tests to run.
    #[arg(long, value_enum, default_value = "full")]
    tests: Tests,
    /// Accept uncommitted changes (for trying the check while preparing a release).
    #[arg(long)]
    allow_dirty: bool,
    /// When everything passes, write the .debs, SHA256SUMS and RELEASE-NOTES.md here.
    #[arg(long)]
    dist: Option<PathBuf>,
    /// With --dist: the apt repository's public key (the `mtgdrcopy-archive-keyring.gpg` that
    /// `cargo xtask apt-repo --sign-key` writes), published with the release, its fingerprint
    /// in the release notes: hosts take the key from the Releases page and compare.
    #[arg(long, value_name = "FILE", requires = "dist")]
    archive_keyring: Option<PathBuf>,
}

/// The release's version: the library line's, which the metapackage carries.
fn release_version(ws: &Workspace) -> Result<String> {
    Ok(ws.krate(Package::Meta.crate_name())?.version.clone())
}

/// Changelog entries that are not ready for a release.
fn unreleased(tree: &Tree) -> Vec<String> {
    let mut findings = Vec::new();
    let entries = tree
        .packages
        .iter()
        .map(|(package, _, entry)| (format!("debian/{}.changelog", package.stage_name()), entry))
        .chain([("debian/changelog".to_owned(), &tree.source)]);
    for (file, entry) in entries {
        if entry.distribution == "UNRELEASED" {
            findings.push(format!(
                "{file}: the newest entry is UNRELEASED: set its distribution (unstable)"
            ));
        }
        if entry.maintainer.is_empty() {
            findings.push(format!(
                "{file}: the newest entry has no ` -- name <email>  date` trailer"
            ));
        }
    }
    findings
}

/// The tag against the release version.
fn tag_matches(tag: &str, version: &str) -> Result<()> {
    ensure!(
        tag == format!("v{version}"),
        "tag {tag} does not name this tree's release v{version} (mtgdrcopy-meta/Cargo.toml)"
    );
    Ok(())
}

/// RELEASE-NOTES.md: the newest changelog entry of each package.
fn release_notes(tree: &Tree, version: &str) -> String {
    let mut notes = format!("# mtgdrcopy {version}\n\n");
    for (package, debian_version, entry) in &tree.packages {
        notes.push_str(&format!(
            "## {} {debian_version}{}\n\n```\n{}\n```\n\n",
            package.deb_name(),
            if *package == Package::Bundle {
                " (single package)"
            } else {
                ""
            },
            entry.changes
        ));
    }
    notes.push_str(
        "Install the split packages with `apt-get install mtgdrcopy` from the apt repository \
         (`cargo xtask apt-repo`), or these files with `apt-get install ./<file>.deb`; \
         SHA256SUMS lists their checksums.\n",
    );
    notes
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load()?;
    let tree = Tree::load(&ws)?;
    let version = release_version(&ws)?;

    // (check, its result or None when skipped, seconds)
    let mut report: Vec<(&str, Option<Result<()>>, f64)> = Vec::new();
    fn check(
        report: &mut Vec<(&'static str, Option<Result<()>>, f64)>,
        name: &'static str,
        f: &mut dyn FnMut() -> Result<()>,
    ) {
        eprintln!("==> release-check: {name}");
        let start = Instant::now();
        let result = f();
        report.push((name, Some(result), start.elapsed().as_secs_f64()));
    }
    let findings_to_result = |findings: Vec<String>| -> Result<()> {
        ensure!(findings.is_empty(), "\n  {}", findings.join("\n  "));
        Ok(())
    };

    check(&mut report, "versions agree", &mut || {
        findings_to_result(versions::disagreements(&tree))
    });
    check(&mut report, "changelog entries released", &mut || {
        findings_to_result(unreleased(&tree))
    });
    if let Some(tag) = &args.tag {
        check(&mut report, "tag names the release", &mut || {
            tag_matches(tag, &version)
        });
    }
    check(&mut report, "working tree committed", &mut || {
        let status = cmd!(sh, "git status --porcelain --untracked-files=normal")
            .quiet()
            .read()
            .context("running git status")?;
        ensure!(
            status.trim().is_empty() || args.allow_dirty,
            "uncommitted changes (commit them, or pass --allow-dirty):\n{status}"
        );
        Ok(())
    });
    check(
        &mut report,
        "no placeholder maintainer or homepage",
        &mut || findings_to_result(identity::placeholder_findings(&tree)?),
    );
    check(
        &mut report,
        "generated files fresh (headers, debian/copyright, identity)",
        &mut || codegen::run(true),
    );
    let name = match args.tests {
        Tests::Full => "tests green (cargo xtask test)",
        Tests::Quick => "tests green (cargo xtask test --no-vm --no-matrix)",
        Tests::None => ".debs built, lintian clean",
    };
    // The .debs `--tests none` builds, which --dist then publishes as they are.
    let mut built = None;
    // The tests take up to half an hour: not for a tree already known not to be releasable.
    if report.iter().any(|(_, r, _)| matches!(r, Some(Err(_)))) {
        report.push((name, None, 0.0));
    } else {
        check(&mut report, name, &mut || match args.tests {
            Tests::Full | Tests::Quick => {
                let quick = matches!(args.tests, Tests::Quick);
                xtask_testbench::runner::run(xtask_testbench::runner::Args {
                    no_vm: quick,
                    no_matrix: quick,
                    no_cross: quick,
                    ..Default::default()
                })
            }
            Tests::None => {
                let debs = deb::build_everything(&sh, &ws)?;
                deb::lintian(&sh, &debs)?;
                built = Some(debs);
                Ok(())
            }
        });
    }

    eprintln!("\nrelease-check of mtgdrcopy {version}:");
    let mut failed = Vec::new();
    for (name, result, secs) in &report {
        match result {
            Some(Ok(())) => eprintln!("  ok      {name} ({secs:.1} s)"),
            Some(Err(e)) => {
                eprintln!("  FAILED  {name} ({secs:.1} s): {e:#}");
                failed.push(*name);
            }
            None => {
                eprintln!("  skipped {name} (an earlier check failed)");
                failed.push(*name);
            }
        }
    }
    ensure!(failed.is_empty(), "not releasable: {}", failed.join(", "));
    println!("mtgdrcopy {version} is releasable");

    if let Some(dist) = args.dist {
        write_dist(&sh, &ws, built, &tree, &version, &dist)?;
        if let Some(keyring) = &args.archive_keyring {
            add_keyring(&sh, keyring, &dist)?;
        }
    }
    Ok(())
}

/// Copies every .deb of this tree's release (with the -dbgsym ones) and the source package into
/// `dist` with SHA256SUMS and RELEASE-NOTES.md. `built`: the .debs this run already built, if
/// it did.
fn write_dist(
    sh: &Shell,
    ws: &Workspace,
    built: Option<Vec<deb::Built>>,
    tree: &Tree,
    version: &str,
    dist: &std::path::Path,
) -> Result<()> {
    files::fresh_dir(dist)?;
    // The .debs as built by this run, or built now (cargo's release build is incremental) for
    // those the test runner built out of reach, rather than picked from build/, where other
    // versions may lie; the source package for distributions that build their own.
    let debs = match built {
        Some(debs) => debs,
        None => deb::build_everything(sh, ws)?,
    };
    let source = xtask_pack::dsc::build(sh)?;
    let files = debs
        .iter()
        .flat_map(|b| std::iter::once(&b.path).chain(&b.dbgsym))
        .chain([&source.dsc, &source.orig, &source.debian]);
    let mut names = Vec::new();
    for path in files {
        let name = path.file_name().context("a release file has no name")?;
        fs::copy(path, dist.join(name))?;
        names.push(name.to_string_lossy().into_owned());
    }
    names.sort();
    let _cwd = sh.push_dir(dist);
    let names_ref = &names;
    let sums = cmd!(sh, "sha256sum -- {names_ref...}").quiet().read()?;
    fs::write(dist.join("SHA256SUMS"), format!("{sums}\n"))?;
    fs::write(dist.join("RELEASE-NOTES.md"), release_notes(tree, version))?;
    eprintln!(
        "    {}: {} files (.debs, the source package), SHA256SUMS, RELEASE-NOTES.md",
        dist.display(),
        names.len()
    );
    Ok(())
}

/// The apt repository's keyring joins the release's files (and SHA256SUMS); the notes state its
/// fingerprint.
fn add_keyring(sh: &Shell, keyring: &std::path::Path, dist: &std::path::Path) -> Result<()> {
    let fingerprint = xtask_pack::aptrepo::keyring_fingerprint(sh, keyring)?;
    let name = "mtgdrcopy-archive-keyring.gpg";
    fs::copy(keyring, dist.join(name))?;
    let _cwd = sh.push_dir(dist);
    let sum = cmd!(sh, "sha256sum -- {name}").quiet().read()?;
    let sums = fs::read_to_string(dist.join("SHA256SUMS"))?;
    fs::write(dist.join("SHA256SUMS"), format!("{sums}{sum}\n"))?;
    let notes = fs::read_to_string(dist.join("RELEASE-NOTES.md"))?;
    let line = xtask_pack::aptrepo::release_notes_key_line(&fingerprint);
    fs::write(dist.join("RELEASE-NOTES.md"), format!("{notes}\n{line}"))?;
    eprintln!("    {name}: fingerprint {fingerprint}, in RELEASE-NOTES.md");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keyring joins the release's files and sums, its fingerprint the notes.
    #[test]
    fn the_archive_keyring_is_published_with_its_fingerprint() -> Result<()> {
        let sh = Shell::new()?;
        let dir = paths::build_dir().join("test-release-keyring");
        files::fresh_dir(&dir)?;
        let key = xtask_pack::aptrepo::TestKey::generate(&sh, &dir.join("gnupg"), "release")?;
        let keyring = dir.join("public.gpg");
        fs::write(&keyring, key.public_key(&sh)?)?;
        let dist = dir.join("dist");
        files::fresh_dir(&dist)?;
        fs::write(dist.join("SHA256SUMS"), "0  a.deb\n")?;
        fs::write(dist.join("RELEASE-NOTES.md"), "# mtgdrcopy 1.0.0\n")?;
        add_keyring(&sh, &keyring, &dist)?;
        let fingerprint = xtask_pack::aptrepo::keyring_fingerprint(&sh, &keyring)?;
        let notes = fs::read_to_string(dist.join("RELEASE-NOTES.md"))?;
        assert!(notes.contains(&format!("`{fingerprint}`")), "{notes}");
        let sums = fs::read_to_string(dist.join("SHA256SUMS"))?;
        assert!(
            sums.ends_with("  mtgdrcopy-archive-keyring.gpg\n"),
            "{sums}"
        );
        assert_eq!(
            fs::read(dist.join("mtgdrcopy-archive-keyring.gpg"))?,
            fs::read(&keyring)?
        );
        Ok(())
    }

    #[test]
    fn tags_name_the_release() {
        assert!(tag_matches("v1.2.0", "1.2.0").is_ok());
        assert!(tag_matches("1.2.0", "1.2.0").is_err());
        assert!(tag_matches("v1.2.1", "1.2.0").is_err());
        assert!(tag_matches("v0.1.0", "1.2.0").is_err());
    }

    #[test]
    fn unreleased_entries_are_reported() {
        let ws = Workspace::load().unwrap();
        let mut tree = Tree::load(&ws).unwrap();
        assert_eq!(unreleased(&tree), Vec::<String>::new());
        tree.packages[2].2.distribution = "UNRELEASED".into();
        let findings = unreleased(&tree);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains("debian/mtgdrcopy-tests.changelog"));
        let notes = release_notes(&tree, "1.0.0");
        assert!(notes.starts_with("# mtgdrcopy 1.0.0\n"));
        assert_eq!(notes.matches("## ").count(), 5, "{notes}");
    }
}
