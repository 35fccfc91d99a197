//! `GDRCOPY_COPY_VARIANT` values that select nothing: one warning on stderr naming the accepted
//! values, whatever the log settings. The library reads the variable once per process, so each
//! case runs this test binary again as a child that selects the variant and exits.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;

use gdrapi::copy::VARIANT_ENV;

/// Set in the child: select the variant, print its name, and do nothing else.
const CHILD_ENV: &str = "GDRAPI_TEST_VARIANT_CHILD";
const CHILD_TEST: &str = "child_selects_the_variant";

#[test]
fn child_selects_the_variant() {
    if std::env::var_os(CHILD_ENV).is_some() {
        println!("selected={}", gdrapi::copy::selected().name);
    }
}

/// The child's stderr with `GDRCOPY_COPY_VARIANT=value` and the given log settings.
fn child_stderr(value: OsString, logging: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let mut command = Command::new(exe);
    command
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(VARIANT_ENV, value)
        .env_remove(gdrapi::log::ENABLE_ENV)
        .env_remove(gdrapi::log::LEVEL_ENV);
    for (name, value) in logging {
        command.env(name, value);
    }
    let out = command.output().expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}");
    let default = gdrapi::copy::default_variant().name;
    assert!(
        stdout.contains(&format!("selected={default}\n")),
        "an ignored value falls back to {default}: {stdout}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_ignored_value_warns_once_naming_the_accepted_values() {
    let log_settings: [&[(&str, &str)]; 4] = [
        &[],
        &[(gdrapi::log::ENABLE_ENV, "1")],
        &[
            (gdrapi::log::ENABLE_ENV, "1"),
            (gdrapi::log::LEVEL_ENV, "1"),
        ],
        &[
            (gdrapi::log::ENABLE_ENV, "1"),
            (gdrapi::log::LEVEL_ENV, "3"),
        ],
    ];
    let values = [
        OsString::from("no-such-variant"),
        OsString::from_vec(b"avx\xff".to_vec()),
    ];
    for value in values {
        for logging in log_settings {
            let stderr = child_stderr(value.clone(), logging);
            let warnings: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("WARN:") && l.contains(VARIANT_ENV))
                .collect();
            assert_eq!(
                warnings.len(),
                1,
                "{value:?} with {logging:?}: one warning, got stderr:\n{stderr}"
            );
            for variant in gdrapi::copy::variants() {
                assert!(
                    warnings[0].contains(variant.name),
                    "the warning names {}: {}",
                    variant.name,
                    warnings[0]
                );
            }
        }
    }
}
