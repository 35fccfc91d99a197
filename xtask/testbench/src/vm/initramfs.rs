//! The guest's root file system: a newc cpio archive the kernel unpacks into RAM.
//!
//! The archive is written here rather than by the `cpio` tool: with our own writer nothing is
//! staged on disk, every entry is owned by root whoever runs xtask, and `/dev/console` can be a
//! real device node without mknod privileges (the kernel needs it to give /init a console before
//! devtmpfs is mounted). newc is a 110-byte ASCII header per entry, so this costs ~50 lines.
//! Debian's busybox-static provides the shell and tools; ldd finds the shared libraries.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

/// The static busybox from Debian's busybox-static: shell and tools for the guest.
const BUSYBOX: &str = "/bin/busybox";

/// Directories glibc's loader searches without an ld.so.cache (the guest has none).
const LIB_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib",
    "/usr/lib",
    "/lib64",
    "/usr/lib64",
];

/// What one archive entry holds. Paths are guest paths without the leading `/`.
#[derive(Debug)]
enum Entry {
    Dir,
    /// Copied from the host, following symlinks, with the given permission bits.
    File(PathBuf, u32),
    Text(String, u32),
    Symlink(String),
    CharDev(u32, u32),
}

/// The guest tree being assembled, kept sorted so that every directory precedes its contents
/// (a parent's path is a prefix of its children's): the kernel does not create missing parents.
#[derive(Default)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
}

impl Tree {
    /// Busybox, its applet links and the directories /init mounts on.
    pub fn base() -> Result<Tree> {
        let mut tree = Tree::default();
        for dir in ["dev", "proc", "sys", "tmp", "root", "etc", "mnt", "run"] {
            tree.entries.insert(dir.into(), Entry::Dir);
        }
        tree.entries
            .insert("dev/console".into(), Entry::CharDev(5, 1));
        tree.add_file(Path::new(BUSYBOX), BUSYBOX)?;
        // Links in the archive rather than `busybox --install` at boot: boot time is emulated
        // instructions, archive entries are free.
        let sh = Shell::new()?;
        let applets = cmd!(sh, "{BUSYBOX} --list-full")
            .quiet()
            .read()
            .context("listing busybox applets; is busybox-static installed?")?;
        for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
            if applet != BUSYBOX.trim_start_matches('/') {
                tree.entries
                    .insert(applet.into(), Entry::Symlink(BUSYBOX.into()));
            }
        }
        Ok(tree)
    }

    /// A host file at `guest` (absolute), keeping its permission bits. Replaces what was there,
    /// so callers' files win over busybox links.
    pub fn add_file(&mut self, host: &Path, guest: &str) -> Result<()> {
        let meta = fs::metadata(host).with_context(|| format!("reading {}", host.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", host.display());
        }
        let mode = meta.permissions().mode() & 0o7777;
        self.insert(guest, Entry::File(host.to_owned(), mode))
    }

    pub fn add_text(&mut self, guest: &str, text: String, mode: u32) -> Result<()> {
        self.insert(guest, Entry::Text(text, mode))
    }

    /// The shared libraries and loader the ELF executables and libraries among `hosts` need,
    /// found with the host's `ldd`. Libraries outside the standard directories (a cargo target
    /// dir on LD_LIBRARY_PATH) go to /usr/lib/x86_64-linux-gnu, which the guest's loader
    /// searches. A library no host path provides is fine if the caller ships it under its name.
    pub fn add_libraries(&mut self, hosts: &[&Path]) -> Result<()> {
        let sh = Shell::new()?;
        let mut needed: BTreeMap<String, PathBuf> = BTreeMap::new();
        for &host in hosts {
            if !is_dynamic_elf(host)? {
                continue;
            }
            // ldd exits 1 for static programs; its output says so and has nothing to add.
            let out = cmd!(sh, "ldd {host}")
                .quiet()
                .ignore_status()
                .output()
                .context("running ldd")?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                match parse_ldd_line(line) {
                    Some(Ldd::Found { name, path }) => {
                        let guest = guest_lib_path(&name, &path);
                        needed.insert(guest, path);
                    }
                    Some(Ldd::Missing(name)) if !self.has_file_named(&name) => {
                        bail!(
                            "{} needs {name}, which neither the host's library path nor the VM's \
                             file list provides",
                            host.display()
                        );
                    }
                    Some(Ldd::Missing(_)) | None => {}
                }
            }
        }
        for (guest, host) in needed {
            // A library the caller ships itself (maybe freshly built) wins.
            if !self.entries.contains_key(guest.trim_start_matches('/')) {
                self.add_file(&host, &guest)?;
            }
        }
        Ok(())
    }

    fn has_file_named(&self, name: &str) -> bool {
        self.entries.iter().any(|(path, entry)| {
            matches!(entry, Entry::File(..)) && path.rsplit('/').next() == Some(name)
        })
    }

    fn insert(&mut self, guest: &str, entry: Entry) -> Result<()> {
        let Some(rel) = guest.strip_prefix('/') else {
            bail!("guest path {guest:?} is not absolute");
        };
        if rel.is_empty()
            || rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            bail!("guest path {guest:?} is not a plain absolute path");
        }
        let mut parent = rel;
        while let Some((dir, _)) = parent.rsplit_once('/') {
            if let Some(Entry::Symlink(_) | Entry::File(..) | Entry::Text(..)) =
                self.entries.get(dir)
            {
                bail!("guest path {guest:?} lies under /{dir}, which is not a directory");
            }
            self.entries.insert(dir.to_owned(), Entry::Dir);
            parent = dir;
        }
        self.entries.insert(rel.to_owned(), entry);
        Ok(())
    }

    /// Writes the archive, uncompressed on purpose: with an 86 MB archive the guest booted no
    /// faster from its gzip'd form (8.4 s against 7.8-8.4 s, TCG decompressing vs. copying), and
    /// compressing would cost the host seconds and a dependency.
    pub fn write(&self, path: &Path) -> Result<()> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = Newc::new(BufWriter::new(file));
        for (name, entry) in &self.entries {
            match entry {
                Entry::Dir => out.entry(name, 0o040755, (0, 0), &mut io::empty(), 0)?,
                Entry::CharDev(major, minor) => {
                    out.entry(name, 0o020600, (*major, *minor), &mut io::empty(), 0)?
                }
                Entry::Symlink(target) => {
                    let bytes = target.as_bytes();
                    out.entry(name, 0o120777, (0, 0), &mut &bytes[..], bytes.len())?
                }
                Entry::Text(text, mode) => {
                    let bytes = text.as_bytes();
                    out.entry(name, 0o100000 | mode, (0, 0), &mut &bytes[..], bytes.len())?
                }
                Entry::File(host, mode) => {
                    let mut f =
                        File::open(host).with_context(|| format!("opening {}", host.display()))?;
                    let len = f.metadata()?.len();
                    let len = usize::try_from(len).context("file too large for cpio")?;
                    out.entry(name, 0o100000 | mode, (0, 0), &mut f, len)
                        .with_context(|| format!("archiving {}", host.display()))?
                }
            }
        }
        out.finish()
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// Where a library found by ldd lives in the guest.
fn guest_lib_path(name: &str, host: &Path) -> String {
    let in_std_dir = host
        .parent()
        .and_then(Path::to_str)
        .is_some_and(|dir| LIB_DIRS.contains(&dir));
    match host.to_str() {
        Some(path) if in_std_dir || name.starts_with('/') => path.to_owned(),
        _ => format!("/usr/lib/x86_64-linux-gnu/{name}"),
    }
}

#[derive(Debug, PartialEq)]
enum Ldd {
    Found { name: String, path: PathBuf },
    Missing(String),
}

/// One line of ldd output: `libc.so.6 => /lib/…/libc.so.6 (0x…)`, the loader as
/// `/lib64/ld-linux-x86-64.so.2 (0x…)`, `libx.so => not found`; others (vdso) are skipped.
fn parse_ldd_line(line: &str) -> Option<Ldd> {
    let line = line.trim();
    let strip_addr = |s: &str| s.split(" (0x").next().unwrap_or(s).trim().to_owned();
    if let Some((name, rest)) = line.split_once(" => ") {
        let rest = rest.trim();
        if rest.starts_with("not found") {
            return Some(Ldd::Missing(name.trim().to_owned()));
        }
        if rest.starts_with('/') {
            return Some(Ldd::Found {
                name: name.trim().to_owned(),
                path: PathBuf::from(strip_addr(rest)),
            });
        }
        return None;
    }
    if line.starts_with('/') {
        let path = strip_addr(line);
        return Some(Ldd::Found {
            name: path.clone(),
            path: PathBuf::from(path),
        });
    }
    None
}

/// An ELF executable or shared object (not a relocatable `.ko`): something the loader maps.
fn is_dynamic_elf(path: &Path) -> Result<bool> {
    let mut header = [0u8; 18];
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let n =
        read_up_to(&mut f, &mut header).with_context(|| format!("reading {}", path.display()))?;
    if n < header.len() || &header[..4] != b"\x7fELF" {
        return Ok(false);
    }
    // e_type, little-endian on x86-64: ET_EXEC = 2, ET_DYN = 3.
    let e_type = u16::from_le_bytes([header[16], header[17]]);
    Ok(matches!(e_type, 2 | 3))
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A newc ("070701") cpio writer: header, NUL-terminated name and data, each padded to 4 bytes.
struct Newc<W: Write> {
    out: W,
    offset: usize,
    ino: u32,
}

impl<W: Write> Newc<W> {
    fn new(out: W) -> Self {
        Newc {
            out,
            offset: 0,
            ino: 0,
        }
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        (rmajor, rminor): (u32, u32),
        data: &mut dyn Read,
        len: usize,
    ) -> Result<()> {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let len32 = u32::try_from(len).context("cpio newc entries are limited to 4 GiB")?;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize
        // check. uid/gid 0 and mtime 0 make the archive independent of who built it and when.
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            len32,
            0,
            0,
            rmajor,
            rminor,
            name.len() + 1,
            0
        );
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(b"\0")?;
        self.pad()?;
        let copied = io::copy(&mut data.take(len as u64), &mut self.out)?;
        if copied != len as u64 {
            bail!("{name}: file changed size while archiving");
        }
        self.offset += len;
        self.pad()
    }

    fn finish(mut self) -> Result<()> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, (0, 0), &mut io::empty(), 0)?;
        self.out.flush()?;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len();
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let pad = (4 - self.offset % 4) % 4;
        self.write(&[0; 3][..pad])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines() {
        assert_eq!(parse_ldd_line("\tlinux-vdso.so.1 (0x00007ffc)"), None);
        assert_eq!(
            parse_ldd_line("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f12)"),
            Some(Ldd::Found {
                name: "libc.so.6".into(),
                path: "/lib/x86_64-linux-gnu/libc.so.6".into()
            })
        );
        assert_eq!(
            parse_ldd_line("\t/lib64/ld-linux-x86-64.so.2 (0x00007f34)"),
            Some(Ldd::Found {
                name: "/lib64/ld-linux-x86-64.so.2".into(),
                path: "/lib64/ld-linux-x86-64.so.2".into()
            })
        );
        assert_eq!(
            parse_ldd_line("\tlibgdrapi.so.1 => not found"),
            Some(Ldd::Missing("libgdrapi.so.1".into()))
        );
        assert_eq!(parse_ldd_line("\tnot a dynamic executable"), None);
    }

    #[test]
    fn libs_outside_std_dirs_move() {
        assert_eq!(
            guest_lib_path("libc.so.6", Path::new("/lib/x86_64-linux-gnu/libc.so.6")),
            "/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            guest_lib_path("libgdrapi.so.1", Path::new("/w/target/debug/libgdrapi.so")),
            "/usr/lib/x86_64-linux-gnu/libgdrapi.so.1"
        );
    }

    #[test]
    fn newc_layout() -> Result<()> {
        let mut buf = Vec::new();
        let mut out = Newc::new(&mut buf);
        out.entry("a", 0o100644, (0, 0), &mut &b"xyz"[..], 3)?;
        out.finish()?;
        assert_eq!(&buf[..6], b"070701");
        // Header 110 + "a\0" = 112, data 3 padded to 4.
        assert_eq!(&buf[110..112], b"a\0");
        assert_eq!(&buf[112..116], b"xyz\0");
        assert_eq!(buf.len() % 4, 0);
        Ok(())
    }

    #[test]
    fn parents_precede_children() -> Result<()> {
        let mut tree = Tree::default();
        tree.add_text("/usr/lib/x/y.so", String::new(), 0o644)?;
        let names: Vec<_> = tree.entries.keys().cloned().collect();
        assert_eq!(names, ["usr", "usr/lib", "usr/lib/x", "usr/lib/x/y.so"]);
        assert!(tree.add_text("relative", String::new(), 0o644).is_err());
        assert!(tree
            .add_text("/usr/lib/x/y.so/z", String::new(), 0o644)
            .is_err());
        Ok(())
    }
}
