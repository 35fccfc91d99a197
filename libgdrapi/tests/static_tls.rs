//! libgdrapi loads with dlopen after other libraries have used up glibc's static TLS surplus
//! (a plugin loader, a Python process with extensions built with initial-exec TLS), and its copy
//! path still works there: the thread's hazard is found through a TLS descriptor, which glibc
//! points at dynamic TLS when no static TLS is left. The dlopen order runs in a C program
//! (tests/c/static_tls_dlopen.c) of its own, since the test binary links the library statically
//! and what a process loaded stays loaded. An LD_PRELOAD'ed library would prove nothing: its TLS
//! is allocated at start-up, outside the surplus.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod built;
mod devnode;
use built::cdylib;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn cc(args: &[&str], source: &str, out: &Path) {
    let output = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O2"])
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(Path::new(MANIFEST_DIR).join("tests/c").join(source))
        .output()
        .expect("running cc");
    assert!(
        output.status.success(),
        "cc {source}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// tests/c/ie_tls.c with `bytes` bytes of initial-exec TLS.
fn ie_tls_library(dir: &Path, bytes: usize) -> PathBuf {
    let library = dir.join(format!("libie_tls_{bytes}.so"));
    if !library.exists() {
        let define = format!("-DTLS_BYTES={bytes}");
        cc(&["-shared", "-fPIC", &define], "ie_tls.c", &library);
    }
    library
}

fn driver(exe: &Path, args: &[&Path]) -> Output {
    driver_with(exe, args, None)
}

fn driver_with(exe: &Path, args: &[&Path], preload: Option<&Path>) -> Output {
    let mut command = Command::new(exe);
    match preload {
        Some(library) => command.env("LD_PRELOAD", library),
        None => command.env_remove("LD_PRELOAD"),
    };
    command
        .args(args)
        // Logging on: a failing gdr_open says why on stderr, shown if the run fails.
        .env("GDRCOPY_ENABLE_LOGGING", "1")
        .output()
        .expect("running static_tls_dlopen")
}

#[test]
fn dlopen_after_the_static_tls_surplus_is_used_up() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("static-tls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test directory");
    let exe = dir.join("static_tls_dlopen");
    cc(&["-pthread"], "static_tls_dlopen.c", &exe);
    let loads = |bytes: usize| {
        let library = ie_tls_library(&dir, bytes);
        driver(&exe, &[Path::new("probe"), &library])
            .status
            .success()
    };
    // The largest filler that still loads (to 16 bytes): what is left of the surplus then is
    // less than the 128 bytes of the control library. glibc's default surplus is about 1.6 KiB;
    // the search does not depend on it.
    let (mut lo, mut hi) = (16, 64 * 1024);
    assert!(
        loads(lo),
        "a library with 16 bytes of initial-exec TLS does not load"
    );
    assert!(
        !loads(hi),
        "64 KiB of initial-exec TLS loads: no limit to test against"
    );
    while hi - lo > 16 {
        let mid = (lo + hi) / 2 / 16 * 16;
        if loads(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let filler = ie_tls_library(&dir, lo);
    let control = ie_tls_library(&dir, 128);
    let out = driver(&exe, &[Path::new("run"), &filler, &control, &cdylib()]);
    assert!(
        out.status.success(),
        "with {lo} bytes of initial-exec TLS loaded first (exit {:?}): {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Real copies through a mapping, the hazard pointer in dynamic TLS (every copy takes the
    // cold path), with the device-node stand-in preloaded (it uses no static TLS).
    let preload = devnode::build(&dir);
    let out = driver_with(
        &exe,
        &[Path::new("run-open"), &filler, &control, &cdylib()],
        Some(&preload),
    );
    assert!(
        out.status.success(),
        "copies through a mapping with {lo} bytes of initial-exec TLS loaded first (exit {:?}): \
         {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
