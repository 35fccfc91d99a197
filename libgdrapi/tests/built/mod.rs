//! Where the integration tests find what cargo built with them.

use std::path::PathBuf;

/// The cdylib cargo built with this test: in `target/<profile>/deps/` (where `cargo test`
/// leaves it) or in `target/<profile>/`.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps directory");
    [deps.join("libgdrapi.so"), deps.join("../libgdrapi.so")]
        .into_iter()
        .find(|p| p.exists())
        .expect("libgdrapi.so in target/<profile>/deps or target/<profile>")
}
