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

#[cfg(test)]
mod tests {
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
