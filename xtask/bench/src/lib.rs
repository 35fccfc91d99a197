//! The test bench of `cargo xtask`: the QEMU VM and its tests, the Debian kernels they boot,
//! the kernel matrix, the package tests (the source package's build, reproducibility, the
//! maintainer scripts, install and upgrade), the apt repository, benchmarks and their plots,
//! copy counts, libFuzzer, the arm64 and static-library checks, and the checks of the tree
//! itself (the rust-versions its dependencies need, the CI workflows). It depends on xtask-base
//! and xtask-pack.

pub mod aptrepo;
pub mod bench;
pub mod copycount;
pub mod crosstest;
pub mod elf;
pub mod fuzz;
pub mod hostbench;
pub mod kernel;
pub mod library;
pub mod matrix;
pub mod msrv;
pub mod pkgtest;
pub mod plot;
pub mod runner;
pub mod staticlib;
pub mod vm;
pub mod vmtest;
pub mod workflows;
