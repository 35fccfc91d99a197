//! The glibc floor, checked on what ships: every ELF file in the .debs (libgdrapi.so.1, the
//! mtgdrcopy_* programs; amd64, and arm64 in the cross step) may need no glibc symbol version
//! newer than [`GLIBC_FLOOR`] (zigbuild.rs says how the build gets there). A version the
//! loader of an older glibc does not know stops the program before `main`, so this is what
//! decides whether the packages run on UOS 20 and Kylin V10 (glibc 2.28).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;
use xtask_base::zigbuild::GLIBC_FLOOR;

use crate::elf;

/// A shipped ELF file and the newest glibc version it needs.
#[derive(Debug)]
pub struct Needs {
    pub file: String,
    pub newest: (u32, u32, u32),
}

/// `GLIBC_2.2.5` as (2, 2, 5); `None` for another name (`GLIBC_PRIVATE`, another library's).
fn glibc_version(name: &str) -> Option<(u32, u32, u32)> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let mut next = || parts.next().map(|p| p.parse::<u32>().ok());
    let major = next()??;
    let minor = next()??;
    let patch = next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

/// The newest glibc version among `needed` ((library, version) pairs), checked against the
/// floor. Fails for a version above it, for `GLIBC_PRIVATE` (no ABI promise at all), and when
/// nothing of libc is needed (not a dynamically linked glibc program: the check would pass
/// without checking anything).
fn newest_within_floor(needed: &[(String, String)]) -> Result<(u32, u32, u32)> {
    let mut newest = None;
    for (library, version) in needed {
        if version == "GLIBC_PRIVATE" {
            bail!("needs GLIBC_PRIVATE of {library}");
        }
        if let Some(v) = glibc_version(version) {
            newest = newest.max(Some(v));
        }
    }
    let newest = newest.context("needs no glibc symbol version at all")?;
    let (major, minor) = GLIBC_FLOOR;
    ensure!(
        (newest.0, newest.1) <= (major, minor),
        "needs GLIBC_{}.{}{}, above the floor {major}.{minor}: {}",
        newest.0,
        newest.1,
        if newest.2 > 0 {
            format!(".{}", newest.2)
        } else {
            String::new()
        },
        needed
            .iter()
            .filter(|(_, v)| glibc_version(v).is_some_and(|v| (v.0, v.1) > (major, minor)))
            .map(|(l, v)| format!("{v} ({l})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(newest)
}

/// Unpacks each of `debs` and checks every ELF file in it; returns what each needs. Fails
/// when one is above the floor, or when the .debs hold no ELF file at all.
pub fn check_debs(sh: &Shell, debs: &[&Path]) -> Result<Vec<Needs>> {
    let scratch = paths::build_dir().join("glibc-floor");
    let mut found = Vec::new();
    let mut failures = Vec::new();
    for deb in debs {
        let name = deb
            .file_name()
            .context("a .deb has no name")?
            .to_string_lossy()
            .into_owned();
        let tree: PathBuf = scratch.join(&name);
        xtask_base::files::fresh_dir(&tree)?;
        cmd!(sh, "dpkg-deb -x {deb} {tree}")
            .quiet()
            .run()
            .with_context(|| format!("unpacking {}", deb.display()))?;
        for file in elf::elf_files(&tree)? {
            let shown = format!("{name}: /{}", file.strip_prefix(&tree)?.display());
            match elf::needed_versions(&file).and_then(|n| newest_within_floor(&n)) {
                Ok(newest) => found.push(Needs {
                    file: shown,
                    newest,
                }),
                Err(e) => failures.push(format!("{shown}: {e:#}")),
            }
        }
        fs::remove_dir_all(&tree)?;
    }
    ensure!(
        failures.is_empty(),
        "shipped ELF files above the glibc floor {}.{}:\n  {}",
        GLIBC_FLOOR.0,
        GLIBC_FLOOR.1,
        failures.join("\n  ")
    );
    ensure!(!found.is_empty(), "no ELF file in {debs:?}");
    for n in &found {
        let (major, minor, patch) = n.newest;
        let patch = if patch > 0 {
            format!(".{patch}")
        } else {
            String::new()
        };
        eprintln!("    GLIBC_{major}.{minor}{patch:<4} {}", n.file);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(versions: &[&str]) -> Vec<(String, String)> {
        versions
            .iter()
            .map(|v| ("libc.so.6".to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn versions_parse() {
        assert_eq!(glibc_version("GLIBC_2.2.5"), Some((2, 2, 5)));
        assert_eq!(glibc_version("GLIBC_2.28"), Some((2, 28, 0)));
        assert_eq!(glibc_version("GLIBC_PRIVATE"), None);
        assert_eq!(glibc_version("GCC_3.0"), None);
    }

    #[test]
    fn the_floor_is_enforced() {
        let ok = newest_within_floor(&needs(&["GLIBC_2.2.5", "GLIBC_2.28", "GLIBC_2.18"]));
        assert_eq!(ok.ok(), Some((2, 28, 0)));
        let above = newest_within_floor(&needs(&["GLIBC_2.2.5", "GLIBC_2.34"]));
        let message = format!("{:#}", above.unwrap_err());
        assert!(message.contains("GLIBC_2.34 (libc.so.6)"), "{message}");
        assert!(newest_within_floor(&needs(&["GLIBC_2.29"])).is_err());
        assert!(newest_within_floor(&needs(&["GLIBC_2.17", "GLIBC_PRIVATE"])).is_err());
        assert!(newest_within_floor(&[("libgcc_s.so.1".into(), "GCC_3.0".into())]).is_err());
    }

    /// The xtask binary is linked by the machine's own toolchain: on a machine whose glibc is
    /// above the floor (this project's: Debian 12, 2.36) the check must refuse it.
    #[test]
    fn a_host_linked_program_is_refused_above_the_floor() -> Result<()> {
        let needed = elf::needed_versions(&std::env::current_exe()?)?;
        let newest = needed
            .iter()
            .filter_map(|(_, v)| glibc_version(v))
            .max()
            .context("no glibc version")?;
        if (newest.0, newest.1) > GLIBC_FLOOR {
            assert!(newest_within_floor(&needed).is_err());
        }
        Ok(())
    }
}
