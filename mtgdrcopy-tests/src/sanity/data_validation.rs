//! Data through the mapping: upstream's `data_validation_*` checks (CPU stores, the copy
//! routines, every offset on either side), and the mapping types mtgpu has (WC and DEVICE;
//! CACHING is refused).

use std::ffi::c_int;

use anyhow::{ensure, Result};
use nix::errno::Errno;

use super::support::*;
use super::{note, Ctx};
use crate::gdr::{self, gdr_mh_t};

/// Rounds of upstream's check 1 (CPU stores through the mapping, read back by the driver).
const CHECK1_ROUNDS: usize = 100;
/// Offsets of checks 4-9, in dwords and in bytes.
const OFFSETS: [usize; 10] = [1, 2, 3, 4, 5, 6, 7, 11, 129, 1023];
/// What device memory is reset to between checks.
const FILL: u8 = 0xA5;

#[derive(Clone, Copy)]
enum Pin {
    V1,
    V2,
}

/// The full data validation of a 320 KiB buffer pinned with gdr_pin_buffer and mapped WC.
pub fn data_validation_mumemalloc(ctx: &Ctx) -> Result<()> {
    data_validation(ctx, Pin::V1, None)
}

/// The full data validation of a 320 KiB buffer pinned with gdr_pin_buffer_v2 and mapped WC.
pub fn data_validation_v2_mumemalloc(ctx: &Ctx) -> Result<()> {
    data_validation(ctx, Pin::V2, None)
}

/// Data validation with GDR_PIN_FLAG_FORCE_PCIE: mtgpu has no such mode, so the attribute
/// reads 0 and the pin fails with EINVAL, pinning nothing (upstream waives the case there).
pub fn data_validation_v2_forcepci_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    super::basic::force_pcie_refused(&gdr, &buf)?;
    Ok(gdr.close()?)
}

/// GDR_MAP_FLAG_REQ_CACHE_MAPPING is refused with EOPNOTSUPP (BAR memory is not coherent) and
/// leaves the handle mappable; a DEVICE (uncached) mapping then passes the full data
/// validation.
pub fn data_validation_device_mapping_mumemalloc(ctx: &Ctx) -> Result<()> {
    data_validation(ctx, Pin::V2, Some(MAP_FLAG_DEVICE))
}

fn data_validation(ctx: &Ctx, pin: Pin, map_flags: Option<c_int>) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let size = buf.size;
    buf.fill(FILL)?;
    let init = walking_bit(size);
    let gdr = Gdr::open()?;
    if map_flags == Some(MAP_FLAG_DEVICE) {
        module_backend_or_skip(&gdr, "a per-map device mapping")?;
    }
    let mh = match pin {
        Pin::V1 => gdr.pin(buf.ptr, size)?,
        Pin::V2 => gdr.pin_v2(buf.ptr, size, 0)?,
    };
    ensure!(mh.h != 0, "null handle");
    let info = gdr.info(mh)?;
    ensure!(
        info.flags & INFO_MAPPED == 0 && info.mapping_type == MAPPING_TYPE_NONE,
        "info says mapped before gdr_map: {info:?}"
    );

    let (bar, expected_type) = match map_flags {
        None => (gdr.map(mh, size)?, MAPPING_TYPE_WC),
        Some(flags) => {
            expect_errno(
                gdr.map_v2(mh, size, MAP_FLAG_CACHE),
                Errno::EOPNOTSUPP,
                "gdr_map_v2(GDR_MAP_FLAG_REQ_CACHE_MAPPING)",
            )?;
            (gdr.map_v2(mh, size, flags)?, MAPPING_TYPE_DEVICE)
        }
    };
    let info = gdr.info(mh)?;
    let wc_bit = if expected_type == MAPPING_TYPE_WC {
        INFO_WC_MAPPING
    } else {
        0
    };
    ensure!(
        info.flags & (INFO_MAPPED | INFO_WC_MAPPING) == INFO_MAPPED | wc_bit
            && info.mapping_type == expected_type,
        "info after gdr_map: {info:?}; expected mapped, type {}",
        gdr::mapping_type_name(gdr::api()?, expected_type)
    );
    note!(
        "mapped {size} bytes at {bar:?}, {}",
        gdr::mapping_type_name(gdr::api()?, info.mapping_type)
    );
    let off = (buf.ptr - info.va) as usize;
    // SAFETY: `off` is 0 (the pin starts on the granule) and the mapping covers `size` bytes.
    let map = unsafe { bar.add(off) };
    let v = Validator {
        gdr: &gdr,
        mh,
        map,
        buf: &buf,
    };

    note!(
        "check 1: CPU stores through the mapping, read back by the driver ({CHECK1_ROUNDS} rounds)"
    );
    for round in 0..CHECK1_ROUNDS {
        // SAFETY: the mapping covers `size` bytes from `map`, which is page aligned.
        unsafe { store_words(map, &init) };
        v.expect_device(&format!("check 1, round {round}"), 0, &init)?;
        buf.fill(FILL)?;
    }

    note!("check 2: gdr_copy_to_mapping, read back by the driver");
    gdr.copy_to(mh, map, &init)?;
    v.expect_device("check 2", 0, &init)?;
    buf.fill(FILL)?;

    note!("check 3: gdr_copy_to_mapping, read back with gdr_copy_from_mapping");
    v.round_trip("check 3", 0, 0, &init)?;

    for (unit, unit_name) in [(4, "dwords"), (1, "bytes")] {
        for (check, place) in [(4, "mapping"), (6, "host buffer"), (8, "both")] {
            let check = if unit == 4 { check } else { check + 1 };
            note!("check {check}: offsets in {unit_name} on the {place}");
            for (i, n) in OFFSETS.iter().enumerate() {
                let o = n * unit;
                let dev = if place == "host buffer" { 0 } else { o };
                let host = if place == "mapping" { 0 } else { o };
                let what = format!("check {check}.{i}: {n} {unit_name} offset on the {place}");
                v.round_trip(&what, dev, host, &init)?;
            }
        }
    }

    gdr.unmap(mh, bar, size)?;
    let info = gdr.info(mh)?;
    ensure!(
        info.flags & INFO_MAPPED == 0,
        "info says mapped after gdr_unmap: {info:?}"
    );
    gdr.unpin(mh)?;
    Ok(gdr.close()?)
}

/// One mapped buffer and the ways to check data through it.
struct Validator<'a> {
    gdr: &'a Gdr,
    mh: gdr_mh_t,
    map: *mut u8,
    buf: &'a DevBuf<'a>,
}

impl Validator<'_> {
    /// The driver reads `expected` at `offset` of the buffer.
    fn expect_device(&self, what: &str, offset: usize, expected: &[u8]) -> Result<()> {
        let got = self.buf.read(offset, expected.len())?;
        compare(&format!("{what} (read back by the driver)"), expected, &got)
    }

    /// Copies `init[host..]` to the mapping at `dev`, reads it back into a host buffer at
    /// `host` and through the driver, then resets device memory.
    fn round_trip(&self, what: &str, dev: usize, host: usize, init: &[u8]) -> Result<()> {
        let len = self.buf.size - dev.max(host);
        let src = &init[host..host + len];
        // SAFETY: `dev` < size, inside the mapping.
        let at = unsafe { self.map.add(dev) };
        self.gdr.copy_to(self.mh, at, src)?;
        let mut copy = vec![FILL; self.buf.size];
        self.gdr
            .copy_from(self.mh, &mut copy[host..host + len], at)?;
        compare(
            &format!("{what} (gdr_copy_from_mapping)"),
            src,
            &copy[host..host + len],
        )?;
        self.expect_device(what, dev, src)?;
        self.buf.fill(FILL)
    }
}

/// One buffer pinned twice, mapped write-combined through one handle and uncached (DEVICE)
/// through the other (CACHING is refused with EOPNOTSUPP): data written through either
/// mapping, by the copy routines or by CPU stores, reads back through the other and through
/// the driver.
pub fn data_validation_mix_mappings_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let size = buf.size;
    buf.fill(FILL)?;
    let gdr = Gdr::open()?;
    module_backend_or_skip(&gdr, "mixing mapping types per map")?;
    let wc_mh = gdr.pin(buf.ptr, size)?;
    let dev_mh = gdr.pin(buf.ptr, size)?;
    expect_errno(
        gdr.map_v2(dev_mh, size, MAP_FLAG_CACHE),
        Errno::EOPNOTSUPP,
        "gdr_map_v2(GDR_MAP_FLAG_REQ_CACHE_MAPPING)",
    )?;
    // DEVICE first: with x86 PAT a page takes the memory type it is already reserved with, so a
    // DEVICE mapping of pages a WC mapping holds comes out write-combined, which the module
    // reports and the library then refuses as not what was asked (EINVAL).
    let dev = gdr.map_v2(dev_mh, size, MAP_FLAG_DEVICE)?;
    let wc = gdr.map_v2(wc_mh, size, MAP_FLAG_WC)?;
    for (mh, want) in [(wc_mh, MAPPING_TYPE_WC), (dev_mh, MAPPING_TYPE_DEVICE)] {
        let t = gdr.info(mh)?.mapping_type;
        let api = gdr::api()?;
        ensure!(
            t == want,
            "mapping type {} ({t}), requested {}",
            gdr::mapping_type_name(api, t),
            gdr::mapping_type_name(api, want)
        );
    }

    let a = walking_bit(size);
    let b: Vec<u8> = a.iter().map(|x| !x).collect();
    let mut back = vec![0u8; size];

    note!("write through WC, read through DEVICE");
    gdr.copy_to(wc_mh, wc, &a)?;
    gdr.copy_from(dev_mh, &mut back, dev)?;
    compare("written WC, read DEVICE", &a, &back)?;
    compare("written WC, read by the driver", &a, &buf.read(0, size)?)?;

    note!("write through DEVICE, read through WC");
    gdr.copy_to(dev_mh, dev, &b)?;
    gdr.copy_from(wc_mh, &mut back, wc)?;
    compare("written DEVICE, read WC", &b, &back)?;
    compare(
        "written DEVICE, read by the driver",
        &b,
        &buf.read(0, size)?,
    )?;

    note!("CPU stores through DEVICE, then through WC");
    // SAFETY: both mappings cover `size` bytes and are page aligned.
    unsafe { store_words(dev, &a) };
    gdr.copy_from(wc_mh, &mut back, wc)?;
    compare("stored DEVICE, read WC", &a, &back)?;
    // SAFETY: as above.
    unsafe { store_words(wc, &b) };
    gdr.copy_from(dev_mh, &mut back, dev)?;
    compare("stored WC, read DEVICE", &b, &back)?;

    gdr.unmap(wc_mh, wc, size)?;
    gdr.unmap(dev_mh, dev, size)?;
    gdr.unpin(wc_mh)?;
    gdr.unpin(dev_mh)?;
    Ok(gdr.close()?)
}
