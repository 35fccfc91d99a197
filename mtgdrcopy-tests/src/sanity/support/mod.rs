//! What the cases share: a thin wrapper over the gdrapi C API (errno results, close on drop,
//! `capi`), device buffers (`devbuf`), upstream's walking-bit pattern, buffer comparison and
//! raw accesses through a mapping (`data`), the module's counters (`pins`), the backend and
//! provider of the run (`environment`), forked helper processes and pipes between them
//! (`process`); buffer sizes here. The cases import it all with `use super::support::*`.

mod capi;
mod data;
mod devbuf;
mod environment;
mod pins;
mod process;

pub use capi::*;
pub use data::*;
pub use devbuf::*;
pub use environment::*;
pub use pins::*;
pub use process::*;

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * KIB;
/// The 64 KiB GPU page pins are rounded to first (gdrapi.h `GPU_PAGE_SIZE`).
pub const GPU_PAGE: usize = gdrapi::GPU_PAGE_SIZE as usize;
/// Upstream's data buffer: 256 KiB + 16 bytes, rounded up to the GPU page (320 KiB).
pub const DATA_SIZE: usize = round_up(256 * KIB + 16, GPU_PAGE);
/// Upstream's small buffer: 16 ints, rounded up to the GPU page.
pub const SMALL_SIZE: usize = round_up(16 * 4, GPU_PAGE);

pub const fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// The host page size.
pub fn host_page() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(4096)
}
