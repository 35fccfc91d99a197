//! `cargo xtask`: the project's build, codegen, packaging and test entry points.
//! One module per subcommand; `main` only parses and dispatches.

mod bench;
mod codegen;
mod copycount;
mod hostbench;
mod kernel;
mod paths;
mod test;
mod vm;
mod vmtest;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, generate, package and test mtgdrcopy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Regenerate the C headers from the Rust ABI definitions.
    Codegen {
        /// Do not write: fail if a generated file differs from what would be generated.
        #[arg(long)]
        check: bool,
    },
    /// Run every test: lints, codegen freshness, unit tests, header compile tests.
    Test(test::Args),
    /// Boot the test kernel in QEMU and get a root shell in it.
    Vm(vm::Args),
    /// Run copybw, copylat and apiperf in the test VM; JSON and SVG plots in build/bench/.
    Bench(bench::Args),
    /// Count instructions and device-side accesses of every copy variant with valgrind.
    CopyCounts,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Codegen { check } => codegen::run(check),
        Command::Test(args) => test::run(args),
        Command::Vm(args) => vm::cli(args),
        Command::Bench(args) => bench::run(args),
        Command::CopyCounts => copycount::run(),
    }
}
