//! `cargo xtask`: the project's build, codegen, packaging and test entry points.
//! One module per subcommand; `main` only parses and dispatches. The subcommands are layered
//! in crates: xtask-base (shared helpers, the build), xtask-pack (packaging), xtask-testbench
//! (the test bench: the VM, matrix and package tests, the test runner and checks) and
//! xtask-benchmarks (`bench`, in the test bench's VM); here are those that sit on all of them
//! (codegen, release-check).

mod codegen;
mod release;

use anyhow::Result;
use clap::{Parser, Subcommand};

use xtask_base::build;
use xtask_pack::stage::Package;
use xtask_pack::{aptrepo, deb, debhelper, dsc, install};
use xtask_testbench::pkgtest;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, generate, package and test mtgdrcopy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Regenerate the C headers from the Rust ABI definitions, debian/copyright's third-party
    /// part from Cargo.lock, and the maintainer and homepage from debian/control.
    Codegen {
        /// Do not write: fail if a generated file differs from what would be generated.
        #[arg(long)]
        check: bool,
    },
    /// Build the driver (for one kernel), the library and/or the tools.
    Build(build::Args),
    /// Remove build/ and cargo's target directory.
    Clean,
    /// Install the library, the tools and/or the driver from source (default prefix /usr/local).
    Install(install::Args),
    /// Stage the mtgdrdrv-dkms package's tree in build/pkg/mtgdrdrv-dkms.
    BuildKmod,
    /// Stage the libgdrapi package's tree in build/pkg/libgdrapi.
    BuildLib,
    /// Stage the mtgdrcopy-tests package's tree in build/pkg/mtgdrcopy-tests.
    BuildTests,
    /// Stage the mtgdrcopy metapackage's tree in build/pkg/mtgdrcopy.
    BuildMeta,
    /// Stage every package's tree in build/pkg/ (the four above; the old `make build`).
    BuildAll,
    /// Build the mtgdrdrv-dkms .deb into build/.
    DebKmod(deb::Args),
    /// Build the libgdrapi .deb into build/.
    DebLib(deb::Args),
    /// Build the mtgdrcopy-tests .deb into build/.
    DebTests(deb::Args),
    /// Build the mtgdrcopy metapackage .deb into build/.
    DebMeta(deb::Args),
    /// Build the four .debs of a release into build/.
    DebAll(deb::Args),
    /// Build the Debian source package (.dsc, orig tarball with the crates vendored,
    /// .debian.tar.xz) into build/source/, for dpkg-buildpackage, sbuild or a PPA.
    DistSource(dsc::Args),
    /// Build the single package `mtgdrcopy` holding everything into build/.
    DebBundle(deb::Args),
    /// Same as deb-bundle (the old single-package name).
    Deb(deb::Args),
    /// The test bench's commands (`test`, the VM, the matrix and package tests).
    #[command(flatten)]
    Testbench(xtask_testbench::Command),
    /// Run copybw, copylat and apiperf in the test VM, and the copy routines on the host; JSON
    /// and SVG plots in build/bench/.
    Bench(xtask_benchmarks::Args),
    /// Check that this tree is releasable: versions, changelogs, headers, lintian, tests.
    ReleaseCheck(release::Args),
    /// Turn build/*.deb into an apt repository (build/apt), optionally signed.
    AptRepo(aptrepo::Args),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Codegen { check } => codegen::run(check),
        Command::Build(args) => build::cli(args),
        Command::Clean => build::clean(),
        Command::Install(args) => install::cli(args),
        Command::BuildKmod => debhelper::cli(&[Package::Kmod]),
        Command::BuildLib => debhelper::cli(&[Package::Lib]),
        Command::BuildTests => debhelper::cli(&[Package::Tests]),
        Command::BuildMeta => debhelper::cli(&[Package::Meta]),
        Command::BuildAll => debhelper::cli(&Package::SPLIT),
        Command::DebKmod(args) => deb::cli(&[Package::Kmod], args),
        Command::DebLib(args) => deb::cli(&[Package::Lib], args),
        Command::DebTests(args) => deb::cli(&[Package::Tests], args),
        Command::DebMeta(args) => deb::cli(&[Package::Meta], args),
        Command::DebAll(args) => deb::cli(&Package::SPLIT, args),
        Command::DistSource(args) if args.check => pkgtest::source::cli(),
        Command::DistSource(_) => dsc::cli(),
        Command::DebBundle(args) | Command::Deb(args) => deb::cli(&[Package::Bundle], args),
        Command::ReleaseCheck(args) => release::cli(args),
        Command::AptRepo(args) => aptrepo::cli(args),
        Command::Testbench(command) => command.run(),
        Command::Bench(args) => xtask_benchmarks::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn usage_names_the_command_users_type() {
        let usage = Cli::command().render_usage().to_string();
        assert!(usage.contains("cargo xtask <COMMAND>"), "{usage}");
    }

    #[test]
    fn build_and_install_take_the_same_component_names() {
        for command in ["build", "install"] {
            for name in ["all", "driver", "drv", "lib", "exes"] {
                assert!(
                    Cli::try_parse_from(["cargo xtask", command, name]).is_ok(),
                    "cargo xtask {command} {name}"
                );
            }
        }
    }

    /// The backticked words of a table cell.
    fn quoted(cell: &str) -> Vec<&str> {
        cell.split('`').skip(1).step_by(2).collect()
    }

    #[test]
    fn every_make_target_of_the_development_docs_table_is_an_xtask_command() {
        let doc = xtask_base::paths::root().join("docs/development.md");
        let doc = std::fs::read_to_string(doc).unwrap();
        let table = doc
            .split_once("### The old Makefile's targets\n")
            .expect("docs/development.md's make-target table")
            .1
            .split("\n\n")
            .map(str::trim)
            .find(|block| block.starts_with('|'))
            .expect("a table under the heading");
        let mut targets = Vec::new();
        for row in table.lines().skip(2) {
            let cells: Vec<&str> = row.split(" | ").collect();
            assert_eq!(cells.len(), 2, "{row}");
            let make = quoted(cells[0]);
            let xtask = if cells[1].contains("the same names") {
                make.clone()
            } else {
                quoted(cells[1])
            };
            assert!(!xtask.is_empty(), "{row}");
            for command in xtask {
                let argv = std::iter::once("cargo xtask").chain(command.split_whitespace());
                if let Err(e) = Cli::try_parse_from(argv) {
                    panic!("`cargo xtask {command}` ({row}): {e}");
                }
            }
            targets.extend(make.iter().map(|t| t.to_string()));
        }
        for target in [
            "all",
            "driver",
            "lib",
            "exes",
            "clean",
            "install",
            "lib_install",
            "exes_install",
            "drv_install",
            "build",
            "deb",
            "deb-bundle",
            "build-kmod",
            "build-lib",
            "build-tests",
            "build-meta",
            "deb-kmod",
            "deb-lib",
            "deb-tests",
            "deb-meta",
            "deb-all",
        ] {
            assert!(
                targets.iter().any(|t| t.split(' ').next() == Some(target)),
                "make {target} is not in docs/development.md's table: {targets:?}"
            );
        }
    }
}
