//! The guest lane's copy counts, run beside its other steps.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;
use xshell::Shell;

use super::{failed_outcome, run_steps, usage, Outcome, COPY_COUNT_STEP};
use crate::step::Step;
use xtask_base::paths;

/// Runs `steps` in order, except the copy counts: those run from the start in a child xtask
/// (`copy-counts`). They need nothing the other steps make, and their tracers take only CPU
/// time nothing else wants (`SCHED_IDLE`): started early, they use what the two lanes leave
/// idle as it comes, instead of needing two cores of their own for minutes at the end. (The
/// machine is busy most of a run, so most of their work still comes last.) The child is reaped
/// only after the other steps, so that its CPU time counts in none of theirs but its own.
pub fn run_steps_beside_copy_counts(sh: &Shell, steps: Vec<Step>) -> Vec<Outcome> {
    let (counts, steps): (Vec<Step>, Vec<Step>) = steps
        .into_iter()
        .partition(|(name, _)| *name == COPY_COUNT_STEP);
    if counts.is_empty() {
        return run_steps(sh, &steps);
    }
    eprintln!("==> {COPY_COUNT_STEP} (a child xtask, beside the steps below)");
    let start = Instant::now();
    let child = match spawn_copy_counts() {
        Ok(child) => child,
        Err(e) => {
            let mut outcomes = run_steps(sh, &steps);
            outcomes.push(failed_outcome(COPY_COUNT_STEP, &e));
            return outcomes;
        }
    };
    let pid = child.id();
    let (mut outcomes, exited) = std::thread::scope(|s| {
        let exited = s.spawn(move || wait_without_reaping(pid).map(|()| start.elapsed()));
        let outcomes = run_steps(sh, &steps);
        (outcomes, exited.join().ok().and_then(Result::ok))
    });
    outcomes.push(reap(child, exited.unwrap_or_else(|| start.elapsed())));
    outcomes
}

fn spawn_copy_counts() -> Result<Child> {
    Command::new(std::env::current_exe().context("finding xtask itself")?)
        .arg("copy-counts")
        .current_dir(paths::root())
        .spawn()
        .context("starting cargo xtask copy-counts")
}

/// Waits until the child has exited, leaving it a zombie (WNOWAIT), so that its CPU time
/// joins this process's children's when `reap` waits for it, not during another step.
fn wait_without_reaping(pid: u32) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(pid)?);
    loop {
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(Errno::EINTR) => continue,
            result => return result.map(drop).context("waiting for the copy counts"),
        }
    }
}

/// The copy counts' outcome: their exit status, the time until they exited and their CPU.
fn reap(mut child: Child, wall: Duration) -> Outcome {
    let before = usage::cpu_secs();
    let status = child.wait();
    let cpu = usage::cpu_secs() - before;
    let secs = wall.as_secs_f64();
    let ok = match &status {
        Ok(s) if s.success() => {
            eprintln!("    ok: {COPY_COUNT_STEP} ({secs:.1} s)");
            true
        }
        Ok(s) => {
            eprintln!("    FAILED: {COPY_COUNT_STEP} ({secs:.1} s): cargo xtask copy-counts {s}");
            false
        }
        Err(e) => {
            eprintln!("    FAILED: {COPY_COUNT_STEP}: waiting for it: {e}");
            false
        }
    };
    Outcome {
        name: COPY_COUNT_STEP.to_owned(),
        secs,
        cpu: Some(cpu),
        ok,
    }
}
