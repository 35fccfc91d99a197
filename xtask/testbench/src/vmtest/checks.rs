//! The guest scripts' own checks (exit statuses of the tools, their files and messages, counts
//! of log lines) report as TAP 14 subtests, the format the sanity runs already use, so that one
//! reader ([`super::subtests`]) judges them all. A script opens a section with `checks_begin
//! NAME`, writes test points with `expect_exit WANT COMMAND...` (the command's exit status),
//! `COMMAND; point DESCRIPTION` (the status of the command just run), or the doctor function
//! (`doctor STATE WANT`), and closes it with `checks_end`, which writes the plan. A script
//! that cannot go on writes TAP's `Bail out! REASON` (`fail`) and exits 1.
//!
//! The judge counts each section's points from the script's text ([`expected_sections`]), so a
//! point that never ran (a section cut short, a check dropped from the script by mistake of
//! the judge) fails the run rather than going unnoticed.

use std::path::Path;

use anyhow::{bail, ensure, Result};

/// The shell functions of the checks, for every guest script that makes any.
pub const FUNCTIONS: &str = r##"fail() { echo "Bail out! $*"; exit 1; }
checks_begin() { section=$1; points=0; section_rc=0; echo "# Subtest: checks $section"; }
point() {
    status=$?
    points=$((points + 1))
    if [ "$status" = 0 ]; then
        echo "    ok $points - $*"
    else
        echo "    not ok $points - $*"
        section_rc=1
        rc=1
    fi
}
checks_end() {
    echo "    1..$points"
    if [ "$section_rc" = 0 ]; then echo "ok - checks $section"; else echo "not ok - checks $section"; fi
}
expect_exit() {
    want=$1
    shift
    "$@" >/tmp/tool.out 2>&1
    got=$?
    [ "$got" = "$want" ]
    point "$* exits $want (got $got)"
    [ "$got" = "$want" ] || sed 's/^/    #   /' /tmp/tool.out
}
"##;

/// The lines of a script that write one test point each.
fn writes_a_point(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("expect_exit ") || line.starts_with("doctor ") || line.contains("; point ")
}

/// Each `checks_begin NAME` section of `script`, in order, with the number of test points its
/// lines write.
pub fn expected_sections(script: &str) -> Vec<(&str, usize)> {
    let mut sections = Vec::new();
    let mut open: Option<(&str, usize)> = None;
    for line in script.lines() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("checks_begin ") {
            open = Some((name.trim(), 0));
        } else if trimmed == "checks_end" {
            sections.extend(open.take());
        } else if let Some((_, points)) = open.as_mut() {
            *points += usize::from(writes_a_point(line));
        }
    }
    sections
}

/// The run wrote every section of `script`, in order, each with all its points, all passing.
pub fn check(console: &str, script: &str, log: &Path) -> Result<()> {
    // Only the script's own: a program's TAP inside a subtest is indented.
    if let Some(reason) = console.lines().find_map(|l| l.strip_prefix("Bail out! ")) {
        bail!(
            "the guest script gave up: {}; full log: {}",
            reason.trim_end(),
            log.display()
        );
    }
    let expected = expected_sections(script);
    let written = super::subtests(console, "checks");
    for section in &written {
        let passed = section.points.iter().filter(|p| p.1).count();
        eprintln!(
            "      guest checks, {}: {passed} of {} passed",
            section.name,
            section.points.len()
        );
        if let Some(fault) = section.fault() {
            bail!(
                "the guest's checks ({}): {fault}; full log: {}",
                section.name,
                log.display()
            );
        }
    }
    let seen: Vec<(&str, usize)> = written
        .iter()
        .map(|s| (s.name.as_str(), s.points.len()))
        .collect();
    ensure!(
        seen == expected,
        "the guest's check sections (name, points) were {seen:?}, expected {expected:?} (the \
         script's checks_begin sections); full log: {}",
        log.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body` after [`FUNCTIONS`] with sh, as the VM does: the functions and the judge are
    /// tested together. Returns the console and the script.
    fn guest(body: &str) -> (String, String) {
        let script = format!("rc=0\n{FUNCTIONS}{body}\nexit $rc\n");
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        (String::from_utf8(out.stdout).unwrap(), script)
    }

    fn judged(body: &str) -> Result<()> {
        let (console, script) = guest(body);
        check(&console, &script, Path::new("test.log"))
    }

    const PASSING: &str = "checks_begin tools
expect_exit 0 true
expect_exit 3 sh -c 'exit 3'
! grep -q x /dev/null; point nothing in an empty file
checks_end
checks_begin more
test 1 = 1; point one is one
checks_end";

    #[test]
    fn passing_sections_pass_and_are_counted_from_the_script() {
        assert_eq!(expected_sections(PASSING), [("tools", 3), ("more", 1)]);
        judged(PASSING).unwrap();
        let (console, script) = guest(PASSING);
        assert!(
            console.contains("    ok 2 - sh -c exit 3 exits 3 (got 3)\n"),
            "{console}"
        );
        // The kernel's lines between a section's lines change nothing.
        let noisy = console.replace("    ok 2", "[   12.5] mtgdrdrv: x\n    ok 2");
        check(&noisy, &script, Path::new("test.log")).unwrap();
    }

    #[test]
    fn a_failed_missing_or_unwritten_point_fails() {
        for broken in [
            PASSING.replace("expect_exit 0 true", "expect_exit 0 false"),
            PASSING.replace("test 1 = 1", "test 1 = 2"),
            PASSING.replace("! grep", "grep"),
            // A section that gave up halfway, with and without saying so.
            PASSING.replace("test 1 = 1; point one is one", "fail no device"),
            PASSING.replace("test 1 = 1; point one is one", "exit 0"),
        ] {
            assert!(judged(&broken).is_err(), "passed:\n{broken}");
        }
        // A point the script has but the console lacks (a check run outside the section's
        // lines, or lost).
        let (console, script) = guest(PASSING);
        let lost = console
            .replace("    ok 1 - one is one\n", "")
            .replace("1..1", "1..0");
        assert!(check(&lost, &script, Path::new("test.log")).is_err());
        // A section the judge expects but the guest never opened.
        let (console, _) = guest(PASSING);
        let more = format!("{PASSING}\nchecks_begin third\nexpect_exit 0 true\nchecks_end");
        assert!(check(&console, &more, Path::new("test.log")).is_err());
    }

    #[test]
    fn the_module_scripts_sections_are_counted() {
        let script = super::super::SCRIPT
            .replace("@DOCTOR_LOADED@\n", &super::super::doctor::loaded_states());
        let sections = expected_sections(&script);
        let names: Vec<&str> = sections.iter().map(|s| s.0).collect();
        assert_eq!(names, ["tools", "no-module", "disabled"]);
        assert!(sections.iter().all(|s| s.1 >= 3), "{sections:?}");
    }
}
