//! `cargo xtask test` in two lanes at once. The guest lane holds the VM tests (6.1, the debug
//! kernel), the VM benchmarks, the kernel matrix and, beside them, the copy counts (in
//! `SCHED_IDLE`, in a child xtask: runner/beside.rs): TCG keeps one core busy
//! while the guest's own waits (boots, timers, module loads) leave the other one idle, and the
//! matrix's chroots wait on dpkg and the network. The host lane (lints, builds, unit tests,
//! fuzzers, the packages and their install and upgrade tests, which use the .debs this lane
//! built) runs in this process meanwhile; the guest lane runs in a child xtask (`--lane
//! guests`) whose output goes to a log, printed after the host lane, so the report reads lane by
//! lane. On the 2-core machine the lanes take about the same time. The guest lane's steps, and
//! most of the host lane's, are the test bench's (xtask-testbench: vmtest, matrix, pkgtest, ...;
//! the benchmarks through `cargo xtask bench`).
//!
//! The lanes share what other xtask processes would: cargo's build directory lock, the package
//! staging lock (xtask-base's `files::lock`), each chroot's lock, and apt's (waited for). Steps
//! of different lanes do not write the same files otherwise.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use super::{Args, Outcome};
use xtask_base::paths;

fn dir() -> PathBuf {
    paths::build_dir().join("test-lanes")
}

fn log_path() -> PathBuf {
    dir().join("guests.log")
}

fn results_path() -> PathBuf {
    dir().join("guests.tsv")
}

/// Starts the guest lane: this xtask again, with the same selection, `--lane guests`.
pub fn spawn_guests(args: &Args) -> Result<Child> {
    fs::create_dir_all(dir())?;
    let _ = fs::remove_file(results_path());
    let log = fs::File::create(log_path())
        .with_context(|| format!("creating {}", log_path().display()))?;
    let mut command = Command::new(std::env::current_exe().context("finding xtask itself")?);
    command.args(["test", "--lane", "guests"]);
    for (set, flag) in [
        (args.no_vm, "--no-vm"),
        (args.no_matrix, "--no-matrix"),
        (args.no_cross, "--no-cross"),
    ] {
        if set {
            command.arg(flag);
        }
    }
    for text in &args.only {
        command.args(["--only", text]);
    }
    command
        .current_dir(paths::root())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the guest lane")
}

/// The guest lane's outcomes, after printing its log; a lane that ended without reporting is
/// one failed outcome.
pub fn wait_guests(mut child: Child) -> Result<Vec<Outcome>> {
    let status = child.wait().context("waiting for the guest lane")?;
    let log = fs::read_to_string(log_path()).unwrap_or_default();
    eprintln!(
        "\n==> guest lane (ran alongside the steps above; log {})",
        log_path().display()
    );
    eprint!("{log}");
    match fs::read_to_string(results_path()) {
        Ok(text) => {
            let (outcomes, cpu) = parse_results(&text);
            if let Some(cpu) = cpu {
                eprintln!("    the guest lane's CPU time: {cpu:.1} s");
            }
            Ok(outcomes)
        }
        Err(_) => Ok(vec![Outcome {
            name: format!("guest lane (exited {status} without reporting its steps)"),
            secs: 0.0,
            cpu: None,
            ok: false,
        }]),
    }
}

/// In the guest lane: leaves its outcomes and its CPU time for the parent.
pub fn write_results(outcomes: &[Outcome], lane_cpu: f64) -> Result<()> {
    fs::create_dir_all(dir())?;
    fs::write(results_path(), format_results(outcomes, lane_cpu))
        .with_context(|| format!("writing {}", results_path().display()))
}

/// A line a step (`ok`, wall, CPU or `-`, name), then the lane's CPU time.
fn format_results(outcomes: &[Outcome], lane_cpu: f64) -> String {
    let mut text: String = outcomes
        .iter()
        .map(|o| format!("{}\t{:.1}\t{}\t{}\n", o.ok, o.secs, o.cpu_text(), o.name))
        .collect();
    text.push_str(&format!("{LANE_CPU}\t{lane_cpu:.1}\n"));
    text
}

const LANE_CPU: &str = "lane-cpu";

fn parse_results(text: &str) -> (Vec<Outcome>, Option<f64>) {
    let mut lane_cpu = None;
    let mut outcomes = Vec::new();
    for line in text.lines() {
        if let Some(cpu) = line
            .strip_prefix(LANE_CPU)
            .and_then(|r| r.strip_prefix('\t'))
        {
            lane_cpu = cpu.parse().ok();
            continue;
        }
        let mut fields = line.splitn(4, '\t');
        let (Some(ok), Some(secs), Some(cpu), Some(name)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(secs) = secs.parse() else { continue };
        outcomes.push(Outcome {
            name: name.to_owned(),
            secs,
            cpu: cpu.parse().ok(),
            ok: ok == "true",
        });
    }
    (outcomes, lane_cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip() {
        let outcomes = [
            Outcome {
                name: "kernel module tests in QEMU (Debian 6.1)".into(),
                secs: 346.6,
                cpu: Some(512.3),
                ok: true,
            },
            Outcome {
                name: "kernel matrix: a\tb".into(),
                secs: 0.0,
                cpu: None,
                ok: false,
            },
        ];
        let (back, lane_cpu) = parse_results(&format_results(&outcomes, 1234.5));
        assert_eq!(back.len(), 2);
        assert!(back[0].ok && back[0].secs == 346.6 && back[0].name == outcomes[0].name);
        assert_eq!(back[0].cpu, Some(512.3));
        assert!(!back[1].ok && back[1].name == "kernel matrix: a\tb" && back[1].cpu.is_none());
        assert_eq!(lane_cpu, Some(1234.5));
    }
}
