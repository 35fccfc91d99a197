//! "Is this the process that opened the `gdr_t`?" is decided by the fork generation, not the
//! PID: a forked child can have the opener's PID (PID 1 of a new PID namespace, as the opener
//! was of its own; or a reused PID), and must still not count as the opener (its `gdr_close`
//! would unmap addresses it never inherited). Runs with the dma-buf backend on the stand-in
//! libmusa, in a child of this test binary: that forks into a new user and PID namespace (PID 1
//! there), opens, then forks into another new PID namespace, where the child is PID 1 again.
//! Needs unprivileged user namespaces (the CI host has them).

mod common;

/// Set in the child process that runs the namespaces.
const CHILD_ENV: &str = "GDRAPI_TEST_OPENER_CHILD";
const CHILD_TEST: &str = "child_in_pid_namespaces";

/// Why a run failed, by exit status.
const WHY: [(i32, &str); 6] = [
    (
        10,
        "unshare(CLONE_NEWUSER | CLONE_NEWPID) failed: no unprivileged user namespaces",
    ),
    (11, "gdr_open on the stand-in libmusa failed"),
    (12, "the opener does not count as the opener"),
    (13, "unshare(CLONE_NEWPID) failed"),
    (
        14,
        "a forked child with the opener's PID counts as the opener",
    ),
    (15, "the processes are not PID 1 of their namespaces"),
];

/// Forks; the child runs `body` and leaves with its value as exit status. The parent's value
/// is the child's exit status, or 100 when it did not exit.
fn in_child(body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `body` (single-threaded from here) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = body();
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        100
    }
}

fn pid_is_1() -> bool {
    // SAFETY: no arguments.
    unsafe { libc::getpid() == 1 }
}

#[test]
fn child_in_pid_namespaces() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // Forked first: unshare(CLONE_NEWUSER) needs a single-threaded process.
    let code = in_child(|| {
        // SAFETY: plain system call.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) } != 0 {
            return 10;
        }
        in_child(|| {
            // The stand-in's first muInit fails; the second open succeeds.
            let Ok(gdr) = gdrapi::Gdr::open().or_else(|_| gdrapi::Gdr::open()) else {
                return 11;
            };
            if !gdr.in_opener() {
                return 12;
            }
            // SAFETY: plain system call.
            if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
                return 13;
            }
            let opener_is_1 = pid_is_1();
            in_child(|| match (opener_is_1 && pid_is_1(), gdr.in_opener()) {
                (false, _) => 15,
                (true, true) => 14,
                (true, false) => 0,
            })
        })
    });
    let why = WHY.iter().find(|(c, _)| *c == code).map_or("", |(_, w)| w);
    assert_eq!(code, 0, "{why}");
}

#[test]
fn a_child_with_the_openers_pid_is_not_the_opener() {
    let (dir, library) = common::stand_in_musa("opener");
    let home = dir.join("musa-home");
    std::fs::create_dir_all(home.join("lib64")).expect("lib64");
    std::fs::copy(&library, home.join("lib64/libmusa.so.1")).expect("installing libmusa");
    common::run_child(CHILD_TEST, &home, &[(CHILD_ENV, &dir)]);
}
