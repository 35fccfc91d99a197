//! The verdicts read from the module tests' console: the exit statuses of the tools, the in-VM
//! test summary, the sanity runs and the counters after them.

use std::path::Path;

use anyhow::{ensure, Result};

use crate::vm;

/// The `expect_exit` lines of [`SCRIPT`]: each tool ended with the status it should, and all
/// of them ran.
pub(super) fn check_tool_statuses(console: &str, expected: usize, log: &Path) -> Result<()> {
    let exits: Vec<&str> = marked(console, "MTGDRCOPY-EXIT ").collect();
    for line in &exits {
        eprintln!("      guest exit status: {line}");
        let mut f = line.split_whitespace();
        let (want, got) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        ensure!(
            want.strip_prefix("want=") == got.strip_prefix("got="),
            "a tool's exit status: {line}; full log: {}",
            log.display()
        );
    }
    ensure!(
        exits.len() == expected,
        "{} tool exit statuses checked in the VM, expected {expected} (the script's \
         expect_exit and doctor calls); full log: {}",
        exits.len(),
        log.display()
    );
    Ok(())
}

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

pub(super) fn judge(outcome: &vm::VmOutcome, log: &Path) -> Result<()> {
    let console = &outcome.console;
    // The in-VM test summary, repeated for whoever reads this run's output.
    for line in console.lines().filter(|l| {
        [
            "test result:",
            "MTGDRCOPY-REFUSED-MMAP-LINES",
            "MTGDRCOPY-DISABLED-LINES",
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
    check_sanity_summaries(console, log)?;
    check_counters(console, log)
}

/// The leak check: every counter that counts what is alive now, the module's
/// ([`mtgdrdrv::procfs::LIVE_COUNTERS`]) and the emulator's ([`mtgpu_emu_abi::LIVE_STATS`],
/// printed by `mtgdrcopy_musainfo --emu-stats` as `emu_<name>:`), was printed once after the
/// tests and is 0. The names come from those two crates, so a counter renamed there or in what
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
            values.len() == 1,
            "counter {name} printed {} times after the tests, expected once; full log: {}",
            values.len(),
            log.display()
        );
        ensure!(
            values[0] == 0,
            "leak after the tests: {name} {}; full log: {}",
            values[0],
            log.display()
        );
    }
    Ok(())
}

/// The sanity runs of [`SCRIPT`]: one per emulated page size on the module backend, then the
/// dma-buf backend forced with the module loaded, and chosen because it is not.
const SANITY_RUNS: [&str; 5] = [
    "4096",
    "65536",
    "2097152",
    "dmabuf-forced",
    "dmabuf-nomodule",
];

/// The sanity suite ran once per entry of [`SANITY_RUNS`] and each run's closing line says it
/// all passed (`N passed, 0 failed`, optionally `, N skipped`).
fn check_sanity_summaries(console: &str, log: &Path) -> Result<()> {
    let mut page = None;
    let mut seen = Vec::new();
    for line in console.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(p) = line.strip_prefix("MTGDRCOPY-SANITY-PAGE ") {
            page = Some(p.trim().to_string());
        } else if let Some((passed, rest)) = line.split_once(" passed, ") {
            let Some(page) = page.take() else { continue };
            let failed = rest.split(" failed").next().unwrap_or("");
            eprintln!("      guest sanity, {page}: {line}");
            ensure!(
                failed == "0" && passed.parse::<u32>().is_ok_and(|n| n > 0),
                "mtgdrcopy_sanity ({page}): {line}; full log: {}",
                log.display()
            );
            seen.push(page);
        }
    }
    ensure!(
        seen == SANITY_RUNS,
        "mtgdrcopy_sanity summaries found for {seen:?}, expected {SANITY_RUNS:?}; full log: {}",
        log.display()
    );
    Ok(())
}

/// The console lines the guest marked with `prefix` (e.g. `MTGDRCOPY-EXIT `), without it.
pub fn marked<'a>(console: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    console
        .lines()
        .filter_map(move |l| l.trim_end_matches('\r').strip_prefix(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn a_live_counter_above_zero_is_a_leak() {
        let leak = CLEAN.replace("emu_dmabuf_mappings: 0", "emu_dmabuf_mappings: 1");
        assert!(counters(&leak).is_err());
        let leak = CLEAN.replace("mappings 0", "mappings 2");
        assert!(counters(&leak).is_err());
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
