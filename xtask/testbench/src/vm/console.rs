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
/// task, RCU stall), with those of the debug kernel's checkers: KASAN and KFENCE ("BUG: KASAN:",
/// "BUG: KFENCE:"), DEBUG_ATOMIC_SLEEP ("BUG: sleeping function called from invalid context",
/// "BUG: scheduling while atomic"), DEBUG_VM ("kernel BUG at mm/…" from VM_BUG_ON, "WARNING:"
/// from VM_WARN_ON, "BUG: Bad page state", dump_page's reason) and lockdep ("WARNING: possible
/// circular locking dependency detected" and its other "WARNING:" reports, "BUG: MAX_… too
/// low!", and the two ways it stops checking without a report of its own).
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
    "page dumped because:",
    "INFO: trying to register non-static key",
    // Lockdep is off from here on: whatever taints the kernel so was reported before, but the
    // rest of the run is no longer checked.
    "Disabling lock debugging due to kernel taint",
];

/// The console's own note that it skipped messages (printed without a timestamp): one of them
/// may have been a report.
const DROPPED: &str = " printk messages dropped **";

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
        if line.contains(DROPPED) {
            problems.push(line.trim_end().to_owned());
            continue;
        }
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

    /// The reports of the debug kernel's checkers, as 6.1 prints them (kernel/locking/lockdep.c,
    /// kernel/sched/core.c, mm/debug.c, mm/page_alloc.c, kernel/panic.c, kernel/printk/printk.c),
    /// each must be one problem, named by its first line.
    #[test]
    fn debug_kernel_reports() {
        let log = "\
[  301.114203] ======================================================\r
[  301.114481] WARNING: possible circular locking dependency detected\r
[  301.114767] 6.1.192 #1 Tainted: G           O      \r
[  301.115032] ------------------------------------------------------\r
[  301.115311] mtgdrdrv_fuzz/412 is trying to acquire lock:\r
[  301.115571] ffff888009b4e0a8 (&mm->mmap_lock){++++}-{3:3}, at: mtgdrdrv_unpin+0x61/0x2c0 [mtgdrdrv]\r
[  301.115990] \r
[  301.115990] but task is already holding lock:\r
[  301.116339] ffff88800a1c5828 (&f->lock){+.+.}-{3:3}, at: mtgdrdrv_ioctl+0x7b/0x530 [mtgdrdrv]\r
[  301.120000] Call Trace:\r
[  302.000001] BUG: sleeping function called from invalid context at mm/slab.h:742\r
[  302.000002] in_atomic(): 1, irqs_disabled(): 0, non_block: 0, pid: 95, name: mtgdrdrv_fuzz\r
[  302.000003] preempt_count: 1, expected: 0\r
[  303.000001] page:00000000a1b2c3d4 refcount:0 mapcount:0 mapping:0000000000000000 index:0x0 pfn:0x1234\r
[  303.000002] page dumped because: VM_BUG_ON_PAGE(page_ref_count(page) == 0)\r
[  303.000003] ------------[ cut here ]------------\r
[  303.000004] kernel BUG at include/linux/mm.h:1150!\r
[  304.000001] INFO: trying to register non-static key.\r
[  304.000002] The code is fine but needs lockdep annotation, or maybe\r
[  304.000003] you didn't initialize this object before use?\r
[  304.000004] turning off the locking correctness validator.\r
[  305.000001] Disabling lock debugging due to kernel taint\r
** 1021 printk messages dropped **\r
[  306.000001] BUG: MAX_LOCKDEP_CHAIN_HLOCKS too low!\r
";
        assert_eq!(
            kernel_problems(log),
            [
                "[  301.114481] WARNING: possible circular locking dependency detected",
                "[  302.000001] BUG: sleeping function called from invalid context at mm/slab.h:742",
                "[  303.000002] page dumped because: VM_BUG_ON_PAGE(page_ref_count(page) == 0)",
                "[  303.000004] kernel BUG at include/linux/mm.h:1150!",
                "[  304.000001] INFO: trying to register non-static key.",
                "[  305.000001] Disabling lock debugging due to kernel taint",
                "** 1021 printk messages dropped **",
                "[  306.000001] BUG: MAX_LOCKDEP_CHAIN_HLOCKS too low!",
            ]
        );
    }

    /// A real report: the debug kernel's step provokes it with LKDTM (vmtest/debug.rs), copied
    /// from its console (stack shortened). One problem for the KASAN report; the lockdep
    /// shutdown that its taint causes is the second.
    #[test]
    fn kasan_report_of_the_debug_kernel() {
        let log = "\
[   13.149634] lkdtm: Attempting bad read from freed memory\r
[   13.150186] ==================================================================\r
[   13.151631] BUG: KASAN: use-after-free in lkdtm_READ_AFTER_FREE.cold+0x5e/0x129\r
[   13.153050] Read of size 4 at addr ffff888004d18810 by task sh/39\r
[   13.153050] \r
[   13.153050] CPU: 0 PID: 39 Comm: sh Not tainted 6.1.192 #2 \r
[   13.153050] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996), BIOS 1.16.2-debian-1.16.2-1 04/01/2014\r
[   13.153050] Call Trace:\r
[   13.153050]  <TASK>\r
[   13.153050]  dump_stack_lvl+0x4c/0x5f\r
[   13.153050]  print_report+0x193/0x4a3\r
[   13.153050]  kasan_report+0xd7/0x180\r
[   13.153050]  lkdtm_READ_AFTER_FREE.cold+0x5e/0x129\r
[   13.153050]  </TASK>\r
[   13.153050] ==================================================================\r
[   13.192973] Disabling lock debugging due to kernel taint\r
[   13.197911] lkdtm: FAIL: Memory was not poisoned!\r
";
        assert_eq!(
            kernel_problems(log),
            [
                "[   13.151631] BUG: KASAN: use-after-free in lkdtm_READ_AFTER_FREE.cold+0x5e/0x129",
                "[   13.192973] Disabling lock debugging due to kernel taint",
            ]
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
