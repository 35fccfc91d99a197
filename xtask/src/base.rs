//! The bottom layer: helpers that several subcommands share. Nothing here imports a subcommand
//! module (only `paths`, `deb822` and other `base` modules), so every module may import it
//! without making a cycle.

pub mod cargo;
pub mod elf;
pub mod files;
pub mod generated;
pub mod host;
pub mod library;
pub mod lintian;
pub mod plot;
pub mod steps;
pub mod targets;
