//! libgdrapi: CPU load/store access to pinned Moore Threads GPU memory.
//!
//! A process pins MUSA device memory through the `mtgdrdrv` kernel module (or, without it, as a
//! dma-buf exported by the MUSA driver), maps the BAR pages backing it write-combined, and
//! reads and writes them with plain CPU accesses.
//!
//! Layers, each talking only to the next:
//! - [`capi`]: the gdrapi.h C ABI, a thin shim (null checks, panic guard, handle table, errno);
//! - [`Gdr`], [`PinnedBuffer`], [`Mapping`]: the safe Rust API whose lifetimes make
//!   unmap-before-unpin and use-after-unmap impossible;
//! - `backend`: the interface of the two backends and the choice at open (`backend::choose`),
//!   each backend with its implementation:
//!   - `backend::module`: ioctls and mmap over `/dev/mtgdrdrv`;
//!   - `backend::dmabuf`: no kernel module; the MUSA driver's dma-buf of each pin is mmapped;
//! - [`copy`]: the copy routines, one variant per CPU feature level.
//!
//! Beside them: the values all layers pass (`types`), page arithmetic (`pages`), the handle
//! registry that makes copies safe against concurrent unmaps (`handles`).
//!
//! Unlike upstream GDRCopy, an open device is safe to use from many threads at once.

mod backend;
pub mod capi;
pub mod copy;
mod error;
mod gdr;
mod handles;
pub mod log;
pub mod musa;
mod pages;
mod types;

pub use backend::module::DEVICE_PATH;
pub use backend::USE_DMABUF_ENV;
pub use error::{Error, Result};
pub use gdr::{Gdr, Mapping, PinnedBuffer};
pub use types::{Attribute, Info, MapRequest, MappingType, PinFlags};

/// Library version, `major << 16 | minor` as exchanged with the driver: this crate's
/// major.minor (libgdrapi/Cargo.toml).
pub const GDR_API_MAJOR_VERSION: u32 = mtgdrdrv::version_part(env!("CARGO_PKG_VERSION_MAJOR"));
pub const GDR_API_MINOR_VERSION: u32 = mtgdrdrv::version_part(env!("CARGO_PKG_VERSION_MINOR"));
pub const GDR_API_VERSION: u32 = mtgdrdrv::pack(GDR_API_MAJOR_VERSION, GDR_API_MINOR_VERSION);

/// The oldest driver this library works with.
pub const MINIMUM_GDRDRV_MAJOR_VERSION: u32 = 0;
pub const MINIMUM_GDRDRV_MINOR_VERSION: u32 = 1;
pub const MINIMUM_GDRDRV_VERSION: u32 =
    mtgdrdrv::pack(MINIMUM_GDRDRV_MAJOR_VERSION, MINIMUM_GDRDRV_MINOR_VERSION);

// The compatibility promise, for this release's pair: the library accepts the driver built from
// the same tree, and the driver accepts the library (same major, minor at least the minimum).
const _: () = assert!(
    mtgdrdrv::accepts(MINIMUM_GDRDRV_VERSION, mtgdrdrv::MTGDRDRV_VERSION),
    "libgdrapi's MINIMUM_GDRDRV_* refuse this tree's driver (mtgdrdrv/Cargo.toml)"
);
const _: () = assert!(
    mtgdrdrv::accepts(mtgdrdrv::MINIMUM_GDR_API_VERSION, GDR_API_VERSION),
    "mtgdrdrv's MINIMUM_GDR_API_* refuse this tree's library (libgdrapi/Cargo.toml)"
);

/// The GPU page: pins are rounded to it, like upstream's, so `info.va` keeps its meaning.
/// The package version, which names the shared library file (`libgdrapi.so.<VERSION>`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub const GPU_PAGE_SHIFT: u32 = 16;
pub const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;

const _: () = assert!(
    GDR_API_MAJOR_VERSION == 1,
    "the soname (build.rs) follows the major"
);

#[cfg(test)]
mod tests {
    #[test]
    fn package_version_matches_the_api_version() {
        let expected = format!(
            "{}.{}.",
            super::GDR_API_MAJOR_VERSION,
            super::GDR_API_MINOR_VERSION
        );
        assert!(
            super::VERSION.starts_with(&expected),
            "{} vs {expected}",
            super::VERSION
        );
    }
}
