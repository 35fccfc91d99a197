//! Reading the guest's serial console: the script's exit status and the kernel's problem reports.

/// Printed by /init after the script, followed by its exit status.
pub const EXIT_MARKER: &str = "MTGDRCOPY-VM-EXIT=";

/// The exit status from the last exit marker. The last one wins so that a test echoing the
/// marker text cannot hide the real status that /init prints after it.
pub fn exit_code(console: &str) -> Option<i32> {
    let (_, rest) = console.rsplit_once(EXIT_MARKER)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Texts that start a kernel problem report (WARN, BUG, oops, KFENCE, DEBUG_LIST, panic, hung
/// task, RCU stall).
const PROBLEMS: &[&str] = &[
    "WARNING:",
    "BUG:",
    "kernel BUG at",
    "Oops:",
    "KFENCE:",
    "list_add corruption",
    "list_del corruption",
    "general protection fault",
    "Kernel panic",
    "INFO: task",
    "self-detected stall",
    "UBSAN:",
];

/// A stack dump counts on its own only when no report above explains it: a WARNING is followed
/// by a Call Trace, and one problem should be one entry. This many kernel lines back.
const TRACE_WINDOW: usize = 40;

/// Kernel lines that report a problem, each from its `[ timestamp]` on. Only lines carrying a
/// printk timestamp count (`printk.time=1` is on the command line), so test output that merely
/// mentions "WARNING:" is not taken for the kernel's. The timestamp may sit mid-line when a
/// kernel message interrupts a half-written line of user output.
pub fn kernel_problems(console: &str) -> Vec<String> {
    let mut problems = Vec::new();
    // Recent kernel messages (line from its timestamp, text after it), to name a lone trace.
    let mut recent: Vec<(&str, &str)> = Vec::new();
    let mut since_problem = usize::MAX;
    for line in console.lines() {
        let Some((start, text)) = kernel_message(line) else {
            continue;
        };
        let line = line[start..].trim_end();
        since_problem = since_problem.saturating_add(1);
        if PROBLEMS.iter().any(|p| text.contains(p)) {
            problems.push(line.to_owned());
            since_problem = 0;
        } else if text.contains("Call Trace:") && since_problem > TRACE_WINDOW {
            problems.push(trace_reason(&recent).unwrap_or(line).to_owned());
            since_problem = 0;
        }
        if recent.len() == 4 {
            recent.remove(0);
        }
        recent.push((line, text));
    }
    problems
}

/// What a stack dump is about: dump_stack() prints `CPU: n PID: …` (and `Hardware name: …`)
/// right before `Call Trace:`, and the caller's own message just before those, e.g. "NMI
/// backtrace for cpu 0" or "INFO: rcu_sched detected stalls".
fn trace_reason<'a>(recent: &[(&'a str, &str)]) -> Option<&'a str> {
    let header = recent
        .iter()
        .rposition(|(_, text)| text.trim_start().starts_with("CPU: ") && text.contains(" PID: "))?;
    recent[..header].last().map(|(line, _)| *line)
}

/// Finds a printk timestamp `[ 12.345678]` in `line`: its byte offset and the text after it.
fn kernel_message(line: &str) -> Option<(usize, &str)> {
    let mut from = 0;
    while let Some(pos) = line[from..].find('[') {
        let start = from + pos;
        let rest = line[start + 1..].trim_start_matches(' ');
        if let Some(end) = timestamp_len(rest) {
            return Some((start, &rest[end..]));
        }
        from = start + 1;
    }
    None
}

/// Length of `<digits>.<digits>]` at the start of `s`, if it is there.
fn timestamp_len(s: &str) -> Option<usize> {
    let secs = s.bytes().take_while(u8::is_ascii_digit).count();
    let after_secs = s[secs..].strip_prefix('.')?;
    let frac = after_secs.bytes().take_while(u8::is_ascii_digit).count();
    let after_frac = after_secs[frac..].strip_prefix(']')?;
    (secs > 0 && frac > 0).then_some(s.len() - after_frac.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_marker_wins() {
        let log = "x MTGDRCOPY-VM-EXIT=7\r\nMTGDRCOPY-VM-EXIT=3\r\n[  1.0] reboot: Power down\r\n";
        assert_eq!(exit_code(log), Some(3));
        assert_eq!(exit_code("no marker"), None);
        assert_eq!(exit_code("MTGDRCOPY-VM-EXIT=\n"), None);
    }

    #[test]
    fn problems_need_a_timestamp() {
        let log = "\
WARNING: from a test, not the kernel\r
[    2.100000] mtgdrdrv: loading out-of-tree module taints kernel.\r
[    3.000000] ------------[ cut here ]------------\r
[    3.000001] WARNING: CPU: 0 PID: 57 at drivers/x.c:10 f+0x1/0x2 [mtgdrdrv]\r
[    3.000002] Call Trace:\r
[    3.000003]  <TASK>\r
partial line[    4.500000] BUG: KFENCE: use-after-free read in g+0x3/0x4\r
[  100.000000] Call Trace:\r
[    5.000000] list_del corruption. prev->next should be ffff\r
";
        assert_eq!(
            kernel_problems(log),
            [
                "[    3.000001] WARNING: CPU: 0 PID: 57 at drivers/x.c:10 f+0x1/0x2 [mtgdrdrv]",
                "[    4.500000] BUG: KFENCE: use-after-free read in g+0x3/0x4",
                "[    5.000000] list_del corruption. prev->next should be ffff",
            ]
        );
    }

    #[test]
    fn lone_call_trace_is_named_by_its_cause() {
        let log = "[    1.000000] ok\n[    2.000000] Call Trace:\n";
        assert_eq!(kernel_problems(log), ["[    2.000000] Call Trace:"]);
        let log = "\
[    3.592921] NMI backtrace for cpu 0\r
[    3.593287] CPU: 0 PID: 95 Comm: sh Not tainted 6.1.0-57-amd64 #1  Debian 6.1.192-3\r
[    3.593505] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996)\r
[    3.593505] Call Trace:\r
";
        assert_eq!(
            kernel_problems(log),
            ["[    3.592921] NMI backtrace for cpu 0"]
        );
    }

    #[test]
    fn timestamps() {
        assert_eq!(kernel_message("[    1.5] x"), Some((0, " x")));
        assert_eq!(kernel_message("ab[12.345678]y"), Some((2, "y")));
        assert_eq!(kernel_message("[ cut here ]"), None);
        assert_eq!(kernel_message("[1.]"), None);
        assert_eq!(kernel_message("[.5]"), None);
    }
}
