//! The test bench of `cargo xtask`: the QEMU VM and its tests, the Debian kernels they boot,
//! the kernel matrix, the package tests (the source package's build, reproducibility, the
//! maintainer scripts, install and upgrade, from an apt repository), copy counts, libFuzzer,
//! the arm64 and static-library checks, and the checks of the tree itself (the CI workflows).
//! It depends on xtask-base and xtask-pack; the benchmarks (xtask-benchmarks) run in its VM,
//! and `cargo xtask test` runs them quickly as `cargo xtask bench --quick`.

pub mod autopkgtest;
pub mod copycount;
pub mod cpu;
pub mod crosstest;
pub mod debugkernel;
pub mod elf;
pub mod fuzz;
pub mod glibcfloor;
pub mod kbuild;
pub mod kernel;
pub mod library;
pub mod manpages;
pub mod matrix;
pub mod piuparts;
pub mod pkgtest;
pub mod runner;
pub mod staticlib;
pub mod step;
pub mod upstreamcli;
pub mod vm;
pub mod vmtest;
pub mod workflows;

/// The bench's subcommands of `cargo xtask` (flattened into its command line).
#[derive(clap::Subcommand)]
pub enum Command {
    /// Run every test: lints and generated-file freshness, unit tests, the library's exports and
    /// header, libFuzzer, copy counts, arm64 under qemu-user, the kernel module and tools in QEMU
    /// (VM tests, benchmarks, the Debian kernel matrix), and the packages (build, lintian, source
    /// package, reproducibility, install and upgrade).
    Test(runner::Args),
    /// Boot the test kernel in QEMU and get a root shell in it.
    Vm(vmtest::shell::Args),
    /// Count the instructions of each public copy call and check its device accesses, for every
    /// copy variant; fails above the ceilings of libgdrapi/copy-ceilings.txt.
    CopyCounts(copycount::Args),
    /// Build the modules and the DKMS package for Debian's 5.10, 6.1, 6.12 and 7.x kernels in
    /// chroots of their suites, and run the VM tests on 6.1 and 7.x.
    KmodMatrix(matrix::Args),
    /// Only the arm64 steps of `test`: tests under qemu-user, header test, packages, lintian.
    CrossTest,
    /// Only the packaging steps of `test`: build the .debs, lintian, piuparts, the upgrade test.
    TestPackages(pkgtest::Args),
    /// Check a static libgdrapi.a: only gdr_* global, no bitcode, links beside other Rust code.
    CheckStaticlib(staticlib::Args),
    /// Check .github/workflows with actionlint and ShellCheck (a step of `test`).
    LintWorkflows,
}

impl Command {
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Test(args) => runner::run(args),
            Command::Vm(args) => vmtest::shell::cli(args),
            Command::CopyCounts(args) => copycount::run(args),
            Command::KmodMatrix(args) => matrix::cli(args),
            Command::CrossTest => crosstest::cli(),
            Command::TestPackages(args) => pkgtest::cli(args),
            Command::CheckStaticlib(args) => staticlib::cli(args),
            Command::LintWorkflows => {
                let sh = xshell::Shell::new()?;
                sh.change_dir(xtask_base::paths::root());
                workflows::test_step(&sh)
            }
        }
    }
}
