//! The bottom layer of `cargo xtask`: where things are (paths, the workspace, debian/), the
//! build (native and arm64), chroots, and helpers that several subcommands share (host
//! packages, files, targets, lintian). It depends on no other xtask crate.

pub mod build;
pub mod cargo;
pub mod chroot;
pub mod cross;
pub mod debian;
pub mod files;
pub mod generated;
pub mod host;
pub mod library;
pub mod lintian;
pub mod paths;
pub mod targets;
pub mod workspace;
pub mod zigbuild;
