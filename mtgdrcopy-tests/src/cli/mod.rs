//! The tools' command lines, kept in the library so that the test of the hand-written manual
//! pages (tests/man_pages.rs) can check each page's options against its program's.

pub mod apiperf;
pub mod copybw;
pub mod copylat;
pub mod doctor;
pub mod musainfo;
pub mod sanity;

use clap::CommandFactory;

/// Every tool's program name and command, in the order of the package.
pub fn commands() -> Vec<clap::Command> {
    vec![
        apiperf::Args::command(),
        copybw::Args::command(),
        copylat::Args::command(),
        doctor::Args::command(),
        musainfo::Cli::command(),
        sanity::Args::command(),
    ]
}

/// Upstream GDRCopy 2.6's option strings (getopt syntax: a letter followed by `:` takes a
/// value), per tool of ours: every one of them is accepted with upstream's meaning.
pub const UPSTREAM_OPTIONS: [(&str, &str); 4] = [
    ("mtgdrcopy_sanity", "hvslt:d:e"),
    ("mtgdrcopy_copybw", "s:d:o:c:w:r:a:M:hl"),
    ("mtgdrcopy_copylat", "s:d:w:r:a:M:cCh"),
    ("mtgdrcopy_apiperf", "s:d:n:w:a:M:h"),
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_upstream_option_letter_is_ours_with_or_without_a_value_as_upstreams() {
        for (tool, getopt) in super::UPSTREAM_OPTIONS {
            let mut cmd = super::commands()
                .into_iter()
                .find(|c| c.get_name() == tool)
                .unwrap_or_else(|| panic!("no {tool}"));
            // Adds clap's own -h.
            cmd.build();
            let chars: Vec<char> = getopt.chars().collect();
            for (i, &letter) in chars.iter().enumerate().filter(|(_, c)| **c != ':') {
                let takes_value = chars.get(i + 1) == Some(&':');
                let arg = cmd
                    .get_arguments()
                    .find(|a| a.get_short() == Some(letter))
                    .unwrap_or_else(|| panic!("{tool} lacks upstream's -{letter}"));
                let ours_takes_value = arg.get_action().takes_values();
                assert_eq!(
                    ours_takes_value, takes_value,
                    "{tool} -{letter}: takes a value here {ours_takes_value}, upstream {takes_value}"
                );
            }
        }
    }

    #[test]
    fn upstreams_invocations_parse() {
        use clap::Parser;
        let ok = |r: Result<(), clap::Error>| r.map_err(|e| e.to_string()).unwrap();
        ok(super::sanity::Args::try_parse_from([
            "s",
            "-v",
            "-s",
            "-t",
            "basic_cumemalloc",
            "-t",
            "attributes_sanity",
            "-d",
            "0",
            "-e",
        ])
        .map(|a| assert!(a.no_summary && a.verbose && a.extended && a.tests.len() == 2)));
        ok(super::copybw::Args::try_parse_from([
            "b",
            "-d",
            "0",
            "-s",
            "65536",
            "-o",
            "0",
            "-c",
            "65536",
            "-w",
            "10",
            "-r",
            "10",
            "-l",
            "-a",
            "cuMemAlloc",
            "-M",
            "wc",
        ])
        .map(drop));
        ok(super::copylat::Args::try_parse_from([
            "l",
            "-c",
            "-s",
            "4096",
            "-d",
            "0",
            "-w",
            "100",
            "-r",
            "100",
            "-a",
            "cuMemAlloc",
            "-M",
            "default",
            "-C",
        ])
        .map(drop));
        ok(super::apiperf::Args::try_parse_from([
            "a",
            "-s",
            "8",
            "-d",
            "0",
            "-n",
            "10",
            "-w",
            "1",
            "-a",
            "cuMemAlloc",
            "-M",
            "device",
        ])
        .map(drop));
    }

    #[test]
    fn every_command_is_consistent_and_has_the_version_flag() {
        for cmd in super::commands() {
            let name = cmd.get_name().to_string();
            assert!(name.starts_with("mtgdrcopy_"), "{name}");
            cmd.clone().debug_assert();
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == Some("version") && a.get_short() == Some('V')),
                "{name} lacks -V/--version"
            );
        }
    }
}
