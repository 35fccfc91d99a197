//! A step of `cargo xtask test`: a name and what it runs; the runner times it and reports it.

use anyhow::Result;
use xshell::Shell;

/// The unit of `cargo xtask test`: a named, timed step.
pub type Step<'a> = (&'static str, Box<dyn Fn(&Shell) -> Result<()> + 'a>);
