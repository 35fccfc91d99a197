//! The stand-in tests of mtgdrdrv-dkms's postinst and prerm (debian/mtgdrdrv-dkms.{postinst,prerm}.in,
//! filled in as staging does), run on the host with stand-ins first on PATH for dkms, uname,
//! ischroot, udevadm and mtgdrdrv-load, which log their calls, and a fake /lib/modules and
//! /etc/dkms (`MTGDRDRV_MODULES_DIR`, `MTGDRDRV_DKMS_ETC`).
//!
//! The kernel choice and DKMS's exit statuses are tested with the real DKMS
//! (debian/tests/dkms-failures, run by autopkgtest in a root with DKMS): the newest and
//! the running kernel, autoinstall_all_kernels (set, and empty), /etc/dkms/no-autoinstall, a
//! kernel without headers, a kernel BUILD_EXCLUSIVE_KERNEL excludes (77), a failed build for
//! another kernel (the warning) and for the running one (configure fails, the retry). Only what
//! that test cannot reach is here:
//! - whether the postinst loads the module: the real test runs in a chroot, where it never does;
//! - DKMS 2's exit 9 for an excluded kernel: bookworm's DKMS 3 returns 77;
//! - a running kernel that is not installed (a chroot, an image build) and no kernel at all: the
//!   real root has the VM's kernel installed, and DKMS needs one to build;
//! - the postinst's other actions, and a prerm whose `dkms remove` fails: no apt or dpkg
//!   command of a working system calls them that way.

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
            fake.kernel(kernel);
        }
        fake
    }

    /// /lib/modules/<kernel>, with headers (build/include).
    fn kernel(&self, kernel: &str) -> &Fake {
        fs::create_dir_all(self.dir.join("modules").join(kernel).join("build/include")).unwrap();
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

/// mtgdrdrv-load runs once, after the module was installed for the running kernel, and only
/// outside a chroot.
#[test]
fn loads_after_the_running_kernels_build_outside_a_chroot() {
    let fake = Fake::new("load");
    let run = fake.configure();
    assert_eq!(
        (run.code, run.installs()),
        (0, vec![NEWER, RUNNING]),
        "{run:?}"
    );
    assert_eq!(run.loads(), ["mtgdrdrv-load --if-provider"], "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
    // The running kernel the newest: built for it alone, and loaded.
    fake.remove_kernel(NEWER);
    let run = fake.configure();
    assert_eq!((run.code, run.installs()), (0, vec![RUNNING]), "{run:?}");
    assert!(run.said(&format!(
        "building for kernel(s) {RUNNING} (the running kernel)\n"
    )));
    assert_eq!(run.loads().len(), 1, "{run:?}");
    // In a chroot, /sys is another system's: built, not loaded.
    let run = fake.run("postinst", &["configure", ""], &[("FAKE_CHROOT", "1")]);
    assert_eq!((run.code, run.installs()), (0, vec![RUNNING]), "{run:?}");
    assert!(run.loads().is_empty(), "{run:?}");
    // The running kernel's build failed or was excluded: nothing to load.
    for code in [10, 77] {
        fake.dkms_exit(RUNNING, code);
        let run = fake.configure();
        assert_eq!(run.code, i32::from(code == 10), "{code}: {run:?}");
        assert!(run.loads().is_empty(), "{code}: {run:?}");
    }
}

/// DKMS 2 said "excluded by BUILD_EXCLUSIVE_*" with 9, DKMS 3 with 77 (which the real DKMS test
/// reaches): both are a skip, not a failure.
#[test]
fn dkms_2s_exit_9_means_skipped() {
    let fake = Fake::new("skipped-9");
    fake.dkms_exit(NEWER, 9);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!(
            "mtgdrdrv: not supported by kernel {NEWER} (BUILD_EXCLUSIVE_* in dkms.conf), \
             skipped\n"
        )),
        "{run:?}"
    );
    assert!(run.stderr.is_empty(), "{run:?}");
    assert_eq!(run.loads().len(), 1, "{run:?}");
    fake.dkms_exit(RUNNING, 9);
    let run = fake.configure();
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.loads().is_empty(), "{run:?}");
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
