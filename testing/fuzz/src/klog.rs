//! The kernel log of the run, read as it is written.
//!
//! The ring buffer holds 128 KiB (Debian's `LOG_BUF_SHIFT=17`), about a thousand lines, and one
//! run makes the emulated provider refuse pins some ten thousand times, each refusal logged as
//! mtgpu logs it. Read once at the end, the buffer had long overwritten the run's first lines,
//! and with them any warning among them. So a reader process follows `/dev/kmsg` from the start
//! of the run to its end (a process, not a thread: the driver forks its fuzzing processes and
//! stays single-threaded), keeps every line, and counts the records the kernel overwrote before
//! it could read them (their sequence numbers are missing), which is a finding of its own.
//! At the end the driver writes a marker into the log; the reader stops at it, so every line
//! logged before the marker has been seen.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::sys;

const KMSG: &str = "/dev/kmsg";

/// How long [`KernelLog::finish`] waits for the reader to reach the end marker.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);

/// What the reader saw between [`KernelLog::start`] and [`KernelLog::finish`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Each record's text (its first line), in order.
    pub lines: Vec<String>,
    /// Records the kernel overwrote before the reader got them.
    pub lost: u64,
}

/// Splits a `/dev/kmsg` record (`<prio>,<seq>,<usec>,<flags>[,…];text\n[ KEY=value\n…]`) into its
/// sequence number and the first line of its text.
pub fn parse_record(record: &[u8]) -> Option<(u64, String)> {
    let record = String::from_utf8_lossy(record);
    let (header, text) = record.split_once(';')?;
    let seq = header.split(',').nth(1)?.parse().ok()?;
    Some((seq, text.lines().next().unwrap_or("").to_owned()))
}

/// Lines in order, and gaps in the sequence numbers counted as lost records.
#[derive(Debug, Default)]
pub struct Tracker {
    next_seq: Option<u64>,
    report: Report,
}

impl Tracker {
    pub fn record(&mut self, seq: u64, text: String) {
        if let Some(next) = self.next_seq {
            self.report.lost += seq.saturating_sub(next);
        }
        self.next_seq = Some(seq + 1);
        self.report.lines.push(text);
    }

    pub fn into_report(self) -> Report {
        self.report
    }
}

/// The reader process and the pipe its report comes back through.
pub struct KernelLog {
    pid: libc::pid_t,
    from_reader: File,
    marker: String,
}

impl KernelLog {
    /// Starts following the log from its current end.
    pub fn start() -> Result<KernelLog> {
        // Blocking reads: the reader sleeps in read() until the next record.
        let mut kmsg = File::open(KMSG).with_context(|| format!("opening {KMSG}"))?;
        kmsg.seek(SeekFrom::End(0))
            .with_context(|| format!("seeking to the end of {KMSG}"))?;
        let (read_end, write_end) = pipe()?;
        let marker = format!(
            "mtgdrdrv_fuzz: kernel log read up to here (pid {}, {:?})",
            std::process::id(),
            Instant::now()
        );
        let stop = marker.clone();
        // The closure runs only in the child: it takes the descriptors by number, and the
        // parent keeps (and below closes) its own copies.
        let (kmsg_fd, read_fd, write_fd) = (
            kmsg.as_raw_fd(),
            read_end.as_raw_fd(),
            write_end.as_raw_fd(),
        );
        let pid = crate::spawn(move || {
            // SAFETY: the child's copies of the parent's descriptors, owned by nothing else here.
            let (kmsg, out) = unsafe {
                libc::close(read_fd);
                (File::from_raw_fd(kmsg_fd), File::from_raw_fd(write_fd))
            };
            reader(kmsg, out, &stop)
        })?;
        drop((kmsg, write_end));
        Ok(KernelLog {
            pid,
            from_reader: File::from(read_end),
            marker,
        })
    }

    /// Marks the end of the log and returns everything the reader saw before the mark.
    pub fn finish(mut self) -> Result<Report> {
        if let Err(e) = write_kmsg(&self.marker) {
            self.kill();
            return Err(e.context("marking the end of the kernel log"));
        }
        if !sys::poll_readable(&self.from_reader, FINISH_TIMEOUT) {
            self.kill();
            bail!("the kernel log reader did not reach the end marker within {FINISH_TIMEOUT:?}");
        }
        let mut text = String::new();
        let read = self.from_reader.read_to_string(&mut text);
        let status = crate::wait(self.pid);
        self.pid = 0;
        read.context("reading the kernel log reader's report")?;
        if status != 0 {
            bail!(
                "the kernel log reader failed ({}): {}",
                crate::describe(status),
                text.trim()
            );
        }
        decode(&text)
    }

    fn kill(&mut self) {
        if self.pid > 0 {
            // SAFETY: signals and reaps our own child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            crate::wait(self.pid);
            self.pid = 0;
        }
    }
}

impl Drop for KernelLog {
    /// A run that fails before its end leaves no reader blocked in read() behind it.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The reader process: records until the marker, then the report to `out`. Exit 0 on success.
fn reader(mut kmsg: File, mut out: File, marker: &str) -> i32 {
    let mut tracker = Tracker::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let Some((seq, text)) = parse_record(&buf[..n]) else {
                    continue;
                };
                let done = text.contains(marker);
                tracker.record(seq, text);
                if done {
                    break;
                }
            }
            // EPIPE: the records after the last one read were overwritten; the next read returns
            // the oldest one left, and the gap in sequence numbers counts what was lost.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = writeln!(out, "reading {KMSG}: {e}");
                return 1;
            }
        }
    }
    match out.write_all(encode(&tracker.into_report()).as_bytes()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// The report as the reader sends it: `lost <n>`, then one line per record.
fn encode(report: &Report) -> String {
    let mut s = format!("lost {}\n", report.lost);
    for line in &report.lines {
        s.push_str(line);
        s.push('\n');
    }
    s
}

fn decode(text: &str) -> Result<Report> {
    let mut lines = text.lines();
    let lost = lines
        .next()
        .and_then(|l| l.strip_prefix("lost "))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("a kernel log report without its count: {text:.200}"))?;
    Ok(Report {
        lost,
        lines: lines.map(str::to_owned).collect(),
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", sys::ename(sys::errno()));
    }
    // SAFETY: both descriptors are fresh and owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `--klog-selftest`: a line logged first survives a flood that overwrites it in the ring
/// buffer. `flood` lines of ~200 bytes each (5,000 are 1 MB, eight times the default buffer).
pub fn selftest(flood: u64) -> Result<()> {
    let log = KernelLog::start()?;
    let injected = format!(
        "mtgdrdrv_fuzz --klog-selftest: pin 1 still has 1 mapping (injected by the test, pid {})",
        std::process::id()
    );
    write_kmsg(&injected)?;
    {
        // The filler is debug level, kept off the console (the harness reads every console
        // line) while every real warning still reaches it.
        let _quiet = ConsoleLevel::set(7)?;
        let filler = "x".repeat(160);
        for i in 0..flood {
            write_kmsg(&format!(
                "<7>mtgdrdrv_fuzz --klog-selftest filler {i:06} {filler}"
            ))?;
        }
    }
    let report = log.finish()?;
    ensure!(
        !ring_buffer_holds(&injected)?,
        "{flood} filler lines did not push the injected line out of the ring buffer, so this \
         test shows nothing (a larger log_buf_len?): give --klog-flood more"
    );
    ensure!(
        report.lines.contains(&injected),
        "the injected line was lost: the reader saw {} lines, {} records lost",
        report.lines.len(),
        report.lost
    );
    ensure!(
        report.lost == 0,
        "{} of {flood} records were overwritten before the reader read them",
        report.lost
    );
    println!(
        "mtgdrdrv_fuzz --klog-selftest: the injected line was caught among {} lines, after the ring buffer \
         overwrote it; 0 records lost",
        report.lines.len()
    );
    Ok(())
}

/// One message into the kernel log. A fresh open for each: /dev/kmsg lets one open file write
/// only 10 lines per 5 s (printk.devkmsg=ratelimit, the default). The newline ends the record:
/// without it the kernel keeps it open for a continuation, and readers see it only once the
/// next message arrives.
fn write_kmsg(line: &str) -> Result<()> {
    OpenOptions::new()
        .write(true)
        .open(KMSG)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        .with_context(|| format!("writing to {KMSG}"))
}

/// Whether a record with this exact text is still in the ring buffer.
fn ring_buffer_holds(text: &str) -> Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    // A fresh open reads from the oldest record the buffer still holds.
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(KMSG)
        .with_context(|| format!("opening {KMSG}"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                if parse_record(&buf[..n]).is_some_and(|(_, t)| t == text) {
                    return Ok(true);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("reading {KMSG}")),
        }
    }
}

/// The console log level (/proc/sys/kernel/printk's first field) for a while, then back.
struct ConsoleLevel {
    saved: String,
}

const PRINTK: &str = "/proc/sys/kernel/printk";

impl ConsoleLevel {
    fn set(level: u32) -> Result<ConsoleLevel> {
        let saved = std::fs::read_to_string(PRINTK).with_context(|| format!("reading {PRINTK}"))?;
        std::fs::write(PRINTK, level.to_string()).with_context(|| format!("writing {PRINTK}"))?;
        Ok(ConsoleLevel { saved })
    }
}

impl Drop for ConsoleLevel {
    fn drop(&mut self) {
        if let Some(level) = self.saved.split_whitespace().next() {
            let _ = std::fs::write(PRINTK, level);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records() {
        assert_eq!(
            parse_record(b"4,1203,5371002,-;mtgpu: refused\n SUBSYSTEM=pci\n"),
            Some((1203, "mtgpu: refused".into()))
        );
        assert_eq!(
            parse_record(b"6,7,1,-,caller=T1;a;b\n"),
            Some((7, "a;b".into()))
        );
        assert_eq!(parse_record(b"no header"), None);
        assert_eq!(parse_record(b"6,x,1,-;text"), None);
    }

    #[test]
    fn gaps_are_lost_records() {
        let mut t = Tracker::default();
        t.record(10, "a".into());
        t.record(11, "b".into());
        // The kernel overwrote 12..=40 before the reader came back.
        t.record(41, "c".into());
        let r = t.into_report();
        assert_eq!(r.lost, 29);
        assert_eq!(r.lines, ["a", "b", "c"]);
    }

    #[test]
    fn report_round_trip() {
        let r = Report {
            lines: vec!["x: still has 1".into(), String::new()],
            lost: 3,
        };
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        assert!(decode("").is_err());
    }
}
