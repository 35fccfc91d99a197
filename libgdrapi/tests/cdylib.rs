//! The shared library as C consumers see it: it exports exactly the symbols of
//! debian/libgdrapi.symbols (the one list of the C API), gdrapi.h declares each, the soname
//! carries the API major, and gdrapi.h compiles warning-free as C11 and C++11 into programs that
//! link against the library and run (tests/c/).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod built;
use built::cdylib;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The header tests: compiler, its standard, source file in tests/c. Warnings are errors.
const HEADER_TESTS: [(&str, &str, &str); 2] = [
    ("cc", "-std=c11", "header_test.c"),
    ("c++", "-std=c++11", "header_test.cpp"),
];
const HEADER_FLAGS: [&str; 4] = ["-Wall", "-Wextra", "-Werror", "-pedantic"];

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn source(path: &str) -> String {
    let path = Path::new(MANIFEST_DIR).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The symbols debian/libgdrapi.symbols lists, sorted.
fn listed_symbols() -> Vec<String> {
    let mut listed: Vec<String> = source("../debian/libgdrapi.symbols")
        .lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next()?.strip_suffix("@Base"))
        .map(String::from)
        .collect();
    listed.sort_unstable();
    listed
}

#[test]
fn exports_exactly_the_symbols_file_and_the_header_declares_each() {
    let nm = run(Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(cdylib()));
    let mut exported: Vec<String> = nm
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            matches!(kind, "T" | "D" | "B" | "R").then(|| name.to_string())
        })
        .collect();
    exported.sort_unstable();
    let listed = listed_symbols();
    assert_eq!(
        exported, listed,
        "the exports differ from debian/libgdrapi.symbols: add each new symbol with the \
         version that introduces it, remove those that are gone (and bump the soname)"
    );
    let header = source("include/gdrapi.h");
    for name in &listed {
        // gdr_get_info is the 40-byte legacy entry; the header's gdr_get_info is a macro.
        assert!(
            header.contains(&format!("{name}(")) || name == "gdr_get_info",
            "gdrapi.h lacks {name}"
        );
    }
}

#[test]
fn soname_is_the_api_major() {
    let dynamic = run(Command::new("readelf").arg("-d").arg(cdylib()));
    let soname = format!(
        "Library soname: [libgdrapi.so.{}]",
        gdrapi::GDR_API_MAJOR_VERSION
    );
    assert!(dynamic.contains(&soname), "no {soname}:\n{dynamic}");
}

/// A directory with the library under its soname (as the package installs it) and the
/// development link, for compiling and running the header tests against it.
fn staged_library(out: &Path) -> PathBuf {
    let lib = out.join("lib");
    std::fs::create_dir_all(&lib).expect("creating the library directory");
    let soname = format!("libgdrapi.so.{}", gdrapi::GDR_API_MAJOR_VERSION);
    for link in [soname.as_str(), "libgdrapi.so"] {
        let path = lib.join(link);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(cdylib(), &path).expect("linking the library");
    }
    lib
}

#[test]
fn header_compiles_as_c_and_cxx_and_its_programs_run() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header-test");
    let lib = staged_library(&out);
    let include = Path::new(MANIFEST_DIR).join("include");
    for (compiler, std, file) in HEADER_TESTS {
        let exe = out.join(file.replace('.', "_"));
        run(Command::new(compiler)
            .arg(std)
            .args(HEADER_FLAGS)
            .arg(format!("-I{}", include.display()))
            .arg(Path::new(MANIFEST_DIR).join("tests/c").join(file))
            .arg(format!("-L{}", lib.display()))
            .arg("-lgdrapi")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-o")
            .arg(&exe));
        check_logging(Path::new(gdrapi::DEVICE_PATH).exists(), |env| {
            Command::new(&exe)
                .env_remove("GDRCOPY_ENABLE_LOGGING")
                .env_remove("GDRCOPY_LOG_LEVEL")
                .envs(env.iter().copied())
                .output()
                .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()))
        });
    }
}

/// The README's C example (the first ```c block under "## Using the library"), compiled with the
/// header test's warnings as errors, linked against the library with a `main` of this test's,
/// and run: with no GPU memory behind the address every step's failure must be handled, and
/// the function must report it (-1) rather than crash. So the README's example can never drift
/// from gdrapi.h.
#[test]
fn the_readmes_c_example_compiles_links_and_handles_failure() {
    let readme = source("../README.md");
    let section = readme
        .split_once("\n## Using the library\n")
        .expect("README.md has \"## Using the library\"")
        .1;
    let example = section
        .split_once("\n```c\n")
        .and_then(|(_, rest)| rest.split_once("\n```\n"))
        .expect("a ```c block under \"## Using the library\"")
        .0;
    let lines = example.lines().count();
    assert!(
        (10..=40).contains(&lines),
        "the README's C example is meant to be short: {lines} lines"
    );
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-example");
    let lib = staged_library(&out);
    let program = out.join("readme_example.c");
    // The address is 64 KiB aligned, as muMemAlloc's are, and no GPU memory: whatever this host
    // has (no module, or a module and no such allocation), some step fails.
    let main = "\n#include <stdio.h>\n\
                int main(void)\n{\n    static const char data[64] = \"mtgdrcopy\";\n    \
                int ret = write_to_gpu(UINT64_C(0x7f0000000000), data, sizeof(data));\n    \
                printf(\"write_to_gpu: %d\\n\", ret);\n    return ret == -1 ? 0 : 1;\n}\n";
    std::fs::write(&program, format!("{example}\n{main}")).expect("writing the example");
    let exe = out.join("readme_example");
    run(Command::new("cc")
        .arg("-std=c11")
        .args(HEADER_FLAGS)
        .arg(format!(
            "-I{}",
            Path::new(MANIFEST_DIR).join("include").display()
        ))
        .arg(&program)
        .arg(format!("-L{}", lib.display()))
        .arg("-lgdrapi")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe));
    let stdout = run(Command::new(&exe).env_remove("GDRCOPY_ENABLE_LOGGING"));
    assert_eq!(stdout, "write_to_gpu: -1\n");
}

/// Runs a header test program (given the logging variables to set) and checks what gdr_open's
/// failure logs where the module is absent (`device` false): nothing by default, one line
/// saying how to load the module with logging on, nothing when the level filters errors out.
fn check_logging(device: bool, run: impl Fn(&[(&str, &str)]) -> Output) {
    let stderr_of = |env: &[(&str, &str)]| -> String {
        let out = run(env);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("header test passed"),
            "{stdout}{stderr}"
        );
        stderr.into_owned()
    };
    if device {
        stderr_of(&[]);
        return;
    }
    let quiet = stderr_of(&[]);
    assert!(quiet.is_empty(), "logging is off by default, yet: {quiet}");
    let logged = stderr_of(&[("GDRCOPY_ENABLE_LOGGING", "")]);
    assert!(
        logged.lines().count() == 1
            && logged.starts_with("ERR:  ")
            && logged.contains("modprobe mtgdrdrv"),
        "expected one error line saying how to load the module, got: {logged}"
    );
    let filtered = stderr_of(&[("GDRCOPY_ENABLE_LOGGING", "1"), ("GDRCOPY_LOG_LEVEL", "5")]);
    assert!(
        filtered.is_empty(),
        "GDRCOPY_LOG_LEVEL=5 filters errors, yet: {filtered}"
    );
}
