//! What copybw, copylat and apiperf share: options ([`cli`]), the result schema ([`result`]),
//! statistics ([`stats`]), the JSON export ([`export`]), terminal handling ([`Term`]) and the
//! GPU/gdr session ([`session`]).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;

pub mod cli;
pub mod export;
pub mod result;
pub mod session;
pub mod stats;
pub mod upstream;

pub use crate::term::Term;

/// A benchmark's `main` after parsing: `--version`, else `run`, whose failure is printed as
/// `program: …` (one line, the whole context chain) with the exit status it stands for
/// ([`crate::tool::Status`]).
pub fn main(program: &str, common: &cli::Common, run: impl FnOnce(Term) -> Result<()>) -> ExitCode {
    crate::tool::main(program, &common.version, |term| {
        run(term).map(|()| crate::tool::Status::Passed)
    })
}

/// Runs `f` `n` times (n >= 1) and returns the mean time per call in µs; the first error
/// stops the loop.
#[inline]
pub fn time_calls(n: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64)
}

/// MiB/s of `bytes` moved in `us` microseconds; `None` when no time was measured.
pub fn mib_per_s(bytes: u64, us: f64) -> Option<f64> {
    (us > 0.0).then(|| bytes as f64 / (us / 1e6) / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bandwidth_is_bytes_per_second_over_2_pow_20() {
        assert_eq!(super::mib_per_s(1 << 20, 1e6), Some(1.0));
        assert_eq!(super::mib_per_s(131072, 1e6 / 8.0), Some(1.0));
        assert_eq!(super::mib_per_s(1, 0.0), None);
    }
}
