//! The README's "From source" lines, run the way its reader runs them: the
//! `cargo xtask` lines on this machine (for the VM's kernel), the `sudo` lines as root in the
//! guest, the others as a user in group `render` there, in a copy of the tree's relevant
//! files at /src. mtgpu_emu stands in for mtgpu (and its device node, group render, for the
//! GPU's render node), the emulated libmusa for the MUSA driver's, installed where MUSA puts
//! it (/usr/local/musa/lib). What the user's tools print must show the module in use.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;

use crate::kernel::Kernel;

/// The README heading whose first `sh` block is run.
pub const SECTION: &str = "### From source";

/// The guest's user and render group (any ids unused in the guest).
const USER_ID: u32 = 1000;
const RENDER_GID: u32 = 992;

/// The block's lines by who runs them, in order: this machine, root, the user.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lines {
    pub host: Vec<String>,
    pub root: Vec<String>,
    pub user: Vec<String>,
}

/// Splits the first ```sh block under [`SECTION`] of `readme`. Comments (` # …`) are dropped.
/// The order must be host lines, then root lines, then user lines, which is how the test runs
/// them.
pub fn readme_lines(readme: &str) -> Result<Lines> {
    let after = readme
        .split_once(&format!("\n{SECTION}\n"))
        .with_context(|| format!("README.md has no heading {SECTION:?}"))?
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(block, _)| block)
        .with_context(|| format!("no ```sh block under {SECTION:?}"))?;
    let mut lines = Lines::default();
    let mut last_phase = 0;
    for raw in block.lines() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (phase, text) = if line.starts_with("cargo xtask ") {
            (0, line)
        } else if let Some(rest) = line.strip_prefix("sudo ") {
            (1, rest)
        } else {
            (2, line)
        };
        ensure!(
            phase >= last_phase,
            "{SECTION:?}: {line:?} comes after a line of a later phase; the test runs the \
             cargo xtask lines, then the sudo lines, then the user's"
        );
        last_phase = phase;
        [&mut lines.host, &mut lines.root, &mut lines.user][phase].push(text.to_string());
    }
    ensure!(
        !lines.host.is_empty() && !lines.root.is_empty() && !lines.user.is_empty(),
        "{SECTION:?} must build (cargo xtask), load (sudo) and run (as the user): {lines:?}"
    );
    Ok(lines)
}

/// The files and the guest script of the step, after running the host lines for `kernel`.
pub fn prepare(sh: &Shell, kernel: &Kernel) -> Result<(Vec<(PathBuf, String)>, String)> {
    let root = paths::root();
    let readme = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let lines = readme_lines(&readme)?;
    let _cwd = sh.push_dir(&root);
    for line in &lines.host {
        let mut words: Vec<String> = line.split_whitespace().map(String::from).collect();
        // The module is built for the VM's kernel, not this machine's.
        if words.get(2).map(String::as_str) == Some("build") {
            words.extend([
                "--kver".into(),
                kernel.release.clone(),
                "--kdir".into(),
                kernel.headers.display().to_string(),
            ]);
        }
        let (program, args) = words.split_first().context("an empty line")?;
        cmd!(sh, "{program} {args...}")
            .run()
            .with_context(|| format!("the README's {line:?}"))?;
    }

    let release = paths::release_dir();
    let mut files = vec![
        (root.join("insmod.sh"), "/src/insmod.sh".to_string()),
        (
            root.join("debian/scripts/mtgdrdrv-load"),
            "/src/debian/scripts/mtgdrdrv-load".into(),
        ),
        (
            root.join("debian/60-mtgdrdrv.rules"),
            "/src/debian/60-mtgdrdrv.rules".into(),
        ),
        (
            xtask_base::build::driver_dir(&kernel.release).join("mtgdrdrv.ko"),
            format!("/src/build/driver/{}/mtgdrdrv.ko", kernel.release),
        ),
        (
            PathBuf::from("/usr/bin/setpriv"),
            "/opt/mtgdrcopy/setpriv".into(),
        ),
    ];
    for name in ["libgdrapi.so".to_string(), xtask_base::library::soname()] {
        files.push((release.join(&name), format!("/src/target/release/{name}")));
    }
    for (path, name) in super::guest::programs(&release, |_| false)? {
        files.push((path, format!("/src/target/release/{name}")));
    }
    let dir = paths::build_dir().join("vm/from-source");
    std::fs::create_dir_all(&dir)?;
    let mut write = |name: &str, guest: &str, text: String| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        files.push((path, guest.to_string()));
        Ok(())
    };
    write(
        "group",
        "/etc/group",
        format!("root:x:0:\nrender:x:{RENDER_GID}:builder\nbuilder:x:{USER_ID}:\n"),
    )?;
    write(
        "passwd",
        "/etc/passwd",
        format!("root:x:0:0:root:/root:/bin/sh\nbuilder:x:{USER_ID}:{USER_ID}::/tmp:/bin/sh\n"),
    )?;
    write(
        "root.sh",
        "/opt/mtgdrcopy/readme-root.sh",
        script(&lines.root),
    )?;
    write(
        "user.sh",
        "/opt/mtgdrcopy/readme-user.sh",
        script(&lines.user),
    )?;
    Ok((files, guest_step()))
}

fn script(lines: &[String]) -> String {
    format!("set -e\ncd /src\n{}\n", lines.join("\n"))
}

fn guest_step() -> String {
    format!(
        r#"step from-source
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu (from source)"
for i in $(seq 50); do [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done
chgrp render /dev/mtgpu_emu && chmod 0660 /dev/mtgpu_emu || fail "/dev/mtgpu_emu for group render"
chmod -R a+rX /src
# Where MUSA installs it, for this step only: the in-VM tests before it need no libmusa found.
mkdir -p /usr/local/musa/lib && cp /usr/lib/mtgdrcopy/emu/libmusa.so.1 /usr/local/musa/lib/
MTGDRDRV_PROVIDER=mtgpu_emu sh /opt/mtgdrcopy/readme-root.sh 2>&1 | sed 's/^/MTGDRCOPY-FROM-SOURCE-ROOT /'
/opt/mtgdrcopy/setpriv --reuid={USER_ID} --regid={USER_ID} --groups={RENDER_GID} \
    env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin HOME=/tmp MTGDRCOPY_ALLOW_EMULATED_MUSA=1 sh /opt/mtgdrcopy/readme-user.sh >/tmp/user.out 2>&1
echo "MTGDRCOPY-FROM-SOURCE-EXIT $?"
sed 's/^/MTGDRCOPY-FROM-SOURCE /' /tmp/user.out
sed 's/^/MTGDRCOPY-COUNTER /' /proc/driver/mtgdrdrv/counters
mtgdrcopy_musainfo --emu-stats | sed 's/^/MTGDRCOPY-COUNTER /'
rmmod mtgdrdrv || fail "rmmod mtgdrdrv (from source)"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (from source)"
"#
    )
}

/// The step's verdict from the console: the user's lines all ran (exit 0), on the module
/// (not the dma-buf fallback), the sanity suite passed, and insmod.sh gave the device the udev
/// rule's group and mode.
pub fn check(console: &str, log: &Path) -> Result<()> {
    let lines = |prefix| -> Vec<&str> { super::judge::marked(console, prefix).collect() };
    let exit = lines("MTGDRCOPY-FROM-SOURCE-EXIT ");
    let user = lines("MTGDRCOPY-FROM-SOURCE ");
    let root = lines("MTGDRCOPY-FROM-SOURCE-ROOT ");
    let shown = || {
        format!(
            "root:\n  {}\nuser:\n  {}",
            root.join("\n  "),
            user.join("\n  ")
        )
    };
    for line in root.iter().chain(&user) {
        eprintln!("      from source: {line}");
    }
    if exit != ["0"] {
        bail!(
            "the README's from-source lines failed in the VM (exit {exit:?}):\n{}\nfull log: {}",
            shown(),
            log.display()
        );
    }
    ensure!(
        root.iter().any(|l| l.contains("group render, mode 0660")),
        "insmod.sh did not apply the udev rule's group and mode:\n{}",
        shown()
    );
    ensure!(
        user.iter()
            .any(|l| l.starts_with("driver:") && l.contains(" mtgdrdrv ")),
        "the user's tools did not use mtgdrdrv:\n{}",
        shown()
    );
    ensure!(
        user.iter()
            .any(|l| l.contains(" passed, 0 failed") && !l.starts_with("0 passed")),
        "no passing mtgdrcopy_sanity summary among the user's output:\n{}",
        shown()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(block: &str) -> String {
        format!("# x\n\n{SECTION}\n\nText.\n\n```sh\n{block}\n```\n\n## next\n")
    }

    #[test]
    fn lines_are_split_by_who_runs_them() {
        let lines = readme_lines(&doc(
            "cargo xtask build   # all\nsudo ./insmod.sh\n\nexport A=$PWD/x\nrun --version  # check",
        ))
        .unwrap();
        assert_eq!(
            lines,
            Lines {
                host: vec!["cargo xtask build".into()],
                root: vec!["./insmod.sh".into()],
                user: vec!["export A=$PWD/x".into(), "run --version".into()],
            }
        );
    }

    #[test]
    fn out_of_order_or_missing_phases_are_refused() {
        assert!(readme_lines(&doc("cargo xtask build\nrun\nsudo ./insmod.sh")).is_err());
        assert!(readme_lines(&doc("sudo ./insmod.sh\ncargo xtask build\nrun")).is_err());
        assert!(readme_lines(&doc("cargo xtask build\nrun")).is_err());
        assert!(readme_lines("no such section").is_err());
    }

    #[test]
    fn the_verdict_needs_the_rule_the_module_and_a_passing_sanity() {
        let good = "MTGDRCOPY-FROM-SOURCE-ROOT insmod.sh: ... group render, mode 0660, as ...\r\n\
                    MTGDRCOPY-FROM-SOURCE-EXIT 0\n\
                    MTGDRCOPY-FROM-SOURCE driver:      mtgdrdrv 0.1 (/dev/mtgdrdrv)\n\
                    MTGDRCOPY-FROM-SOURCE 41 passed, 0 failed, 1 skipped\n";
        let log = Path::new("log");
        check(good, log).unwrap();
        for (from, to) in [
            ("EXIT 0", "EXIT 1"),
            ("mode 0660", "mode 0600"),
            ("mtgdrdrv 0.1", "dma-buf backend"),
            ("0 failed", "2 failed"),
        ] {
            assert!(check(&good.replace(from, to), log).is_err(), "{to}");
        }
    }

    #[test]
    fn the_readme_has_the_three_phases() {
        let readme = std::fs::read_to_string(paths::root().join("README.md")).unwrap();
        let lines = readme_lines(&readme).unwrap();
        assert!(lines.host[0].starts_with("cargo xtask build"), "{lines:?}");
        assert!(
            lines.root.iter().any(|l| l.starts_with("./insmod.sh")),
            "{lines:?}"
        );
        assert!(
            lines.user.iter().any(|l| l.contains("LD_LIBRARY_PATH")),
            "{lines:?}"
        );
    }
}
