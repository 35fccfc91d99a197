//! One line per check: `OK    <check>: <finding>`, or `WARN`/`FAIL` with `; fix: <what to do>`
//! (the status word left-aligned in six columns), and the exit status the lines make.

use std::fmt;

use crate::status::Status;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One check's result. `fix` is empty for `OK` (and then not printed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    pub check: String,
    pub finding: String,
    pub fix: String,
}

impl Line {
    pub fn ok(check: impl Into<String>, finding: impl Into<String>) -> Line {
        Line {
            level: Level::Ok,
            check: check.into(),
            finding: finding.into(),
            fix: String::new(),
        }
    }

    pub fn warn(
        check: impl Into<String>,
        finding: impl Into<String>,
        fix: impl Into<String>,
    ) -> Line {
        Line {
            level: Level::Warn,
            check: check.into(),
            finding: finding.into(),
            fix: fix.into(),
        }
    }

    pub fn fail(
        check: impl Into<String>,
        finding: impl Into<String>,
        fix: impl Into<String>,
    ) -> Line {
        Line {
            level: Level::Fail,
            check: check.into(),
            finding: finding.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.level {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        write!(f, "{word:<6}{}: {}", self.check, self.finding)?;
        if self.level != Level::Ok {
            write!(f, "; fix: {}", self.fix)?;
        }
        Ok(())
    }
}

/// 1 when a check failed, else 0 (warnings allowed).
pub fn status(lines: &[Line]) -> Status {
    if lines.iter().any(|l| l.level == Level::Fail) {
        Status::Failed
    } else {
        Status::Passed
    }
}

/// The lines to print: all of them, or with `quiet` only warnings and failures.
pub fn shown(lines: &[Line], quiet: bool) -> impl Iterator<Item = &Line> {
    lines.iter().filter(move |l| !quiet || l.level != Level::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_have_the_contracts_format() {
        assert_eq!(
            Line::ok("mtgpu", "loaded").to_string(),
            "OK    mtgpu: loaded"
        );
        assert_eq!(
            Line::warn("libmusa", "emulated", "install the driver").to_string(),
            "WARN  libmusa: emulated; fix: install the driver"
        );
        assert_eq!(
            Line::fail("pat", "off", "reboot").to_string(),
            "FAIL  pat: off; fix: reboot"
        );
    }

    #[test]
    fn a_failure_fails_warnings_do_not_and_quiet_hides_ok() {
        let ok = Line::ok("a", "b");
        let warn = Line::warn("c", "d", "e");
        let fail = Line::fail("f", "g", "h");
        assert_eq!(status(&[ok.clone(), warn.clone()]), Status::Passed);
        assert_eq!(status(&[ok.clone(), fail.clone()]), Status::Failed);
        let all = [ok, warn, fail];
        assert_eq!(shown(&all, true).count(), 2);
        assert_eq!(shown(&all, false).count(), 3);
    }
}
