//! Concurrency: 8 threads pinning, mapping and copying at once (MTGDRCOPY_STRESS_CYCLES cycles
//! each), and an unmap, unpin or close racing a copy through the same handle.

use super::*;

/// Cycles per thread of the concurrency tests: MTGDRCOPY_STRESS_CYCLES, default 10,000, which
/// `cargo xtask test` runs. Under TCG (2 vCPUs) 8 × 2,000 cycles on one gdr_t plus 8 × 2,000 with
/// a gdr_t per thread took 11 s on an idle host, so 10,000 take about a minute; on a loaded
/// host up to four times that.
fn stress_cycles() -> u64 {
    std::env::var("MTGDRCOPY_STRESS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// One pin/map/copy/verify/unmap/unpin cycle through the C API on `g`, in `[base, base+64K)`.
///
/// # Safety
/// `g` is a live gdr_t.
pub(super) unsafe fn c_api_cycle(g: gdr_t, base: u64, word: u64) {
    let size = 65536usize;
    // SAFETY: valid pointers; the caller vouches for `g`.
    unsafe {
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, base as _, size, 0, &mut mh), 0);
        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, size), 0);
        let off = (word as usize * 8) % size;
        let bytes = word.to_le_bytes();
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(off), bytes.as_ptr().cast(), 8),
            0
        );
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), map.add(off), 8),
            0
        );
        assert_eq!(back, bytes, "a thread reads back what it wrote");
        assert_eq!(gdr_unmap(g, mh, map, size), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
    }
}

/// 8 threads × N pin/map/copy/unmap/unpin cycles: through the safe API on one shared `Gdr`,
/// through the C API on one shared `gdr_t`, and through the C API with a `gdr_t` per thread.
/// Each thread works in its own 64 KiB of one allocation; at the end the emulator's DMA path
/// sees exactly the last word each thread wrote, and nothing is pinned.
#[test]
fn eight_threads_pin_map_copy_unmap_unpin_concurrently() {
    let cycles = stress_cycles();
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let per_thread = 65536u64;
    let va = emu.alloc(8 * per_thread, 0, 65536, false).expect("alloc");
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let gdr = &gdr;
            let emu = &emu;
            s.spawn(move || {
                let base = va + t * per_thread;
                for round in 0..cycles.min(500) {
                    let pin = gdr.pin(base, per_thread, PinFlags::DEFAULT).expect("pin");
                    let map = pin.map(MapRequest::Default).expect("map");
                    let data = pattern(t * 1000 + round, 256);
                    map.write((round as usize % 256) * 256, &data)
                        .expect("write");
                    let mut back = vec![0u8; 256];
                    emu.read(base + (round % 256) * 256, &mut back)
                        .expect("dma");
                    assert!(back == data, "thread {t} round {round}");
                    drop(map);
                    pin.unpin().expect("unpin");
                }
            });
        }
    });
    let safe_api = t0.elapsed();
    for shared in [true, false] {
        let t0 = std::time::Instant::now();
        let one = SharedGdr(if shared { gdr_open() } else { ptr::null_mut() });
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let one = &one;
                s.spawn(move || {
                    let own = SharedGdr(if shared { ptr::null_mut() } else { gdr_open() });
                    let g = if shared { one.0 } else { own.0 };
                    assert!(!g.is_null());
                    let base = va + t * per_thread;
                    for round in 0..cycles {
                        // SAFETY: `g` is live until closed below.
                        unsafe { c_api_cycle(g, base, t << 32 | round) };
                    }
                    if !shared {
                        // SAFETY: this thread's own gdr_t, not used again.
                        assert_eq!(unsafe { gdr_close(own.0) }, 0);
                    }
                });
            }
        });
        if shared {
            // SAFETY: no thread uses it any more.
            assert_eq!(unsafe { gdr_close(one.0) }, 0);
        }
        for t in 0..8u64 {
            let last = t << 32 | (cycles - 1);
            let mut word = [0u8; 8];
            emu.read(
                va + t * per_thread + (last as usize * 8 % 65536) as u64,
                &mut word,
            )
            .expect("dma");
            assert_eq!(u64::from_le_bytes(word), last, "thread {t}'s last write");
        }
        eprintln!(
            "8 threads x {cycles} C API cycles on {}: {:.1} s",
            if shared { "one gdr_t" } else { "a gdr_t each" },
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "8 threads x {} safe API cycles: {:.1} s",
        cycles.min(500),
        safe_api.as_secs_f64()
    );
    drop(gdr);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

struct SharedGdr(gdr_t);
// SAFETY: libgdrapi documents gdr_t as safe to use from several threads at once.
unsafe impl Sync for SharedGdr {}

/// Regression (library): gdr_unmap (or gdr_unpin_buffer, gdr_close) racing a copy through the
/// same handle in another thread. Defined outcome: the copy either completes before the unmap
/// releases the mapping, or returns EINVAL; it never faults and never touches the address after
/// the unmap returned (where a new mapping may already live). Run in a child process so that a
/// fault shows as a failure instead of killing the test binary.
#[test]
fn unmap_racing_a_copy_completes_or_fails_with_einval() {
    let emu = Emu::open().expect("emulator");
    let code = in_child(|| {
        // GPU VAs are per process: the child allocates its own.
        let Ok(emu) = Emu::open() else { return 67 };
        let Ok(va) = emu.alloc(MIB, 0, 65536, false) else {
            return 68;
        };
        let mut outcomes = [0u64; 2];
        for round in 0..60u32 {
            // SAFETY: valid pointers; the racing thread is joined before the next round.
            unsafe {
                let g = SharedGdr(gdr_open());
                let mut mh = gdr_mh_t::default();
                if gdr_pin_buffer_v2(g.0, va as _, MIB as usize, 0, &mut mh) != 0 {
                    return 60;
                }
                let mut map: *mut c_void = ptr::null_mut();
                if gdr_map(g.0, mh, &mut map, MIB as usize) != 0 {
                    return 61;
                }
                let addr = map as usize;
                let stop = std::sync::atomic::AtomicBool::new(false);
                let result = std::thread::scope(|s| {
                    let copier = s.spawn(|| {
                        let data = vec![0x3cu8; 256 * 1024];
                        let (mut ok, mut refused) = (0u64, 0u64);
                        loop {
                            match gdr_copy_to_mapping(
                                mh,
                                addr as *mut c_void,
                                data.as_ptr().cast(),
                                data.len(),
                            ) {
                                0 => ok += 1,
                                libc::EINVAL => refused += 1,
                                _ => return Err(62),
                            }
                            if stop.load(std::sync::atomic::Ordering::Acquire) && refused > 0 {
                                return Ok((ok, refused));
                            }
                        }
                    });
                    std::thread::sleep(std::time::Duration::from_micros(
                        500 + u64::from(round) * 97,
                    ));
                    let rc = match round % 3 {
                        0 => gdr_unmap(g.0, mh, addr as *mut c_void, MIB as usize),
                        1 => gdr_unpin_buffer(g.0, mh),
                        _ => gdr_close(g.0),
                    };
                    // The address is free now: take it, so a late store would land here.
                    let filler = libc::mmap(
                        addr as *mut c_void,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    );
                    stop.store(true, std::sync::atomic::Ordering::Release);
                    let r = copier.join().unwrap_or(Err(63));
                    (rc, filler, r)
                });
                let (rc, filler, r) = result;
                if rc != 0 {
                    return 64;
                }
                match r {
                    Ok((ok, refused)) => {
                        outcomes[0] += ok;
                        outcomes[1] += refused;
                    }
                    Err(code) => return code,
                }
                if filler == addr as *mut c_void && *(addr as *const u8) != 0 {
                    return 65;
                }
                if filler != libc::MAP_FAILED {
                    libc::munmap(filler, 4096);
                }
                if round % 3 != 2 && gdr_close(g.0) != 0 {
                    return 66;
                }
            }
        }
        eprintln!(
            "racing copies: {} completed, {} refused",
            outcomes[0], outcomes[1]
        );
        0
    });
    assert_eq!(code, 0, "a copy racing an unmap did something undefined");
    assert_no_pins(&emu);
}
