//! mtgdrdrv against the provider as the vendor driver really behaves (issue 15): both entry-0
//! conventions, both entry-count formulas, per-allocation contiguity, sparse memory, bad
//! tables, chunked pins, refusals that cost one provider call, the put outside mmap_lock, the
//! pin limit and exec without O_CLOEXEC. The emulator's generation switches are module
//! parameters, restored by [`ProviderMode`] when a test ends.

use super::*;
use mtgpu_emu_abi::{MTGPU_EMU_ALLOC_SPARSE, MTGPU_EMU_PAGE_2M, MTGPU_EMU_PAGE_4K};

const PARAMS: &str = "/sys/module/mtgpu_emu/parameters";

fn set_param(dir: &str, name: &str, value: &str) {
    let path = format!("{dir}/{name}");
    std::fs::write(&path, value).unwrap_or_else(|e| panic!("writing {path}: {e}"));
}

/// The emulator's driver generation for one test; the measured default comes back on drop.
struct ProviderMode;

impl ProviderMode {
    fn set(entry0_page_base: bool, short_count: bool) -> ProviderMode {
        let yn = |b: bool| if b { "Y" } else { "N" };
        set_param(PARAMS, "p2p_entry0_page_base", yn(entry0_page_base));
        set_param(PARAMS, "p2p_short_count", yn(short_count));
        ProviderMode
    }
}

impl Drop for ProviderMode {
    fn drop(&mut self) {
        set_param(PARAMS, "p2p_entry0_page_base", "N");
        set_param(PARAMS, "p2p_short_count", "N");
    }
}

/// The four generations: (entry 0 is a page base, 2.1.2-2.6 entry count).
const GENERATIONS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// The provider's own counters, as deltas from a starting point.
struct Calls {
    get: u64,
    refused: u64,
}

fn provider_calls(emu: &Emu) -> Calls {
    let s = emu.stats().expect("stats");
    Calls {
        get: s.get_pages_calls,
        refused: s.get_pages_refused,
    }
}

/// The 8 MiB chunks mtgdrdrv asks for a pin in.
const CHUNK: u64 = 8 * MIB;

/// get_pages calls a pin of `[start, start + len)` costs: one per 8 MiB chunk, plus one for
/// each chunk whose table a 2.1-2.6 driver returns one entry short (then asked for again).
fn expected_calls(start: u64, len: u64, ps: u64, short: bool) -> u64 {
    let end = start + len;
    let mut va = start;
    let mut calls = 0;
    while va < end {
        let clen = (CHUNK - va % CHUNK).min(end - va);
        let full = (va % ps + clen).div_ceil(ps);
        calls += 1 + u64::from(short && full != clen.div_ceil(ps));
        va += clen;
    }
    calls
}

/// Pins `[va + off, va + off + len)`, maps it and checks every byte against what the emulator
/// holds, then writes through the mapping and reads back by DMA. Returns get_pages calls made.
fn pin_map_check(emu: &Emu, gdr: &Gdr, va: u64, off: u64, len: u64, what: &str) -> u64 {
    let before = provider_calls(emu);
    let pin = gdr
        .pin(va + off, len, PinFlags::DEFAULT)
        .unwrap_or_else(|e| panic!("{what}: pin of {len:#x} at +{off:#x}: {e}"));
    let calls = provider_calls(emu).get - before.get;
    assert_eq!(
        provider_calls(emu).refused,
        before.refused,
        "{what}: no refused call"
    );
    let info = pin.info().expect("info");
    assert_eq!(
        (info.va, info.mapped_size, info.page_size),
        (va + off, len, 4096),
        "{what}: host-page rounding"
    );
    let map = pin.map(MapRequest::Default).expect("map");
    let mut seen = vec![0u8; len as usize];
    map.read(0, &mut seen).expect("read");
    let mut want = vec![0u8; len as usize];
    emu.read(va + off, &mut want).expect("dma read");
    if let Some(i) = (0..seen.len()).find(|&i| seen[i] != want[i]) {
        panic!(
            "{what}: byte {i:#x} of the mapping is {:#x}, device memory has {:#x}",
            seen[i], want[i]
        );
    }
    let data = pattern(off ^ len, len as usize);
    map.write(0, &data).expect("write");
    emu.read(va + off, &mut want).expect("dma read");
    assert!(
        want == data,
        "{what}: writes through the mapping land in place"
    );
    drop(map);
    pin.unpin().expect("unpin");
    calls
}

#[test]
fn expected_calls_follows_the_chunks_and_the_short_count() {
    const M2: u64 = 2 * MIB;
    // One chunk, aligned: one call either way.
    assert_eq!(expected_calls(16 * MIB, M2, M2, true), 1);
    // Unaligned inside one page: both counts agree.
    assert_eq!(expected_calls(16 * MIB + 4096, 8192, M2, true), 1);
    // Unaligned across a page boundary: the short count loses the last page.
    assert_eq!(expected_calls(16 * MIB + M2 - 4096, 8192, M2, true), 2);
    assert_eq!(expected_calls(16 * MIB + M2 - 4096, 8192, M2, false), 1);
    // Three chunks; the first ends on a page boundary, so nothing is lost.
    assert_eq!(expected_calls(8 * MIB + 20480, 20 * MIB, M2, true), 3);
}

/// Pins whose address is not aligned to the allocation's contiguity, on every driver
/// generation and page size, contiguous and scattered, byte-exact through the mapping. A
/// 2.1-2.6 driver's short table costs one more call; nothing is ever refused.
#[test]
fn unaligned_pins_on_every_driver_generation_and_page_size() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    for (page_base, short) in GENERATIONS {
        let _mode = ProviderMode::set(page_base, short);
        for page_size in PAGE_SIZES {
            let ps = u64::from(page_size);
            for scatter in [false, true] {
                let size = 3 * ps.max(64 * KIB);
                let va = emu.alloc(size, 0, page_size, scatter).expect("alloc");
                emu.write(va, &pattern(ps + u64::from(scatter), size as usize))
                    .expect("fill");
                let what = |o: u64, l: u64| {
                    format!(
                        "page base {page_base}, short count {short}, page {ps:#x}, \
                         scatter {scatter}, +{o:#x} len {l:#x}"
                    )
                };
                for (off, len) in [
                    (0, size),
                    (4096, 4096),
                    (3 * 4096, ps),
                    (ps - 4096, 2 * 4096),
                    (ps + 8192, size - ps - 8192),
                    (4096, size - 2 * 4096),
                ] {
                    let calls = pin_map_check(&emu, &gdr, va, off, len, &what(off, len));
                    assert_eq!(
                        calls,
                        expected_calls(va + off, len, ps, short),
                        "{}: provider calls",
                        what(off, len)
                    );
                }
                emu.free(va).expect("free");
            }
        }
    }
    assert_no_pins(&emu);
}

/// A pin the provider refuses costs exactly one call (one line in mtgpu's log), and a 4 KiB-page
/// allocation that is not 64 KiB aligned pins in one call too.
#[test]
fn a_refused_pin_costs_one_provider_call() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let first = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let va = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let target = if va % 65536 != 0 { va } else { first };
    let before = provider_calls(&emu);
    let pin = gdr.pin(target, 12 * KIB, PinFlags::DEFAULT).expect("pin");
    let after = provider_calls(&emu);
    assert_eq!((after.get - before.get, after.refused), (1, before.refused));
    drop(pin);
    for (addr, size) in [
        (target, 16 * KIB),
        (target + 8 * KIB, 8 * KIB),
        (0x1234_0000, 4096),
    ] {
        let before = provider_calls(&emu);
        let err = gdr
            .pin(addr, size, PinFlags::DEFAULT)
            .err()
            .expect("outside the allocation");
        assert_eq!(err.errno(), Errno::EINVAL);
        let after = provider_calls(&emu);
        assert_eq!(
            (after.get - before.get, after.refused - before.refused),
            (1, 1),
            "pin({addr:#x}, {size:#x}): one refused call"
        );
    }
    emu.free(first).expect("free");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// Every kind of bad table: the pin fails, the table goes back to the provider, the module
/// counts it, nothing is pinned or mapped.
#[test]
fn bad_tables_are_refused_put_back_and_counted() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, true).expect("alloc");
    for (kind, errno) in [
        (FaultKind::MTGPU_EMU_FAULT_PA_RAM, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_PA_ZERO, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_PA_OUTSIDE_BAR, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_PA_REPEAT, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_NULL_ARRAY, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_BAD_COUNT, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_BAD_PAGE_SIZE, Errno::EINVAL),
        (FaultKind::MTGPU_EMU_FAULT_BAD_VERSION, Errno::EPROTO),
    ] {
        // At an offset inside a page, so that entry 0 carries an offset.
        for (off, len) in [(0, 4 * 65536), (4096, 3 * 65536)] {
            let bad = counter("bad_tables");
            let before = emu.stats().expect("stats");
            emu.inject_fault(kind, 1).expect("inject");
            let err = gdr
                .pin(va + off, len, PinFlags::DEFAULT)
                .err()
                .unwrap_or_else(|| panic!("{kind:?} must fail the pin"));
            assert_eq!(err.errno(), errno, "{kind:?}");
            assert_eq!(counter("bad_tables"), bad + 1, "{kind:?} counted");
            let after = emu.stats().expect("stats");
            assert_eq!(
                after.put_pages_calls - before.put_pages_calls,
                after.get_pages_calls - before.get_pages_calls,
                "{kind:?}: the table was put back"
            );
            assert_no_pins(&emu);
        }
    }
    // A sparse allocation: one backed page pins; a range over a hole is a compacted table.
    let sparse = emu
        .alloc_flags(4 * 65536, 0, 65536, MTGPU_EMU_ALLOC_SPARSE)
        .expect("sparse alloc");
    pin_map_check(&emu, &gdr, sparse, 0, 65536, "sparse, backed page");
    let bad = counter("bad_tables");
    let err = gdr
        .pin(sparse, 2 * 65536, PinFlags::DEFAULT)
        .err()
        .expect("a pin over a hole");
    assert_eq!(err.errno(), Errno::EINVAL);
    assert_eq!(counter("bad_tables"), bad + 1);
    emu.free(sparse).expect("free");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// A pin longer than one 8 MiB chunk: one table per chunk, one handle, byte-exact across the
/// chunk boundaries, on both count formulas (2 MiB pages, unaligned start). The unit test of
/// [`expected_calls`] covers the arithmetic; the calls counted here come from the emulator.
#[test]
fn a_pin_longer_than_a_chunk_is_one_pin_of_several_tables() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    for (page_size, short) in [(MTGPU_EMU_PAGE_4K, false), (MTGPU_EMU_PAGE_2M, true)] {
        let _mode = ProviderMode::set(false, short);
        let size = 26 * MIB;
        let va = emu.alloc(size, 0, page_size, false).expect("alloc");
        emu.write(va, &pattern(7, size as usize)).expect("fill");
        let (off, len) = (5 * 4096, size - 9 * 4096);
        let calls = pin_map_check(&emu, &gdr, va, off, len, "multi-chunk");
        let chunks = (va + off + len - 1) / CHUNK - (va + off) / CHUNK + 1;
        assert!(chunks >= 3, "the pin spans {chunks} chunks");
        let ps = u64::from(page_size);
        assert_eq!(
            calls,
            expected_calls(va + off, len, ps, short),
            "page {page_size}"
        );
        emu.free(va).expect("free");
    }
    assert_no_pins(&emu);
}

/// A 1 TiB pin of 4 KiB pages fails cleanly, without the page allocator's warning (the VM
/// judge fails the run on any WARNING in the kernel log): by default with ENOSPC before any
/// provider call (it is more than the BARs hold), and with the byte limit raised, in one call
/// the provider refuses.
#[test]
fn a_1_tib_pin_fails_cleanly() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 4096, false).expect("alloc");
    let before = provider_calls(&emu);
    let err = gdr.pin(va, 1 << 40, PinFlags::DEFAULT).err();
    assert_eq!(
        err.map(|e| e.errno()),
        Some(Errno::ENOSPC),
        "the BARs' size"
    );
    assert_eq!(provider_calls(&emu).get, before.get, "no provider call");
    let _limit = ByteLimit::set(2 << 40);
    let err = gdr
        .pin(va, 1 << 40, PinFlags::DEFAULT)
        .err()
        .expect("1 TiB pin");
    assert_eq!(err.errno(), Errno::EINVAL);
    let after = provider_calls(&emu);
    assert_eq!(
        (after.get - before.get, after.refused - before.refused),
        (1, 1)
    );
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// mtgdrdrv's max_bytes_per_file for one test; the default (0: the BARs' size) comes back on drop.
struct ByteLimit;

impl ByteLimit {
    fn set(limit: u64) -> ByteLimit {
        set_param(MOD_PARAMS, "max_bytes_per_file", &limit.to_string());
        ByteLimit
    }
}

impl Drop for ByteLimit {
    fn drop(&mut self) {
        set_param(MOD_PARAMS, "max_bytes_per_file", "0");
    }
}

const MOD_PARAMS: &str = "/sys/module/mtgdrdrv/parameters";

/// Unpinned while mapped, the pin is put when its last VMA goes: from the work item, never from
/// under the munmap's mmap_lock (the emulator counts puts made with it held).
#[test]
fn the_put_after_the_last_munmap_runs_outside_mmap_lock() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let dev = RawDev::open();
    let locked = emu.stats().expect("stats").put_pages_mmap_locked;
    let deferred = counter("deferred_puts");
    let h = dev.pin(va, MIB).expect("pin");
    let map = dev.mmap(h, MIB as usize).expect("mmap");
    dev.unpin(h).expect("unpin while mapped");
    assert_eq!(counter("pins_outstanding"), 1);
    munmap(map, MIB as usize);
    drop(dev); // release waits for the deferred put
    assert_eq!(counter("pins_outstanding"), 0);
    assert_eq!(counter("deferred_puts"), deferred + 1);
    assert_eq!(
        emu.stats().expect("stats").put_pages_mmap_locked,
        locked,
        "put_pages ran under mmap_lock"
    );
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// Restores max_pins_per_file when the test ends.
struct PinLimit(String);

impl PinLimit {
    fn set(limit: u32) -> PinLimit {
        let dir = "/sys/module/mtgdrdrv/parameters";
        let old = std::fs::read_to_string(format!("{dir}/max_pins_per_file")).expect("param");
        set_param(dir, "max_pins_per_file", &limit.to_string());
        PinLimit(old.trim().to_string())
    }
}

impl Drop for PinLimit {
    fn drop(&mut self) {
        set_param(
            "/sys/module/mtgdrdrv/parameters",
            "max_pins_per_file",
            &self.0,
        );
    }
}

#[test]
fn pins_per_file_are_limited() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let _limit = PinLimit::set(3);
    let dev = RawDev::open();
    let handles: Vec<u64> = (0..3).map(|_| dev.pin(va, 65536).expect("pin")).collect();
    let calls = provider_calls(&emu).get;
    assert_eq!(dev.pin(va, 65536).err(), Some(Errno::ENOSPC), "the 4th pin");
    assert_eq!(
        provider_calls(&emu).get,
        calls,
        "refused before the provider"
    );
    let other = RawDev::open();
    let h = other.pin(va, 65536).expect("the limit is per file");
    other.unpin(h).expect("unpin");
    dev.unpin(handles[0]).expect("unpin");
    let h = dev.pin(va, 65536).expect("room again after an unpin");
    for h in [h, handles[1], handles[2]] {
        dev.unpin(h).expect("unpin");
    }
    drop((dev, other));
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// The variable telling [`exec_probe`] which fd and handle to probe after the exec.
const EXEC_PROBE_ENV: &str = "MTGDRDRV_EXEC_PROBE";

/// A process pins, then execs with the device fd still open (no O_CLOEXEC): the new image has
/// the same thread group but not the same address space, and gets EACCES for everything.
#[test]
fn exec_without_cloexec_loses_the_pins() {
    let exe = std::fs::read_link("/proc/self/exe").expect("own executable");
    let code = in_child(|| {
        let emu = Emu::open().expect("emulator");
        let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
        let dev = RawDev::open();
        let h = dev.pin(va, MIB).expect("pin");
        let fd = dev.0.as_raw_fd();
        // SAFETY: clearing FD_CLOEXEC on our own open fd.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        let err = std::os::unix::process::CommandExt::exec(
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "provider::exec_probe",
                    "--ignored",
                    "--test-threads=1",
                ])
                .env(EXEC_PROBE_ENV, format!("{fd}:{h}")),
        );
        panic!("exec: {err}");
    });
    assert_eq!(code, 0, "the exec'd image could use the pins");
    assert_no_pins(&Emu::open().expect("emulator"));
}

/// Runs only in the image [`exec_without_cloexec_loses_the_pins`] execs.
#[test]
#[ignore = "run by exec_without_cloexec_loses_the_pins after its exec"]
fn exec_probe() {
    let spec = std::env::var(EXEC_PROBE_ENV).expect("run by exec_without_cloexec_loses_the_pins");
    let (fd, h) = spec.split_once(':').expect("fd:handle");
    let (fd, h): (i32, u64) = (fd.parse().expect("fd"), h.parse().expect("handle"));
    // SAFETY: the fd was inherited across the exec for this probe and is owned here now.
    let dev = RawDev(unsafe { OwnedFd::from_raw_fd(fd) });
    assert_eq!(dev.info(h).err(), Some(Errno::EACCES), "GET_INFO");
    assert_eq!(dev.mmap(h, 4096).err(), Some(Errno::EACCES), "mmap");
    assert_eq!(dev.unpin(h).err(), Some(Errno::EACCES), "UNPIN");
}

/// Run by the VM script with mtgpu_emu loaded with disable_driver=1 (the state the vendor's
/// DKMS leaves mtgpu in): pins fail with ENODEV before any provider call (a call WARNs in the
/// emulator, which fails the run).
#[test]
#[ignore = "needs mtgpu_emu loaded with disable_driver=1 (the VM script does it)"]
fn disabled_provider_refuses_pins_without_calling_it() {
    let dev = RawDev::open();
    let unavailable = counter("provider_unavailable");
    for _ in 0..20 {
        assert_eq!(dev.pin(0x1000_0000_0000, 65536).err(), Some(Errno::ENODEV));
    }
    assert_eq!(counter("provider_unavailable"), unavailable + 20);
    assert_eq!(counter("get_pages_calls"), 0);
    assert_eq!(counter("get_pages_refused"), 0);
    let gdr = Gdr::open().expect("gdr_open");
    let err = gdr
        .pin(0x1000_0000_0000, 65536, PinFlags::DEFAULT)
        .err()
        .expect("pin through the library");
    assert_eq!(err.errno(), Errno::ENODEV);
}
