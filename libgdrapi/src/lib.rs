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
//! Beside them: the values all layers pass (`types`), page arithmetic and the GPU page
//! (`pages`), the versions (`version`), the handle registry that makes copies safe against
//! concurrent unmaps (`handles`).
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
mod version;

pub use backend::module::DEVICE_PATH;
pub use backend::USE_DMABUF_ENV;
pub use error::{Error, Result};
pub use gdr::{Gdr, Mapping, PinnedBuffer};
pub use pages::{GPU_PAGE_SHIFT, GPU_PAGE_SIZE};
pub use types::{Attribute, Info, MapRequest, MappingType, PinFlags};
pub use version::{
    GDR_API_MAJOR_VERSION, GDR_API_MINOR_VERSION, GDR_API_VERSION, MINIMUM_GDRDRV_MAJOR_VERSION,
    MINIMUM_GDRDRV_MINOR_VERSION, MINIMUM_GDRDRV_VERSION, VERSION,
};
