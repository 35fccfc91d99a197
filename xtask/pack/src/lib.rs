//! The packaging layer of `cargo xtask`: the staged trees, the .debs, the source package, the
//! apt repository a release publishes, the generated identity and licences, versions and
//! install from source. It depends on xtask-base only; the packages' tests are the test bench's
//! (xtask-testbench's pkgtest).

pub mod aptrepo;
pub mod changelog;
pub mod deb;
pub mod debhelper;
pub mod dsc;
pub mod identity;
pub mod install;
pub mod licences;
pub mod shipped;
pub mod stage;
pub mod versions;
