//! The README's "Coming from NVIDIA GDRCopy" table: every row says what differs and what a
//! caller must do, the differences a user of upstream trips over first each have a row, and the
//! names it gives for our tools and upstream's sanity cases are real.

use std::fs;
use std::path::Path;

use mtgdrcopy_tests::sanity::names::UPSTREAM;

const SECTION: &str = "## Coming from NVIDIA GDRCopy";

/// The table's body rows, each split into its cells.
fn rows() -> Vec<Vec<String>> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = fs::read_to_string(&readme).expect("README.md is readable");
    let start = text
        .find(SECTION)
        .unwrap_or_else(|| panic!("README.md has no {SECTION:?} section"));
    let section = &text[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let table: Vec<&str> = section.lines().filter(|l| l.starts_with('|')).collect();
    assert!(table.len() > 2, "the section has no table");
    assert_eq!(
        cells(table[0]),
        ["upstream GDRCopy", "here", "what to do"],
        "the table's header"
    );
    table[2..].iter().map(|l| cells(l)).collect()
}

/// A row's cells; `\|` inside a cell is a literal bar.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner
        .replace("\\|", "\u{0}")
        .split('|')
        .map(|c| c.trim().replace('\u{0}', "|"))
        .collect()
}

#[test]
fn every_row_says_what_differs_and_what_to_do() {
    for row in rows() {
        assert_eq!(row.len(), 3, "a row without three cells: {row:?}");
        assert!(
            row.iter().all(|c| !c.is_empty()),
            "a row with an empty cell: {row:?}"
        );
    }
}

#[test]
fn the_differences_users_meet_first_each_have_a_row() {
    let rows = rows();
    for topic in [
        "granule",
        "p2p_token",
        "FORCE_PCIE",
        "CACHE_MAPPING",
        "PERSISTENT_MAPPING",
        "gdrcopy_pplat",
        "cuMemCreate",
        "gpuDirectRDMACapable",
        "LS64",
        "/dev/gdrdrv",
        "_cumemalloc",
    ] {
        assert!(
            rows.iter()
                .any(|r| r[0].contains(topic) || r[1].contains(topic)),
            "no row about {topic}"
        );
    }
}

#[test]
fn the_tools_and_cases_it_names_exist() {
    let tools: Vec<String> = mtgdrcopy_tests::cli::commands()
        .iter()
        .map(|c| c.get_name().to_string())
        .collect();
    for row in rows() {
        for word in row[1].split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("mtgdrcopy_") {
                assert!(tools.iter().any(|t| t == word), "no tool {word}");
            }
        }
        for word in row.iter().flat_map(|c| c.split('`')) {
            if !word.starts_with('*')
                && (word.ends_with("_cumemalloc") || word.ends_with("_vmmalloc"))
            {
                assert!(UPSTREAM.contains(&word), "{word} is not an upstream case");
            }
        }
    }
}
