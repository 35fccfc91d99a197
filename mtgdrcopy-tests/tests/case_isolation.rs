//! How the sanity harness ends a case: passed, failed (error or panic), skipped, killed by a
//! signal, timed out. A test binary of its own, with this one test: `run_isolated` forks, which
//! is safe only while the process has a single thread (as mtgdrcopy_sanity has), and libtest
//! runs the tests of one binary on several threads, where a forked child can block forever on
//! a lock another thread held at the fork (seen in CI: the failing case timed out).

use std::time::{Duration, Instant};

use mtgdrcopy_tests::sanity::runner::{run_isolated, Outcome};
use mtgdrcopy_tests::sanity::Skip;

const T: Duration = Duration::from_secs(20);

#[test]
fn pass_fail_skip_panic_signal_and_timeout() {
    assert_eq!(run_isolated(|| Ok(()), T).unwrap(), Outcome::Passed);
    assert_eq!(
        run_isolated(|| anyhow::bail!("bad value {}", 3), T).unwrap(),
        Outcome::Failed("bad value 3".into())
    );
    assert_eq!(
        run_isolated(|| Err(Skip("needs hardware".into()).into()), T).unwrap(),
        Outcome::Skipped("needs hardware".into())
    );
    let Outcome::Failed(text) = run_isolated(|| panic!("boom"), T).unwrap() else {
        panic!("a panic is a failure");
    };
    assert!(text.contains("boom"), "{text}");
    let Outcome::Failed(text) = run_isolated(
        || {
            // SAFETY: raising a signal in the forked test child.
            unsafe { libc::raise(libc::SIGTERM) };
            Ok(())
        },
        T,
    )
    .unwrap() else {
        panic!("death by signal is a failure");
    };
    assert!(text.contains("SIGTERM"), "{text}");
    let start = Instant::now();
    let outcome = run_isolated(
        || {
            std::thread::sleep(Duration::from_secs(30));
            Ok(())
        },
        Duration::from_millis(300),
    )
    .unwrap();
    assert!(matches!(outcome, Outcome::Failed(t) if t.contains("timed out")));
    assert!(start.elapsed() < Duration::from_secs(10));
}
