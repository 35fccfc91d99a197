//! `cargo xtask apt-repo`: the .debs in build/ as an apt repository a fleet installs from
//! (`apt-get install mtgdrcopy`), in build/apt/ by default:
//!
//! ```text
//! pool/main/*.deb                      the four packages of the release
//! pool/main/*.dsc, *.tar.xz            the source package (`apt-get source mtgdrcopy`)
//! pool/bundle/*.deb                    the single-package build
//! dists/<suite>/{main,bundle}/binary-<arch>/Packages, Packages.gz
//! dists/<suite>/main/source/Sources, Sources.gz
//! dists/<suite>/Release                MD5Sum, SHA1, SHA256, SHA512 of the indices
//! dists/<suite>/InRelease, Release.gpg  with --sign-key/--gpg-homedir
//! mtgdrcopy-archive-keyring.gpg        the signing key's public part, for signed-by=
//! ```
//!
//! The indices and Release are written by apt-ftparchive (apt-utils): Debian's own tool for
//! exactly this, already trusted by every apt client, with the hash set apt expects. (No crate
//! writes Release files; dpkg-scanpackages only writes Packages.) Signing is gpg's
//! `--clearsign` and `--detach-sign`, with a key the release engineer provides; the same key
//! clearsigns the .dsc in the pool, as an uploader signs it for Debian, so that `dpkg-source -x`
//! (run by `apt-get source`) verifies it against that key too. apt itself checks each source
//! file against the hashes in Sources, which the signed Release covers.
//!
//! The bundle shares its name with the metapackage (`mtgdrcopy`) and conflicts with the split
//! packages, so it lives in its own component: a host lists `main` (split packages, the
//! default) or `bundle`, never both: with both, apt takes the bundle, whose version sorts
//! higher (1.0.0-1+bundle > 1.0.0-1), which is also how a split host moves to the bundle.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use flate2::write::GzEncoder;
use xshell::{cmd, Shell};

use crate::stage;
use xtask_base::workspace::Workspace;
use xtask_base::{files, host, paths};

mod keys;
mod sources;

pub use keys::{keyring_fingerprint, release_notes_key_line, TestKey};
pub use sources::deb_src;
use sources::put_sources;

/// Where the release engineer publishes the repository (the project's GitHub Pages), as the
/// README's apt lines name it.
pub const PUBLISHED_AT: &str = "https://mtgdrcopy.github.io/mtgdrcopy/apt";

/// What the host needs: apt-ftparchive, and gpg for signing.
pub const HOST_PACKAGES: &[&str] = &["apt-utils", "gpg"];

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the repository (it is replaced): default build/apt.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The suite (dists/<suite>), what hosts name in their sources entry.
    #[arg(long, default_value = "stable")]
    pub suite: String,
    /// Sign Release (InRelease, Release.gpg) with this key (a key id, fingerprint or user id).
    #[arg(long)]
    pub sign_key: Option<String>,
    /// The GnuPG home that holds the signing key (default: gpg's own). Given alone, signs with
    /// that home's default key.
    #[arg(long)]
    pub gpg_homedir: Option<PathBuf>,
}

/// How to sign: gpg's home and key.
#[derive(Clone, Debug, Default)]
pub struct Signer {
    pub homedir: Option<PathBuf>,
    pub key: Option<String>,
}

impl Signer {
    fn gpg_args(&self) -> Vec<String> {
        let mut args = vec!["--batch".to_owned(), "--yes".to_owned()];
        if let Some(home) = &self.homedir {
            args.extend(["--homedir".to_owned(), home.display().to_string()]);
        }
        if let Some(key) = &self.key {
            args.extend(["--local-user".to_owned(), key.clone()]);
        }
        args
    }
}

/// A .deb as the repository sees it.
#[derive(Clone, Debug)]
struct Deb {
    path: PathBuf,
    package: String,
    version: String,
    architecture: String,
}

impl Deb {
    fn read(sh: &Shell, path: &Path) -> Result<Deb> {
        let fields = cmd!(sh, "dpkg-deb -f {path} Package Version Architecture")
            .quiet()
            .read()
            .with_context(|| format!("reading the control fields of {}", path.display()))?;
        let get = |name: &str| -> Result<String> {
            fields
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .map(|v| v.trim().to_owned())
                .with_context(|| format!("{}: no {name} field", path.display()))
        };
        Ok(Deb {
            path: path.to_path_buf(),
            package: get("Package")?,
            version: get("Version")?,
            architecture: get("Architecture")?,
        })
    }

    /// The component: the single-package build (version `...+bundle`) or the release's split.
    fn component(&self) -> &'static str {
        if self.version.ends_with("+bundle") {
            "bundle"
        } else {
            "main"
        }
    }
}

/// A written repository.
#[derive(Clone, Debug)]
pub struct Repo {
    pub dir: PathBuf,
    pub suite: String,
    pub architectures: Vec<String>,
    pub components: Vec<String>,
    /// The public keyring file for `signed-by=`, when signed.
    pub keyring: Option<PathBuf>,
}

pub fn cli(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let ws = Workspace::load()?;
    let _lock = files::lock()?;
    let mut debs = Vec::new();
    for entry in fs::read_dir(paths::build_dir())
        .context("reading build/; run `cargo xtask deb-all` and `deb-bundle` first")?
    {
        let path = entry?.path();
        // Debug symbol packages belong in a debug archive of their own, not beside these.
        let dbgsym = path.to_string_lossy().contains("-dbgsym_");
        if path.extension().is_some_and(|e| e == "deb") && !dbgsym {
            debs.push(path);
        }
    }
    debs.sort();
    ensure!(
        !debs.is_empty(),
        "build/ has no .deb: run `cargo xtask deb-all` and `cargo xtask deb-bundle` first"
    );
    // A .deb of another version (left by an older checkout) must not slip into a release.
    let revision = xtask_base::debian::revision()?;
    for path in &debs {
        let deb = Deb::read(&sh, path)?;
        let expected = stage::Package::SPLIT
            .into_iter()
            .chain([stage::Package::Bundle])
            .filter(|p| p.deb_name() == deb.package)
            .map(|p| -> Result<String> { crate::versions::package_version(&ws, p, &revision) })
            .collect::<Result<Vec<_>>>()?;
        ensure!(
            expected.contains(&deb.version),
            "{} is {} {}, but this tree builds {:?}: rebuild the .debs",
            path.display(),
            deb.package,
            deb.version,
            expected
        );
    }
    let signer = (args.sign_key.is_some() || args.gpg_homedir.is_some()).then(|| Signer {
        homedir: args.gpg_homedir.clone(),
        key: args.sign_key.clone(),
    });
    let out = args.out.unwrap_or_else(|| paths::build_dir().join("apt"));
    // The source package of this tree (`cargo xtask dist-source`), for `apt-get source`.
    let source = crate::dsc::build(&sh)?;
    let repo = build(
        &sh,
        &debs,
        &[source.dsc],
        &out,
        &args.suite,
        signer.as_ref(),
    )?;
    println!("{}", repo.dir.display());
    if repo.keyring.is_none() {
        eprintln!("Unsigned (no --sign-key or --gpg-homedir): for local trials only.");
    }
    eprintln!("Published at {PUBLISHED_AT} (as the README says; else use where it is published),");
    let line = repo.sources_line(PUBLISHED_AT, "main", "/etc/apt/keyrings/mtgdrcopy.gpg");
    eprintln!("a host installs from it with this sources entry (and `apt-get install mtgdrcopy`):");
    eprintln!("{line}");
    eprintln!("and for `apt-get source mtgdrcopy`:\n{}", deb_src(&line));
    Ok(())
}

impl Repo {
    /// A one-line sources entry for `component` of this repository at `uri`.
    pub fn sources_line(&self, uri: &str, component: &str, keyring_path: &str) -> String {
        let options = if self.keyring.is_some() {
            format!("[signed-by={keyring_path}] ")
        } else {
            // An unsigned repository is for local experiments only.
            "[trusted=yes] ".to_owned()
        };
        format!("deb {options}{uri} {} {component}", self.suite)
    }
}

/// Writes the repository of `debs` and the source packages `dscs` (each .dsc with the files it
/// names beside it) into `out` (replaced), signed when `signer` is given.
pub fn build(
    sh: &Shell,
    debs: &[PathBuf],
    dscs: &[PathBuf],
    out: &Path,
    suite: &str,
    signer: Option<&Signer>,
) -> Result<Repo> {
    host::ensure_host_packages(HOST_PACKAGES)?;
    ensure!(
        !suite.is_empty()
            && suite
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "suite {suite:?}: use letters, digits, '-', '_' and '.'"
    );
    files::fresh_dir(out)?;
    let mut read = Vec::new();
    for path in debs {
        read.push(Deb::read(sh, path)?);
    }
    let mut architectures: Vec<String> = read
        .iter()
        .map(|d| d.architecture.clone())
        .filter(|a| a != "all")
        .collect();
    architectures.sort();
    architectures.dedup();
    ensure!(
        !architectures.is_empty(),
        "no architecture-specific .deb among {debs:?}: a repository needs at least one"
    );
    let mut components: Vec<String> = read.iter().map(|d| d.component().to_owned()).collect();
    components.sort();
    components.dedup();
    // main first: the component hosts use by default.
    components.sort_by_key(|c| c != "main");

    for deb in &read {
        let name = deb.path.file_name().context("a .deb without a file name")?;
        let pool = out.join("pool").join(deb.component());
        fs::create_dir_all(&pool)?;
        fs::copy(&deb.path, pool.join(name))
            .with_context(|| format!("copying {}", deb.path.display()))?;
    }

    if !dscs.is_empty() {
        put_sources(sh, dscs, &out.join("pool/main"), signer)?;
    }

    let _cwd = sh.push_dir(out);
    let dists = Path::new("dists").join(suite);
    if !dscs.is_empty() {
        let dir = dists.join("main/source");
        fs::create_dir_all(out.join(&dir))?;
        // Quiet about override files, which a repository of our own has no use for.
        let sources = cmd!(sh, "apt-ftparchive sources pool/main")
            .quiet()
            .ignore_stderr()
            .read()
            .context("running apt-ftparchive sources")?;
        write_index(&out.join(dir.join("Sources")), &format!("{sources}\n"))?;
    }
    for component in &components {
        for arch in &architectures {
            let dir = dists.join(component).join(format!("binary-{arch}"));
            fs::create_dir_all(out.join(&dir))?;
            let pool = format!("pool/{component}");
            // --arch keeps <arch> and `all` packages (by file name, which deb.rs sets).
            let packages = cmd!(sh, "apt-ftparchive --arch {arch} packages {pool}")
                .quiet()
                .read()
                .context("running apt-ftparchive packages (apt-utils)")?;
            write_index(&out.join(dir.join("Packages")), &format!("{packages}\n"))?;
        }
    }

    let conf = |key: &str, value: &str| format!("-oAPT::FTPArchive::Release::{key}={value}");
    let options = [
        conf("Origin", "mtgdrcopy"),
        conf("Label", "mtgdrcopy"),
        conf("Suite", suite),
        conf("Codename", suite),
        conf("Architectures", &architectures.join(" ")),
        conf("Components", &components.join(" ")),
        conf(
            "Description",
            "GDRCopy for Moore Threads GPUs: kernel module (DKMS), library and tools",
        ),
    ];
    let release = cmd!(sh, "apt-ftparchive {options...} release {dists}")
        .quiet()
        .read()
        .context("running apt-ftparchive release")?;
    let release_path = out.join(&dists).join("Release");
    fs::write(&release_path, format!("{release}\n"))?;

    let mut keyring = None;
    if let Some(signer) = signer {
        let gpg = signer.gpg_args();
        let gpg_ref = &gpg;
        let (inrelease, detached) = (
            out.join(&dists).join("InRelease"),
            out.join(&dists).join("Release.gpg"),
        );
        cmd!(
            sh,
            "gpg {gpg_ref...} --clearsign --output {inrelease} {release_path}"
        )
        .quiet()
        .run()
        .context("gpg --clearsign of Release (is the key there, without a passphrase prompt?)")?;
        cmd!(
            sh,
            "gpg {gpg...} --armor --detach-sign --output {detached} {release_path}"
        )
        .quiet()
        .run()
        .context("gpg --detach-sign of Release")?;
        // The public part for hosts: of the named key, or of the home's default (first) key.
        let mut export = vec!["--batch".to_owned()];
        if let Some(home) = &signer.homedir {
            export.extend(["--homedir".to_owned(), home.display().to_string()]);
        }
        let path = out.join("mtgdrcopy-archive-keyring.gpg");
        let which: Vec<String> = signer.key.iter().cloned().collect();
        let which_ref = &which;
        let public = cmd!(sh, "gpg {export...} --export {which_ref...}")
            .quiet()
            .output()
            .context("gpg --export")?;
        if public.stdout.is_empty() {
            bail!("gpg --export {which:?} gave no key");
        }
        fs::write(&path, &public.stdout)?;
        keyring = Some(path);
    }
    Ok(Repo {
        dir: out.to_path_buf(),
        suite: suite.to_owned(),
        architectures,
        components,
        keyring,
    })
}

/// An index file and its .gz beside it.
fn write_index(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text)?;
    let mut gz_path = path.as_os_str().to_owned();
    gz_path.push(".gz");
    let mut gz = GzEncoder::new(fs::File::create(&gz_path)?, flate2::Compression::best());
    gz.write_all(text.as_bytes())?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal .deb made with dpkg-deb.
    fn tiny_deb(dir: &Path, package: &str, version: &str, arch: &str) -> PathBuf {
        let tree = dir.join(format!("{package}-{arch}"));
        fs::create_dir_all(tree.join("DEBIAN")).unwrap();
        fs::write(
            tree.join("DEBIAN/control"),
            format!(
                "Package: {package}\nVersion: {version}\nArchitecture: {arch}\n\
                 Maintainer: Test <test@example.org>\nDescription: test package\n"
            ),
        )
        .unwrap();
        let deb = dir.join(format!("{package}_{version}_{arch}.deb"));
        let status = std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&tree)
            .arg(&deb)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        deb
    }

    /// A minimal native source package made with dpkg-source; returns its .dsc.
    fn tiny_source(dir: &Path) -> PathBuf {
        let tree = dir.join("tiny-1.0");
        fs::create_dir_all(tree.join("debian/source")).unwrap();
        fs::write(tree.join("debian/source/format"), "3.0 (native)\n").unwrap();
        fs::write(
            tree.join("debian/control"),
            "Source: tiny\nMaintainer: Test <test@example.org>\n\n\
             Package: tiny\nArchitecture: all\nDescription: test package\n",
        )
        .unwrap();
        fs::write(
            tree.join("debian/changelog"),
            "tiny (1.0) unstable; urgency=medium\n\n  * Test.\n\n \
             -- Test <test@example.org>  Thu, 01 Jan 2026 00:00:00 +0000\n",
        )
        .unwrap();
        let status = std::process::Command::new("dpkg-source")
            .current_dir(dir)
            .args(["-b", "tiny-1.0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        dir.join("tiny_1.0.dsc")
    }

    #[test]
    fn a_signed_repository_with_both_components() {
        let sh = Shell::new().unwrap();
        let scratch = paths::build_dir().join("test-aptrepo");
        files::fresh_dir(&scratch).unwrap();
        let debs = vec![
            tiny_deb(&scratch, "libgdrapi", "1.0.0-1", "amd64"),
            tiny_deb(&scratch, "mtgdrcopy", "1.0.0-1", "all"),
            tiny_deb(&scratch, "mtgdrcopy", "1.0.0-1+bundle", "amd64"),
        ];
        let dsc = tiny_source(&scratch);
        let key = TestKey::generate(&sh, &scratch.join("gnupg"), "repo-test").unwrap();
        let out = scratch.join("apt");
        let repo = build(&sh, &debs, &[dsc], &out, "stable", Some(&key.signer())).unwrap();
        assert_eq!(repo.components, ["main", "bundle"]);
        assert_eq!(repo.architectures, ["amd64"]);

        let main = fs::read_to_string(out.join("dists/stable/main/binary-amd64/Packages")).unwrap();
        assert!(
            main.contains("Filename: pool/main/libgdrapi_1.0.0-1_amd64.deb"),
            "{main}"
        );
        assert!(
            main.contains("Filename: pool/main/mtgdrcopy_1.0.0-1_all.deb"),
            "{main}"
        );
        assert!(!main.contains("+bundle"), "{main}");
        let bundle =
            fs::read_to_string(out.join("dists/stable/bundle/binary-amd64/Packages")).unwrap();
        assert!(bundle.contains("Version: 1.0.0-1+bundle"), "{bundle}");
        assert_eq!(bundle.matches("Package: ").count(), 1, "{bundle}");

        let release = fs::read_to_string(out.join("dists/stable/Release")).unwrap();
        for line in [
            "Suite: stable",
            "Components: main bundle",
            "Architectures: amd64",
            "SHA256:",
        ] {
            assert!(release.contains(line), "Release lacks {line}:\n{release}");
        }
        assert!(
            release.contains("main/binary-amd64/Packages.gz"),
            "{release}"
        );
        assert!(release.contains("main/source/Sources.gz"), "{release}");
        let sources = fs::read_to_string(out.join("dists/stable/main/source/Sources")).unwrap();
        assert!(
            sources.contains("Package: tiny\n")
                && sources.contains("Directory: pool/main\n")
                && sources.contains("tiny_1.0.tar.xz"),
            "{sources}"
        );
        assert!(out.join("pool/main/tiny_1.0.tar.xz").exists());

        // gpgv with only the exported keyring accepts both signatures...
        let keyring = repo.keyring.clone().unwrap();
        let dists = out.join("dists/stable");
        let gpgv = |args: &[&Path]| {
            std::process::Command::new("gpgv")
                .arg("--keyring")
                .arg(&keyring)
                .args(args)
                .output()
                .unwrap()
                .status
                .success()
        };
        assert!(gpgv(&[&dists.join("InRelease")]));
        // The pool's .dsc is clearsigned by the same key.
        assert!(gpgv(&[&out.join("pool/main/tiny_1.0.dsc")]));
        assert!(gpgv(&[&dists.join("Release.gpg"), &dists.join("Release")]));
        // ...and refuses a Release changed after signing.
        fs::write(dists.join("Release"), format!("{release}Tampered: yes\n")).unwrap();
        assert!(!gpgv(&[&dists.join("Release.gpg"), &dists.join("Release")]));

        let fingerprint = keyring_fingerprint(&sh, &keyring).unwrap();
        assert_eq!(fingerprint.len(), 40, "{fingerprint}");
        assert!(release_notes_key_line(&fingerprint).contains(&fingerprint));

        // Another key's keyring does not verify it.
        let other = TestKey::generate(&sh, &scratch.join("gnupg-other"), "other").unwrap();
        let other_ring = scratch.join("other.gpg");
        fs::write(&other_ring, other.public_key(&sh).unwrap()).unwrap();
        let status = std::process::Command::new("gpgv")
            .arg("--keyring")
            .arg(&other_ring)
            .arg(dists.join("InRelease"))
            .output()
            .unwrap()
            .status;
        assert!(!status.success());
    }
}
