//! mtgdrcopy_sanity's results on standard output, in the format `--format` asks for: the
//! human-readable summary, TAP version 14, or JSON lines. Progress and warnings go to standard
//! error in every format, so standard output stays parseable.
//!
//! The text summary starts with upstream GDRCopy's line, `Total: N, Passed: N, Failed: N,
//! Waived: N` (waived = skipped), byte for byte, for the scripts that parse it; then ours.
//! `-s` leaves the text summary out, as upstream's does; the structured formats keep theirs.

use std::io::{self, Write};

use serde::Serialize;

use super::runner::Outcome;
use crate::cli::sanity::Format;

/// Writes results as they come.
pub struct Report<W: Write> {
    format: Format,
    out: W,
    results: Vec<(String, Outcome)>,
    summary: bool,
}

#[derive(Serialize)]
struct CaseLine<'a> {
    case: &'a str,
    outcome: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    seconds: f64,
}

#[derive(Serialize)]
struct SummaryLine {
    passed: usize,
    failed: usize,
    skipped: usize,
}

#[derive(Serialize)]
struct SummaryRecord {
    summary: SummaryLine,
}

#[derive(Serialize)]
struct ErrorRecord<'a> {
    error: &'a str,
    exit_status: u8,
}

impl<W: Write> Report<W> {
    /// Starts a run of `planned` cases (TAP's version line and plan).
    pub fn start(format: Format, mut out: W, planned: usize) -> io::Result<Report<W>> {
        if format == Format::Tap {
            writeln!(out, "TAP version 14")?;
            writeln!(out, "1..{planned}")?;
            out.flush()?;
        }
        Ok(Report {
            format,
            out,
            results: Vec::new(),
            summary: true,
        })
    }

    /// Leaves the text format's summary out (`-s`).
    pub fn without_summary(mut self) -> Report<W> {
        self.summary = false;
        self
    }

    /// A run that could not start (no case ran): TAP's `Bail out!`, a JSON `error` record;
    /// nothing in text format, where the error goes to standard error alone.
    pub fn bail_out(format: Format, mut out: W, message: &str, status: u8) -> io::Result<()> {
        let line = message.lines().next().unwrap_or("");
        match format {
            Format::Text => return Ok(()),
            Format::Tap => writeln!(out, "Bail out! {line}")?,
            Format::JsonLines => {
                let record = ErrorRecord {
                    error: message,
                    exit_status: status,
                };
                writeln!(out, "{}", json(&record))?;
            }
        }
        out.flush()
    }

    /// One case's result, written at once (TAP and JSON lines).
    pub fn case(&mut self, name: &str, outcome: Outcome, seconds: f64) -> io::Result<()> {
        let n = self.results.len() + 1;
        match self.format {
            Format::Text => {}
            Format::Tap => match &outcome {
                Outcome::Passed => writeln!(self.out, "ok {n} - {name}")?,
                Outcome::Skipped(why) => {
                    writeln!(self.out, "ok {n} - {name} # SKIP {}", one_line(why))?
                }
                Outcome::Failed(why) => {
                    writeln!(self.out, "not ok {n} - {name}")?;
                    // A YAML diagnostic block; the message as a literal block scalar.
                    writeln!(self.out, "  ---\n  message: |")?;
                    for l in why.lines() {
                        writeln!(self.out, "    {l}")?;
                    }
                    writeln!(self.out, "  ...")?;
                }
            },
            Format::JsonLines => {
                let (word, reason) = match &outcome {
                    Outcome::Passed => ("passed", None),
                    Outcome::Failed(why) => ("failed", Some(why.as_str())),
                    Outcome::Skipped(why) => ("skipped", Some(why.as_str())),
                };
                let line = CaseLine {
                    case: name,
                    outcome: word,
                    reason,
                    seconds: (seconds * 1000.0).round() / 1000.0,
                };
                writeln!(self.out, "{}", json(&line))?;
            }
        }
        self.out.flush()?;
        self.results.push((name.to_string(), outcome));
        Ok(())
    }

    /// The summary; true when no case failed.
    pub fn finish(mut self) -> io::Result<bool> {
        let count = |f: fn(&Outcome) -> bool| self.results.iter().filter(|(_, o)| f(o)).count();
        let passed = count(|o| matches!(o, Outcome::Passed));
        let failed = count(|o| matches!(o, Outcome::Failed(_)));
        let skipped = count(|o| matches!(o, Outcome::Skipped(_)));
        match self.format {
            Format::Text if !self.summary => {}
            Format::Text => self.text_summary(passed, failed, skipped)?,
            Format::Tap => writeln!(
                self.out,
                "# {passed} passed, {failed} failed, {skipped} skipped"
            )?,
            Format::JsonLines => {
                let record = SummaryRecord {
                    summary: SummaryLine {
                        passed,
                        failed,
                        skipped,
                    },
                };
                writeln!(self.out, "{}", json(&record))?;
            }
        }
        self.out.flush()?;
        Ok(failed == 0)
    }

    /// Upstream's `Total:` line; `N passed, N failed[, N skipped]`; then the failed and the
    /// skipped cases with why.
    fn text_summary(&mut self, passed: usize, failed: usize, skipped: usize) -> io::Result<()> {
        writeln!(
            self.out,
            "{}",
            upstream_total(self.results.len(), passed, failed, skipped)
        )?;
        let mut line = format!("{passed} passed, {failed} failed");
        if skipped > 0 {
            line += &format!(", {skipped} skipped");
        }
        writeln!(self.out, "{line}")?;
        if failed > 0 {
            writeln!(self.out, "Failed:")?;
            for (name, o) in &self.results {
                if let Outcome::Failed(why) = o {
                    writeln!(self.out, "    {name}: {}", one_line(why))?;
                }
            }
        }
        if skipped > 0 {
            writeln!(self.out, "Skipped:")?;
            for (name, o) in &self.results {
                if let Outcome::Skipped(why) = o {
                    writeln!(self.out, "    {name}: {why}")?;
                }
            }
        }
        Ok(())
    }
}

/// Upstream's summary line (a skipped case is what upstream calls waived).
pub fn upstream_total(total: usize, passed: usize, failed: usize, waived: usize) -> String {
    format!("Total: {total}, Passed: {passed}, Failed: {failed}, Waived: {waived}")
}

/// The banner upstream prints on standard error with `-v` when a case ends: `&&&& PASSED
/// name`, `&&&& FAILED name` or `&&&& WAIVED name` (a skipped case).
pub fn upstream_banner(name: &str, outcome: &Outcome) -> String {
    let word = match outcome {
        Outcome::Passed => "PASSED",
        Outcome::Failed(_) => "FAILED",
        Outcome::Skipped(_) => "WAIVED",
    };
    format!("&&&& {word} {name}")
}

fn one_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// One JSON line; serializing these plain structs cannot fail.
fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: Format) -> (String, bool) {
        let mut buf = Vec::new();
        let mut r = Report::start(format, &mut buf, 3).unwrap();
        r.case("a_case", Outcome::Passed, 0.5).unwrap();
        r.case("b_case", Outcome::Failed("bad data\nbyte 3".into()), 1.0)
            .unwrap();
        r.case("c_case", Outcome::Skipped("needs X".into()), 0.0)
            .unwrap();
        let ok = r.finish().unwrap();
        (String::from_utf8(buf).unwrap(), ok)
    }

    #[test]
    fn tap_has_a_plan_and_one_point_per_case() {
        let (out, ok) = run(Format::Tap);
        assert!(!ok);
        assert_eq!(
            out,
            "TAP version 14\n1..3\nok 1 - a_case\nnot ok 2 - b_case\n  ---\n  message: |\n    \
             bad data\n    byte 3\n  ...\nok 3 - c_case # SKIP needs X\n\
             # 1 passed, 1 failed, 1 skipped\n"
        );
    }

    #[test]
    fn json_lines_are_one_object_each() {
        let (out, _) = run(Format::JsonLines);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["case"], "a_case");
        assert_eq!(lines[0]["outcome"], "passed");
        assert!(lines[0].get("reason").is_none());
        assert_eq!(lines[1]["outcome"], "failed");
        assert_eq!(lines[1]["reason"], "bad data\nbyte 3");
        assert_eq!(lines[2]["outcome"], "skipped");
        assert_eq!(lines[3]["summary"]["failed"], 1);
    }

    #[test]
    fn text_is_the_summary_and_the_lists() {
        let (out, _) = run(Format::Text);
        assert_eq!(
            out,
            "Total: 3, Passed: 1, Failed: 1, Waived: 1\n\
             1 passed, 1 failed, 1 skipped\nFailed:\n    b_case: bad data\nSkipped:\n    \
             c_case: needs X\n"
        );
    }

    #[test]
    fn without_summary_text_prints_nothing_and_the_other_formats_keep_theirs() {
        for (format, expected_lines) in
            [(Format::Text, 0), (Format::Tap, 4), (Format::JsonLines, 2)]
        {
            let mut buf = Vec::new();
            let mut r = Report::start(format, &mut buf, 1)
                .unwrap()
                .without_summary();
            r.case("a_case", Outcome::Passed, 0.5).unwrap();
            assert!(r.finish().unwrap());
            let out = String::from_utf8(buf).unwrap();
            assert_eq!(out.lines().count(), expected_lines, "{format:?}: {out}");
            assert!(!out.contains("Total:"), "{out}");
        }
    }

    #[test]
    fn upstream_lines_are_byte_for_byte() {
        assert_eq!(
            upstream_total(37, 30, 1, 6),
            "Total: 37, Passed: 30, Failed: 1, Waived: 6"
        );
        assert_eq!(
            upstream_banner("basic_cumemalloc", &Outcome::Passed),
            "&&&& PASSED basic_cumemalloc"
        );
        assert_eq!(
            upstream_banner("x", &Outcome::Failed("e".into())),
            "&&&& FAILED x"
        );
        assert_eq!(
            upstream_banner("x", &Outcome::Skipped("why".into())),
            "&&&& WAIVED x"
        );
    }

    #[test]
    fn bail_out_lines() {
        let mut buf = Vec::new();
        Report::bail_out(Format::Tap, &mut buf, "no GPU\nmore", 77).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "Bail out! no GPU\n");
        let mut buf = Vec::new();
        Report::bail_out(Format::JsonLines, &mut buf, "no GPU", 77).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(
            (v["error"].as_str(), v["exit_status"].as_u64()),
            (Some("no GPU"), Some(77))
        );
    }
}
