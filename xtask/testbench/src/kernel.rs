//! Debian kernels for building and booting the module: headers from apt, images from the cache.
//!
//! The host cannot load modules, so tests boot a Debian kernel in QEMU. The kernel image must be
//! the one the installed headers describe, or modversions reject our module. Images are fetched
//! with `apt-get download` (the machine's own apt sources, or those of the chroot that holds the
//! headers; no mirror is named here) and unpacked into `cache_dir()/kernels/<release>/`, so a
//! second run touches neither apt nor the network.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::{chroot, host, paths};

/// A kernel we can build modules against and boot.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// `uname -r` of the kernel, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The bootable image (bzImage), unpacked from Debian's unsigned image package.
    pub vmlinuz: PathBuf,
    /// The kbuild tree: `make -C <headers> M=<dir> modules`, a path as `builder` sees it.
    pub headers: PathBuf,
    /// Where modules for this kernel are compiled.
    pub builder: Builder,
}

/// Where a kernel's modules are compiled: on this machine (its headers and gcc match), or in a
/// chroot of the kernel's own suite, which has the compiler the kernel was built with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Builder {
    Host,
    /// The chroot's root directory on the host (see xtask-base's chroot.rs).
    Chroot(PathBuf),
}

impl Builder {
    /// The host path of `path` as the builder sees it.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        match self {
            Builder::Host => path.to_owned(),
            Builder::Chroot(root) => chroot::host_path(root, path),
        }
    }

    /// `program` run by the builder, in `cwd` (a path as the builder sees it) when given.
    pub fn cmd<'a>(&self, sh: &'a Shell, cwd: Option<&Path>, program: &str) -> xshell::Cmd<'a> {
        match self {
            // A Cmd takes the Shell's directory when it runs, not when it is built: `env -C`
            // makes the directory part of the command.
            Builder::Host => match cwd {
                Some(dir) => cmd!(sh, "env -C {dir} {program}"),
                None => sh.cmd(program),
            },
            Builder::Chroot(root) => chroot::command(
                sh,
                root,
                &chroot::Options {
                    cwd,
                    ..Default::default()
                },
                program,
            ),
        }
    }
}

/// The newest bookworm 6.1 kernel whose headers are installed, installing headers and fetching
/// the image on first use.
pub fn bookworm_kernel() -> Result<Kernel> {
    let release = match newest_bookworm_headers()? {
        Some(release) => release,
        None => {
            host::ensure_host_packages(&["linux-headers-amd64"])?;
            newest_bookworm_headers()?.context(
                "linux-headers-amd64 is installed but no /usr/src/linux-headers-6.1.0-*-amd64 \
                 exists; is this a Debian 12 (bookworm) host?",
            )?
        }
    };
    let headers = PathBuf::from(format!("/usr/src/linux-headers-{release}"));
    let vmlinuz = cached_image(&release, &Builder::Host)?;
    Ok(Kernel {
        release,
        vmlinuz,
        headers,
        builder: Builder::Host,
    })
}

/// The kernel `release` whose headers are installed in the chroot at `root`, its image fetched
/// through that chroot's apt on first use.
pub fn chroot_kernel(root: &Path, release: &str) -> Result<Kernel> {
    let builder = Builder::Chroot(root.to_owned());
    let headers = PathBuf::from(format!("/usr/src/linux-headers-{release}"));
    ensure!(
        builder.host_path(&headers).join("Makefile").is_file(),
        "{} has no headers for {release}",
        root.display()
    );
    let vmlinuz = cached_image(release, &builder)?;
    Ok(Kernel {
        release: release.to_owned(),
        vmlinuz,
        headers,
        builder,
    })
}

/// The `6.1.0-<abi>-amd64` release with a headers tree in /usr/src and the highest ABI number.
fn newest_bookworm_headers() -> Result<Option<String>> {
    let src = Path::new("/usr/src");
    let entries = match fs::read_dir(src) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("reading /usr/src"),
    };
    let mut found: Vec<(u32, String)> = Vec::new();
    for entry in entries {
        let entry = entry.context("reading /usr/src")?;
        let name = entry.file_name();
        let Some(release) = name.to_str().and_then(|n| n.strip_prefix("linux-headers-")) else {
            continue;
        };
        let Some(abi) = bookworm_abi(release) else {
            continue;
        };
        // A half-removed package can leave the directory without the kbuild entry point.
        if !entry.path().join("Makefile").is_file() {
            continue;
        }
        found.push((abi, release.to_owned()));
    }
    Ok(found.into_iter().max().map(|(_, release)| release))
}

/// The ABI number of a bookworm kernel release name (`6.1.0-57-amd64` → 57). Compared as a
/// number, since `6.1.0-9` sorts after `6.1.0-57` as a string.
fn bookworm_abi(release: &str) -> Option<u32> {
    let abi = release.strip_prefix("6.1.0-")?.strip_suffix("-amd64")?;
    abi.parse().ok()
}

/// The image for `release` in the cache, downloaded (through `apt`'s package lists) and unpacked
/// if absent.
fn cached_image(release: &str, apt: &Builder) -> Result<PathBuf> {
    let dir = paths::cache_dir().join("kernels").join(release);
    let vmlinuz_in = |dir: &Path| dir.join("boot").join(format!("vmlinuz-{release}"));
    let vmlinuz = vmlinuz_in(&dir);
    if vmlinuz.is_file() {
        return Ok(vmlinuz);
    }
    eprintln!(
        "xtask: fetching the kernel image for {release} (once; cached in {})",
        dir.display()
    );
    xtask_base::files::cached_dir(
        &dir,
        |dir| vmlinuz_in(dir).is_file(),
        |staging| fetch_image(release, staging, apt),
    )?;
    if !vmlinuz.is_file() {
        bail!("the image package for {release} has no boot/vmlinuz-{release}");
    }
    Ok(vmlinuz)
}

fn fetch_image(release: &str, staging: &Path, apt: &Builder) -> Result<()> {
    unpack_image_package(release, staging, apt)?;
    let boot = staging.join("boot");
    let vmlinuz = boot.join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        let modules = staging.join("usr/lib/modules").join(release);
        let found = ["vmlinuz.unsigned", "vmlinuz"]
            .iter()
            .map(|name| modules.join(name))
            .find(|p| p.is_file())
            .with_context(|| format!("the image package for {release} has no vmlinuz"))?;
        fs::create_dir_all(&boot).with_context(|| format!("creating {}", boot.display()))?;
        fs::rename(&found, &vmlinuz)
            .with_context(|| format!("moving {} to {}", found.display(), vmlinuz.display()))?;
    }
    // Only boot/ (vmlinuz, config, System.map) is needed: the guest gets its modules from the
    // initramfs, and lib/modules would add ~400 MB to the cache.
    for sub in ["download", "lib", "usr"] {
        let path = staging.join(sub);
        if path.exists() {
            fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// The image package of `release` (the same upload as its installed headers), unpacked into
/// `staging`.
fn unpack_image_package(release: &str, staging: &Path, apt: &Builder) -> Result<()> {
    let sh = Shell::new()?;
    // Debian 7.x split the image package: the unsigned bzImage moved from
    // linux-image-<release>-unsigned (boot/vmlinuz-<release>) to linux-binary-unsigned-<release>
    // (usr/lib/modules/<release>/vmlinuz.unsigned).
    let packages = [
        format!("linux-image-{release}-unsigned"),
        format!("linux-binary-unsigned-{release}"),
    ];
    // Pin the image to the exact upload of the installed headers: the same ABI name can be
    // rebuilt, and modversion CRCs must match the kernel we boot.
    let headers_version = apt
        .cmd(&sh, None, "dpkg-query")
        .args([
            "-W",
            "-f",
            "${Version}",
            &format!("linux-headers-{release}"),
        ])
        .quiet()
        .ignore_stderr()
        .read()
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    let mut candidates: Vec<String> = Vec::new();
    if let Some(version) = &headers_version {
        candidates.extend(packages.iter().map(|p| format!("{p}={version}")));
    }
    candidates.extend(packages.iter().cloned());

    // apt-get download writes into its working directory, which must be visible to the
    // builder: inside the chroot for a chroot's apt.
    let download_inside = match apt {
        Builder::Host => staging.join("download"),
        Builder::Chroot(_) => PathBuf::from(format!(
            "/var/tmp/mtgdrcopy-download-{}",
            std::process::id()
        )),
    };
    let download = apt.host_path(&download_inside);
    fs::create_dir_all(&download).with_context(|| format!("creating {}", download.display()))?;
    let result = download_deb(&sh, apt, &download_inside, &candidates).and_then(|()| {
        let deb = fs::read_dir(&download)
            .with_context(|| format!("reading {}", download.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", download.display()))?;
        cmd!(sh, "dpkg-deb -x {deb} {staging}")
            .quiet()
            .run()
            .with_context(|| format!("unpacking {}", deb.display()))
    });
    // Best effort: a leftover download directory only wastes space.
    let _ = fs::remove_dir_all(&download);
    result
}

/// A few of `kernel`'s own modules, `names` and what they need, in a tree of their own
/// (`<dir>/lib/modules/<release>/`, with its modules.dep), cached as `modules-<recipe>` beside
/// the image: for an initramfs that mounts a disk or a shared directory. `recipe` names the
/// list, so that another list is fetched anew.
pub fn image_modules(kernel: &Kernel, names: &[&str], recipe: &str) -> Result<PathBuf> {
    let release = &kernel.release;
    let dir = paths::cache_dir()
        .join("kernels")
        .join(release)
        .join(format!("modules-{recipe}"));
    let tree = |root: &Path| root.join("lib/modules").join(release);
    let unpacked = dir.with_file_name(format!(".modules-{recipe}.package-{}", std::process::id()));
    let result = xtask_base::files::cached_dir(
        &dir,
        |dir| tree(dir).join("modules.dep").is_file(),
        |staging| {
            unpack_image_package(release, &unpacked, &kernel.builder)?;
            let sh = Shell::new()?;
            // Debian 12 ships the modules under /lib, Debian 13 on under /usr/lib.
            let base = if tree(&unpacked).exists() {
                unpacked.clone()
            } else {
                unpacked.join("usr")
            };
            cmd!(sh, "depmod -b {base} {release}").quiet().run()?;
            let deps = fs::read_to_string(tree(&base).join("modules.dep"))?;
            for module in module_closure(&deps, names)? {
                let to = tree(staging).join(&module);
                fs::create_dir_all(to.parent().context("a module path has no parent")?)?;
                fs::copy(tree(&base).join(&module), &to)
                    .with_context(|| format!("copying {module}"))?;
            }
            // It warns of the lists of a whole kernel (modules.order, .builtin) this tree lacks.
            cmd!(sh, "depmod -b {staging} {release}")
                .quiet()
                .ignore_stderr()
                .run()?;
            Ok(())
        },
    );
    let _ = fs::remove_dir_all(&unpacked);
    result.with_context(|| format!("collecting modules {names:?} of {release}"))?;
    Ok(dir)
}

/// The paths (relative to the modules tree) of `names` and of every module they depend on,
/// from a modules.dep (`path: dependency paths`).
fn module_closure(modules_dep: &str, names: &[&str]) -> Result<Vec<String>> {
    let deps: Vec<(&str, Vec<&str>)> = modules_dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(module, needs)| (module, needs.split_whitespace().collect()))
        .collect();
    let mut wanted = Vec::new();
    for name in names {
        let (module, needs) = deps
            .iter()
            .find(|(path, _)| {
                let file = path.rsplit('/').next().unwrap_or(path);
                file.split('.').next() == Some(*name)
            })
            .with_context(|| format!("the kernel has no module {name}"))?;
        for path in needs.iter().chain([module]) {
            if !wanted.contains(&path.to_string()) {
                wanted.push(path.to_string());
            }
        }
    }
    Ok(wanted)
}

/// Downloads the first of `candidates` that `apt` can find into `dir` (a path as `apt` sees
/// it), refreshing the package lists once if none is known (fresh containers ship without lists).
fn download_deb(sh: &Shell, apt: &Builder, dir: &Path, candidates: &[String]) -> Result<()> {
    let mut errors = String::new();
    for refreshed in [false, true] {
        if refreshed {
            match apt {
                Builder::Host => host::apt(sh, &["update"])?,
                Builder::Chroot(root) => {
                    apt.cmd(sh, None, "apt-get")
                        .arg("update")
                        .quiet()
                        .ignore_stdout()
                        .run()
                        .with_context(|| format!("apt-get update in {}", root.display()))?;
                }
            }
        }
        for candidate in candidates {
            let out = apt
                .cmd(sh, Some(dir), "apt-get")
                .args(["download", candidate])
                .quiet()
                .ignore_status()
                .output()
                .context("running apt-get download")?;
            if out.status.success() {
                return Ok(());
            }
            errors.push_str(&String::from_utf8_lossy(&out.stderr));
        }
    }
    bail!(
        "could not download any of {}:\n{errors}",
        candidates.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::{bookworm_abi, module_closure};

    #[test]
    fn a_modules_dependencies_come_before_it_once() {
        let dep = "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/jbd2/jbd2.ko\n\
                   kernel/lib/crc16.ko:\nkernel/fs/jbd2/jbd2.ko:\n\
                   kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko\nkernel/net/9p/9pnet.ko:\n";
        assert_eq!(
            module_closure(dep, &["ext4", "9p", "crc16"]).unwrap(),
            [
                "kernel/lib/crc16.ko",
                "kernel/fs/jbd2/jbd2.ko",
                "kernel/fs/ext4/ext4.ko",
                "kernel/net/9p/9pnet.ko",
                "kernel/fs/9p/9p.ko"
            ]
        );
        assert!(module_closure(dep, &["virtio_blk"]).is_err());
    }

    #[test]
    fn abi_is_numeric() {
        assert_eq!(bookworm_abi("6.1.0-57-amd64"), Some(57));
        assert_eq!(bookworm_abi("6.1.0-9-amd64"), Some(9));
        assert_eq!(bookworm_abi("6.1.0-57-common"), None);
        assert_eq!(bookworm_abi("6.12.30+deb13-amd64"), None);
        assert_eq!(bookworm_abi("6.1.0-57-rt-amd64"), None);
    }
}
