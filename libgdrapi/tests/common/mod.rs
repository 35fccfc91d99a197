//! What the tests that open the dma-buf backend without a GPU share: a stand-in libmusa
//! (tests/c/failing_musa.c, whose first `muInit` fails) and a child process of the test binary
//! to run one test in (what the library loads and reads stays for the life of a process).

use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// A fresh directory `name` under cargo's test scratch directory, with the stand-in libmusa
/// built in it; returns (directory, library).
pub fn stand_in_musa(name: &str) -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let library = dir.join("failing_musa.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&library)
        .arg(Path::new(MANIFEST_DIR).join("tests/c/failing_musa.c"))
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, library)
}

/// Runs the test `test` of this binary alone in a child with the dma-buf backend forced,
/// `MUSA_HOME` set to `musa_home`, no `LD_LIBRARY_PATH` (cargo's could hold a build's libmusa)
/// and `envs`; asserts it passed.
pub fn run_child(test: &str, musa_home: &Path, envs: &[(&str, &Path)]) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("MUSA_HOME", musa_home)
        .env("GDRCOPY_USE_DMABUF_MMAP", "1")
        .env_remove("LD_LIBRARY_PATH");
    for (name, value) in envs {
        command.env(name, value);
    }
    let out = command.output().expect("running the child");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
