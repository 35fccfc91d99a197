//! Support for the mtgdrcopy test programs: GPU memory backends and helpers shared by the
//! sanity, bandwidth, latency and API-performance tools.

pub mod emu;
