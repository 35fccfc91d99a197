//! Tests of mtgdrdrv-dkms's postinst and prerm (debian/mtgdrdrv-dkms.{postinst,prerm}.in, filled in as
//! staging does), run on the host with stand-ins first on PATH for dkms, uname, ischroot,
//! udevadm and mtgdrdrv-load, which log their calls, and a fake /lib/modules and /etc/dkms
//! (`MTGDRDRV_MODULES_DIR`, `MTGDRDRV_DKMS_ETC`). They cover which kernels the postinst builds
//! for and what it makes of each `dkms install` status, including DKMS 2's 9 that today's DKMS
//! never returns. The package install test (pkgtest.rs) runs the shipped scripts with the real
//! DKMS in a bookworm root: a failing build for a kernel that is not running, then for the
//! running one, /etc/dkms/no-autoinstall, and a kernel BUILD_EXCLUSIVE_KERNEL excludes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;
use xtask_base::paths;
use xtask_pack::stage;

const VERSION: &str = "0.1.0";
const RUNNING: &str = "6.1.0-57-amd64";
const OLDER: &str = "6.1.0-9-amd64";
const NEWER: &str = "6.12.0-1-amd64";

/// mtgdrdrv-dkms's `script` (postinst, prerm) from debian/mtgdrdrv-dkms.<script>.in, as
/// debian/rules makes it: the module's version and mtgdrdrv-load's path filled in; then what
/// dh_installdeb does with the `#DEBHELPER#` line when no debhelper snippet applies (none does
/// here): it goes.
fn maintainer_script(script: &str, version: &str, load: &str) -> Result<String> {
    let text = stage::template(
        &paths::root().join(format!("debian/mtgdrdrv-dkms.{script}.in")),
        &[("VERSION", version), ("LOAD_SCRIPT", load)],
    )?;
    Ok(text
        .lines()
        .filter(|l| l.trim() != "#DEBHELPER#")
        .map(|l| format!("{l}\n"))
        .collect())
}

/// dkms: `add` and `remove` register and unregister (a file), `status` prints the registration,
/// `install -k K` exits with the status in exit/K (default 0) and on failure writes K's make.log
/// into the build directory, as DKMS does, replacing the previous one.
const DKMS: &str = r#"#!/bin/sh
echo "dkms $*" >>"$FAKE_DIR/calls"
case $1 in
status) [ -e "$FAKE_DIR/registered" ] && echo "mtgdrdrv/0.1.0: added"; exit 0 ;;
add) touch "$FAKE_DIR/registered" ;;
remove) rm -f "$FAKE_DIR/registered"; exit "${FAKE_REMOVE_EXIT:-0}" ;;
install)
	while [ $# -gt 0 ]; do [ "$1" = -k ] && kernel=$2; shift; done
	rc=$(cat "$FAKE_DIR/exit/$kernel" 2>/dev/null || echo 0)
	mkdir -p "$FAKE_DIR/dkms/mtgdrdrv/0.1.0/build"
	echo "make.log of $kernel" >"$FAKE_DIR/dkms/mtgdrdrv/0.1.0/build/make.log"
	exit "$rc"
	;;
esac
"#;

const LOGGER: &str = r#"#!/bin/sh
echo "${0##*/} $*" >>"$FAKE_DIR/calls"
"#;

struct Fake {
    dir: PathBuf,
    running: String,
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    calls: Vec<String>,
}

impl Run {
    /// The kernels `dkms install` was run for, in order.
    fn installs(&self) -> Vec<&str> {
        self.calls
            .iter()
            .filter_map(|c| c.strip_prefix("dkms install -m mtgdrdrv -v 0.1.0 -k "))
            .collect()
    }

    fn loads(&self) -> Vec<&String> {
        self.calls
            .iter()
            .filter(|c| c.starts_with("mtgdrdrv-load"))
            .collect()
    }

    fn said(&self, text: &str) -> bool {
        self.stdout.contains(text) || self.stderr.contains(text)
    }
}

impl Fake {
    /// Kernels OLDER, RUNNING (running) and NEWER, each with headers; DKMS's tree in the fake
    /// directory (framework.conf's dkms_tree).
    fn new(name: &str) -> Fake {
        let dir =
            std::env::temp_dir().join(format!("xtask-postinst-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for sub in ["bin", "modules", "etc/framework.conf.d", "exit"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let script = |name: &str, text: &str| {
            let path = dir.join("bin").join(name);
            fs::write(&path, text).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        };
        script("dkms", DKMS);
        script(
            "uname",
            "#!/bin/sh\n[ \"$1\" = -r ] && echo \"$FAKE_RUNNING\"\n",
        );
        script("ischroot", "#!/bin/sh\n[ -n \"$FAKE_CHROOT\" ]\n");
        script("udevadm", LOGGER);
        script("mtgdrdrv-load", LOGGER);
        fs::write(
            dir.join("etc/framework.conf"),
            format!("# DKMS's\ndkms_tree={}\n", dir.join("dkms").display()),
        )
        .unwrap();
        let fake = Fake {
            dir,
            running: RUNNING.into(),
        };
        for kernel in [OLDER, RUNNING, NEWER] {
            fake.kernel(kernel, true);
        }
        fake
    }

    /// /lib/modules/<kernel>, with headers (build/include) or without.
    fn kernel(&self, kernel: &str, headers: bool) -> &Fake {
        let dir = self.dir.join("modules").join(kernel);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join(if headers { "build/include" } else { "kernel" })).unwrap();
        self
    }

    fn remove_kernel(&self, kernel: &str) {
        fs::remove_dir_all(self.dir.join("modules").join(kernel)).unwrap();
    }

    /// `dkms install -k <kernel>` exits with `code`.
    fn dkms_exit(&self, kernel: &str, code: i32) -> &Fake {
        fs::write(self.dir.join("exit").join(kernel), code.to_string()).unwrap();
        self
    }

    fn conf(&self, file: &str, text: &str) -> &Fake {
        fs::write(self.dir.join("etc").join(file), text).unwrap();
        self
    }

    fn run(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let path = self.dir.join(script);
        let load = self.dir.join("bin/mtgdrdrv-load");
        let text = maintainer_script(script, VERSION, load.to_str().unwrap()).unwrap();
        fs::write(&path, text).unwrap();
        let _ = fs::remove_file(self.dir.join("calls"));
        let mut command = Command::new("sh");
        command
            .arg(&path)
            .args(args)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.dir.join("bin").display(),
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
                ),
            )
            .env("FAKE_DIR", &self.dir)
            .env("FAKE_RUNNING", &self.running)
            .env("MTGDRDRV_MODULES_DIR", self.dir.join("modules"))
            .env("MTGDRDRV_DKMS_ETC", self.dir.join("etc"))
            .env_remove("FAKE_CHROOT")
            .env_remove("FAKE_REMOVE_EXIT");
        for (k, v) in env {
            command.env(k, v);
        }
        let out = command.output().expect("running sh");
        Run {
            code: out.status.code().expect("the script was killed"),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            calls: fs::read_to_string(self.dir.join("calls"))
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect(),
        }
    }

    fn configure(&self) -> Run {
        self.run("postinst", &["configure", ""], &[])
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn builds_for_the_newest_and_the_running_kernel() {
    let fake = Fake::new("newest");
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    // Registered first; the running kernel last; the older kernel not at all.
    assert_eq!(
        run.calls[..2],
        [
            "dkms status -m mtgdrdrv -v 0.1.0",
            "dkms add -m mtgdrdrv -v 0.1.0"
        ]
    );
    assert_eq!(run.installs(), [NEWER, RUNNING], "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "mtgdrdrv: building for kernel(s) {NEWER} {RUNNING} (the newest installed kernel \
             and the running one)\n"
        )),
        "{run:?}"
    );
    assert_eq!(run.loads(), ["mtgdrdrv-load --if-provider"], "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
}

#[test]
fn builds_for_the_running_kernel_when_it_is_the_newest() {
    let fake = Fake::new("running-newest");
    fake.remove_kernel(NEWER);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.installs(), [RUNNING], "{run:?}");
    assert!(run.said(&format!(
        "building for kernel(s) {RUNNING} (the running kernel)"
    )));
    assert_eq!(run.loads().len(), 1, "{run:?}");
}

#[test]
fn autoinstall_all_kernels_builds_every_kernel() {
    for (file, value) in [
        ("framework.conf", "yes"),
        ("framework.conf.d/local.conf", "1"),
    ] {
        let fake = Fake::new("all");
        let base = fs::read_to_string(fake.dir.join("etc/framework.conf")).unwrap();
        let line = format!("autoinstall_all_kernels=\"{value}\"\n");
        if file == "framework.conf" {
            fake.conf(file, &format!("{base}{line}"));
        } else {
            fake.conf(file, &line);
        }
        let run = fake.configure();
        assert_eq!(run.code, 0, "{file}: {run:?}");
        assert_eq!(run.installs(), [OLDER, NEWER, RUNNING], "{file}: {run:?}");
        assert!(
            run.said(&format!(
                "building for kernel(s) {OLDER} {NEWER} {RUNNING} (DKMS's \
                 autoinstall_all_kernels is set)\n"
            )),
            "{run:?}"
        );
    }
    // Empty is unset, as DKMS reads it.
    let fake = Fake::new("all-empty");
    fake.conf(
        "framework.conf.d/local.conf",
        "autoinstall_all_kernels=\"\"\n",
    );
    assert_eq!(fake.configure().installs(), [NEWER, RUNNING]);
}

#[test]
fn every_kernel_when_the_running_one_is_not_installed() {
    let mut fake = Fake::new("chroot");
    fake.running = "5.10.0-30-amd64".into();
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.installs(), [OLDER, RUNNING, NEWER], "{run:?}");
    assert!(run.said(
        "(every kernel in the fake modules directory, since the running kernel 5.10.0-30-amd64 \
         is not installed here)"
            .replace(
                "the fake modules directory",
                &fake.dir.join("modules").display().to_string()
            )
            .as_str()
    ));
    // Not built for the running kernel: nothing to load.
    assert!(run.loads().is_empty(), "{run:?}");
    // No kernel at all: nothing to do, and said so.
    for kernel in [OLDER, RUNNING, NEWER] {
        fake.remove_kernel(kernel);
    }
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.installs().is_empty() && run.said("nothing to build"),
        "{run:?}"
    );
}

#[test]
fn no_autoinstall_builds_nothing() {
    let fake = Fake::new("no-autoinstall");
    fake.conf("no-autoinstall", "");
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.calls[1], "dkms add -m mtgdrdrv -v 0.1.0", "{run:?}");
    assert!(
        run.installs().is_empty() && run.loads().is_empty(),
        "{run:?}"
    );
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{run:?}");
    assert!(
        lines[0].contains("autoinstall is disabled")
            && lines[0].contains("dkms install mtgdrdrv/0.1.0 -k <kernel>"),
        "{run:?}"
    );
}

#[test]
fn kernels_without_headers_are_skipped_with_the_package_to_install() {
    let fake = Fake::new("headers");
    fake.kernel(NEWER, false);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.installs(), [RUNNING], "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "mtgdrdrv: no headers for kernel {NEWER}, not building for it (install \
             linux-headers-{NEWER}, then: dkms install mtgdrdrv/0.1.0 -k {NEWER})\n"
        )),
        "{run:?}"
    );
}

#[test]
fn dkms_9_and_77_mean_skipped() {
    for code in [9, 77] {
        let fake = Fake::new(&format!("skipped-{code}"));
        fake.dkms_exit(NEWER, code);
        let run = fake.configure();
        assert_eq!(run.code, 0, "{code}: {run:?}");
        assert!(
            run.stdout.contains(&format!(
                "mtgdrdrv: not supported by kernel {NEWER} (BUILD_EXCLUSIVE_* in dkms.conf), \
                 skipped\n"
            )),
            "{code}: {run:?}"
        );
        assert!(run.stderr.is_empty(), "{code}: {run:?}");
        assert_eq!(run.loads().len(), 1, "{run:?}");
        // The running kernel excluded: not an error either, but nothing to load.
        fake.dkms_exit(RUNNING, code);
        let run = fake.configure();
        assert_eq!(run.code, 0, "{code}: {run:?}");
        assert!(run.loads().is_empty(), "{code}: {run:?}");
    }
}

#[test]
fn a_failed_build_for_another_kernel_is_a_warning() {
    let fake = Fake::new("other-fails");
    fake.dkms_exit(NEWER, 10);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.installs(), [NEWER, RUNNING], "{run:?}");
    let kept = fake
        .dir
        .join(format!("dkms/mtgdrdrv/0.1.0/make-{NEWER}.log"));
    assert_eq!(
        run.stderr,
        format!(
            "mtgdrdrv: warning: the DKMS build failed for kernel {NEWER} (not the running one; \
             dkms exit 10), which stays without mtgdrdrv: see {}\n",
            kept.display()
        )
    );
    // Its log survives the running kernel's build, which replaced DKMS's build/make.log.
    assert_eq!(
        fs::read_to_string(&kept).unwrap(),
        format!("make.log of {NEWER}\n")
    );
    assert_eq!(run.loads(), ["mtgdrdrv-load --if-provider"], "{run:?}");
}

#[test]
fn a_failed_build_for_the_running_kernel_fails_configure() {
    let fake = Fake::new("running-fails");
    fake.dkms_exit(RUNNING, 10);
    let run = fake.configure();
    assert_eq!(run.code, 1, "{run:?}");
    // The other kernel was still built.
    assert_eq!(run.installs(), [NEWER, RUNNING], "{run:?}");
    let log = fake.dir.join("dkms/mtgdrdrv/0.1.0/build/make.log");
    assert_eq!(
        run.stderr,
        format!(
            "mtgdrdrv: the DKMS build failed for the running kernel {RUNNING} (dkms exit 10): \
             see {}; once the cause is fixed, retry with: dpkg --configure -a\n",
            log.display()
        )
    );
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        format!("make.log of {RUNNING}\n")
    );
    assert!(run.loads().is_empty(), "{run:?}");
    // The retry replaces the registration the failed run left, and succeeds once fixed.
    fake.dkms_exit(RUNNING, 0);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.calls[..3],
        [
            "dkms status -m mtgdrdrv -v 0.1.0",
            "dkms remove -m mtgdrdrv -v 0.1.0 --all",
            "dkms add -m mtgdrdrv -v 0.1.0"
        ]
    );
    assert_eq!(run.installs(), [NEWER, RUNNING], "{run:?}");
}

#[test]
fn no_load_in_a_chroot() {
    let fake = Fake::new("ischroot");
    let run = fake.run("postinst", &["configure", ""], &[("FAKE_CHROOT", "1")]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.installs(), [NEWER, RUNNING], "{run:?}");
    assert!(run.loads().is_empty(), "{run:?}");
}

#[test]
fn other_actions_do_nothing() {
    let fake = Fake::new("actions");
    for action in ["abort-upgrade", "abort-remove", "triggered"] {
        let run = fake.run("postinst", &[action, VERSION], &[]);
        assert_eq!(run.code, 0, "{action}: {run:?}");
        assert!(run.calls.is_empty(), "{action}: {run:?}");
    }
}

#[test]
fn prerm_unregisters_and_never_fails() {
    let fake = Fake::new("prerm");
    fs::write(fake.dir.join("registered"), "").unwrap();
    for action in ["remove", "upgrade", "deconfigure"] {
        fs::write(fake.dir.join("registered"), "").unwrap();
        let run = fake.run("prerm", &[action], &[("FAKE_REMOVE_EXIT", "3")]);
        assert_eq!(run.code, 0, "{action}: {run:?}");
        assert!(
            run.calls
                .contains(&"dkms remove -m mtgdrdrv -v 0.1.0 --all".to_owned()),
            "{action}: {run:?}"
        );
    }
    let run = fake.run("prerm", &["failed-upgrade", "0.0.9"], &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.calls.is_empty(), "{run:?}");
}

#[test]
fn templates_are_debhelper_scripts() {
    for script in ["postinst", "prerm"] {
        let path = xtask_base::paths::root().join(format!("debian/mtgdrdrv-dkms.{script}.in"));
        let template = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = template.lines().collect();
        let at = lines.iter().position(|l| *l == "#DEBHELPER#");
        assert!(at.is_some(), "{script}.in has no #DEBHELPER# line");
        assert_eq!(lines.iter().filter(|l| **l == "#DEBHELPER#").count(), 1);
        assert_eq!(lines.last(), Some(&"exit 0"), "{script}.in");
        assert!(at.unwrap() < lines.len() - 1);
        let filled = maintainer_script(script, VERSION, "/x/load").unwrap();
        assert!(!filled.contains("#DEBHELPER#"), "{script}: {filled}");
    }
}
