//! Tests of debian/scripts/mtgdrdrv-load, the script that decides whether mtgdrdrv may be loaded (for
//! the postinst and insmod.sh), run on the host against a fake sysfs tree (`MTGDRDRV_SYSFS`)
//! with stand-ins for insmod, rmmod and modprobe first on PATH, which log their arguments and
//! add or remove the fake tree's /sys/module/mtgdrdrv. debian/tests/gpu runs the shipped script
//! on autopkgtest's VM testbed against the real sysfs and the emulated provider.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use xtask_base::paths;

/// A fake sysfs root and bin directory under the system's temporary directory.
struct Fake {
    dir: PathBuf,
}

/// What one run of the script did.
#[derive(Debug)]
struct Run {
    code: i32,
    stderr: String,
    stdout: String,
    /// The stand-ins' calls, one line each: `modprobe mtgdrdrv`, `insmod /x.ko a=1`.
    calls: Vec<String>,
}

const STAND_IN: &str = r#"#!/bin/sh
name=${0##*/}
echo "$name $*" >>"$FAKE_LOG"
[ "${FAKE_FAIL:-}" = "$name" ] && exit 1
case $name in
rmmod) rmdir "$MTGDRDRV_SYSFS/module/mtgdrdrv" ;;
*) mkdir "$MTGDRDRV_SYSFS/module/mtgdrdrv" ;;
esac
"#;

impl Fake {
    fn new(name: &str) -> Fake {
        let dir =
            std::env::temp_dir().join(format!("xtask-mtgdrdrv-load-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("sys/module")).unwrap();
        fs::create_dir_all(dir.join("bin")).unwrap();
        for tool in ["insmod", "rmmod", "modprobe"] {
            let path = dir.join("bin").join(tool);
            fs::write(&path, STAND_IN).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        Fake { dir }
    }

    /// /sys/module/<name>, with parameters/disable_driver holding `disable_driver` if given.
    fn module(&self, name: &str, disable_driver: Option<&str>) -> &Fake {
        let module = self.dir.join("sys/module").join(name);
        fs::create_dir_all(&module).unwrap();
        if let Some(value) = disable_driver {
            fs::create_dir_all(module.join("parameters")).unwrap();
            fs::write(
                module.join("parameters/disable_driver"),
                format!("{value}\n"),
            )
            .unwrap();
        }
        self
    }

    fn loaded(&self, name: &str) -> bool {
        self.dir.join("sys/module").join(name).is_dir()
    }

    /// Runs the script with `MTGDRDRV_PROVIDER` set to `provider` (unset if None).
    fn run(&self, provider: Option<&str>, fail: Option<&str>, args: &[&str]) -> Run {
        let log = self.dir.join("calls");
        let _ = fs::remove_file(&log);
        let path = format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
        );
        let mut command = Command::new("sh");
        command
            .arg(paths::root().join("debian/scripts/mtgdrdrv-load"))
            .args(args)
            .env("PATH", path)
            .env("MTGDRDRV_SYSFS", self.dir.join("sys"))
            .env("FAKE_LOG", &log)
            .env_remove("MTGDRDRV_PROVIDER")
            .env_remove("FAKE_FAIL");
        if let Some(p) = provider {
            command.env("MTGDRDRV_PROVIDER", p);
        }
        if let Some(f) = fail {
            command.env("FAKE_FAIL", f);
        }
        let out = command.output().expect("running sh");
        Run {
            code: out.status.code().expect("the script was killed"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            calls: fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect(),
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The refusal for a provider loaded with disable_driver=1, as the script prints it.
fn disabled_line(provider: &str) -> String {
    format!(
        "mtgdrdrv: not loaded, because {provider} is loaded with disable_driver=1 and its GPU \
         driver is not initialised; mtgdrdrv loads once {provider} is loaded normally: after a \
         reboot, or modprobe -r {provider} && modprobe {provider} (without disable_driver), \
         then modprobe mtgdrdrv\n"
    )
}

#[test]
fn postinst_without_provider_does_nothing_quietly() {
    let fake = Fake::new("absent-postinst");
    let run = fake.run(None, None, &["--if-provider"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.is_empty() && run.stdout.is_empty(), "{run:?}");
    assert!(run.calls.is_empty(), "{run:?}");
}

#[test]
fn refuses_without_provider() {
    let fake = Fake::new("absent");
    // Another module's disabled state is not the provider's.
    fake.module("mtgpu", Some("N"));
    let run = fake.run(Some("mtgpu_emu"), None, &["/x/mtgdrdrv.ko"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.stderr,
        "mtgdrdrv: the mtgpu_emu driver is not loaded, and mtgdrdrv needs its \
         mtgpu_p2p_get_pages: load it first (modprobe mtgpu_emu)\n"
    );
    assert!(run.calls.is_empty(), "{run:?}");
}

#[test]
fn postinst_refuses_while_driver_disabled() {
    for value in ["Y", "1"] {
        let fake = Fake::new(&format!("disabled-postinst-{value}"));
        fake.module("mtgpu", Some(value));
        // MTGDRDRV_PROVIDER empty: the default, mtgpu.
        for provider in [None, Some("")] {
            let run = fake.run(provider, None, &["--if-provider"]);
            assert_eq!(run.code, 3, "disable_driver {value}: {run:?}");
            assert_eq!(run.stderr, disabled_line("mtgpu"));
            assert!(run.stdout.is_empty() && run.calls.is_empty(), "{run:?}");
            assert!(!fake.loaded("mtgdrdrv"));
        }
    }
}

#[test]
fn insmod_refuses_while_driver_disabled() {
    let fake = Fake::new("disabled-insmod");
    fake.module("mtgpu_emu", Some("Y"));
    // A loaded mtgdrdrv stays: the refusal comes before anything is unloaded.
    fake.module("mtgdrdrv", None);
    let run = fake.run(
        Some("mtgpu_emu"),
        None,
        &["/x/mtgdrdrv.ko", "dbg_enabled=1"],
    );
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(run.stderr, disabled_line("mtgpu_emu"));
    assert!(run.calls.is_empty(), "{run:?}");
    assert!(fake.loaded("mtgdrdrv"));
}

#[test]
fn postinst_loads_with_driver_enabled() {
    // N: the parameter as the kernel shows a false bool; None: a provider without it.
    for (name, value) in [("enabled", Some("N")), ("no-parameter", None)] {
        let fake = Fake::new(&format!("postinst-{name}"));
        fake.module("mtgpu", value);
        let run = fake.run(None, None, &["--if-provider"]);
        assert_eq!(run.code, 0, "{name}: {run:?}");
        assert!(run.stderr.is_empty(), "{run:?}");
        assert_eq!(run.calls, ["modprobe mtgdrdrv"]);
        assert!(fake.loaded("mtgdrdrv"));
        // Loaded already: nothing more to do.
        let again = fake.run(None, None, &["--if-provider"]);
        assert_eq!(again.code, 0, "{again:?}");
        assert!(again.calls.is_empty(), "{again:?}");
    }
}

#[test]
fn insmod_reloads_with_parameters() {
    let fake = Fake::new("insmod");
    fake.module("mtgpu_emu", Some("N"));
    let run = fake.run(
        Some("mtgpu_emu"),
        None,
        &["/x/mtgdrdrv.ko", "dbg_enabled=1"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.calls, ["insmod /x/mtgdrdrv.ko dbg_enabled=1"]);
    let run = fake.run(Some("mtgpu_emu"), None, &["/x/mtgdrdrv.ko"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.calls, ["rmmod mtgdrdrv", "insmod /x/mtgdrdrv.ko"]);
}

#[test]
fn failed_load_exits_1() {
    let fake = Fake::new("fails");
    fake.module("mtgpu", Some("N"));
    let run = fake.run(None, Some("modprobe"), &["--if-provider"]);
    assert_eq!(run.code, 1, "{run:?}");
    let run = fake.run(None, Some("insmod"), &["/x/mtgdrdrv.ko"]);
    assert_eq!(run.code, 1, "{run:?}");
}

#[test]
fn rejects_unknown_options() {
    let fake = Fake::new("usage");
    fake.module("mtgpu", Some("N"));
    let run = fake.run(None, None, &["--check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.starts_with("usage: mtgdrdrv-load"), "{run:?}");
    assert!(run.calls.is_empty(), "{run:?}");
}

/// The code of a shell script of the tree, without its comments.
fn code(path: &str) -> String {
    fs::read_to_string(paths::root().join(path))
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// debian/tests/gpu runs mtgdrdrv-load exactly as the postinst does, from where the package
/// installs it (debian/scripts/install-tree; the postinst's `@LOAD_SCRIPT@`, filled in by
/// debian/rules), and the postinst loads mtgdrdrv only through it; gpu checks the softdep
/// where the package installs it.
#[test]
fn the_gpu_test_runs_mtgdrdrv_load_as_the_postinst_does() {
    let postinst = code("debian/mtgdrdrv-dkms.postinst.in");
    assert_eq!(postinst.matches("@LOAD_SCRIPT@ --if-provider").count(), 1);
    assert!(
        !postinst.contains("modprobe"),
        "the postinst loads mtgdrdrv itself"
    );
    let gpu = code("debian/tests/gpu");
    assert!(gpu.contains("load_script=/usr/lib/mtgdrdrv/mtgdrdrv-load\n"));
    assert!(gpu.contains("softdep=/usr/lib/modprobe.d/mtgdrdrv.conf\n"));
    assert_eq!(gpu.matches("\"$load_script\" --if-provider").count(), 2);
}
