//! ELF files in a package's tree: which are loadable (the package tests expect a -dbgsym
//! package exactly then, and arm64 code in the arm64 packages), executable or shared library,
//! and which symbol versions they need (the glibc floor). Read with the `object` crate (the
//! gimli project's, what rustc's own tools read object files with) rather than by hand.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use object::elf::SHT_NOBITS;
use object::read::elf::{ElfFile64, SectionHeader};
use object::{Architecture, Endianness, Object, ObjectKind};

use xtask_base::files;
use xtask_base::targets::Target;

/// Executables and shared libraries (not archives, not kernel objects) in `tree`.
pub fn elf_files(tree: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for path in files::files(tree)? {
        if elf_kind(&path)?.is_some() {
            found.push(path);
        }
    }
    Ok(found)
}

/// What dh_strip tells apart: executables (PIE ones are ET_DYN too) and shared libraries
/// (by their name, `*.so` or `*.so.*`, as dh_strip does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfKind {
    Executable,
    SharedObject,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The kind of `path` if it is a loadable ELF file (not an archive or a kernel object).
pub fn elf_kind(path: &Path) -> Result<Option<ElfKind>> {
    let data = read(path)?;
    let loadable = match object::File::parse(&*data) {
        Ok(file) => matches!(file.kind(), ObjectKind::Executable | ObjectKind::Dynamic),
        Err(_) => false,
    };
    if !loadable {
        return Ok(None);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Some(if name.ends_with(".so") || name.contains(".so.") {
        ElfKind::SharedObject
    } else {
        ElfKind::Executable
    }))
}

/// Checks that `path` is an ELF file for `target` (the cross build really produced arm64 code).
pub fn ensure_elf_for(path: &Path, target: &Target) -> Result<()> {
    let data = read(path)?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an object file", path.display()))?;
    let expected = match target.debian {
        "arm64" => Architecture::Aarch64,
        other => anyhow::bail!("no ELF architecture known for {other}"),
    };
    ensure!(
        file.format() == object::BinaryFormat::Elf && file.architecture() == expected,
        "{} is not an ELF file for {} ({:?})",
        path.display(),
        target.triple,
        file.architecture()
    );
    Ok(())
}

/// The symbol versions `path` needs, as (library, version) pairs: its `.gnu.version_r`
/// section, what the dynamic loader checks against the libraries it finds. Empty when the file
/// has none (a static program, or a -dbgsym file, whose sections hold no data).
pub fn needed_versions(path: &Path) -> Result<Vec<(String, String)>> {
    needed_versions_in(&read(path)?)
        .with_context(|| format!("{}: reading its version needs", path.display()))
}

fn needed_versions_in(data: &[u8]) -> Result<Vec<(String, String)>> {
    let file = ElfFile64::<Endianness>::parse(data).context("not an ELF64 file")?;
    let endian = file.endian();
    let sections = file.elf_section_table();
    let mut needed = Vec::new();
    let Some((mut entries, link)) = sections.gnu_verneed(endian, data)? else {
        return Ok(needed);
    };
    if sections.section(link)?.sh_type(endian) == SHT_NOBITS {
        return Ok(needed);
    }
    let strings = sections.strings(endian, data, link)?;
    while let Some((entry, mut versions)) = entries.next()? {
        let library = String::from_utf8_lossy(entry.file(endian, strings)?).into_owned();
        while let Some(version) = versions.next()? {
            let name = version.name(endian, strings)?;
            needed.push((library.clone(), String::from_utf8_lossy(name).into_owned()));
        }
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test program, linked on this machine, needs libc's versions, and what `readelf -V`
    /// lists is what the parser finds.
    #[test]
    fn version_needs_are_readelfs() -> Result<()> {
        let exe = std::env::current_exe()?;
        let needed = needed_versions(&exe)?;
        assert!(
            needed
                .iter()
                .any(|(lib, v)| lib == "libc.so.6" && v.starts_with("GLIBC_2.")),
            "{needed:?}"
        );
        let out = std::process::Command::new("readelf")
            .args(["-V", "--wide"])
            .arg(&exe)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut theirs: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("Flags:"))
            .filter_map(|l| l.split("Name: ").nth(1)?.split_whitespace().next())
            .collect();
        let mut ours: Vec<&str> = needed.iter().map(|(_, v)| v.as_str()).collect();
        theirs.sort();
        ours.sort();
        assert_eq!(ours, theirs);
        assert!(needed_versions_in(b"\x7fELF\x01\x01").is_err());
        assert!(needed_versions_in(&[0x7f, b'E', b'L', b'F', 2, 1, 0, 0]).is_err());
        Ok(())
    }

    /// A test program is an executable; the same bytes named like a library are one; a file
    /// that is no ELF file is neither.
    #[test]
    fn kinds() -> Result<()> {
        let exe = std::env::current_exe()?;
        assert_eq!(elf_kind(&exe)?, Some(ElfKind::Executable));
        let dir = std::env::temp_dir().join(format!("elf-kinds-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let lib = dir.join("libx.so.1");
        fs::copy(&exe, &lib)?;
        let text = dir.join("notes.txt");
        fs::write(&text, "not an ELF file")?;
        let kinds = (elf_kind(&lib)?, elf_kind(&text)?);
        fs::remove_dir_all(&dir)?;
        assert_eq!(kinds, (Some(ElfKind::SharedObject), None));
        Ok(())
    }
}
