//! A step of `cargo xtask test`: a name and what it runs; the runner times it and reports it.

use std::time::Instant;

use anyhow::Result;
use xshell::Shell;

/// The unit of `cargo xtask test`: a named, timed step.
pub type Step<'a> = (&'static str, Box<dyn Fn(&Shell) -> Result<()> + 'a>);

/// Prints how long a part of a step took, under the step, as the part ends.
pub fn timed(what: &str, start: Instant) {
    eprintln!("    {what}: {:.1} s", start.elapsed().as_secs_f64());
}
