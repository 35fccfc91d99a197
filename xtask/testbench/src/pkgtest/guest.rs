//! The install test's VM part (step 3): the files the guest gets from the host and container
//! roots, the boot, and the checks of what the guest printed.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use xshell::{cmd, Shell};

use super::guest_script::guest_script;
use super::installed::{LOAD_SCRIPT, SOFTDEP};
use super::root::Root;
use crate::step::timed;
use xtask_base::paths;

use crate::kernel::Kernel;
use crate::{vm, vmtest};

/// The emulated provider's module for `kernel` and the emulated libmusa, built: what the package
/// tests' VMs need beside the packages.
pub(super) fn emulated_provider(sh: &Shell, kernel: &Kernel) -> Result<(PathBuf, PathBuf)> {
    let t = Instant::now();
    let (_, emu) = crate::kbuild::build_modules(sh, kernel)?;
    let libmusa = xtask_base::build::emulated_musa(sh)?;
    timed("emulated provider and libmusa built", t);
    Ok((emu, libmusa))
}

/// The libraries `file` (a library built on this machine) loads, as ldd resolves them here:
/// the same paths in the bookworm roots.
pub(crate) fn host_libraries(sh: &Shell, file: &std::path::Path) -> Result<Vec<String>> {
    let listing = cmd!(sh, "ldd {file}")
        .quiet()
        .read()
        .with_context(|| format!("ldd {}", file.display()))?;
    Ok(listing
        .lines()
        .filter_map(|l| l.split_once(" => ")?.1.split_whitespace().next())
        .filter(|lib| lib.starts_with('/'))
        .map(str::to_owned)
        .collect())
}

pub(super) fn run_vm(sh: &Shell, kernel: &Kernel, host: &Root, container: &Root) -> Result<()> {
    let (emu, libmusa) = emulated_provider(sh, kernel)?;

    let release = &kernel.release;
    let mut host_paths = package_files(sh, host, &["libgdrapi", "mtgdrcopy-tests"])?;
    host_paths.retain(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"));
    host_paths.push("/usr/lib/udev/rules.d/60-mtgdrdrv.rules".into());
    let udev = package_files(sh, host, &["udev"])?;
    let udevd = udev
        .iter()
        .find(|p| p.ends_with("/systemd-udevd"))
        .context("the udev package has no systemd-udevd")?
        .clone();
    let udevadm = udev
        .iter()
        .find(|p| p.ends_with("/udevadm"))
        .context("the udev package has no udevadm")?
        .clone();
    host_paths.extend([
        udevd.clone(),
        udevadm,
        "/usr/bin/setpriv".into(),
        "/etc/passwd".into(),
        "/etc/group".into(),
        "/tmp/consumer/consumer".into(),
    ]);
    host_paths.extend([
        format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko"),
        // DKMS's depmod wrote it: the postinst's modprobe (busybox's here) finds mtgdrdrv there.
        format!("/lib/modules/{release}/modules.dep"),
        LOAD_SCRIPT.into(),
        SOFTDEP.into(),
        // kmod's modprobe, for the softdep: busybox's knows no softdep.
        "/usr/bin/kmod".into(),
    ]);
    // What the emulated libmusa (built here, by the system's linker) needs, e.g. libgcc_s.so.1,
    // which the packaged programs, linked by zig, no longer pull in.
    let musa_needs = host_libraries(sh, &libmusa)?;
    host_paths.extend(musa_needs.iter().cloned());
    let mut files = root_files(sh, host, &host_paths, "", "vm-files")?;
    // The guest's /tmp is a fresh tmpfs, and busybox has its own, smaller setpriv.
    for (_, guest) in files.iter_mut() {
        if guest == "/tmp/consumer/consumer" || guest == "/usr/bin/setpriv" {
            let name = guest.rsplit('/').next().unwrap_or_default().to_owned();
            *guest = format!("/opt/mtgdrcopy/{name}");
        }
    }
    // insmod.sh runs debian/scripts/mtgdrdrv-load beside it: there too, the copy the package installed.
    let load = files
        .iter()
        .find(|(_, guest)| guest == LOAD_SCRIPT)
        .context("mtgdrdrv-load is not among the guest's files")?
        .0
        .clone();
    files.push((
        load,
        "/opt/mtgdrcopy/debian/scripts/mtgdrdrv-load".to_owned(),
    ));

    let container_paths = package_files(sh, container, &["libgdrapi", "mtgdrcopy-tests"])?
        .into_iter()
        .filter(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"))
        .chain(musa_needs)
        .collect::<Vec<_>>();
    files.extend(root_files(
        sh,
        container,
        &container_paths,
        "/container",
        "vm-files",
    )?);

    files.extend([
        (emu, "/lib/mtgdrcopy/mtgpu_emu.ko".to_owned()),
        (
            libmusa.clone(),
            "/usr/lib/mtgdrcopy/emu/libmusa.so.1".to_owned(),
        ),
        (
            libmusa,
            "/container/usr/lib/mtgdrcopy/emu/libmusa.so.1".to_owned(),
        ),
        (
            paths::root().join("insmod.sh"),
            "/opt/mtgdrcopy/insmod.sh".to_owned(),
        ),
    ]);
    let group = host.read(sh, "/etc/group")?;
    ensure!(
        group.lines().any(|l| l.starts_with("render:")),
        "the host root has no render group, which the udev rule names"
    );

    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = files;
    spec.script = guest_script(&udevd);
    spec.ivshmem_mb = 256;
    spec.timeout = Duration::from_secs(600);
    let log = paths::build_dir()
        .join("pkgtest")
        .join(format!("vm-{release}.log"));
    let outcome = vm::run(&spec, &log)?;
    let console = outcome.console.replace('\r', "");
    vmtest::print_guest_steps(&console);
    if let Some(node) = console
        .lines()
        .find_map(|l| l.strip_prefix("MTGDRCOPY-NODE "))
    {
        eprintln!("      /dev/mtgdrdrv: mode {node} (udev, debian/60-mtgdrdrv.rules)");
    }
    for seen in vmtest::marked(&console, "MTGDRCOPY-KMOD ") {
        eprintln!("      kmod: {seen}");
    }
    outcome.ensure_passed("the VM part", &log)?;
    // Last: a guest that stopped early printed fewer of the messages, which says less than why.
    check_readme_quotes(&console)
}

/// The messages README.md's troubleshooting table quotes, as the guest printed them: the
/// library's (logging on), insmod.sh's and mtgdrdrv-load's (with mtgpu for the emulated
/// provider's name) and the kernel's. Each must be in the table word for word, so that a user
/// who searches the README for the message finds its cause and fix.
fn check_readme_quotes(console: &str) -> Result<()> {
    let readme =
        fs::read_to_string(paths::root().join("README.md")).context("reading README.md")?;
    let table = troubleshooting_table(&readme)?;
    let mut quoted = 0;
    for line in console.lines() {
        // Kernel lines carry a `[   4.5]` timestamp first.
        let text = match line.split_once("] ") {
            Some((stamp, rest)) if stamp.starts_with('[') => rest,
            _ => line,
        };
        let text = text.trim_end();
        let wanted = text.starts_with("ERR:  ")
            || (text.starts_with("DBG:  ") && text.contains("mmap"))
            || text.starts_with("insmod.sh: ")
            || text.starts_with("mtgdrdrv: Unknown symbol")
            || (text.starts_with("mtgdrdrv: ")
                && (text.contains("driver is not loaded")
                    || text.contains("loaded with disable_driver=1")));
        if !wanted {
            continue;
        }
        // mtgdrdrv-load names the provider, the emulated one here; README.md names mtgpu.
        let text = &text.replace("mtgpu_emu", "mtgpu");
        ensure!(
            table.iter().any(|row| row.contains(text.as_str())),
            "README.md's troubleshooting table does not quote this message the guest \
             printed:\n{text}"
        );
        quoted += 1;
    }
    ensure!(
        quoted >= 7,
        "the guest printed only {quoted} of the messages README.md quotes"
    );
    Ok(())
}

/// The body rows of the table under README.md's "## Troubleshooting" (symptom, cause, fix).
fn troubleshooting_table(readme: &str) -> Result<Vec<&str>> {
    let section = readme
        .split_once("\n## Troubleshooting\n")
        .context("README.md has no \"## Troubleshooting\"")?
        .1;
    let section = section.split("\n## ").next().unwrap_or(section);
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .collect();
    ensure!(
        !rows.is_empty(),
        "README.md's \"## Troubleshooting\" has no table"
    );
    Ok(rows)
}

/// Host files for the guest: `paths` of `root` (symlinks followed), each at `prefix` + its
/// path, plus the shared libraries they need, taken from the root itself (ldd inside it).
pub(super) fn root_files(
    sh: &Shell,
    root: &Root,
    paths: &[String],
    prefix: &str,
    export: &str,
) -> Result<Vec<(PathBuf, String)>> {
    let mut all: Vec<String> = paths.to_vec();
    let mut args = vec!["ldd"];
    args.extend(paths.iter().map(String::as_str));
    // ldd fails for the files that are not dynamic ELF objects; it still lists the others.
    let (_, out, _) = root.output(sh, &args)?;
    for line in out.lines() {
        let line = line.trim();
        // With several files, ldd heads each one's list with `<file>:`.
        if line.ends_with(':') {
            continue;
        }
        let lib = match line.split_once(" => ") {
            Some((_, rest)) => rest.split(" (").next().unwrap_or_default().trim(),
            None if line.starts_with('/') => line.split(" (").next().unwrap_or_default().trim(),
            None => continue,
        };
        // A library among `paths` under another directory name (/lib is /usr/lib here) is
        // the same file: cp would skip it, and the guest's loader searches both.
        let name = lib.rsplit('/').next().unwrap_or(lib);
        if lib.starts_with('/') && !all.iter().any(|p| p.rsplit('/').next() == Some(name)) {
            all.push(lib.to_owned());
        }
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let dir = root.export(sh, &refs, export)?;
    Ok(all
        .iter()
        .map(|p| (dir.join(p.trim_start_matches('/')), format!("{prefix}{p}")))
        .collect())
}

/// What `packages` installed in `root` (dpkg -L: files, links and directories).
pub(super) fn package_files(sh: &Shell, root: &Root, packages: &[&str]) -> Result<Vec<String>> {
    let mut args = vec!["dpkg", "-L"];
    args.extend(packages);
    let out = root.run(sh, &args)?;
    Ok(out.lines().map(String::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_troubleshooting_table_quotes_the_guests_messages() {
        let readme = fs::read_to_string(paths::root().join("README.md")).unwrap();
        let rows = troubleshooting_table(&readme).unwrap();
        assert!(
            rows.iter().all(|r| r.matches(" | ").count() == 2),
            "{rows:#?}"
        );
        // A guest that printed the same messages as a passing run, kernel timestamps and
        // the emulated provider's name included.
        let console = rows
            .iter()
            .flat_map(|r| r.split('`'))
            .filter(|q| q.starts_with("ERR:  ") || q.starts_with("mtgdrdrv: "))
            .map(|q| {
                format!(
                    "[  4.5] {}",
                    q.replace("mtgpu is loaded", "mtgpu_emu is loaded")
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        check_readme_quotes(&console).unwrap();
        let unknown = format!("{console}\nERR:  something the README does not say");
        assert!(check_readme_quotes(&unknown).is_err());
        assert!(troubleshooting_table("# x\n\n## Troubleshooting\n\ntext\n").is_err());
    }
}
