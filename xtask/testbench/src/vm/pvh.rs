//! Booting the uncompressed kernel through its PVH entry point.
//!
//! Debian compresses its x86 kernels with xz. Under TCG the kernel's own decompressor runs as
//! emulated code and took 5-7 s of every boot here, more than the rest of the boot. QEMU can
//! instead load the uncompressed ELF `vmlinux` directly when it carries the PVH entry note
//! (CONFIG_PVH, set in Debian's kernels), so the kernel starts ~0.7 s after QEMU. The ELF is
//! unpacked on the host once, with xz (~1.5 s), and cached. Any kernel that does not fit (other
//! compression, no PVH note) boots as the bzImage it is, just slower.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::UNIX_EPOCH;

use anyhow::{bail, ensure, Context, Result};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::Endianness;

use xtask_base::{host, paths};

const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
/// Xen's note type for the 32-bit PVH entry point, which QEMU looks for in an ELF kernel.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// The image to hand to `-kernel`: the cached PVH-bootable ELF when it can be had, else `vmlinuz`.
pub fn boot_image(vmlinuz: &Path) -> PathBuf {
    match cached_elf(vmlinuz) {
        Ok(Some(elf)) => elf,
        Ok(None) => vmlinuz.to_owned(),
        Err(e) => {
            eprintln!(
                "xtask: booting {} compressed (slower): {e:#}",
                vmlinuz.display()
            );
            vmlinuz.to_owned()
        }
    }
}

fn cached_elf(vmlinuz: &Path) -> Result<Option<PathBuf>> {
    let bzimage = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let Some(payload) = bzimage_payload(&bzimage) else {
        return Ok(None);
    };
    if !payload.starts_with(XZ_MAGIC) {
        return Ok(None);
    }
    // Keyed by the image's name, size and mtime, so that a replaced image is unpacked again.
    let meta = fs::metadata(vmlinuz)?;
    let mtime = meta.modified()?.duration_since(UNIX_EPOCH)?.as_secs();
    let name = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("vmlinuz");
    let dir = paths::cache_dir().join("vmlinux");
    let elf = dir.join(format!("{name}-{}-{mtime}.elf", meta.len()));
    if elf.is_file() {
        return Ok(Some(elf));
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    host::ensure_host_packages(&["xz-utils"])?;
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = unxz(payload, &tmp).and_then(|()| {
        let bytes = fs::read(&tmp).with_context(|| format!("reading {}", tmp.display()))?;
        ensure!(has_pvh_note(&bytes), "the kernel has no PVH entry point");
        fs::rename(&tmp, &elf).with_context(|| format!("writing {}", elf.display()))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| Some(elf))
}

/// The compressed kernel inside a bzImage, located by the x86 boot protocol's setup header
/// (Documentation/arch/x86/boot.rst): `payload_offset`/`payload_length`, counted from the
/// protected-mode code that follows the `setup_sects` real-mode sectors.
fn bzimage_payload(image: &[u8]) -> Option<&[u8]> {
    let u16_at = |off: usize| {
        Some(u16::from_le_bytes(
            image.get(off..off + 2)?.try_into().ok()?,
        ))
    };
    let u32_at = |off: usize| {
        Some(u32::from_le_bytes(
            image.get(off..off + 4)?.try_into().ok()?,
        ))
    };
    if image.get(0x202..0x206)? != b"HdrS" || u16_at(0x206)? < 0x208 {
        return None;
    }
    let setup_sects = match *image.get(0x1f1)? {
        0 => 4,
        n => usize::from(n),
    };
    let start = (setup_sects + 1) * 512 + usize::try_from(u32_at(0x248)?).ok()?;
    let len = usize::try_from(u32_at(0x24c)?).ok()?;
    image.get(start..start.checked_add(len)?)
}

/// Decompresses an xz stream into `out`. `--single-stream` because the kernel build appends the
/// uncompressed size after the stream.
fn unxz(payload: &[u8], out: &Path) -> Result<()> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut xz = Command::new("xz")
        .args(["-dc", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(file)
        .stderr(Stdio::piped())
        .spawn()
        .context("running xz (package xz-utils)")?;
    let mut stdin = xz.stdin.take().context("xz's stdin was not piped")?;
    // stdout goes to a file, so writing all input before reading anything cannot deadlock.
    let written = stdin.write_all(payload);
    drop(stdin);
    let output = xz.wait_with_output().context("waiting for xz")?;
    if !output.status.success() {
        bail!(
            "xz failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    written.context("feeding xz")
}

/// Whether an ELF64 image has the Xen PVH entry note, which QEMU needs to boot it.
fn has_pvh_note(elf: &[u8]) -> bool {
    pvh_note(elf).unwrap_or(false)
}

fn pvh_note(elf: &[u8]) -> object::read::Result<bool> {
    let file = ElfFile64::<Endianness>::parse(elf)?;
    let endian = file.endian();
    for header in file.elf_program_headers() {
        let Some(mut notes) = header.notes(endian, elf)? else {
            continue;
        };
        while let Some(note) = notes.next()? {
            if note.name() == b"Xen" && note.n_type(endian).0 == XEN_ELFNOTE_PHYS32_ENTRY {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_from_setup_header() {
        let mut image = vec![0u8; 4096];
        image[0x1f1] = 2; // setup_sects: payload area starts at 3 * 512
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        image[0x248..0x24c].copy_from_slice(&100u32.to_le_bytes());
        image[0x24c..0x250].copy_from_slice(&6u32.to_le_bytes());
        image[1636..1642].copy_from_slice(XZ_MAGIC);
        assert_eq!(bzimage_payload(&image), Some(XZ_MAGIC));
        image[0x202] = b'X';
        assert_eq!(bzimage_payload(&image), None);
    }

    #[test]
    fn finds_the_pvh_note() {
        // ELF header (64 bytes) + one PT_NOTE program header at 64 + one note at 120.
        let mut elf = vec![0u8; 120];
        elf[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&4u32.to_le_bytes());
        elf[64 + 8..64 + 16].copy_from_slice(&120u64.to_le_bytes());
        elf[64 + 0x20..64 + 0x28].copy_from_slice(&24u64.to_le_bytes());
        for v in [4u32, 8, XEN_ELFNOTE_PHYS32_ENTRY] {
            elf.extend_from_slice(&v.to_le_bytes());
        }
        elf.extend_from_slice(b"Xen\0");
        elf.extend_from_slice(&[0; 8]);
        assert!(has_pvh_note(&elf));
        elf[128] = 17;
        assert!(!has_pvh_note(&elf));
    }
}
