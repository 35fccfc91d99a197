//! The dma-buf backend keeps only success: a `gdr_open` that finds no libmusa, or whose
//! `muInit` fails, leaves the next one to look and initialise again. Each run is a child process
//! of this test binary (what was loaded stays for the life of a process): `MUSA_HOME` names an
//! empty directory, the child opens, then puts a stand-in libmusa (tests/c/failing_musa.c,
//! whose first `muInit` fails) there and opens twice more. Needs a host without an installed
//! MUSA driver, as the CI host is (step 1 says so if one is found).

mod common;

use std::path::PathBuf;

use nix::errno::Errno;

/// Set in the child: the stand-in library to install under `MUSA_HOME`.
const CHILD_ENV: &str = "GDRAPI_TEST_MUSA_RETRY_LIBRARY";
const CHILD_TEST: &str = "child_opens_three_times";

/// Each open's outcome: `Ok` or the errno.
fn open() -> Result<(), Errno> {
    gdrapi::Gdr::open().map(drop).map_err(|e| e.errno())
}

#[test]
fn child_opens_three_times() {
    let Some(library) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let home = PathBuf::from(std::env::var_os(gdrapi::musa::MUSA_HOME_ENV).expect("MUSA_HOME"));
    assert_eq!(
        open(),
        Err(Errno::ENOENT),
        "1: no libmusa anywhere (is a MUSA driver installed on this host?)"
    );
    std::fs::create_dir_all(home.join("lib64")).expect("lib64");
    std::fs::copy(&library, home.join("lib64/libmusa.so.1")).expect("installing libmusa");
    assert_eq!(
        open(),
        Err(Errno::ENODEV),
        "2: libmusa is looked for again and found; its first muInit fails"
    );
    assert_eq!(open(), Ok(()), "3: muInit is called again and succeeds");
}

#[test]
fn a_failed_load_or_init_is_tried_again_at_the_next_open() {
    let (dir, library) = common::stand_in_musa("musa-retry");
    common::run_child(CHILD_TEST, &dir.join("musa-home"), &[(CHILD_ENV, &library)]);
}
