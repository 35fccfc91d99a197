//! What a user of NVIDIA GDRCopy types, on a machine without a GPU: upstream's sanity options
//! and case names are accepted (the run then ends for want of libgdrapi, status 77, not with a
//! usage error), and `-l` shows upstream's names beside ours. The same invocations with a GPU,
//! and upstream's output lines, are checked in the test VM (`cargo xtask test`, the step
//! "upstream GDRCopy's invocations and output lines").

use std::process::Command;

use mtgdrcopy_tests::sanity::names::UPSTREAM;

fn sanity(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mtgdrcopy_sanity"))
        .args(args)
        .env("MUSA_HOME", "/nonexistent-musa-home")
        .env("GDRCOPY_LIBRARY", "/nonexistent/libgdrapi.so.1")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("mtgdrcopy_sanity runs");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn upstreams_options_and_every_upstream_case_name_are_accepted() {
    let mut args = vec!["-v", "-s", "-d", "0", "-e"];
    for name in UPSTREAM {
        args.extend(["-t", name]);
    }
    let (code, stdout, stderr) = sanity(&args);
    assert_eq!(code, 77, "stdout {stdout:?} stderr {stderr:?}");
    assert!(stderr.contains("libgdrapi"), "{stderr}");
}

#[test]
fn a_list_shows_upstreams_name_beside_ours() {
    let (code, stdout, stderr) = sanity(&["-l"]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "    basic_mumemalloc (upstream: basic_cumemalloc)",
        "    leakage_pin_pages_fork_mumemalloc (upstream: leakage_pin_pages_fork_cumemalloc)",
        "    basic_with_tokens",
        "    attributes_sanity",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}"
        );
    }
    // Every upstream name appears, as ours or as the alias of ours.
    for name in UPSTREAM {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim() == name || l.ends_with(&format!("(upstream: {name})"))),
            "{name} is not listed:\n{stdout}"
        );
    }
}
