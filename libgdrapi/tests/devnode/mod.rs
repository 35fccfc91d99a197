//! The copy harness's stand-in for /dev/mtgdrdrv (testing/copy-harness/devnode_double.c), for
//! the tests that preload it: with it, gdr_open, pins, maps and copies work without a device. It
//! has no TLS of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the double as `dir/devnode_double.so` and returns its path.
pub fn build(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let library = dir.join("devnode_double.so");
    let include = format!("-I{}", root.join("mtgdrdrv/kmod").display());
    let output = Command::new("cc")
        .args([
            "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC", &include,
        ])
        .arg(root.join("testing/copy-harness/devnode_double.c"))
        .arg("-o")
        .arg(&library)
        .arg("-ldl")
        .output()
        .expect("running cc");
    assert!(
        output.status.success(),
        "cc devnode_double.c: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    library
}
