//! How long each part of a package test took, printed under its step as the part ends.

use std::time::Instant;

pub(super) fn timed(what: &str, start: Instant) {
    eprintln!("    {what}: {:.1} s", start.elapsed().as_secs_f64());
}
