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
    let counters: Vec<&str> = console
        .lines()
        .filter_map(|l| Some(l[l.find("MTGDRCOPY-COUNTER ")? + 18..].trim()))
        .collect();
    ensure!(
        !counters.is_empty(),
        "no counters were printed; full log: {}",
        log.display()
    );
    for line in &counters {
        let mut f = line.split_whitespace();
        let (name, value) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        let name = name.trim_end_matches(':');
        let live = mtgdrdrv::procfs::LIVE_COUNTERS.contains(&name)
            || matches!(
                name,
                "emu_pins_outstanding"
                    | "emu_dmabufs_live"
                    | "emu_dmabuf_mappings"
                    | "emu_allocations"
            );
        ensure!(
            !live || value == "0",
            "leak after the tests: {line}; full log: {}",
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
