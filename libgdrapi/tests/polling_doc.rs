//! gdrapi.h's overview and gdrapi(3) say what a poll loop on a write-combined mapping can rely
//! on (streaming-load buffers are not snooped: Intel SDM Vol. 1, 12.10.3) and what a caller
//! that polls a flag and then reads the payload must do; and the sizes they give are the
//! library's: reads from `copy::inline_below()` bytes up may use streaming loads, shorter ones
//! are plain loads of at most the generic variant's width.

use std::path::Path;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text as one line of words: comment markers, roff requests and escapes gone.
fn words(text: &str) -> String {
    text.lines()
        .map(|l| l.trim_start_matches([' ', '*', '/']))
        .map(|l| {
            l.strip_prefix(".BR ")
                .or_else(|| l.strip_prefix(".RB "))
                .or_else(|| l.strip_prefix(".B "))
                .unwrap_or(l)
        })
        .filter(|l| !l.starts_with('.'))
        .collect::<Vec<_>>()
        .join(" ")
        .replace("\\~", " ")
        .replace("\\-", "-")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn header_and_man_page_say_how_to_poll() {
    let inline = gdrapi::copy::inline_below();
    let plain = gdrapi::copy::GENERIC.load_width;
    for (name, text) in [
        ("include/gdrapi.h", words(&read("include/gdrapi.h"))),
        ("man/gdrapi.3", words(&read("man/gdrapi.3"))),
    ] {
        for needed in [
            format!("reads {inline} bytes and more with streaming loads"),
            "12.10.3".to_string(),
            format!("Poll with reads of at most {plain} bytes, or put an mfence"),
            "between the flag read and the payload read".to_string(),
            format!("fewer than {inline} bytes does the lfence"),
        ] {
            assert!(
                text.to_lowercase().contains(&needed.to_lowercase()),
                "{name} does not say {needed:?}"
            );
        }
    }
}
