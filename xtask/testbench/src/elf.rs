//! ELF files in a package's tree: which are loadable (the package tests expect a -dbgsym
//! package exactly then, and arm64 code in the arm64 packages), executable or shared library.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

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

/// The start of an ELF header: identification, e_type (16..18), e_machine (18..20). `None`
/// for a file too short to be one.
fn header(path: &Path) -> Result<Option<[u8; 20]>> {
    let mut header = [0u8; 20];
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    match file.read_exact(&mut header) {
        Ok(()) => Ok(Some(header)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The kind of `path` if it is a loadable ELF file (not an archive or a kernel object).
pub fn elf_kind(path: &Path) -> Result<Option<ElfKind>> {
    let Some(header) = header(path)? else {
        return Ok(None);
    };
    // ET_EXEC (2) or ET_DYN (3), little-endian (amd64, arm64).
    let loadable =
        &header[..4] == b"\x7fELF" && matches!(u16::from_le_bytes([header[16], header[17]]), 2 | 3);
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
    let header = header(path)?
        .with_context(|| format!("{} is too short for an ELF file", path.display()))?;
    // e_machine: EM_AARCH64 is 183.
    let machine = u16::from_le_bytes([header[18], header[19]]);
    let expected = match target.debian {
        "arm64" => 183,
        other => bail!("no ELF machine number known for {other}"),
    };
    ensure!(
        &header[..4] == b"\x7fELF" && machine == expected,
        "{} is not an ELF file for {} (e_machine {machine})",
        path.display(),
        target.triple
    );
    Ok(())
}

/// The symbol versions `path` needs, as (library, version) pairs: the `.gnu.version_r` section
/// (SHT_GNU_verneed) of a little-endian ELF64 file (amd64, arm64), what the dynamic loader
/// checks against the libraries it finds. Empty when the file has none (a static program, or
/// a -dbgsym file whose section holds no data).
pub fn needed_versions(path: &Path) -> Result<Vec<(String, String)>> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    needed_versions_in(&data)
        .with_context(|| format!("{}: reading its version needs", path.display()))
}

fn needed_versions_in(data: &[u8]) -> Result<Vec<(String, String)>> {
    ensure!(
        data.get(..6) == Some(b"\x7fELF\x02\x01".as_slice()),
        "not a little-endian ELF64 file"
    );
    let shoff = usize::try_from(u64_at(data, 0x28)?)?;
    let (shentsize, shnum) = (
        usize::from(u16_at(data, 0x3a)?),
        usize::from(u16_at(data, 0x3c)?),
    );
    let section = |i: usize| -> Result<Section> {
        let at = shoff + i * shentsize;
        Ok(Section {
            kind: u32_at(data, at + 4)?,
            offset: usize::try_from(u64_at(data, at + 24)?)?,
            link: usize::try_from(u32_at(data, at + 40)?)?,
            info: u32_at(data, at + 44)?,
        })
    };
    const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
    const SHT_NOBITS: u32 = 8;
    let mut needed = Vec::new();
    for i in 0..shnum {
        let verneed = section(i)?;
        if verneed.kind != SHT_GNU_VERNEED {
            continue;
        }
        let strings = section(verneed.link)?;
        if strings.kind == SHT_NOBITS {
            continue;
        }
        let string = |at: u32| -> Result<String> {
            let start = strings.offset + usize::try_from(at)?;
            let rest = data
                .get(start..)
                .context("a name past the end of the file")?;
            let end = rest
                .iter()
                .position(|&b| b == 0)
                .context("an unterminated name")?;
            Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
        };
        // sh_info entries (Elf64_Verneed), each with vn_cnt Elf64_Vernaux.
        let mut entry = verneed.offset;
        for _ in 0..verneed.info {
            let (count, file) = (u16_at(data, entry + 2)?, u32_at(data, entry + 4)?);
            let library = string(file)?;
            let mut aux = entry + usize::try_from(u32_at(data, entry + 8)?)?;
            for _ in 0..count {
                needed.push((library.clone(), string(u32_at(data, aux + 8)?)?));
                aux += usize::try_from(u32_at(data, aux + 12)?)?;
            }
            entry += usize::try_from(u32_at(data, entry + 12)?)?;
        }
    }
    Ok(needed)
}

/// What `needed_versions_in` reads of a section header.
struct Section {
    kind: u32,
    offset: usize,
    link: usize,
    info: u32,
}

fn bytes_at<const N: usize>(data: &[u8], at: usize) -> Result<[u8; N]> {
    let slice = data
        .get(at..at.checked_add(N).context("an offset overflows")?)
        .with_context(|| format!("offset {at:#x} is past the end of the file"))?;
    Ok(slice.try_into()?)
}

fn u16_at(data: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(bytes_at(data, at)?))
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(bytes_at(data, at)?))
}

fn u64_at(data: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(bytes_at(data, at)?))
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
}
