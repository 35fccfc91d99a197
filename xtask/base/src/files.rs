//! Plain-file helpers: fresh directories, files put with a mode, symbolic links, copies of
//! trees, and the locks that keep two xtask processes from writing the same files.

use fs_err as fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

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
/// are left alone.
pub fn copy_module_sources(from: &Path, to: &Path) -> Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let kind = entry.file_type()?;
        if name.starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            copy_module_sources(&path, &to.join(&name))?;
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
        }
    }
    Ok(())
}

/// An empty directory at `dir`, whatever was there: a tree, a file, a link, or nothing.
pub fn fresh_dir(dir: &Path) -> Result<()> {
    remove_any(dir)?;
    Ok(fs::create_dir_all(dir)?)
}

/// Removes `path`, a directory tree or anything else (a link itself, not its target), if it is
/// there. (A download once took a tree's name: `remove_dir_all` alone then fails.)
pub fn remove_any(path: &Path) -> Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    removed.with_context(|| format!("removing {}", path.display()))
}

/// The cached directory `dir`, made by `make` where `complete` says it is not. `make` fills a
/// staging directory next to it that is then renamed to `dir`, so that an interrupted or
/// failed `make` never leaves a `dir` that looks complete. Where another process completed
/// `dir` meanwhile (it may be using it), theirs is kept.
pub fn cached_dir(
    dir: &Path,
    complete: impl Fn(&Path) -> bool,
    make: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    if complete(dir) {
        return Ok(());
    }
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no file name", dir.display()))?;
    let staging = dir.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    remove_any(&staging)?;
    let result = make(&staging).and_then(|()| {
        if complete(dir) {
            return Ok(());
        }
        remove_any(dir)?;
        fs::rename(&staging, dir)?;
        Ok(())
    });
    // Best effort: a leftover staging directory only wastes space.
    let _ = remove_any(&staging);
    result
}

pub fn parent_of(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    Ok(())
}

pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    Ok(fs::set_permissions(
        path,
        std::fs::Permissions::from_mode(mode),
    )?)
}

pub fn put_file(from: &Path, to: &Path, mode: u32) -> Result<()> {
    parent_of(to)?;
    if to.is_symlink() || to.exists() {
        fs::remove_file(to).with_context(|| format!("replacing {}", to.display()))?;
    }
    fs::copy(from, to)?;
    set_mode(to, mode)
}

pub fn put_text(to: &Path, text: &str, mode: u32) -> Result<()> {
    parent_of(to)?;
    fs::write(to, text)?;
    set_mode(to, mode)
}

pub fn put_symlink(target: &str, link: &Path) -> Result<()> {
    parent_of(link)?;
    if link.is_symlink() || link.exists() {
        fs::remove_file(link).with_context(|| format!("replacing {}", link.display()))?;
    }
    symlink(target, link).with_context(|| format!("linking {}", link.display()))
}

/// The regular files under `dir`, sorted.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir)? {
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

/// Copies a file, a symlink or a directory tree as it is (modes, links, times): `cp -a`.
pub fn copy_path(sh: &Shell, from: &Path, to: &Path) -> Result<()> {
    parent_of(to)?;
    cmd!(sh, "cp -a --no-target-directory {from} {to}")
        .quiet()
        .run()
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_dir_replaces_a_tree_a_file_a_link_or_nothing() {
        let dir = std::env::temp_dir().join(format!("files-test-{}", std::process::id()));
        let (tree, file, link) = (dir.join("tree"), dir.join("file"), dir.join("link"));
        fs::create_dir_all(tree.join("sub")).unwrap();
        fs::write(tree.join("sub/x"), "x").unwrap();
        fs::write(&file, "a .deb that took the tree's name").unwrap();
        symlink(&tree, &link).unwrap();
        for path in [&link, &tree, &file, &dir.join("absent")] {
            fresh_dir(path).unwrap();
            assert!(path.is_dir() && fs::read_dir(path).unwrap().next().is_none());
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cached_dir_appears_whole_or_not_at_all() {
        let top = std::env::temp_dir().join(format!("cached-dir-test-{}", std::process::id()));
        let dir = top.join("cache");
        let complete = |d: &Path| d.join("done").is_file();
        fs::create_dir_all(&top).unwrap();
        let failed = cached_dir(&dir, complete, |staging| {
            fs::create_dir_all(staging)?;
            fs::write(staging.join("half"), "")?;
            anyhow::bail!("interrupted")
        });
        assert!(failed.is_err());
        assert!(!dir.exists(), "a failed make left {}", dir.display());
        let made = |staging: &Path| -> Result<()> {
            fs::create_dir_all(staging)?;
            fs::write(staging.join("done"), "")?;
            Ok(())
        };
        cached_dir(&dir, complete, made).unwrap();
        assert!(complete(&dir));
        cached_dir(&dir, complete, |_| anyhow::bail!("made again")).unwrap();
        assert_eq!(
            fs::read_dir(&top).unwrap().count(),
            1,
            "a staging dir was left"
        );
        fs::remove_dir_all(&top).unwrap();
    }
}
