//! Support for the mtgdrcopy test programs: the gdrapi C API loaded from the shared library,
//! the GPU backend (MUSA's driver API, loaded at run time), and the emulator client used by the
//! in-VM tests.

pub mod bench;
pub mod cli;
pub mod doctor;
pub mod gdr;
pub mod gpu;
pub mod musa;
pub mod sanity;
pub mod status;
pub mod term;
pub mod tool;
mod vmm;
