//! The unit of `cargo xtask test`: a named, timed step.

use anyhow::Result;
use xshell::Shell;

pub type Step<'a> = (&'static str, Box<dyn Fn(&Shell) -> Result<()> + 'a>);
