//! The upgrade test's signed apt repository inside a root, published again as releases come out.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use super::release::Deb;
use xtask_base::files;

use crate::pkgtest::root::Root;
use xtask_pack::aptrepo;

/// A signed repository inside a root, published again as releases come out; apt in the root
/// sees only it.
#[derive(Clone, Copy)]
pub(super) struct Repo<'a> {
    pub(super) root: &'a Root,
    pub(super) key: &'a aptrepo::TestKey,
    pub(super) scratch: &'a Path,
}

const REPO: &str = "/tmp/mtgdrcopy-apt";
const LIST: &str = "/etc/apt/sources.list.d/mtgdrcopy.list";
const KEYRING: &str = "/etc/apt/keyrings/mtgdrcopy.gpg";

impl Repo<'_> {
    /// The repository of `debs` replaces the root's, then `apt-get update`.
    pub(super) fn publish(&self, sh: &Shell, debs: &[Deb]) -> Result<()> {
        let files: Vec<PathBuf> = debs.iter().map(|d| d.path.clone()).collect();
        let repo = aptrepo::build(
            sh,
            &files,
            &[],
            &self.scratch.join("apt"),
            "stable",
            Some(&self.key.signer()),
        )?;
        let keyring = repo
            .keyring
            .clone()
            .context("the signed repository has no keyring")?;
        let into = self.root.new_file(REPO);
        files::fresh_dir(&into)?;
        // Made in the upper directory, /tmp would have its mode: apt's unprivileged user
        // writes its temporary files there while checking signatures.
        files::set_mode(&self.root.new_file("/tmp"), 0o1777)?;
        let from = repo.dir.join(".");
        cmd!(sh, "cp -a {from} {into}").quiet().run()?;
        files::put_file(&keyring, &self.root.new_file(KEYRING), 0o644)?;
        files::put_text(
            &self.root.new_file(LIST),
            &format!(
                "{}\n",
                repo.sources_line(&format!("file:{REPO}"), "main", KEYRING)
            ),
            0o644,
        )?;
        self.apt(sh, &["update"]).map(drop)
    }

    /// `apt-get <args>` with only the repository's source; fails on a non-zero exit.
    pub(super) fn apt(&self, sh: &Shell, args: &[&str]) -> Result<String> {
        let (ok, out, err) = self.apt_output(sh, args)?;
        if !ok {
            bail!(
                "`apt-get {}` failed:\n{}{}",
                args.join(" "),
                crate::vm::tail(&out, 30),
                err
            );
        }
        Ok(out)
    }

    pub(super) fn apt_output(&self, sh: &Shell, args: &[&str]) -> Result<(bool, String, String)> {
        let mut all = vec![
            "apt-get",
            "-q",
            "-y",
            "--no-install-recommends",
            "-o",
            "Dir::Etc::SourceParts=-",
            "-o",
            "APT::Get::List-Cleanup=0",
        ];
        let list = format!("Dir::Etc::SourceList={LIST}");
        all.extend(["-o", &list]);
        all.extend(args);
        self.root.output(sh, &all)
    }
}
