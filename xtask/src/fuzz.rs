//! The libFuzzer step of `cargo xtask test`: libgdrapi's cargo-fuzz targets (libgdrapi/fuzz),
//! each run for a bounded time. They need the nightly toolchain (cargo-fuzz builds with
//! `-Zsanitizer=address` and sanitizer coverage); without it the step says so and passes, as the
//! deterministic fuzzers in the VM (mtgdrdrv_fuzz) do not need it. cargo-fuzz itself comes from
//! crates.io (`cargo install cargo-fuzz`) the first time.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::paths;

/// Seconds each target runs in `cargo xtask test`; MTGDRCOPY_LIBFUZZER_SECONDS overrides.
const DEFAULT_SECONDS: u64 = 30;

const TARGETS: &[&str] = &["copy_variants", "capi_fake_device"];

pub fn libfuzzer_step(sh: &Shell) -> Result<()> {
    let toolchains = cmd!(sh, "rustup toolchain list")
        .quiet()
        .read()
        .unwrap_or_default();
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        eprintln!(
            "    skipped: no nightly toolchain (cargo-fuzz needs it for -Zsanitizer); the \
             deterministic fuzzers run in the VM step"
        );
        return Ok(());
    }
    if cmd!(sh, "cargo +nightly fuzz --version")
        .quiet()
        .ignore_stderr()
        .read()
        .is_err()
    {
        eprintln!("    installing cargo-fuzz from crates.io");
        cmd!(sh, "cargo install --locked cargo-fuzz")
            .run()
            .context("cargo install cargo-fuzz")?;
    }
    let seconds = std::env::var("MTGDRCOPY_LIBFUZZER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECONDS)
        .to_string();
    let dir = paths::root().join("libgdrapi");
    let _cd = sh.push_dir(&dir);
    // The corpus and findings stay under build/, out of the source tree.
    let out = paths::build_dir().join("libfuzzer");
    for target in TARGETS {
        let corpus = out.join("corpus").join(target);
        let artifacts = out.join("artifacts").join(target);
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let artifact_prefix = format!("-artifact_prefix={}/", artifacts.display());
        let max_time = format!("-max_total_time={seconds}");
        let result = cmd!(
            sh,
            "cargo +nightly fuzz run --release {target} {corpus} -- {max_time} -print_final_stats=1 {artifact_prefix}"
        )
        .run();
        if result.is_err() {
            report_artifacts(&artifacts);
            bail!(
                "libFuzzer target {target} found a failure (artifacts in {})",
                artifacts.display()
            );
        }
    }
    Ok(())
}

fn report_artifacts(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            eprintln!(
                "    reproduce: cargo +nightly fuzz run {} {}",
                dir.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                e.path().display()
            );
        }
    }
}
