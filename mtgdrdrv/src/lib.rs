//! The ioctl ABI of the `mtgdrdrv` kernel module.
//!
//! This crate is the single definition of the interface between libgdrapi and the module: ioctl
//! numbers, parameter structs, mapping types, attributes, pin flags and versions. The C header
//! the module includes (`mtgdrdrv/kmod/mtgdrdrv_ioctl.h`) is generated from it by
//! `cargo xtask codegen`; a test fails when that header is stale.
//!
//! Numbers and layouts are frozen to upstream gdrdrv's (magic 0xDA, same command numbers and
//! struct layouts), including its quirk of encoding a pointer type in seven of the nine `_IOWR`
//! macros, so that the encoded size is `sizeof(void *)` rather than the struct size.
#![no_std]

pub mod abi;
pub mod procfs;
pub mod version;

pub use abi::*;
pub use version::*;
