//! The libFuzzer step of `cargo xtask test`: libgdrapi's cargo-fuzz targets (libgdrapi/fuzz),
//! each run for a fixed number of inputs, so that a loaded machine takes longer rather than
//! testing less. They need the nightly toolchain (cargo-fuzz builds with
//! `-Zsanitizer=address` and sanitizer coverage); without it the step says so and passes, as the
//! deterministic fuzzers in the VM (mtgdrdrv_fuzz) do not need it. cargo-fuzz itself comes from
//! crates.io (`cargo install cargo-fuzz`) the first time.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use xtask_base::paths;

/// The targets and the inputs each runs in `cargo xtask test` (MTGDRCOPY_LIBFUZZER_RUNS
/// overrides): about what 30 s gave each on a loaded 2-core machine, when the budget was time.
const TARGETS: &[(&str, u64)] = &[("copy_variants", 80_000), ("capi_fake_device", 400_000)];

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
    let runs_override: Option<u64> = std::env::var("MTGDRCOPY_LIBFUZZER_RUNS")
        .ok()
        .and_then(|s| s.parse().ok());
    let dir = paths::root().join("libgdrapi");
    let _cd = sh.push_dir(&dir);
    // The corpus and findings stay under build/, out of the source tree.
    let out = paths::build_dir().join("libfuzzer");
    for &(target, runs) in TARGETS {
        let corpus = out.join("corpus").join(target);
        let artifacts = out.join("artifacts").join(target);
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&artifacts)?;
        let artifact_prefix = format!("-artifact_prefix={}/", artifacts.display());
        let runs = format!("-runs={}", runs_override.unwrap_or(runs));
        let result = cmd!(
            sh,
            "cargo +nightly fuzz run --release {target} {corpus} -- {runs} -print_final_stats=1 {artifact_prefix}"
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
