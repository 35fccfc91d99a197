//! Plain-file helpers: fresh directories, files put with a mode, symbolic links, copies of
//! trees, and the locks that keep two xtask processes from writing the same files.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::paths;

/// Excludes other xtask processes from build/pkg/ and the .debs in build/ while held: the
/// staged trees and debhelper's copy of the tree have fixed paths (build/pkg/<package>/,
/// build/deb/<flavour>/), so two runs staging at once would pull files from under each other.
pub fn lock() -> Result<fs::File> {
    lock_file(&paths::build_dir().join("pkg/.lock"), "building packages")
}

/// An exclusive lock on `path` (created if needed), held until the file is dropped; says that it
/// waits for another xtask `doing` something when the lock is taken.
pub fn lock_file(path: &Path, doing: &str) -> Result<fs::File> {
    parent_of(path)?;
    let file = fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!("xtask: waiting for another xtask that is {doing}");
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

/// Copies the module's build inputs (Kbuild, Makefile, C sources and headers, scripts, the
/// compile probes) and nothing a build leaves behind; files already there with the same content
/// are left alone. Returns the top-level names copied.
pub fn copy_module_sources(from: &Path, to: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let kind = entry.file_type()?;
        if name.starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            copy_module_sources(&path, &to.join(&name))?;
            copied.push(name);
            continue;
        }
        let source = name == "Kbuild"
            || name == "Makefile"
            || name.ends_with(".c")
            || (name.ends_with(".h") && name != "conftest.h")
            || name.ends_with(".sh");
        if kind.is_file() && source {
            let mode = if name.ends_with(".sh") { 0o755 } else { 0o644 };
            let target = to.join(&name);
            // Unchanged files keep their timestamps, so kbuild does not rebuild for nothing.
            if fs::read(&path)? != fs::read(&target).unwrap_or_default() {
                put_file(&path, &target, mode)?;
            }
            copied.push(name);
        }
    }
    Ok(copied)
}

pub fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

pub fn parent_of(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

pub fn put_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    parent_of(to)?;
    if to.is_symlink() || to.exists() {
        fs::remove_file(to).with_context(|| format!("replacing {}", to.display()))?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    set_mode(to, mode)
}

pub fn put_text(to: &Path, text: &str, mode: u32) -> Result<()> {
    parent_of(to)?;
    fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    set_mode(to, mode)
}

pub fn put_symlink(target: &str, link: &Path) -> Result<()> {
    parent_of(link)?;
    if link.is_symlink() || link.exists() {
        fs::remove_file(link).with_context(|| format!("replacing {}", link.display()))?;
    }
    symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

/// Copies the tree `from/rel` into `to/rel`: directories, regular files with their mode,
/// symlinks as symlinks; `skip` lists paths (relative to `from`) left out.
pub fn copy_tree(from: &Path, to: &Path, rel: &Path, skip: &[String]) -> Result<()> {
    let dir = from.join(rel);
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        if skip.iter().any(|s| Path::new(s) == rel) {
            continue;
        }
        let kind = entry.file_type()?;
        let (src, dst) = (entry.path(), to.join(&rel));
        if kind.is_symlink() {
            let target = fs::read_link(&src)?;
            let target = target
                .to_str()
                .with_context(|| format!("{} is not UTF-8", src.display()))?;
            put_symlink(target, &dst)?;
        } else if kind.is_dir() {
            copy_tree(from, to, &rel, skip)?;
        } else {
            let mode = entry.metadata()?.permissions().mode() & 0o7777;
            put_file(&src, &dst, mode)?;
        }
    }
    Ok(())
}

/// The regular files under `dir`, sorted.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Copies a file (with its mode), a symlink (as a symlink) or a directory tree.
pub fn copy_path(from: &Path, to: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(from).with_context(|| format!("reading {}", from.display()))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(from)?;
        let target = target
            .to_str()
            .with_context(|| format!("{} is not UTF-8", from.display()))?;
        put_symlink(target, to)
    } else if meta.is_dir() {
        fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
        copy_tree(from, to, Path::new(""), &[])
    } else {
        put_file(from, to, meta.permissions().mode() & 0o7777)
    }
}
