//! `cargo xtask test`: every test the project has, in order, each step timed, then a summary
//! line (`N passed, N failed`). Steps after a failure still run, so one report shows everything.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::{codegen, paths};

#[derive(clap::Args)]
pub struct Args {
    /// Skip the steps that boot QEMU (the kernel module tests).
    #[arg(long)]
    pub no_vm: bool,
    /// Skip the kernel matrix (`cargo xtask kmod-matrix`: chroots of four Debian suites).
    #[arg(long)]
    pub no_matrix: bool,
    /// Skip the arm64 cross build and its tests under qemu-user (cross.rs).
    #[arg(long)]
    pub no_cross: bool,
    /// Run only the steps whose name contains TEXT (case-insensitive; repeatable), e.g.
    /// `--only qemu` for the VM tests: for a developer between changes, not for CI.
    #[arg(long, value_name = "TEXT")]
    pub only: Vec<String>,
}

pub type Step<'a> = (&'static str, Box<dyn Fn(&Shell) -> Result<()> + 'a>);

pub fn run(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    let mut steps: Vec<Step> = vec![
        ("cargo fmt --check", Box::new(fmt)),
        (
            "codegen freshness",
            Box::new(|_: &Shell| codegen::run(true)),
        ),
        (
            "versions agree (crates released together, dkms.conf, pins, changelogs)",
            Box::new(|sh: &Shell| crate::versions::check(&crate::workspace::Workspace::load(sh)?)),
        ),
        (
            "workflows: actionlint and ShellCheck",
            Box::new(crate::workflows::test_step),
        ),
        ("clippy -D warnings", Box::new(clippy)),
        (
            "rust-version: no dependency needs a newer Rust (product, xtask)",
            Box::new(crate::msrv::check),
        ),
        ("unit and integration tests", Box::new(unit_tests)),
        (
            "libgdrapi.a: only gdr_* global, no bitcode, links beside another Rust staticlib",
            Box::new(crate::staticlib::test_step),
        ),
        (
            "libFuzzer targets of libgdrapi (cargo-fuzz)",
            Box::new(crate::fuzz::libfuzzer_step),
        ),
        (
            "copy calls: instructions per call within the ceilings, every device access checked",
            Box::new(|_: &Shell| crate::copycount::run(crate::copycount::Args::default())),
        ),
    ];
    if !args.no_cross {
        steps.extend(crate::cross::test_steps());
    }
    if !args.no_vm {
        steps.extend(crate::vmtest::test_steps());
        steps.extend(crate::bench::quick_steps());
    }
    if !args.no_matrix {
        steps.push(crate::matrix::test_step(!args.no_vm));
    }
    // The .debs, lintian on them, and (with the VM) their install test.
    steps.extend(crate::pkgtest::test_steps(!args.no_vm));

    if !args.only.is_empty() {
        let wanted = |name: &str| {
            let name = name.to_lowercase();
            args.only.iter().any(|t| name.contains(&t.to_lowercase()))
        };
        steps.retain(|(name, _)| wanted(name));
        anyhow::ensure!(!steps.is_empty(), "--only {:?} matches no step", args.only);
    }

    let mut failed = Vec::new();
    let mut times = Vec::new();
    for (name, step) in &steps {
        eprintln!("==> {name}");
        let start = Instant::now();
        let result = step(&sh);
        let secs = start.elapsed().as_secs_f64();
        times.push((*name, secs, result.is_ok()));
        match result {
            Ok(()) => eprintln!("    ok: {name} ({secs:.1} s)"),
            Err(e) => {
                eprintln!("    FAILED: {name} ({secs:.1} s): {e:#}");
                failed.push(*name);
            }
        }
    }
    eprintln!("\nstep times:");
    for (name, secs, ok) in &times {
        let verdict = if *ok { "ok" } else { "FAILED" };
        eprintln!("  {secs:>7.1} s  {verdict:<6}  {name}");
    }
    let total: f64 = times.iter().map(|(_, s, _)| s).sum();
    eprintln!("  {total:>7.1} s  total");
    println!(
        "xtask: {} passed, {} failed",
        steps.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!("failed steps: {}", failed.join(", "));
    }
    Ok(())
}

fn fmt(sh: &Shell) -> Result<()> {
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    Ok(())
}

fn clippy(sh: &Shell) -> Result<()> {
    cmd!(
        sh,
        "cargo clippy --quiet --workspace --all-targets -- -D warnings"
    )
    .run()?;
    Ok(())
}

fn unit_tests(sh: &Shell) -> Result<()> {
    cmd!(sh, "cargo test --quiet --workspace").run()?;
    Ok(())
}

/// Builds the release library and stages it under build/lib with its real name
/// (`libgdrapi.so.1.0.0`), the soname link and the development link; returns that directory.
pub fn build_library(sh: &Shell) -> Result<PathBuf> {
    cmd!(sh, "cargo build --quiet --release -p libgdrapi --locked").run()?;
    link_library(
        &paths::root().join("target/release"),
        &paths::build_dir().join("lib"),
    )
}

/// Stages the library built in `target` (a release directory) in `lib` with its real name, the
/// soname link and the development link; returns `lib`.
pub fn link_library(target: &Path, lib: &Path) -> Result<PathBuf> {
    let lib = lib.to_path_buf();
    std::fs::create_dir_all(&lib)?;
    let version = gdrapi_version();
    let real = format!("libgdrapi.so.{version}");
    let soname = crate::build::soname();
    std::fs::copy(target.join("libgdrapi.so"), lib.join(&real))?;
    std::fs::copy(target.join("libgdrapi.a"), lib.join("libgdrapi.a"))?;
    for (link, to) in [
        (soname.as_str(), real.as_str()),
        ("libgdrapi.so", soname.as_str()),
    ] {
        let path = lib.join(link);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(to, &path)
            .with_context(|| format!("linking {}", path.display()))?;
    }
    Ok(lib)
}

/// The library's package version, which names its real file.
pub fn gdrapi_version() -> &'static str {
    gdrapi::VERSION
}
