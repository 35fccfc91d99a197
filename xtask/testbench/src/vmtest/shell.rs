//! `cargo xtask vm`: the test VM (vm.rs's harness) with both modules loaded, then a shell on
//! this terminal, or one command line. Here, above vm.rs, because the VM it boots is the module
//! tests' (`module_vm`).

use anyhow::{bail, ensure, Result};
use xshell::Shell;

use super::guest::module_vm;
use super::script::load_only;
use xtask_base::paths;

use crate::kernel::{self, Kernel};
use crate::vm;

#[derive(clap::Args)]
pub struct Args {
    /// Appended to the guest kernel's command line.
    #[arg(long, value_name = "ARGS", default_value = "")]
    kernel_cmdline: String,
    /// Instead of a shell, run this shell command line in the guest (modules loaded, tools in
    /// /usr/bin, LD_LIBRARY_PATH set), print the console and exit with its status.
    #[arg(long, value_name = "CMD")]
    run: Option<String>,
}

/// `cargo xtask vm`: a shell in the guest, on this terminal.
pub fn cli(args: Args) -> Result<()> {
    let kernel = kernel::bookworm_kernel()?;
    eprintln!(
        "xtask: booting {} under TCG with mtgpu_emu and mtgdrdrv loaded; the shell comes after \
         ~5 s. Leave with `poweroff -f` or Ctrl-A x.",
        kernel.release
    );
    let sh = xshell::Shell::new()?;
    sh.change_dir(paths::root());
    if let Some(command) = &args.run {
        return run_command(&sh, &kernel, command, args.kernel_cmdline);
    }
    let spec = interactive(&sh, &kernel, args.kernel_cmdline)?;
    vm::run(
        &spec,
        &paths::build_dir().join("vm").join("interactive.log"),
    )?;
    Ok(())
}

/// `cargo xtask vm`: the test VM with both modules loaded, then a shell.
pub fn interactive(sh: &Shell, kernel: &Kernel, extra_cmdline: String) -> Result<vm::VmSpec> {
    let mut spec = module_vm(sh, kernel)?;
    spec.script = load_only();
    spec.interactive = true;
    spec.extra_cmdline = extra_cmdline;
    Ok(spec)
}

/// `cargo xtask vm --run CMD`: boots the test VM with both modules loaded and runs `cmd` there
/// (a shell command line), printing the console; fails unless it exits 0 with a clean kernel log.
pub fn run_command(sh: &Shell, kernel: &Kernel, cmd: &str, extra_cmdline: String) -> Result<()> {
    let mut spec = module_vm(sh, kernel)?;
    spec.script = format!("{}\n{cmd}\n", load_only());
    spec.extra_cmdline = extra_cmdline;
    let log = paths::build_dir().join("vm").join("run.log");
    let outcome = vm::run(&spec, &log)?;
    print!("{}", outcome.console.replace('\r', ""));
    ensure!(
        outcome.kernel_problems.is_empty(),
        "kernel reported problems:\n{}",
        outcome.kernel_problems.join("\n")
    );
    match outcome.exit_code {
        Some(0) => Ok(()),
        code => bail!("the command exited with {code:?}; log: {}", log.display()),
    }
}
