//! `mtgdrcopy_doctor`: checks the whole chain a GPU copy needs on this host or in this container
//! (mtgpu, mtgdrdrv, /dev/mtgdrdrv, the container's options, libmusa, the GPUs, x86 PAT, NUMA
//! affinity, the copy variant, the dma-buf backend) and prints one line per check with the fix.
//! Exit status 0 without a FAIL, 1 with one, 2 usage, 77 when this is no Moore Threads host.

use std::process::ExitCode;

use clap::Parser;
use mtgdrcopy_tests::cli::doctor::Args;
use mtgdrcopy_tests::doctor::{self, report};
use mtgdrcopy_tests::tool::{self, Status};

const PROGRAM: &str = "mtgdrcopy_doctor";

fn main() -> ExitCode {
    let args = Args::parse();
    tool::main(PROGRAM, &args.version, |_| {
        let outcome = doctor::run(&args);
        if outcome.nothing_to_check {
            return Err(tool::unavailable(anyhow::anyhow!(
                "nothing to check: no mtgpu driver, no mtgdrdrv and no libmusa on this system \
                 (not a Moore Threads GPU host)"
            )));
        }
        for line in report::shown(&outcome.lines, args.quiet) {
            println!("{line}");
        }
        Ok(match report::status(&outcome.lines) {
            Status::Failed => Status::Failed,
            _ => Status::Passed,
        })
    })
}
