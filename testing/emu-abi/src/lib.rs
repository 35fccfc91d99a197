//! The emulated mtgpu provider's char device, `/dev/mtgpu_emu`: its ioctl ABI and the one client
//! every user shares (the tools' emulator-only checks, the in-VM tests, the emulated libmusa and
//! the fuzzer, which adds only its raw hostile calls through [`Emu::fd`]).
//!
//! The emulator is a test-only kernel module (testing/mtgpu-emu) that stands in for the mtgpu
//! driver; nothing here is installed by the production packages' libraries.

pub mod abi;
mod client;

pub use abi::*;
pub use client::{device_path, Emu, FaultKind, Stats, LIVE_STATS, PAGE_SIZES};
pub use nix::errno::Errno;
