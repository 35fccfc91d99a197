//! Out-of-tree kbuild of our two kernel modules, mtgdrdrv and the emulated provider, for one
//! test kernel: the sources copied out of the tree, `make W=1`, and the log judged by
//! [`Warnings`]. Used by the VM tests (vmtest), the package tests' guests and the kernel matrix.

mod warnings;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::Shell;

use xtask_base::paths;

use crate::kernel::{Builder, Kernel};
pub use warnings::Warnings;

/// Builds `mtgdrdrv.ko` and `mtgpu_emu.ko` for `kernel` in a copy of the sources, so the source
/// tree stays clean and kernels do not share objects: in build/kmod/<release> on the host, or, for
/// a kernel built in a chroot, in the chroot (the .ko files are then copied to
/// build/kmod/<release>). mtgdrdrv takes the provider's symbol CRCs from its co-built stub, as on
/// hosts without mtgpu's Module.symvers: loading it against the emulator then proves the CRCs
/// match. The build is incremental; [`clean_modules`] first makes every file compile again.
///
/// W=1, and warnings are errors for our files: a compiler warning located in our sources or
/// headers, or any modpost/objtool warning about our modules, fails the build (see
/// [`Warnings`]); warnings located in the kernel's own headers are counted, not failed.
pub fn build_modules(sh: &Shell, kernel: &Kernel) -> Result<(PathBuf, PathBuf)> {
    let out = paths::build_dir().join("kmod").join(&kernel.release);
    let work = work_dir(kernel);
    let work_host = kernel.builder.host_path(&work);
    // The repository's layout, which the emulator's Kbuild relies on (it uses mtgdrdrv's probes).
    let (kmod, emu) = ("mtgdrdrv/kmod", "testing/mtgpu-emu");
    for dir in [kmod, emu] {
        copy_sources(&paths::root().join(dir), &work_host.join(dir))?;
    }
    make_module(
        sh,
        kernel,
        &work.join(kmod),
        &["MTGPU_SYMVERS=", "MTGDRDRV_TEST_HOOKS=y"],
        "mtgdrdrv",
    )?;
    make_module(sh, kernel, &work.join(emu), &[], "mtgpu_emu")?;
    let mut built = [
        work_host.join(kmod).join("mtgdrdrv.ko"),
        work_host.join(emu).join("mtgpu_emu.ko"),
    ];
    if kernel.builder != Builder::Host {
        // A chroot's work directory is reused by the next kernel: keep the modules outside it.
        for (ko, to) in built
            .iter_mut()
            .zip(["kmod/mtgdrdrv.ko", "emu/mtgpu_emu.ko"])
        {
            let to = out.join(to);
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::copy(&*ko, &to)
                .with_context(|| format!("copying {} to {}", ko.display(), to.display()))?;
            *ko = to;
        }
    }
    let [kmod, emu] = built;
    Ok((kmod, emu))
}

/// Forgets the objects of earlier builds of `kernel`'s modules, so that the next
/// [`build_modules`] compiles every file and so reports every warning.
pub fn clean_modules(kernel: &Kernel) -> Result<()> {
    let work = kernel.builder.host_path(&work_dir(kernel));
    match std::fs::remove_dir_all(&work) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", work.display()))
        }
        _ => Ok(()),
    }
}

/// Where `kernel`'s modules are built, as its builder sees the path. A chroot holds one kernel.
fn work_dir(kernel: &Kernel) -> PathBuf {
    match kernel.builder {
        Builder::Host => paths::build_dir().join("kmod").join(&kernel.release),
        Builder::Chroot(_) => PathBuf::from("/root/mtgdrcopy-kmod"),
    }
}

/// `make` of one module directory (`dir` as the builder sees it), judged by [`Warnings`].
fn make_module(sh: &Shell, kernel: &Kernel, dir: &Path, args: &[&str], name: &str) -> Result<()> {
    let jobs = format!(
        "-j{}",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let kdir = format!("KDIR={}", kernel.headers.display());
    let out = kernel
        .builder
        .cmd(sh, None, "make")
        .args(["-s", &jobs, "-C"])
        .arg(dir)
        .arg(kdir)
        .args(args)
        .arg("W=1")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running make for {name}"))?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        eprint!("{log}");
        bail!(
            "building {name} for {} failed ({})",
            kernel.release,
            out.status
        );
    }
    let warnings = Warnings::find(&log, dir);
    if !warnings.ours.is_empty() {
        eprint!("{log}");
        // Kbuild would not compile these objects again: remove them so that the warnings come
        // back on the next build instead of passing silently, as -Werror would.
        let host_dir = kernel.builder.host_path(dir);
        for entry in std::fs::read_dir(&host_dir)
            .with_context(|| format!("reading {}", host_dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "o" || e == "ko") {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        bail!(
            "{name} for {}: warnings in our files (W=1; they are errors):\n  {}",
            kernel.release,
            warnings.ours.join("\n  ")
        );
    }
    if warnings.others > 0 {
        eprintln!(
            "    {name} for {}: {} warning(s) located in the kernel's headers, not ours:",
            kernel.release, warnings.others
        );
        eprint!("{log}");
    }
    Ok(())
}

/// Copies the regular files of `from` (sources, Kbuild, Makefile, probes) into `to`, leaving
/// build products behind.
fn copy_sources(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&name))?;
            continue;
        }
        let built = [
            ".o", ".ko", ".mod", ".mod.c", ".cmd", ".symvers", ".order", ".d",
        ]
        .iter()
        .any(|ext| name_str.ends_with(ext))
            || name_str.starts_with('.')
            || name_str == "conftest.h";
        // Unchanged files keep their timestamps, so kbuild does not rebuild for nothing.
        let target = to.join(&name);
        if !built && std::fs::read(&path)? != std::fs::read(&target).unwrap_or_default() {
            std::fs::copy(&path, &target)?;
        }
    }
    Ok(())
}
