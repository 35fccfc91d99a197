//! Logging as upstream's: off unless `GDRCOPY_ENABLE_LOGGING` exists (even empty); then every
//! message at or above `GDRCOPY_LOG_LEVEL` (default 4, errors only) goes to stderr. Levels:
//! 1 debug, 2 info, 3 warn, 4 error. Unlike upstream, the environment is read once in a
//! thread-safe way.

use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

pub const ENABLE_ENV: &str = "GDRCOPY_ENABLE_LOGGING";
pub const LEVEL_ENV: &str = "GDRCOPY_LOG_LEVEL";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

impl Level {
    fn prefix(self) -> &'static str {
        match self {
            Level::Debug => "DBG:  ",
            Level::Info => "INFO: ",
            Level::Warn => "WARN: ",
            Level::Error => "ERR:  ",
        }
    }
}

/// `None` when logging is off, else the threshold.
fn threshold() -> Option<i64> {
    static THRESHOLD: OnceLock<Option<i64>> = OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        std::env::var_os(ENABLE_ENV)?;
        let level = std::env::var(LEVEL_ENV)
            .map(|v| leading_int(&v))
            .unwrap_or(Level::Error as i64);
        Some(level)
    })
}

/// `atoi` semantics: the leading decimal integer, 0 when there is none.
fn leading_int(text: &str) -> i64 {
    let t = text.trim_start();
    let (sign, digits) = match t.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse::<i64>().map(|v| sign * v).unwrap_or(0)
}

pub fn enabled(level: Level) -> bool {
    threshold().is_some_and(|t| level as i64 >= t)
}

pub fn log(level: Level, args: fmt::Arguments<'_>) {
    if enabled(level) {
        // One write per line so lines from several threads do not interleave.
        let line = format!("{}{}\n", level.prefix(), args);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// A warning written whatever `GDRCOPY_ENABLE_LOGGING` and `GDRCOPY_LOG_LEVEL` say: for a
/// setting the user made that the library ignores, which they would otherwise never learn.
pub fn warn_always(args: fmt::Arguments<'_>) {
    let line = format!("{}{}\n", Level::Warn.prefix(), args);
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

pub fn debug(args: fmt::Arguments<'_>) {
    log(Level::Debug, args)
}
pub fn info(args: fmt::Arguments<'_>) {
    log(Level::Info, args)
}
pub fn warn(args: fmt::Arguments<'_>) {
    log(Level::Warn, args)
}
pub fn error(args: fmt::Arguments<'_>) {
    log(Level::Error, args)
}

#[cfg(test)]
mod tests {
    use super::leading_int;

    #[test]
    fn level_parses_like_atoi() {
        assert_eq!(leading_int("3"), 3);
        assert_eq!(leading_int(" 2xyz"), 2);
        assert_eq!(leading_int("-1"), -1);
        assert_eq!(leading_int("debug"), 0);
        assert_eq!(leading_int(""), 0);
    }
}
