//! The source package in the repository: the .dsc and its files in the pool (the .dsc
//! clearsigned with the repository's key), and the `deb-src` entry hosts add.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use super::Signer;

/// The `deb-src` entry of a `deb` entry: the same repository, options and component.
pub fn deb_src(deb_line: &str) -> String {
    match deb_line.strip_prefix("deb ") {
        Some(rest) => format!("deb-src {rest}"),
        None => deb_line.to_owned(),
    }
}

/// Copies each .dsc and the files it names into `pool`; with a signer, the pool's .dsc is the
/// clearsigned one.
pub(super) fn put_sources(
    sh: &Shell,
    dscs: &[PathBuf],
    pool: &Path,
    signer: Option<&Signer>,
) -> Result<()> {
    fs::create_dir_all(pool)?;
    for dsc in dscs {
        let text = fs::read_to_string(dsc).with_context(|| format!("reading {}", dsc.display()))?;
        let dir = dsc.parent().context("a .dsc without a directory")?;
        for name in dsc_files(&text) {
            ensure!(
                !name.contains('/'),
                "{} names {name}, not a file beside it",
                dsc.display()
            );
            fs::copy(dir.join(&name), pool.join(&name))
                .with_context(|| format!("copying {name}, which {} names", dsc.display()))?;
        }
        let name = dsc.file_name().context("a .dsc without a file name")?;
        let to = pool.join(name);
        match signer {
            Some(signer) => {
                let gpg = signer.gpg_args();
                cmd!(sh, "gpg {gpg...} --clearsign --output {to} {dsc}")
                    .quiet()
                    .run()
                    .context("gpg --clearsign of the .dsc")?;
            }
            None => {
                fs::copy(dsc, &to)?;
            }
        }
    }
    Ok(())
}

/// The file names a .dsc's `Files:` field lists (`<md5> <size> <name>` lines).
fn dsc_files(dsc: &str) -> Vec<String> {
    dsc.lines()
        .skip_while(|l| !l.starts_with("Files:"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsc_files_are_listed() {
        let dsc = "Format: 3.0 (quilt)\nSource: x\nChecksums-Sha256:\n a 1 x_1.orig.tar.xz\n\
                   Files:\n b 10 x_1.orig.tar.xz\n c 20 x_1-1.debian.tar.xz\n";
        assert_eq!(dsc_files(dsc), ["x_1.orig.tar.xz", "x_1-1.debian.tar.xz"]);
    }
}
