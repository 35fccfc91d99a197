//! The README's own install commands, run as a reader runs them, in a package-test root of each
//! distribution tested here (bookworm; bullseye, glibc 2.31, with bullseye.rs):
//!
//! 1. `## Quick start`'s block: the release's files are served from the root's /tmp through a
//!    `file://` URL in place of the Releases page's prefix
//!    (`https://github.com/mtgdrcopy/mtgdrcopy/releases/download/`), everything else as
//!    written: curl, `sha256sum --check` against SHA256SUMS, `sudo apt-get install ./….deb`
//!    (DKMS builds the module for the root's kernel headers). Its verification commands (the
//!    `mtgdrcopy_*` lines) need a GPU and the module loaded; here each program must be installed
//!    and answer `--version` (debian/tests/gpu runs the packaged sanity against the module, on
//!    the VM testbed). Then the packages are purged.
//! 2. `### From the apt repository`'s block: the keyring from the same (local) release, the
//!    repository (`cargo xtask apt-repo`, signed with the test's key) at a `file:` URI in place
//!    of its published one. First a sources entry naming another key must make `apt-get update`
//!    fail (apt really checks the signature). The fingerprint `gpg --show-keys` prints must be
//!    the key's, which the release notes state (aptrepo.rs writes that line for release-check).
//! 3. `apt-get source mtgdrcopy` from the same repository (a `deb-src` entry with the same
//!    `signed-by`): apt checks each file against the signed Sources index and unpacks it
//!    (`dpkg-source --no-check -x`); then `dpkg-source --require-valid-signature
//!    --require-strong-checksums -x` on the fetched .dsc checks its signature (the test key as a
//!    trusted key) and checksums; the unpacked tree's debian/changelog names the source
//!    package's version.

use std::fs;
use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use super::root::Root;
use xtask_base::paths;
use xtask_pack::aptrepo;
use xtask_pack::deb::Built;
use xtask_pack::dsc::SourcePackage;
use xtask_pack::stage::Package;

/// The Releases page's download prefix the quick start names.
pub const RELEASES: &str = "https://github.com/mtgdrcopy/mtgdrcopy/releases/download/";
/// Where the apt repository is published, as the README names it.
pub const APT_URL: &str = aptrepo::PUBLISHED_AT;
const QUICK_START: &str = "## Quick start";
const FROM_APT: &str = "### From the apt repository";

/// Where the root finds the "Releases page" and the repository.
const LOCAL_RELEASES: &str = "/tmp/mtgdrcopy-releases/";
const LOCAL_APT: &str = "/tmp/mtgdrcopy-apt";

/// The one ```sh block of the README section under `heading` (up to the next heading of the
/// same or a higher level).
pub fn sh_block(readme: &str, heading: &str) -> Result<String> {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut lines = readme.lines().skip_while(|l| *l != heading);
    ensure!(lines.next().is_some(), "README.md has no `{heading}`");
    let section: Vec<&str> = lines
        .take_while(|l| {
            let hashes = l.chars().take_while(|&c| c == '#').count();
            !(hashes > 0 && hashes <= level && l[hashes..].starts_with(' '))
        })
        .collect();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in section {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(block), "```") => {
                blocks.push(block.join("\n"));
                current = None;
            }
            (Some(block), _) => block.push(line),
            (None, _) => {}
        }
    }
    match blocks.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "README.md's `{heading}` has {} ```sh blocks, expected one",
            blocks.len()
        ),
    }
}

/// The mtgdrcopy programs a shell line runs as commands (first word, or after `sudo`, `&&`,
/// `||`, `;`): the quick start's verification, which needs a GPU.
fn programs_run(line: &str) -> Vec<String> {
    let mut programs = Vec::new();
    let mut command_position = true;
    for word in line.split_whitespace() {
        if command_position && word.starts_with("mtgdrcopy_") {
            programs.push(word.to_owned());
        }
        command_position = matches!(word, "sudo" | "&&" | "||" | ";" | "|");
    }
    programs
}

/// `block` with `from` replaced by `to`, which it must name.
fn rewrite(block: &str, from: &str, to: &str) -> Result<String> {
    ensure!(
        block.contains(from),
        "the README block names no {from}:\n{block}"
    );
    Ok(block.replace(from, to))
}

/// The release's files as the Releases page has them for `version`: every .deb, SHA256SUMS
/// and the repository's keyring, in the root's [`LOCAL_RELEASES`]`v<version>/`.
fn put_release(sh: &Shell, root: &Root, debs: &[Built], keyring: &std::path::Path) -> Result<()> {
    let version = super::debs::find(debs, Package::Meta)?
        .version()
        .split('-')
        .next()
        .unwrap_or_default()
        .to_owned();
    let dir = root.new_file(&format!("{LOCAL_RELEASES}v{version}"));
    xtask_base::files::fresh_dir(&dir)?;
    let mut names = Vec::new();
    for deb in debs {
        let name = deb.path.file_name().context("a .deb has no name")?;
        fs::copy(&deb.path, dir.join(name))?;
        names.push(name.to_string_lossy().into_owned());
    }
    fs::copy(keyring, dir.join("mtgdrcopy-archive-keyring.gpg"))?;
    let _cwd = sh.push_dir(&dir);
    let sums = cmd!(sh, "sha256sum -- {names...}").quiet().read()?;
    fs::write(dir.join("SHA256SUMS"), format!("{sums}\n"))?;
    Ok(())
}

/// Runs `script` with bash in a fresh directory of the root; returns its output.
fn run_script(sh: &Shell, root: &Root, name: &str, script: &str) -> Result<String> {
    let dir = format!("/tmp/{name}");
    let path = format!("/tmp/{name}.sh");
    fs::create_dir_all(root.new_file(&dir))?;
    fs::write(
        root.new_file(&path),
        format!("set -euo pipefail\ncd {dir}\n{script}\n"),
    )?;
    root.run(sh, &["bash", &path])
}

/// The installed version of `package` in the root.
fn installed(sh: &Shell, root: &Root, package: &str) -> Result<String> {
    let format = "${Version}";
    root.run(sh, &["dpkg-query", "-W", "-f", format, package])
}

/// The three parts of the module doc in `root` (fresh).
pub(super) fn test(
    sh: &Shell,
    root: &Root,
    debs: &[Built],
    source: &SourcePackage,
    key: &aptrepo::TestKey,
) -> Result<()> {
    let readme = fs::read_to_string(paths::root().join("README.md"))?;
    // What the README's commands run besides apt (a host has them; a minbase root may not),
    // and dpkg-source for `apt-get source`: from the root's Debian archive, into this run's
    // upper directory only.
    root.run(sh, &["apt-get", "update", "-q"])?;
    root.apt_install(sh, &["curl", "gpg", "sudo", "dpkg-dev"])?;
    let scratch = paths::build_dir().join("pkgtest");
    let files: Vec<PathBuf> = debs.iter().map(|d| d.path.clone()).collect();
    let repo = aptrepo::build(
        sh,
        &files,
        std::slice::from_ref(&source.dsc),
        &scratch.join("apt-readme"),
        "stable",
        Some(&key.signer()),
    )?;
    let keyring = repo.keyring.clone().context("the repository is unsigned")?;
    put_release(sh, root, debs, &keyring)?;
    // Made in the upper directory, /tmp takes that directory's mode: apt's unprivileged user
    // writes there while checking signatures.
    xtask_base::files::set_mode(&root.new_file("/tmp"), 0o1777)?;
    let into = root.new_file(LOCAL_APT);
    fs::create_dir_all(&into)?;
    let from = repo.dir.join(".");
    cmd!(sh, "cp -a {from} {into}").quiet().run()?;

    // 1. The quick start.
    let block = sh_block(&readme, QUICK_START)?;
    let block = rewrite(&block, RELEASES, &format!("file://{LOCAL_RELEASES}"))?;
    let (verify, install): (Vec<&str>, Vec<&str>) =
        block.lines().partition(|l| !programs_run(l).is_empty());
    let programs: Vec<String> = verify.iter().flat_map(|l| programs_run(l)).collect();
    ensure!(!programs.is_empty(), "the quick start verifies nothing");
    run_script(sh, root, "quick-start", &install.join("\n"))?;
    for package in Package::SPLIT {
        let built = super::debs::find(debs, package)?;
        let version = installed(sh, root, package.deb_name())?;
        ensure!(
            version == built.version(),
            "after the quick start, {} {version} is installed, expected {}",
            package.deb_name(),
            built.version()
        );
    }
    for program in &programs {
        root.run(sh, &["sh", "-c", &format!("command -v {program}")])?;
        root.run(sh, &[program, "--version"])
            .with_context(|| format!("the quick start's {program}"))?;
    }
    eprintln!(
        "    quick start: downloaded, checked, installed; {} --version",
        programs.join(", ")
    );
    let mut purge = vec!["apt-get", "purge", "-y", "-q"];
    purge.extend(Package::SPLIT.iter().map(|p| p.deb_name()));
    root.run(sh, &purge)?;

    // 2. The apt repository.
    another_key_is_refused(sh, root, &repo, key)?;
    let block = sh_block(&readme, FROM_APT)?;
    let block = rewrite(&block, RELEASES, &format!("file://{LOCAL_RELEASES}"))?;
    let block = rewrite(&block, APT_URL, &format!("file:{LOCAL_APT}"))?;
    let output = run_script(sh, root, "from-apt", &block)?;
    let fingerprint = aptrepo::keyring_fingerprint(sh, &keyring)?;
    ensure!(
        output.split_whitespace().any(|w| w == fingerprint),
        "gpg --show-keys in the README's apt lines did not print the key's fingerprint \
         {fingerprint}:\n{output}"
    );
    for package in Package::SPLIT {
        let built = super::debs::find(debs, package)?;
        let version = installed(sh, root, package.deb_name())?;
        ensure!(
            version == built.version(),
            "from the apt repository, {} {version} is installed, expected {}",
            package.deb_name(),
            built.version()
        );
    }
    eprintln!("    apt repository: keyring {fingerprint}, `apt-get install mtgdrcopy`");

    // 3. apt-get source.
    apt_get_source(sh, root, key, source)
}

/// `apt-get source mtgdrcopy` through a `deb-src` entry beside the README's `deb` one.
/// apt really checks the repository's signature: a sources entry for it whose `signed-by`
/// names another key must fail `apt-get update` with NO_PUBKEY. The entry and the key are
/// removed afterwards.
fn another_key_is_refused(
    sh: &Shell,
    root: &Root,
    repo: &aptrepo::Repo,
    key: &aptrepo::TestKey,
) -> Result<()> {
    const LIST: &str = "/etc/apt/sources.list.d/stranger.list";
    const KEYRING: &str = "/tmp/stranger.gpg";
    let mut home = key.home.clone().into_os_string();
    home.push("-stranger");
    let stranger = aptrepo::TestKey::generate(sh, std::path::Path::new(&home), "stranger")?;
    fs::write(root.new_file(KEYRING), stranger.public_key(sh)?)?;
    let entry = repo.sources_line(&format!("file:{LOCAL_APT}"), "main", KEYRING);
    xtask_base::files::put_text(&root.new_file(LIST), &format!("{entry}\n"), 0o644)?;
    // Only this entry is fetched: the root's Debian lists stay as they are.
    let (ok, stdout, stderr) = root.output(
        sh,
        &[
            "apt-get",
            "update",
            "-q",
            "-o",
            &format!("Dir::Etc::SourceList={LIST}"),
            "-o",
            "Dir::Etc::SourceParts=-",
            "-o",
            "APT::Get::List-Cleanup=0",
        ],
    )?;
    root.run(sh, &["rm", "-f", LIST, KEYRING])?;
    ensure!(
        !ok && format!("{stdout}{stderr}").contains("NO_PUBKEY"),
        "apt-get update accepted the repository with a sources entry naming another key \
         (exit ok: {ok}):\n{stdout}{stderr}"
    );
    eprintln!("    apt repository: a sources entry naming another key is refused");
    Ok(())
}

fn apt_get_source(
    sh: &Shell,
    root: &Root,
    key: &aptrepo::TestKey,
    source: &SourcePackage,
) -> Result<()> {
    let list = root.read(sh, "/etc/apt/sources.list.d/mtgdrcopy.list")?;
    let deb = list
        .lines()
        .find(|l| l.starts_with("deb "))
        .context("the README's apt lines wrote no `deb` entry")?;
    fs::write(
        root.new_file("/etc/apt/sources.list.d/mtgdrcopy-src.list"),
        format!("{}\n", aptrepo::deb_src(deb)),
    )?;
    // dpkg-source verifies a .dsc's signature with gpgv against ~/.gnupg/trustedkeys.gpg.
    let trusted = root.new_file("/root/.gnupg/trustedkeys.gpg");
    fs::create_dir_all(trusted.parent().context("no parent")?)?;
    fs::write(&trusted, key.public_key(sh)?)?;
    let dsc = fs::read_to_string(&source.dsc)?;
    let field = |name: &str| -> Result<String> {
        dsc.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::to_owned)
            .with_context(|| format!("the .dsc has no {name}"))
    };
    let (name, version) = (field("Source")?, field("Version")?);
    let upstream = version.split('-').next().unwrap_or_default().to_owned();
    let output = run_script(
        sh,
        root,
        "apt-source",
        &format!("apt-get update -q\napt-get source {name} 2>&1"),
    )?;
    let wanted = format!("dpkg-source: info: extracting {name} in {name}-{upstream}");
    ensure!(
        output.contains(&wanted),
        "apt-get source {name}: no `{wanted}` in its output:\n{output}"
    );
    // apt checked each file against the signed Sources and ran `dpkg-source --no-check -x`:
    // the .dsc's own signature and checksums, as a packager checks them.
    // (dpkg-source prints nothing of gpgv's when the signature is good: without the key in
    // the trusted keyring, the same command must fail.)
    let dsc_name = source
        .dsc
        .file_name()
        .context("no .dsc name")?
        .to_string_lossy();
    let check = |into: &str| {
        format!(
            "cd /tmp/apt-source && dpkg-source --require-valid-signature \
             --require-strong-checksums -x {dsc_name} {into} 2>&1"
        )
    };
    let checked = root.run(sh, &["bash", "-c", &check("checked")])?;
    ensure!(
        !checked.contains("dpkg-source: warning"),
        "dpkg-source warned on the .dsc apt-get source fetched:\n{checked}"
    );
    root.run(
        sh,
        &["mv", "/root/.gnupg/trustedkeys.gpg", "/root/trusted.gpg"],
    )?;
    let (accepted, out, err) = root.output(sh, &["bash", "-c", &check("unchecked")])?;
    ensure!(
        !accepted,
        "dpkg-source --require-valid-signature accepted the .dsc without its key:\n{out}{err}"
    );
    let tree = format!("/tmp/apt-source/{name}-{upstream}");
    let changelog = root.read(sh, &format!("{tree}/debian/changelog"))?;
    let first = changelog.lines().next().unwrap_or_default();
    ensure!(
        first.starts_with(&format!("{name} ({version}) ")),
        "the unpacked debian/changelog starts {first:?}, expected version {version}"
    );
    for path in [
        "Cargo.toml",
        "Cargo.lock",
        "vendor",
        "debian/control",
        "libgdrapi/src",
    ] {
        ensure!(
            root.exists(sh, &format!("{tree}/{path}"))?,
            "apt-get source left no {path} in {tree}"
        );
    }
    eprintln!("    apt-get source {name}: {version}, signature and checksums verified");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "# x\n\n## Quick start\n\ntext\n\n```sh\nA\nB\n```\n\n### sub\n\n\
                          ```sh\nC\n```\n\n## Next\n\n```sh\nD\n```\n";

    #[test]
    fn blocks_are_found_under_their_heading() {
        // `### sub` is inside `## Quick start`: two blocks, refused.
        assert!(sh_block(README, "## Quick start").is_err());
        assert_eq!(sh_block(README, "### sub").unwrap(), "C");
        assert_eq!(sh_block(README, "## Next").unwrap(), "D");
        assert!(sh_block(README, "## Missing").is_err());
    }

    /// The README has the sections, one block each, naming the prefixes the test replaces.
    #[test]
    fn the_readme_blocks_name_the_release_and_the_repository() {
        let readme = fs::read_to_string(paths::root().join("README.md")).unwrap();
        let quick = sh_block(&readme, QUICK_START).unwrap();
        assert!(quick.contains(RELEASES), "{quick}");
        assert!(quick.contains("apt-get install"), "{quick}");
        let apt = sh_block(&readme, FROM_APT).unwrap();
        for wanted in [RELEASES, APT_URL, "signed-by=", "apt-get install"] {
            assert!(apt.contains(wanted), "{wanted}: {apt}");
        }
        assert!(rewrite("x", "y", "z").is_err());
    }

    #[test]
    fn verification_lines_are_told_from_downloads() {
        assert_eq!(programs_run("mtgdrcopy_sanity"), ["mtgdrcopy_sanity"]);
        assert_eq!(
            programs_run("sudo mtgdrcopy_doctor && mtgdrcopy_sanity -v"),
            ["mtgdrcopy_doctor", "mtgdrcopy_sanity"]
        );
        assert!(programs_run("for f in mtgdrcopy_1.0.0-1_all.deb; do curl -O $f; done").is_empty());
        assert!(programs_run("sudo apt-get install ./mtgdrcopy_1.0.0-1_all.deb").is_empty());
    }
}
