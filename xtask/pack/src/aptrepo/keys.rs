//! The repository's keys: a throwaway one for tests, and the fingerprint hosts compare.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::{files, host, paths};

use super::{Signer, HOST_PACKAGES};

/// The fingerprint of the (first) key in the keyring file `path`, as `gpg --show-keys` prints
/// it: what a host compares with the release notes' before trusting the repository.
pub fn keyring_fingerprint(sh: &Shell, path: &Path) -> Result<String> {
    // A home of its own: gpg would otherwise create ~/.gnupg to list a file.
    let home = paths::build_dir().join(format!("gnupg-show-{}", std::process::id()));
    files::fresh_dir(&home)?;
    files::set_mode(&home, 0o700)?;
    let listing = cmd!(
        sh,
        "gpg --batch --homedir {home} --with-colons --show-keys {path}"
    )
    .quiet()
    .ignore_stderr()
    .read();
    let _ = fs::remove_dir_all(&home);
    let listing = listing.with_context(|| format!("gpg --show-keys {}", path.display()))?;
    listing
        .lines()
        .find_map(|l| l.strip_prefix("fpr:"))
        .and_then(|rest| rest.split(':').find(|f| !f.is_empty()))
        .map(str::to_owned)
        .with_context(|| format!("{} holds no key", path.display()))
}

/// The release notes' line for the apt repository's key (release-check writes it; the README
/// tells hosts to compare).
pub fn release_notes_key_line(fingerprint: &str) -> String {
    format!(
        "The apt repository is signed by the key in mtgdrcopy-archive-keyring.gpg, fingerprint \
         `{fingerprint}`: `gpg --show-keys mtgdrcopy-archive-keyring.gpg` must print it.\n"
    )
}

/// A throwaway signing key in a fresh GnuPG home, for tests; its agent is stopped on drop.
pub struct TestKey {
    pub home: PathBuf,
    pub user_id: String,
}

impl TestKey {
    pub fn generate(sh: &Shell, home: &Path, name: &str) -> Result<TestKey> {
        host::ensure_host_packages(HOST_PACKAGES)?;
        files::fresh_dir(home)?;
        files::set_mode(home, 0o700)?;
        let user_id = format!("{name} <{name}@mtgdrcopy.invalid>");
        let key = TestKey {
            home: home.to_path_buf(),
            user_id,
        };
        let uid = &key.user_id;
        cmd!(
            sh,
            "gpg --batch --homedir {home} --passphrase '' --quick-gen-key {uid} ed25519 sign never"
        )
        .quiet()
        .ignore_stderr()
        .run()
        .context("generating a throwaway GnuPG key")?;
        Ok(key)
    }

    /// The public key, as a binary keyring for `signed-by=`.
    pub fn public_key(&self, sh: &Shell) -> Result<Vec<u8>> {
        let home = &self.home;
        let out = cmd!(sh, "gpg --batch --homedir {home} --export")
            .quiet()
            .output()
            .context("gpg --export")?;
        ensure!(!out.stdout.is_empty(), "gpg --export gave no key");
        Ok(out.stdout)
    }

    pub fn signer(&self) -> Signer {
        Signer {
            homedir: Some(self.home.clone()),
            key: Some(self.user_id.clone()),
        }
    }
}

impl Drop for TestKey {
    fn drop(&mut self) {
        // gpg started an agent for this home; it would outlive the test otherwise.
        let _ = std::process::Command::new("gpgconf")
            .arg("--homedir")
            .arg(&self.home)
            .args(["--kill", "gpg-agent"])
            .status();
    }
}
