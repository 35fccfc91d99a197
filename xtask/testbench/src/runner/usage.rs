//! CPU time, for the step table: `cargo xtask test` is CPU-bound on a 2-core machine, so what
//! shortens a run is less CPU work, and a step's wall time cannot say what it costs. getrusage
//! counts this process's threads and every child it has waited for, with their children:
//! QEMU, cargo, dpkg, the guest lane. Processes that leave the process tree (a gpg-agent) are
//! not counted, so the figures are lower bounds.

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeValLike;

/// User and system time so far of this process and of the children it has waited for.
pub fn cpu_secs() -> f64 {
    secs_of(UsageWho::RUSAGE_SELF) + secs_of(UsageWho::RUSAGE_CHILDREN)
}

fn secs_of(who: UsageWho) -> f64 {
    getrusage(who).map_or(0.0, |u| {
        (u.user_time().num_microseconds() + u.system_time().num_microseconds()) as f64 / 1e6
    })
}

/// The CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_waited_for_child() {
        // The children's part alone: the other tests' threads count in RUSAGE_SELF.
        let before = secs_of(UsageWho::RUSAGE_CHILDREN);
        // A fixed amount of work, about 0.3 s of CPU here, whatever the load.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let spent = secs_of(UsageWho::RUSAGE_CHILDREN) - before;
        assert!(
            spent > 0.05,
            "the child's CPU time was not counted ({spent} s)"
        );
    }
}
