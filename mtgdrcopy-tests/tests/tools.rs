//! The tools on a machine without what they need (no MUSA driver library, so no GPU; libgdrapi
//! missing or present): exit statuses, the one error format, `--version`, `--json` that leaves
//! no file behind, and what the help hides. The same tools with the environment present are
//! run in the test VM (`cargo xtask test`). On a machine where the MUSA driver library can be
//! loaded, the tests that need it absent say so and check only what still holds there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TOOLS: [(&str, &str); 6] = [
    ("mtgdrcopy_apiperf", env!("CARGO_BIN_EXE_mtgdrcopy_apiperf")),
    ("mtgdrcopy_copybw", env!("CARGO_BIN_EXE_mtgdrcopy_copybw")),
    ("mtgdrcopy_copylat", env!("CARGO_BIN_EXE_mtgdrcopy_copylat")),
    // Without mtgpu, mtgdrdrv and libmusa there is nothing for it to check: 77 as well.
    ("mtgdrcopy_doctor", env!("CARGO_BIN_EXE_mtgdrcopy_doctor")),
    (
        "mtgdrcopy_musainfo",
        env!("CARGO_BIN_EXE_mtgdrcopy_musainfo"),
    ),
    ("mtgdrcopy_sanity", env!("CARGO_BIN_EXE_mtgdrcopy_sanity")),
];

const BENCHMARKS: [&str; 3] = ["mtgdrcopy_apiperf", "mtgdrcopy_copybw", "mtgdrcopy_copylat"];

/// A command for `tool` that finds no MUSA driver library (none is installed where the tests
/// run, and MUSA_HOME points nowhere) and, with `libgdrapi: None`, no libgdrapi either.
fn tool(name: &str, libgdrapi: Option<&Path>) -> Command {
    let exe = TOOLS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, e)| *e)
        .expect("a tool of this package");
    let mut cmd = Command::new(exe);
    cmd.env("MUSA_HOME", "/nonexistent-musa-home")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("GDRCOPY_USE_DMABUF_MMAP")
        .env("NO_COLOR", "1")
        .env(
            "GDRCOPY_LIBRARY",
            libgdrapi.unwrap_or(Path::new("/nonexistent/libgdrapi.so.1")),
        );
    cmd
}

fn run(mut cmd: Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("the tool runs");
    (
        status.code().expect("the tool exited, not killed"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// This build's libgdrapi.so (cargo builds the cdylib of the dependency beside the tools).
fn built_libgdrapi() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_mtgdrcopy_copybw"))
        .parent()
        .expect("the tools' directory")
        .to_path_buf();
    [dir.join("libgdrapi.so"), dir.join("deps/libgdrapi.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no libgdrapi.so in {} or its deps/", dir.display()))
}

/// Whether this machine has a MUSA driver library the tools would find (then "no MUSA" cannot
/// be arranged from the environment: the loader's cache still has it).
fn musa_installed() -> bool {
    let installed = gdrapi::musa::open_library().is_ok();
    if installed {
        eprintln!("a MUSA driver library is installed here: the no-MUSA checks do not apply");
    }
    installed
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mtgdrcopy-tools-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_missing_environment_exits_77_with_one_line_naming_the_tool() {
    // musainfo needs only the MUSA driver: where one is installed, it has its environment.
    let musa = musa_installed();
    for (name, _) in TOOLS
        .into_iter()
        .filter(|(n, _)| !musa || *n != "mtgdrcopy_musainfo")
    {
        let (code, stdout, stderr) = run(tool(name, None));
        assert_eq!(code, 77, "{name}: stdout {stdout:?} stderr {stderr:?}");
        let first = stderr.lines().next().unwrap_or("");
        assert!(
            first.starts_with(&format!("{name}: ")),
            "{name}: the error line is {first:?}"
        );
        assert!(!stderr.contains("Error:"), "{name}: {stderr}");
    }
}

#[test]
fn without_the_musa_driver_the_library_alone_is_not_enough() {
    if musa_installed() {
        return;
    }
    let lib = built_libgdrapi();
    for (name, _) in TOOLS {
        let (code, _, stderr) = run(tool(name, Some(&lib)));
        assert_eq!(code, 77, "{name}: {stderr}");
        assert!(
            stderr.contains("libmusa") || stderr.contains("MUSA"),
            "{name} should say the MUSA driver is missing: {stderr}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    for (name, _) in TOOLS {
        let mut cmd = tool(name, None);
        cmd.arg("--no-such-option");
        let (code, _, stderr) = run(cmd);
        assert_eq!(code, 2, "{name}: {stderr}");
    }
    // Errors found after parsing, before anything is opened.
    for (name, args) in [
        ("mtgdrcopy_copybw", &["-o", "6"][..]),
        ("mtgdrcopy_copybw", &["-s", "0"][..]),
        ("mtgdrcopy_copylat", &["-C", "-M", "wc"][..]),
        ("mtgdrcopy_apiperf", &["-s", "0"][..]),
    ] {
        let mut cmd = tool(name, None);
        cmd.args(args);
        let (code, _, stderr) = run(cmd);
        assert_eq!(code, 2, "{name} {args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("{name}: ")), "{stderr}");
    }
}

#[test]
fn sanity_usage_and_machine_readable_errors() {
    let mut cmd = tool("mtgdrcopy_sanity", None);
    cmd.args(["-t", "basic_mumemaloc"]);
    let (code, _, stderr) = run(cmd);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("did you mean: basic_mumemalloc"),
        "{stderr}"
    );

    let mut cmd = tool("mtgdrcopy_sanity", None);
    cmd.args(["--format", "tap"]);
    let (code, stdout, _) = run(cmd);
    assert_eq!(code, 77);
    assert!(stdout.starts_with("Bail out! "), "{stdout}");

    let mut cmd = tool("mtgdrcopy_sanity", None);
    cmd.args(["--format", "json-lines"]);
    let (code, stdout, _) = run(cmd);
    assert_eq!(code, 77);
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(line["exit_status"], 77);
    assert!(line["error"]
        .as_str()
        .is_some_and(|e| e.contains("libgdrapi")));
}

#[test]
fn version_names_every_component_and_exits_0() {
    let lib = built_libgdrapi();
    for (name, _) in TOOLS {
        let mut cmd = tool(name, Some(&lib));
        cmd.arg("--version");
        let (code, stdout, stderr) = run(cmd);
        assert_eq!(code, 0, "{name}: {stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{name}: {stdout}");
        assert_eq!(
            lines[0],
            format!("{name} {}", env!("CARGO_PKG_VERSION")),
            "{name}"
        );
        let want_lib = format!(
            "libgdrapi:   {}.{} (",
            gdrapi::GDR_API_MAJOR_VERSION,
            gdrapi::GDR_API_MINOR_VERSION
        );
        assert!(lines[1].starts_with(&want_lib), "{name}: {}", lines[1]);
        assert!(lines[1].contains("libgdrapi.so"), "{name}: {}", lines[1]);
        assert!(
            lines[2].starts_with("driver:      "),
            "{name}: {}",
            lines[2]
        );
        assert!(
            lines[3].starts_with("MUSA driver: "),
            "{name}: {}",
            lines[3]
        );
        if !musa_installed() {
            assert!(
                lines[3].starts_with("MUSA driver: not loaded: "),
                "{name}: {}",
                lines[3]
            );
        }
    }
    // Without libgdrapi, it says so and still exits 0.
    let mut cmd = tool("mtgdrcopy_copybw", None);
    cmd.arg("-V");
    let (code, stdout, _) = run(cmd);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("libgdrapi:   not loaded: cannot load"),
        "{stdout}"
    );
}

#[test]
fn a_failed_run_leaves_no_json_file_and_keeps_an_old_one() {
    let dir = scratch("json");
    for name in BENCHMARKS {
        let new = dir.join(format!("{name}-new.json"));
        let old = dir.join(format!("{name}-old.json"));
        std::fs::write(&old, "an earlier run\n").unwrap();
        // Without libgdrapi, and (where no MUSA driver is installed) with it.
        let with_library = (!musa_installed()).then(built_libgdrapi);
        for (target, lib) in [(&new, None), (&old, with_library)] {
            let mut cmd = tool(name, lib.as_deref());
            cmd.arg("--json").arg(target);
            let (code, _, stderr) = run(cmd);
            assert_eq!(code, 77, "{name}: {stderr}");
        }
        assert!(!new.exists(), "{name} left {}", new.display());
        assert_eq!(
            std::fs::read_to_string(&old).unwrap(),
            "an earlier run\n",
            "{name}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left.len(),
        BENCHMARKS.len(),
        "temporary files left: {left:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // A path that cannot be written is a usage error before anything is opened, naming the file.
    let mut cmd = tool("mtgdrcopy_copybw", None);
    cmd.args(["--json", "/nonexistent-dir/r.json"]);
    let (code, _, stderr) = run(cmd);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("/nonexistent-dir/r.json"), "{stderr}");
}

#[test]
fn test_only_options_and_cases_are_hidden() {
    let mut cmd = tool("mtgdrcopy_musainfo", None);
    cmd.arg("--help");
    let (code, stdout, _) = run(cmd);
    assert_eq!(code, 0);
    assert!(!stdout.contains("emu-stats"), "{stdout}");

    // The packages' build (no `emulator` feature) has neither the option nor the cases that
    // drive the emulator: they would link the test-only mtgpu-emu-abi.
    if !cfg!(feature = "emulator") {
        let mut cmd = tool("mtgdrcopy_musainfo", None);
        cmd.arg("--emu-stats");
        let (code, _, stderr) = run(cmd);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("--emu-stats"), "{stderr}");
        let mut cmd = tool("mtgdrcopy_sanity", None);
        cmd.args(["-t", "fault_get_pages_enomem"]);
        let (code, _, stderr) = run(cmd);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("unknown test"), "{stderr}");
    }

    // Where there is no emulated provider, its cases are neither listed nor run.
    if Path::new("/dev/mtgpu_emu").exists() {
        return;
    }
    let mut cmd = tool("mtgdrcopy_sanity", None);
    cmd.arg("-l");
    let (code, stdout, _) = run(cmd);
    assert_eq!(code, 0);
    assert!(stdout.contains("basic_mumemalloc"), "{stdout}");
    for hidden in ["fault_get_pages_enomem", "dmabuf_refused_mmap"] {
        assert!(!stdout.contains(hidden), "{hidden} listed:\n{stdout}");
    }
}
