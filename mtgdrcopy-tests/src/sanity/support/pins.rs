//! What is pinned system-wide: the module's counters (`/proc/driver/mtgdrdrv/counters`) and,
//! in the test suite's tools (feature `emulator`), the emulator's, taken together as a snapshot
//! to compare with after a case.

use anyhow::{ensure, Context, Result};

#[cfg(feature = "emulator")]
use super::emulated;
#[cfg(feature = "emulator")]
use mtgpu_emu_abi::Emu;

pub use mtgdrdrv::procfs::COUNTERS_PATH;

/// `/proc/driver/mtgdrdrv/counters`: pins, pinned bytes and mappings outstanding system-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    pub pins_outstanding: i64,
    pub bytes_pinned: i64,
    pub mappings: i64,
}

impl Counters {
    pub fn read() -> Result<Counters> {
        let text = std::fs::read_to_string(COUNTERS_PATH)
            .with_context(|| format!("reading {COUNTERS_PATH}"))?;
        let get = |name: &str| -> Result<i64> {
            mtgdrdrv::procfs::counter(&text, name)
                .with_context(|| format!("{COUNTERS_PATH} has no {name} line"))
        };
        Ok(Counters {
            pins_outstanding: get("pins_outstanding")?,
            bytes_pinned: get("bytes_pinned")?,
            mappings: get("mappings")?,
        })
    }
}

/// What is pinned system-wide: the module's counters (when it is loaded) and, on the
/// emulator, its page tables, live dma-bufs and their mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinSnapshot {
    module: Option<Counters>,
    #[cfg(feature = "emulator")]
    emulator: Option<EmuPins>,
}

/// The emulator's counters of what holds its memory.
#[cfg(feature = "emulator")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuPins {
    pub page_tables: u64,
    pub dmabufs: u64,
    pub dmabuf_mappings: u64,
}

#[cfg(feature = "emulator")]
impl EmuPins {
    pub fn read(emu: &Emu) -> Result<EmuPins> {
        let stats = emu
            .stats()
            .map_err(|e| anyhow::anyhow!("emulator stats: {e}"))?;
        Ok(EmuPins {
            page_tables: stats.pins_outstanding,
            dmabufs: stats.dmabufs_live,
            dmabuf_mappings: stats.dmabuf_mappings,
        })
    }
}

impl PinSnapshot {
    pub fn take() -> Result<PinSnapshot> {
        #[cfg(feature = "emulator")]
        let emulator = if emulated() {
            let emu = Emu::open().map_err(|e| anyhow::anyhow!("opening the emulator: {e}"))?;
            Some(EmuPins::read(&emu)?)
        } else {
            None
        };
        let module = if std::path::Path::new(COUNTERS_PATH).exists() {
            Some(Counters::read()?)
        } else {
            None
        };
        Ok(PinSnapshot {
            module,
            #[cfg(feature = "emulator")]
            emulator,
        })
    }

    /// Fails unless nothing more (or less) is pinned or mapped than in `self`.
    pub fn expect_same(&self, what: &str) -> Result<()> {
        let now = PinSnapshot::take()?;
        ensure!(now == *self, "{what}: pins went from {self:?} to {now:?}");
        Ok(())
    }
}
