//! The verdicts read from the module tests' console: the in-VM test summary, the sanity runs
//! and the counters after them (the script's own checks: checks.rs).

use std::path::Path;

use anyhow::{bail, ensure, Result};

use crate::vm;

/// The guest's step markers, as durations.
pub fn print_guest_steps(console: &str) {
    let marks: Vec<(&str, f64)> = console
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("MTGDRCOPY-STEP ")? + "MTGDRCOPY-STEP ".len()..];
            let mut f = rest.split_whitespace();
            Some((f.next()?, f.next()?.parse().ok()?))
        })
        .collect();
    for pair in marks.windows(2) {
        eprintln!("      guest {}: {:.1} s", pair[0].0, pair[1].1 - pair[0].1);
    }
}

/// The run of `script`: the in-VM tests passed, every sanity run of the script passed, nothing
/// leaked.
pub(super) fn judge(outcome: &vm::VmOutcome, script: &str, log: &Path) -> Result<()> {
    let console = &outcome.console;
    // The in-VM test summary, repeated for whoever reads this run's output.
    for line in console.lines().filter(|l| {
        [
            "test result:",
            "FAILED",
            "panicked",
            "mtgdrdrv_fuzz",
            "FINDING",
            "phase exact",
            "phase concurrent",
            "phase api",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) {
        eprintln!("      guest: {}", line.trim());
    }
    outcome.ensure_passed("the in-VM tests", log)?;
    check_sanity_runs(console, &sanity_runs_in(script), log)?;
    check_counters(console, log)
}

/// The leak check: every counter that counts what is alive now, the module's
/// ([`mtgdrdrv::procfs::LIVE_COUNTERS`]) and the emulator's ([`mtgpu_emu_abi::LIVE_STATS`],
/// printed by `mtgdrcopy_musainfo --emu-stats` as `emu_<name>:`), was printed after the tests
/// (the from-source run prints them a second time) and is 0 each time. The names come from those two crates, so a counter renamed there or in what
/// prints it fails this check instead of no longer being checked.
fn check_counters(console: &str, log: &Path) -> Result<()> {
    let printed: Vec<(&str, i64)> = console
        .lines()
        .filter_map(|l| Some(&l[l.find("MTGDRCOPY-COUNTER ")? + "MTGDRCOPY-COUNTER ".len()..]))
        .flat_map(mtgdrdrv::procfs::parse_counters)
        .collect();
    let module = mtgdrdrv::procfs::LIVE_COUNTERS.map(String::from);
    let emulator = mtgpu_emu_abi::LIVE_STATS.map(|name| format!("emu_{name}"));
    for name in module.iter().chain(&emulator) {
        let values: Vec<i64> = printed
            .iter()
            .filter(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .collect();
        ensure!(
            !values.is_empty(),
            "counter {name} was not printed after the tests; full log: {}",
            log.display()
        );
        if let Some(value) = values.iter().find(|&&v| v != 0) {
            bail!(
                "leak after the tests: {name} {value}; full log: {}",
                log.display()
            );
        }
    }
    Ok(())
}

/// The names of the sanity runs `script` makes: its `sanity_run NAME ...` lines, in order
/// (counted from the script, so that the expected runs cannot drift from it).
pub(super) fn sanity_runs_in(script: &str) -> Vec<&str> {
    script
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("sanity_run "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect()
}

/// A TAP 14 subtest read from the console: a sanity run (`sanity_run` writes it) or the
/// upstream corpus' checks.
#[derive(Debug, Default)]
pub struct Subtest {
    pub name: String,
    /// The subtest's plan, `1..N`.
    plan: Option<usize>,
    /// Its test points: number, passed, skipped.
    pub points: Vec<(usize, bool, bool)>,
    /// Its `# N passed, N failed, N skipped` comment.
    pub summary: String,
    /// The run's own test point: `ok` when the suite exited 0.
    ok: bool,
}

impl Subtest {
    /// What is wrong with the run, if anything: it exited with an error, a case failed, or its
    /// test points are not the plan's (a run cut short, or no case run).
    pub fn fault(&self) -> Option<String> {
        let numbers: Vec<usize> = self.points.iter().map(|p| p.0).collect();
        let expected: Vec<usize> = (1..=self.plan.unwrap_or(0)).collect();
        if !self.ok {
            Some("the run exited with an error".into())
        } else if let Some(p) = self.points.iter().find(|p| !p.1) {
            Some(format!("case {} failed", p.0))
        } else if self.plan.is_none_or(|n| n == 0) || numbers != expected {
            Some(format!("plan {:?} but test points {numbers:?}", self.plan))
        } else if self.points.iter().all(|p| p.2) {
            Some("every case was skipped".into())
        } else {
            None
        }
    }
}

/// The subtests of `kind` in a console, in order: each `# Subtest: KIND NAME`, its indented
/// TAP lines, up to its own `ok`/`not ok - KIND NAME` line. Lines that are not TAP (the
/// kernel's, the programs' messages on standard error) are passed over.
pub fn subtests(console: &str, kind: &str) -> Vec<Subtest> {
    let opening = format!("# Subtest: {kind} ");
    let (passed, failed) = (format!("ok - {kind} "), format!("not ok - {kind} "));
    let mut runs = Vec::new();
    let mut run: Option<Subtest> = None;
    for line in console.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(name) = line.strip_prefix(opening.as_str()) {
            run = Some(Subtest {
                name: name.trim().to_string(),
                ..Subtest::default()
            });
            continue;
        }
        let Some(current) = run.as_mut() else {
            continue;
        };
        if let Some(inner) = line.strip_prefix("    ") {
            if let Some(n) = inner.strip_prefix("1..") {
                current.plan = n.trim().parse().ok();
            } else if inner.starts_with("# ") && inner.contains(" passed, ") {
                current.summary = inner[2..].to_string();
            } else if let Some((ok, rest)) = inner
                .strip_prefix("ok ")
                .map(|r| (true, r))
                .or_else(|| inner.strip_prefix("not ok ").map(|r| (false, r)))
            {
                let number = rest.split_whitespace().next().and_then(|n| n.parse().ok());
                current
                    .points
                    .push((number.unwrap_or(0), ok, rest.contains(" # SKIP")));
            }
        } else if let Some(ok) = [(&passed, true), (&failed, false)]
            .iter()
            .find_map(|(p, ok)| line.starts_with(p.as_str()).then_some(*ok))
        {
            current.ok = ok;
            runs.extend(run.take());
        }
    }
    runs
}

/// The sanity suite ran once per `expected` name, in that order, and each run passed.
fn check_sanity_runs(console: &str, expected: &[&str], log: &Path) -> Result<()> {
    let runs = subtests(console, "sanity");
    for run in &runs {
        eprintln!("      guest sanity, {}: {}", run.name, run.summary);
        if let Some(fault) = run.fault() {
            bail!(
                "mtgdrcopy_sanity ({}): {fault}; full log: {}",
                run.name,
                log.display()
            );
        }
    }
    let seen: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    ensure!(
        seen == expected,
        "mtgdrcopy_sanity runs found {seen:?}, expected {expected:?} (the script's sanity_run \
         lines); full log: {}",
        log.display()
    );
    Ok(())
}

/// The console lines the guest marked with `prefix` (e.g. `MTGDRCOPY-DOCTOR `), without it.
pub fn marked<'a>(console: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    console
        .lines()
        .filter_map(move |l| l.trim_end_matches('\r').strip_prefix(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The console of `lines` run by the guest's shell with the script's `sanity_run`, as the
    /// VM runs it: the function and the judge are tested together.
    fn guest(lines: &str) -> String {
        // Tests run in parallel: each its own output file.
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = std::env::temp_dir().join(format!("sanity-{}-{n}.tap", std::process::id()));
        let function =
            super::super::SANITY_FUNCTION.replace("/tmp/sanity.tap", &out.to_string_lossy());
        let script = format!("rc=0\n{function}{lines}\nexit 0\n");
        let console = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap()
            .stdout;
        std::fs::remove_file(&out).unwrap();
        String::from_utf8(console).unwrap()
    }

    const PASSING: &str = "printf 'TAP version 14\\n1..2\\nok 1 - a\\nok 2 - b # SKIP no\\n# 1 passed, 0 failed, 1 skipped\\n'";

    fn sanity(console: &str, expected: &[&str]) -> Result<()> {
        check_sanity_runs(console, expected, Path::new("test.log"))
    }

    #[test]
    fn the_scripts_sanity_runs_are_its_sanity_run_lines() {
        assert_eq!(
            sanity_runs_in(super::super::SCRIPT),
            [
                "4096",
                "65536",
                "2097152",
                "dmabuf-forced",
                "dmabuf-nomodule"
            ]
        );
    }

    #[test]
    fn passing_runs_pass() {
        let console = guest(&format!(
            "sanity_run one {PASSING}\nsanity_run two {PASSING}"
        ));
        sanity(&console, &["one", "two"]).unwrap();
        // The kernel's lines between a subtest's lines change nothing.
        let noisy = console.replace("    ok 2", "[   12.5] mtgdrdrv: x\n    ok 2");
        sanity(&noisy, &["one", "two"]).unwrap();
    }

    #[test]
    fn a_missing_or_extra_run_fails() {
        let console = guest(&format!("sanity_run one {PASSING}"));
        assert!(sanity(&console, &["one", "two"]).is_err());
        assert!(sanity(&console, &[]).is_err());
    }

    #[test]
    fn a_failed_case_or_run_fails() {
        for broken in [
            // A case fails (the suite then exits 1 too; the point alone must be enough).
            "printf 'TAP version 14\\n1..2\\nok 1 - a\\nnot ok 2 - b\\n'",
            // The suite fails without writing a failed point.
            "sh -c 'printf \"1..1\\nok 1 - a\\n\"; exit 1'",
            // Cut short: fewer points than planned.
            "printf 'TAP version 14\\n1..3\\nok 1 - a\\nok 2 - b\\n'",
            // No plan, or no case at all (the suite could not start).
            "printf 'ok 1 - a\\n'",
            "printf 'TAP version 14\\nBail out! no GPU\\n'",
            // Every case skipped.
            "printf '1..1\\nok 1 - a # SKIP no\\n'",
            // Not the suite at all.
            "false",
        ] {
            let console = guest(&format!("sanity_run one {broken}"));
            assert!(
                sanity(&console, &["one"]).is_err(),
                "passed: {broken}\n{console}"
            );
        }
    }

    /// The counter lines of a clean run: the module's, then the emulator's.
    const CLEAN: &str = "MTGDRCOPY-COUNTER pins_outstanding 0\n\
                         MTGDRCOPY-COUNTER bytes_pinned 0\n\
                         MTGDRCOPY-COUNTER mappings 0\n\
                         MTGDRCOPY-COUNTER get_pages_calls 812\n\
                         MTGDRCOPY-COUNTER emu_allocations: 0\n\
                         MTGDRCOPY-COUNTER emu_pins_outstanding: 0\n\
                         MTGDRCOPY-COUNTER emu_get_pages_calls: 812\n\
                         MTGDRCOPY-COUNTER emu_dmabufs_live: 0\n\
                         MTGDRCOPY-COUNTER emu_dmabuf_mappings: 0\n";

    fn counters(console: &str) -> Result<()> {
        check_counters(console, Path::new("test.log"))
    }

    #[test]
    fn released_counters_pass_the_leak_check() {
        counters(CLEAN).unwrap();
        // The from-source run prints them again.
        counters(&format!("{CLEAN}{CLEAN}")).unwrap();
    }

    #[test]
    fn a_live_counter_above_zero_is_a_leak() {
        let leak = CLEAN.replace("emu_dmabuf_mappings: 0", "emu_dmabuf_mappings: 1");
        assert!(counters(&leak).is_err());
        let leak = CLEAN.replace("mappings 0", "mappings 2");
        assert!(counters(&leak).is_err());
        assert!(counters(&format!("{CLEAN}{leak}")).is_err());
    }

    /// A counter renamed on one side, or a line lost, must fail the check, never skip it.
    #[test]
    fn a_missing_live_counter_fails_the_leak_check() {
        for line in CLEAN
            .lines()
            .filter(|l| l.ends_with(" 0") || l.ends_with(": 0"))
        {
            let without = CLEAN.replace(&format!("{line}\n"), "");
            assert!(counters(&without).is_err(), "passed without {line:?}");
        }
    }
}
