//! The dma-buf backend's own cases: each pin holds one dma-buf fd, which unpin and gdr_close
//! close; unmap, unpin, free and close in every order leave nothing behind; a forked child
//! inherits neither mappings nor the right to copy; the documented differences from the module
//! backend (host-page granule, mapping type fixed at pin, no driver version); a refused mmap.
//!
//! Each case forces the backend itself (`GDRCOPY_USE_DMABUF_MMAP=1`, set in its own process
//! before it opens anything), so they run whether mtgdrdrv is loaded or not. They need the
//! emulated provider: its counters of live dma-bufs and their mappings are the oracle.

use std::ffi::c_int;

use anyhow::{ensure, Context, Result};
use nix::errno::Errno;

use super::support::*;
use super::{note, Ctx};
use mtgpu_emu_abi::Emu;

/// Forces the dma-buf backend in this (single-threaded) case process; `emu_mode` is the
/// emulated libmusa's `MTGPU_EMU_DMABUF`. Returns the emulator, or skips on hardware.
fn dma_buf_case(what: &str, emu_mode: &str) -> Result<Emu> {
    let emu = emulator_or_skip(what)?;
    // The case process is single-threaded here, and nothing has read these yet.
    std::env::set_var(gdrapi::USE_DMABUF_ENV, "1");
    std::env::set_var("MTGPU_EMU_DMABUF", emu_mode);
    Ok(emu)
}

/// Descriptors open in this process.
fn open_fds() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .context("reading /proc/self/fd")?
        .count())
}

/// What a case compares before and after: this process's fds and the emulator's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    fds: usize,
    pins: EmuPins,
}

impl Held {
    fn now(emu: &Emu) -> Result<Held> {
        Ok(Held {
            fds: open_fds()?,
            pins: EmuPins::read(emu)?,
        })
    }

    /// Fails unless `self` is `base` plus `dmabufs` dma-bufs (and fds) and `mappings` mappings.
    fn expect(&self, base: &Held, dmabufs: u64, mappings: u64, what: &str) -> Result<()> {
        let want = Held {
            fds: base.fds + dmabufs as usize,
            pins: EmuPins {
                page_tables: base.pins.page_tables,
                dmabufs: base.pins.dmabufs + dmabufs,
                dmabuf_mappings: base.pins.dmabuf_mappings + mappings,
            },
        };
        ensure!(*self == want, "{what}: {self:?}, expected {want:?}");
        Ok(())
    }
}

fn open_dma_buf_gdr() -> Result<Gdr> {
    let gdr = Gdr::open()?;
    ensure!(
        dma_buf_backend(&gdr)?,
        "GDRCOPY_USE_DMABUF_MMAP=1 did not select the dma-buf backend"
    );
    Ok(gdr)
}

/// One fd per pin: pin adds a dma-buf and a descriptor, map a mapping; unmap removes the
/// mapping, unpin the descriptor and (with it) the dma-buf. Data goes both ways meanwhile.
pub fn dmabuf_fd_closed_on_unpin(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("the dma-buf fd lifetime", "on")?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = open_dma_buf_gdr()?;
    let base = Held::now(&emu)?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    Held::now(&emu)?.expect(&base, 1, 0, "after pin")?;
    let map = gdr.map(mh, buf.size)?;
    Held::now(&emu)?.expect(&base, 1, 1, "after map")?;
    let data = walking_bit(buf.size);
    gdr.copy_to(mh, map, &data)?;
    compare(
        "device memory written through the dma-buf",
        &data,
        &buf.read(0, buf.size)?,
    )?;
    let mut back = vec![0u8; buf.size];
    gdr.copy_from(mh, &mut back, map)?;
    compare("read back through the dma-buf", &data, &back)?;
    gdr.unmap(mh, map, buf.size)?;
    Held::now(&emu)?.expect(&base, 1, 0, "after unmap")?;
    gdr.unpin(mh)?;
    Held::now(&emu)?.expect(&base, 0, 0, "after unpin")?;
    Ok(gdr.close()?)
}

/// gdr_close with pins left, mapped and not: every dma-buf fd is closed and every mapping
/// removed.
pub fn dmabuf_fd_closed_on_gdr_close(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("the dma-buf fd lifetime", "on")?;
    let gpu = ctx.gpu()?;
    let bufs = [
        DevBuf::aligned(&*gpu, SMALL_SIZE)?,
        DevBuf::aligned(&*gpu, DATA_SIZE)?,
        DevBuf::new(&*gpu, SMALL_SIZE)?,
    ];
    let base = Held::now(&emu)?;
    let gdr = open_dma_buf_gdr()?;
    let opened = Held::now(&emu)?;
    ensure!(
        opened.pins == base.pins,
        "gdr_open created dma-bufs: {opened:?}"
    );
    let mut handles = Vec::new();
    for b in &bufs {
        handles.push(gdr.pin(b.ptr, b.size)?);
    }
    for (mh, b) in handles.iter().zip(&bufs).take(2) {
        let map = gdr.map(*mh, b.size)?;
        gdr.copy_to(*mh, map, &walking_bit(b.size))?;
    }
    let held = Held::now(&emu)?;
    held.expect(&opened, 3, 2, "three pins, two mapped")?;
    gdr.close()?;
    Held::now(&emu)?.expect(&base, 0, 0, "after gdr_close")?;
    Ok(())
}

/// Every order of unmap, unpin, free and close: unpin while mapped unmaps first; freeing the
/// allocation while its dma-buf lives keeps the memory (and the data) until the last of the
/// dma-buf goes; gdr_close after a free releases it all.
pub fn dmabuf_close_ordering(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("dma-buf close ordering", "on")?;
    let gpu = ctx.gpu()?;
    let gdr = open_dma_buf_gdr()?;
    let base = Held::now(&emu)?;
    let stats0 = emu.stats().map_err(|e| anyhow::anyhow!("stats: {e}"))?;

    // Unpin while mapped.
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    let map = gdr.map(mh, buf.size)?;
    gdr.unpin(mh)?;
    Held::now(&emu)?.expect(&base, 0, 0, "unpin while mapped")?;
    expect_errno(
        gdr.copy_to(mh, map, &[1, 2, 3, 4]),
        Errno::EINVAL,
        "copy through an unpinned handle",
    )?;
    drop(buf);

    // Free while pinned and mapped: the data stays, the memory goes with the dma-buf.
    for close_instead in [false, true] {
        let gdr2 = open_dma_buf_gdr()?;
        let mut buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
        let mh = gdr2.pin(buf.ptr, buf.size)?;
        let map = gdr2.map(mh, buf.size)?;
        let data = walking_bit(buf.size);
        gdr2.copy_to(mh, map, &data)?;
        buf.free()?;
        let stats = emu.stats().map_err(|e| anyhow::anyhow!("stats: {e}"))?;
        ensure!(
            stats.freed_while_exported > stats0.freed_while_exported,
            "the free was not counted as freed while exported: {stats:?}"
        );
        let mut back = vec![0u8; buf.size];
        gdr2.copy_from(mh, &mut back, map)?;
        compare("data after the allocation was freed", &data, &back)?;
        if close_instead {
            gdr2.close()?;
        } else {
            gdr2.unmap(mh, map, buf.size)?;
            gdr2.unpin(mh)?;
            gdr2.close()?;
        }
        Held::now(&emu)?.expect(&base, 0, 0, "after releasing the freed buffer")?;
        let stats = emu.stats().map_err(|e| anyhow::anyhow!("stats: {e}"))?;
        ensure!(
            stats.allocations == stats0.allocations
                && stats.bytes_allocated == stats0.bytes_allocated,
            "the freed allocation outlived its dma-buf (close: {close_instead}): {stats:?}, \
             before {stats0:?}"
        );
    }
    Ok(gdr.close()?)
}

/// Fork: the child inherits the handle but no mapping (copies fail with EINVAL), and its
/// gdr_close closes only its own copies of the fds; the parent's pin, mapping and data are
/// untouched, and nothing is left once the parent closes.
pub fn dmabuf_fork(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("dma-buf fork", "on")?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let base = Held::now(&emu)?;
    let gdr = open_dma_buf_gdr()?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    let map = gdr.map(mh, buf.size)?;
    let v = token_value(9);
    // SAFETY: offset 0 of a live mapping.
    unsafe { store_u32(map, v) };
    let pinned = Held::now(&emu)?;
    let end = in_helper("child", || {
        let mut word = [0u8; 4];
        expect_errno(
            gdr.copy_from(mh, &mut word, map),
            Errno::EINVAL,
            "child's copy through the parent's mapping",
        )?;
        let mappings = EmuPins::read(&emu)?.dmabuf_mappings;
        ensure!(
            mappings == pinned.pins.dmabuf_mappings,
            "the child inherited the mapping: {mappings} mappings"
        );
        let before = open_fds()?;
        // SAFETY: this forked child does not use its copy afterwards.
        unsafe { gdr.close_inherited() }?;
        let after = open_fds()?;
        ensure!(
            after + 1 == before,
            "the child's gdr_close left its copy of the dma-buf fd ({before} -> {after} fds)"
        );
        Ok(0)
    })?;
    end.expect_success("the child")?;
    Held::now(&emu)?.expect(&base, 1, 1, "parent after the child")?;
    // SAFETY: offset 0 of the parent's live mapping.
    let got = unsafe { load_u32(map) };
    ensure!(
        got == v,
        "parent read {got:#x} after the fork, wrote {v:#x}"
    );
    let mut word = [0u8; 4];
    gdr.copy_from(mh, &mut word, map)?;
    ensure!(
        u32::from_le_bytes(word) == v,
        "parent's copy after the fork"
    );
    gdr.close()?;
    Held::now(&emu)?.expect(&base, 0, 0, "after the parent's gdr_close")?;
    Ok(())
}

/// The host-page granule: a pin at any address is rounded to host pages; it maps when the
/// address is host-page aligned (not only 64 KiB aligned, as the module needs), else EINVAL.
pub fn dmabuf_host_page_granule(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("the dma-buf pin granule", "on")?;
    let page = host_page();
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, 4 * page.max(GPU_PAGE))?;
    buf.fill(0)?;
    let gdr = open_dma_buf_gdr()?;
    let base = Held::now(&emu)?;
    for (offset, len) in [(100usize, 1000usize), (page, 3 * page - 8), (2 * page, 1)] {
        let addr = buf.ptr + offset as u64;
        let mh = gdr.pin(addr, len)?;
        let info = gdr.info(mh)?;
        let want_va = addr & !(page as u64 - 1);
        let want_size = round_up(offset % page + len, page) as u64;
        ensure!(
            info.va == want_va && info.mapped_size == want_size && info.page_size as usize == page,
            "pin of {len} bytes at +{offset}: {info:?}, expected va {want_va:#x} size \
             {want_size:#x} page {page}"
        );
        if offset % page != 0 {
            expect_errno(
                gdr.map(mh, len),
                Errno::EINVAL,
                "gdr_map of a pin off the host page",
            )?;
        } else {
            let map = gdr.map(mh, len)?;
            let pattern = walking_bit(len);
            gdr.copy_to(mh, map, &pattern)?;
            compare(
                &format!("{len} bytes written at +{offset}"),
                &pattern,
                &buf.read(offset, len)?,
            )?;
            gdr.unmap(mh, map, len)?;
        }
        gdr.unpin(mh)?;
        note!("pin at +{offset} of {len} bytes: va {:#x}", info.va);
    }
    Held::now(&emu)?.expect(&base, 0, 0, "after the pins")?;
    Ok(gdr.close()?)
}

/// What differs from the module backend: the mapping type is fixed at pin
/// (write-combining; cache and device requests fail with EINVAL), the callback flag is 0,
/// mappings are persistent, FORCE_PCIE is refused, and there is no driver version.
pub fn dmabuf_backend_differences(ctx: &Ctx) -> Result<()> {
    let _emu = dma_buf_case("the dma-buf backend's attributes", "on")?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let gdr = open_dma_buf_gdr()?;
    for (attr, want, name) in [
        (ATTR_USING_DMA_BUF_MMAP, 1, "USING_DMA_BUF_MMAP"),
        (ATTR_USE_PERSISTENT_MAPPING, 1, "USE_PERSISTENT_MAPPING"),
        (
            ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE,
            0,
            "SUPPORT_PIN_FLAG_FORCE_PCIE",
        ),
    ] {
        let got = gdr.attribute(attr)?;
        ensure!(got == want, "{name} is {got}, expected {want}");
    }
    expect_errno(
        gdr.driver_version(),
        Errno::EOPNOTSUPP,
        "gdr_driver_get_version",
    )?;
    expect_errno(
        gdr.pin_v2(buf.ptr, buf.size, PIN_FLAG_FORCE_PCIE),
        Errno::EINVAL,
        "pin with FORCE_PCIE",
    )?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    ensure!(gdr.callback_flag(mh)? == 0, "callback flag");
    for flag in [MAP_FLAG_CACHE, MAP_FLAG_DEVICE] {
        expect_errno(
            gdr.map_v2(mh, buf.size, flag),
            Errno::EINVAL,
            &format!("map with flag {flag}"),
        )?;
    }
    let map = gdr.map_v2(mh, buf.size, MAP_FLAG_WC)?;
    let info = gdr.info(mh)?;
    ensure!(
        info.mapping_type == MAPPING_TYPE_WC as c_int
            && info.flags & (INFO_MAPPED | INFO_WC_MAPPING) == INFO_MAPPED | INFO_WC_MAPPING
            && info.tm_cycles == 0
            && info.cycles_per_ms == 0,
        "info of a mapped pin: {info:?}"
    );
    expect_errno(
        gdr.map(mh, buf.size),
        Errno::EAGAIN,
        "a second map of the same handle",
    )?;
    gdr.unmap(mh, map, buf.size)?;
    ensure!(
        gdr.info(mh)?.mapping_type == MAPPING_TYPE_NONE,
        "mapping type after unmap"
    );
    gdr.unpin(mh)?;
    Ok(gdr.close()?)
}

/// A dma-buf that refuses CPU mmap (as mtgpu's might): pin works, gdr_map fails with the
/// kernel's errno (EINVAL) and the library logs one line saying so; nothing is left behind.
pub fn dmabuf_refused_mmap(ctx: &Ctx) -> Result<()> {
    let emu = dma_buf_case("a refused dma-buf mmap", "no-mmap")?;
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, SMALL_SIZE)?;
    let gdr = open_dma_buf_gdr()?;
    let base = Held::now(&emu)?;
    let mh = gdr.pin(buf.ptr, buf.size)?;
    expect_errno(
        gdr.map(mh, buf.size),
        Errno::EINVAL,
        "map of a no-mmap dma-buf",
    )?;
    ensure!(
        gdr.info(mh)?.mapping_type == MAPPING_TYPE_NONE,
        "a refused map left the handle mapped"
    );
    gdr.unpin(mh)?;
    Held::now(&emu)?.expect(&base, 0, 0, "after unpin")?;
    Ok(gdr.close()?)
}

/// A driver whose devices do not support dma-buf: gdr_open fails with EOPNOTSUPP when the
/// dma-buf backend is forced.
pub fn dmabuf_unsupported_device(ctx: &Ctx) -> Result<()> {
    let _emu = dma_buf_case("a device without dma-buf", "off")?;
    let _gpu = ctx.gpu()?;
    match Gdr::try_open()? {
        Ok(_) => anyhow::bail!("gdr_open succeeded with a device that cannot export dma-bufs"),
        Err(e) => ensure!(
            e.errno == Errno::EOPNOTSUPP,
            "gdr_open failed with {e}; expected EOPNOTSUPP"
        ),
    }
    Ok(())
}
