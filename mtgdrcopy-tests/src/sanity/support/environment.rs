//! What this run has: which backend `gdr_open` picked, and whether the emulated provider is
//! there (only tools built with the `emulator` feature drive it); skips for the cases that need
//! the other.

use anyhow::Result;

use super::{Gdr, ATTR_USING_DMA_BUF_MMAP};
use crate::sanity::skip;

/// Whether `gdr` is libgdrapi's dma-buf backend (`GDR_ATTR_USING_DMA_BUF_MMAP`).
pub fn dma_buf_backend(gdr: &Gdr) -> Result<bool> {
    Ok(gdr.attribute(ATTR_USING_DMA_BUF_MMAP)? == 1)
}

/// A skip when `gdr` is the dma-buf backend, for cases about what only the module does.
pub fn module_backend_or_skip(gdr: &Gdr, what: &str) -> Result<()> {
    if dma_buf_backend(gdr)? {
        skip!("{what} is about the mtgdrdrv module; this run uses the dma-buf backend");
    }
    Ok(())
}

/// The emulated provider, or a skip for hardware runs.
#[cfg(feature = "emulator")]
pub fn emulator_or_skip(what: &str) -> Result<mtgpu_emu_abi::Emu> {
    let path = mtgpu_emu_abi::device_path();
    if !std::path::Path::new(&path).exists() {
        skip!("{what} needs the emulated provider ({path}); not available on MUSA hardware");
    }
    mtgpu_emu_abi::Emu::open().map_err(|e| anyhow::anyhow!("opening {path}: {e}"))
}

/// Whether the run uses the emulated provider.
#[cfg(feature = "emulator")]
pub fn emulated() -> bool {
    std::path::Path::new(&mtgpu_emu_abi::device_path()).exists()
}

/// Built without the `emulator` feature (the packages), the tools cannot drive the emulated
/// provider, so they run as on hardware wherever they are.
#[cfg(not(feature = "emulator"))]
pub fn emulated() -> bool {
    false
}
