//! `cargo xtask cross-test`, and the cross steps of `cargo xtask test`: for every cross target,
//! the tests under qemu-user, the header test, and the packages with lintian. Apart from
//! cross.rs (the toolchain) because the packages are built by deb.rs, which uses that toolchain.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use xshell::{Cmd, Shell};

use crate::library::link_library;
use crate::step::Step;
use xtask_base::cross::{build, toolchain};
use xtask_base::paths;
use xtask_base::targets::{self, Target, TARGETS};
use xtask_base::targets::{release_dir, AARCH64};
use xtask_base::workspace::Workspace;

use crate::elf::{self, ensure_elf_for};
use xtask_pack::stage::Package;

/// `deb-all` for `target`: the four packages, checked to carry the right architecture and
/// arm64 code within the glibc floor (glibcfloor.rs), then lintian on them (lintian reads foreign-architecture packages).
pub fn packages(sh: &Shell, target: &'static Target) -> Result<()> {
    let ws = Workspace::load()?.for_target(Some(target));
    let debs = xtask_pack::deb::build(sh, &ws, &Package::SPLIT)?;
    for built in &debs {
        let package = built.package;
        let arch = xtask_pack::deb::field(&built.control, "Architecture").unwrap_or_default();
        let expected = if package.arch_all() {
            "all"
        } else {
            target.debian
        };
        ensure!(
            arch == expected,
            "{}: Architecture is {arch:?}, expected {expected}",
            built.path.display()
        );
        eprintln!("    {}", built.path.display());
    }
    // The staged trees are the packages' contents: their programs and libraries are arm64.
    for package in [Package::Lib, Package::Tests] {
        let elves = elf::elf_files(&package.tree())?;
        ensure!(!elves.is_empty(), "{} has no ELF files", package.deb_name());
        for elf in elves {
            ensure_elf_for(&elf, target)?;
        }
    }
    let paths: Vec<&Path> = debs.iter().map(|b| b.path.as_path()).collect();
    crate::glibcfloor::check_debs(sh, &paths)?;
    xtask_pack::deb::lintian(sh, &debs)
}

/// The crates' tests for `target`, run under qemu-user: the ABI crate's layout tests and all
/// of libgdrapi's, among them the copy variants' size × misalignment matrix (NEON and generic
/// on arm64).
pub fn unit_tests(sh: &Shell, target: &Target) -> Result<()> {
    let toolchain = toolchain(sh)?;
    eprintln!("    toolchain: {}", toolchain.rustc);
    toolchain
        .cargo(sh, target, "test")
        // The library targets' tests: libgdrapi's integration test (tests/cdylib.rs) runs host
        // compilers, and header_test below is its arm64 counterpart.
        .args(["--quiet", "-p", "mtgdrdrv", "-p", "libgdrapi", "--lib"])
        // qemu-user cannot run it: a seccomp filter for arm64 system calls would be installed
        // in the x86-64 qemu process. The native run covers the arm64-neutral protocol.
        .args([
            "--",
            "--skip",
            "an_unmap_after_membarrier_broke_keeps_the_mapping",
        ])
        .run()
        .with_context(|| format!("tests of mtgdrdrv and libgdrapi for {}", target.triple))
}

/// gdrapi.h's C and C++ tests (libgdrapi/tests/c, which libgdrapi's own `cdylib` test runs
/// natively) for `target`: compiled with the cross gcc/g++ against the cross-built
/// libgdrapi.so.1 and run under qemu-user with logging on, so the struct sizes and offsets the
/// tests assert hold on that ABI too and the library's one error line reaches C's stderr. (How
/// logging is filtered is the same Rust on every target: the native test covers it.) On arm64,
/// also where the release library makes LD64B/ST64B ([`ls64_instructions`]).
pub fn header_test(sh: &Shell, target: &Target) -> Result<()> {
    build(sh, target, true, false)?;
    // The cross build really produced code for the target.
    ensure_elf_for(&release_dir(target).join("libgdrapi.so"), target)?;
    if target.triple == AARCH64.triple {
        ls64_instructions(sh, target, &release_dir(target).join("libgdrapi.so"))?;
    }
    let toolchain = toolchain(sh)?;
    let out = paths::build_dir().join(format!("header-test-{}", target.debian));
    let lib = link_library(&release_dir(target), &out.join("lib"))?;
    let src = paths::root().join("libgdrapi/tests/c");
    let include = paths::root().join("libgdrapi/include");
    for (compiler, std, file) in [
        ("gcc", "-std=c11", "header_test.c"),
        ("g++", "-std=c++11", "header_test.cpp"),
    ] {
        let compiler = format!("{}-{compiler}", target.multiarch);
        let exe = out.join(file.replace('.', "_"));
        toolchain
            .cmd(sh, target, &[], None, &compiler)
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic"])
            .arg(format!("-I{}", include.display()))
            .arg(src.join(file))
            .arg(format!("-L{}", lib.display()))
            .arg("-lgdrapi")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-o")
            .arg(&exe)
            .run()
            .with_context(|| format!("compiling {file} with {compiler}"))?;
        ensure_elf_for(&exe, target)?;
        // The chroot has no /dev/mtgdrdrv: gdr_open fails and says how to load the module.
        let env = ["GDRCOPY_ENABLE_LOGGING=1".to_owned()];
        let run = run_program(sh, target, &env, &exe)?
            .quiet()
            .ignore_status()
            .output()
            .with_context(|| format!("running {} under {}", exe.display(), target.qemu))?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        ensure!(
            run.status.success()
                && stdout.contains("header test passed")
                && stderr.lines().count() == 1
                && stderr.contains("modprobe mtgdrdrv"),
            "{} under {}: {stdout}{stderr}",
            exe.display(),
            target.qemu
        );
    }
    Ok(())
}

/// The release library's `st64b`s are all in the LS64 variant's store routine and its `ld64b`s
/// in its load routine, and both exist: the shipped build has the instructions that qemu-user
/// lacks and the unit tests can only emulate (libgdrapi/src/copy/aarch64/ls64_tests.rs), and no
/// other routine (NEON's, the generic one) makes them.
fn ls64_instructions(sh: &Shell, target: &Target, lib: &Path) -> Result<()> {
    let objdump = format!("{}-objdump", target.multiarch);
    let listing = toolchain(sh)?
        .cmd(sh, target, &[], None, &objdump)
        .args(["-d", "--no-show-raw-insn"])
        .arg(lib)
        .read()
        .with_context(|| format!("disassembling {} with {objdump}", lib.display()))?;
    let mut function = "";
    let mut found = Vec::new();
    for line in listing.lines() {
        if line.ends_with(">:") {
            function = line;
        } else if let Some(op @ ("st64b" | "ld64b")) = line.split_whitespace().nth(1) {
            found.push((op, function));
        }
    }
    for (op, routine) in [("st64b", "ls64_to_device"), ("ld64b", "ls64_from_device")] {
        ensure!(
            found.iter().any(|&(o, _)| o == op),
            "{}: no {op} (the LS64 variant's {routine})",
            lib.display()
        );
        if let Some((_, elsewhere)) = found
            .iter()
            .find(|&&(o, f)| o == op && !f.contains(routine))
        {
            anyhow::bail!("{}: {op} outside {routine}, in {elsewhere}", lib.display());
        }
    }
    Ok(())
}

/// `exe args…` under qemu-user in the toolchain chroot, with `env` in its environment.
pub fn run_program<'a>(
    sh: &'a Shell,
    target: &Target,
    env: &[String],
    exe: &Path,
) -> Result<Cmd<'a>> {
    let sysroot = format!("/usr/{}", target.multiarch);
    Ok(toolchain(sh)?
        .cmd(sh, target, env, None, target.qemu)
        .args(["-L", &sysroot])
        .arg(exe))
}

/// The whole workspace, every target kind, type-checked by Debian's rustc for the machine's
/// own architecture: the workspace must build with both toolchains, not only the crates that
/// are cross-built (xtask, the fuzzer and the emulated libmusa too).
pub fn workspace_with_debian_rustc(sh: &Shell) -> Result<()> {
    let toolchain = toolchain(sh)?;
    toolchain
        .cmd(sh, &AARCH64, &[], None, "cargo")
        .args([
            "check",
            "--quiet",
            "--workspace",
            "--all-targets",
            "--locked",
            "--offline",
        ])
        .run()
        .with_context(|| format!("cargo check --workspace with {}", toolchain.rustc))
}

/// The steps of `cargo xtask test` for the cross toolchain: the workspace checked with it, and
/// for every cross target its tests under qemu-user, the header test, and its packages with
/// lintian.
pub fn test_steps() -> Vec<Step<'static>> {
    let mut steps: Vec<Step<'static>> = vec![(
        "Debian's rustc: cargo check --workspace --all-targets",
        Box::new(workspace_with_debian_rustc),
    )];
    for &target in TARGETS {
        if targets::parse(Some(target.triple)).ok().flatten().is_none() {
            continue; // the machine's own: the native steps cover it
        }
        steps.push((
            "arm64: toolchain chroot, mtgdrdrv and libgdrapi tests under qemu-user (copy matrix)",
            Box::new(move |sh: &Shell| unit_tests(sh, target)),
        ));
        steps.push((
            "arm64: gdrapi.h C and C++ test under qemu-user, LD64B/ST64B in the release library",
            Box::new(move |sh: &Shell| header_test(sh, target)),
        ));
        steps.push((
            "arm64: deb-all, glibc floor and lintian",
            Box::new(move |sh: &Shell| packages(sh, target)),
        ));
    }
    steps
}

/// `cargo xtask cross-test`: the steps of [`test_steps`], each timed; stops at a failure.
pub fn cli() -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(paths::root());
    for (name, step) in test_steps() {
        eprintln!("==> {name}");
        let start = std::time::Instant::now();
        step(&sh).with_context(|| format!("{name} failed"))?;
        eprintln!("    ok: {name} ({:.1} s)", start.elapsed().as_secs_f64());
    }
    Ok(())
}
