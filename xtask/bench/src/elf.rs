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
