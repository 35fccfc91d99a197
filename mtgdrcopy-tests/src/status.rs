//! How a tool ends: its exit status, and the two kinds of error that are not a failed test
//! (the environment lacks something; the command line is wrong), kept apart from everything
//! else so that the modules that find them need nothing but this file.

use std::fmt;
use std::process::ExitCode;

/// How a tool ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Everything ran and passed.
    Passed = 0,
    /// A test, a copy or a check of the data failed.
    Failed = 1,
    /// The command line is wrong (clap exits with 2 for its own errors too).
    Usage = 2,
    /// The machine lacks what the tool needs: libgdrapi, the MUSA driver or a GPU, mtgdrdrv or
    /// a working dma-buf backend.
    Unavailable = 77,
}

impl Status {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Status> for ExitCode {
    fn from(s: Status) -> ExitCode {
        ExitCode::from(s.code())
    }
}

/// An error meaning the environment lacks something (exit status 77).
#[derive(Debug)]
struct Unavailable(anyhow::Error);

/// An error in what the user asked for, found after parsing (exit status 2).
#[derive(Debug)]
struct Usage(String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}
impl std::error::Error for Usage {}

/// Marks `e` as "the environment lacks something": the tool exits with 77.
pub fn unavailable(e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Unavailable(e.into()))
}

/// A usage error found after parsing (a value out of range for another value): exit status 2.
pub fn usage(msg: impl fmt::Display) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.to_string()))
}

/// The exit status an error stands for (contexts added on top do not change it).
pub fn status_of(e: &anyhow::Error) -> Status {
    if e.downcast_ref::<Unavailable>().is_some() {
        Status::Unavailable
    } else if e.downcast_ref::<Usage>().is_some() {
        Status::Usage
    } else {
        Status::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn statuses_survive_added_context() {
        let e = unavailable(anyhow::anyhow!("no libmusa"));
        assert_eq!(status_of(&e), Status::Unavailable);
        let e = Err::<(), _>(e).context("opening GPU 0").unwrap_err();
        assert_eq!(status_of(&e), Status::Unavailable);
        assert_eq!(format!("{e:#}"), "opening GPU 0: no libmusa");
        let e = Err::<(), _>(usage("-o must be a multiple of 4"))
            .context("plan")
            .unwrap_err();
        assert_eq!(status_of(&e), Status::Usage);
        assert_eq!(status_of(&anyhow::anyhow!("data differs")), Status::Failed);
    }

    #[test]
    fn exit_codes_are_the_documented_ones() {
        let codes: Vec<u8> = [
            Status::Passed,
            Status::Failed,
            Status::Usage,
            Status::Unavailable,
        ]
        .iter()
        .map(|s| s.code())
        .collect();
        assert_eq!(codes, [0, 1, 2, 77]);
    }
}
