//! `cargo xtask cross-test`, and the cross steps of `cargo xtask test`: for every cross target,
//! the tests under qemu-user, the header test, and the packages with lintian. Apart from
//! cross.rs (the toolchain) because the packages are built by deb.rs, which uses that toolchain.

use anyhow::{ensure, Context, Result};
use xshell::Shell;

use xtask_base::cross::{ensure_elf_for, header_test, unit_tests, workspace_with_debian_rustc};
use xtask_base::steps::Step;
use xtask_base::targets::{self, Target, TARGETS};
use xtask_base::workspace::Workspace;
use xtask_base::{elf, paths};
use xtask_pack::stage::Package;

/// `deb-all` for `target`: the four packages, checked to carry the right architecture and
/// arm64 code, then lintian on them (lintian reads foreign-architecture packages).
pub fn packages(sh: &Shell, target: &'static Target) -> Result<()> {
    let ws = Workspace::load(sh)?.for_target(Some(target));
    let debs = xtask_pack::deb::build_split(sh, &ws)?;
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
    xtask_pack::deb::lintian(sh, &debs)
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
            "arm64: gdrapi.h C and C++ test under qemu-user",
            Box::new(move |sh: &Shell| header_test(sh, target)),
        ));
        steps.push((
            "arm64: deb-all and lintian",
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
