//! Pin, map and unpin: upstream's `basic_*` cases and the pin rules that are mtgpu's own (pin
//! granule, page sizes, refused flags and tokens, managed memory, pins across allocations).

use std::sync::{mpsc, Barrier};

use anyhow::{ensure, Context, Result};
use nix::errno::Errno;

use super::support::*;
use super::{note, skip, Ctx};
use crate::gdr::gdr_mh_t;
use crate::gpu::DevicePtr;

/// Pins and unpins a 320 KiB muMemAlloc buffer with gdr_pin_buffer (no tokens), then closes.
pub fn basic_mumemalloc(ctx: &Ctx) -> Result<()> {
    basic(ctx, |gdr, ptr, size| gdr.pin(ptr, size))
}

/// Pins and unpins a 320 KiB muMemAlloc buffer with gdr_pin_buffer_v2 (default flags).
pub fn basic_v2_mumemalloc(ctx: &Ctx) -> Result<()> {
    basic(ctx, |gdr, ptr, size| gdr.pin_v2(ptr, size, 0))
}

fn basic(ctx: &Ctx, pin: impl Fn(&Gdr, DevicePtr, usize) -> GdrResult<gdr_mh_t>) -> Result<()> {
    let gpu = ctx.gpu()?;
    let mut buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    let mh = pin(&gdr, buf.ptr, buf.size)?;
    ensure!(mh.h != 0, "the pin returned the null handle");
    gdr.unpin(mh)?;
    gdr.close()?;
    buf.free()
}

/// GDR_PIN_FLAG_FORCE_PCIE does not exist on mtgpu: the attribute reads 0 and gdr_pin_buffer_v2
/// with the flag fails with EINVAL, pinning nothing; a default pin of the same buffer works.
pub fn basic_v2_forcepci_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    force_pcie_refused(&gdr, &buf)?;
    let mh = gdr.pin_v2(buf.ptr, buf.size, 0)?;
    gdr.unpin(mh)?;
    Ok(gdr.close()?)
}

/// The FORCE_PCIE attribute reads 0 and a FORCE_PCIE pin of `buf` fails cleanly with EINVAL.
pub(super) fn force_pcie_refused(gdr: &Gdr, buf: &DevBuf) -> Result<()> {
    let supported = gdr.attribute(ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE)?;
    ensure!(
        supported == 0,
        "GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE reads {supported}; mtgpu has no such mode"
    );
    let before = PinSnapshot::take()?;
    expect_errno(
        gdr.pin_v2(buf.ptr, buf.size, PIN_FLAG_FORCE_PCIE),
        Errno::EINVAL,
        "gdr_pin_buffer_v2(GDR_PIN_FLAG_FORCE_PCIE)",
    )?;
    before.expect_same("after the refused FORCE_PCIE pin")
}

/// mtgpu has no P2P tokens: gdr_pin_buffer with a non-zero p2p_token or va_space fails with
/// EINVAL and pins nothing (upstream pins with real tokens; persistent mode refuses them too).
pub fn basic_with_tokens(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    let before = PinSnapshot::take()?;
    for (token, va_space) in [(0x0123_4567_89ab_cdef, 0), (0, 1), (0xdead_beef, 7)] {
        expect_errno(
            gdr.pin_with_tokens(buf.ptr, buf.size, token, va_space),
            Errno::EINVAL,
            &format!("gdr_pin_buffer(p2p_token {token:#x}, va_space {va_space})"),
        )?;
    }
    before.expect_same("after the refused pins with tokens")?;
    Ok(gdr.close()?)
}

/// A pin at an address off the pin granule works but cannot be mapped (EINVAL); the next
/// 64 KiB boundary pins, maps and stays writable while a small neighbouring allocation is
/// pinned, mapped and freed.
pub fn basic_unaligned_mapping(ctx: &Ctx) -> Result<()> {
    const FA_SIZE: usize = 4;
    const A_SIZE: usize = GPU_PAGE + 4;
    let gpu = ctx.gpu()?;
    let mut fa = DevBuf::aligned(&*gpu, FA_SIZE)?;
    note!("first allocation {:#x}, {FA_SIZE} bytes", fa.ptr);

    // Upstream waits for the allocator to return an address off a 64 KiB boundary. Failing
    // that (allocations here are 64 KiB aligned unless backed by 4 KiB pages), the address
    // 4 bytes into an allocation is just as unaligned.
    let mut held = Vec::new();
    for _ in 0..10 {
        let a = DevBuf::new(&*gpu, A_SIZE)?;
        let unaligned = a.ptr % GPU_PAGE as u64 != 0;
        held.push(a);
        if unaligned {
            break;
        }
    }
    let a = held.last().context("no allocation")?;
    let gdr = Gdr::open()?;

    if a.ptr % GPU_PAGE as u64 != 0 {
        // Pinned as is, the range is rounded to the host page; mappable exactly when the
        // address is on the pin granule.
        let mh = gdr.pin(a.ptr, A_SIZE)?;
        let info = gdr.info(mh)?;
        note!(
            "allocator returned {:#x}: pinned from {:#x}, granule {}",
            a.ptr,
            info.va,
            info.page_size
        );
        if a.ptr % u64::from(info.page_size) == 0 {
            let map = gdr.map(mh, A_SIZE)?;
            gdr.unmap(mh, map, A_SIZE)?;
        } else {
            expect_errno(
                gdr.map(mh, A_SIZE),
                Errno::EINVAL,
                "gdr_map of an unaligned pin",
            )?;
        }
        gdr.unpin(mh)?;
    }
    let d_a = a.ptr + 4;
    let mh = gdr.pin(d_a, A_SIZE - 4)?;
    let info = gdr.info(mh)?;
    ensure!(
        info.va < d_a,
        "pin at {d_a:#x} reports info.va {:#x}",
        info.va
    );
    expect_errno(
        gdr.map(mh, A_SIZE - 4),
        Errno::EINVAL,
        &format!("gdr_map of the pin at {d_a:#x}"),
    )?;
    gdr.unpin(mh)?;

    // The next GPU page boundary: the first page may belong to another allocation.
    let d_aligned = (d_a + GPU_PAGE as u64) & !(GPU_PAGE as u64 - 1);
    let aligned_size = (a.ptr + A_SIZE as u64 - d_aligned) as usize;
    note!("pin and map {d_aligned:#x}, {aligned_size} bytes");
    let aligned_mh = gdr.pin(d_aligned, aligned_size)?;
    let aligned_map = gdr.map(aligned_mh, aligned_size)?;
    // SAFETY: offset 0 of a live mapping of at least 4 bytes.
    unsafe { store_u32(aligned_map, 7) };

    let fa_mh = gdr.pin(fa.ptr, FA_SIZE)?;
    let _fa_map = gdr.map(fa_mh, FA_SIZE)?;
    fa.free()?;
    // SAFETY: as above; freeing the neighbour must not have touched this mapping.
    unsafe { store_u32(aligned_map, 9) };
    let back = gpu_read_u32(a, (d_aligned - a.ptr) as usize)?;
    ensure!(back == 9, "read {back} back through the driver, wrote 9");
    gdr.unpin(aligned_mh)?;
    Ok(gdr.close()?)
}

fn gpu_read_u32(buf: &DevBuf, offset: usize) -> Result<u32> {
    let b = buf.read(offset, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Issue 244: two 8-byte buffers in one GPU page both pin, with distinct handles; the one at
/// the page start maps and works, the one 8 bytes in cannot be mapped (EINVAL).
pub fn basic_small_buffers_mapping(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, GPU_PAGE)?;
    let gdr = Gdr::open()?;
    let (a, b) = (buf.ptr, buf.ptr + 8);
    let mh_a = gdr.pin(a, 8)?;
    let mh_b = gdr.pin(b, 8)?;
    ensure!(mh_a != mh_b, "both pins got handle {:#x}", mh_a.h);
    let (info_a, info_b) = (gdr.info(mh_a)?, gdr.info(mh_b)?);
    ensure!(
        info_a.va == a && info_b.va == a,
        "both pins start at the page {a:#x}: info.va {:#x} and {:#x}",
        info_a.va,
        info_b.va
    );
    let map_a = gdr.map(mh_a, 8)?;
    expect_errno(
        gdr.map(mh_b, 8),
        Errno::EINVAL,
        "gdr_map of the second buffer",
    )?;
    // SAFETY: bytes 0..8 of a live mapping.
    unsafe {
        store_u32(map_a, 0x1122_3344);
        store_u32(map_a.add(4), 0x5566_7788);
    }
    let back = buf.read(0, 8)?;
    compare(
        "8 bytes written through the mapping",
        &0x5566_7788_1122_3344u64.to_le_bytes(),
        &back,
    )?;
    gdr.unmap(mh_a, map_a, 8)?;
    gdr.unpin(mh_a)?;
    gdr.unpin(mh_b)?;
    Ok(gdr.close()?)
}

/// One gdr_t from several threads: pin/map/copy/unmap/unpin in a child thread; pin and map in
/// one thread, copy and tear down in another; two threads pinning and mapping the same buffer
/// at once; gdr_close from a thread other than the opener.
pub fn basic_child_thread_pins_buffer_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let buf = DevBuf::aligned(&*gpu, DATA_SIZE)?;
    let gdr = Gdr::open()?;
    let data = walking_bit(DATA_SIZE);

    note!("pin, map, copy, unmap and unpin in a child thread");
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            let (mh, map) = pin_and_map(&gdr, buf.ptr, buf.size)?;
            gdr.copy_to(mh, map, &data)?;
            gdr.unmap(mh, map, buf.size)?;
            Ok(gdr.unpin(mh)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the child thread panicked"))?
    })?;
    compare(
        "data copied by the child thread",
        &data,
        &buf.read(0, buf.size)?,
    )?;

    note!("set up in one thread, tear down in another");
    buf.fill(0xA5)?;
    let (tx, rx) = mpsc::channel::<(gdr_mh_t, usize)>();
    std::thread::scope(|s| -> Result<()> {
        let setup = s.spawn(|| -> Result<()> {
            let (mh, map) = pin_and_map(&gdr, buf.ptr, buf.size)?;
            tx.send((mh, map as usize))?;
            Ok(())
        });
        let (gdr, data, buf) = (&gdr, &data, &buf);
        let teardown = s.spawn(move || -> Result<()> {
            let (mh, map) = rx.recv()?;
            let map = map as *mut u8;
            gdr.copy_to(mh, map, data)?;
            gdr.unmap(mh, map, buf.size)?;
            Ok(gdr.unpin(mh)?)
        });
        for t in [setup, teardown] {
            t.join()
                .map_err(|_| anyhow::anyhow!("a thread panicked"))??;
        }
        Ok(())
    })?;
    compare(
        "data copied by the tear-down thread",
        &data,
        &buf.read(0, buf.size)?,
    )?;

    note!("two threads pin and map the same buffer at once");
    buf.fill(0xA5)?;
    let barrier = Barrier::new(2);
    std::thread::scope(|s| -> Result<()> {
        let threads: Vec<_> = (0..2usize)
            .map(|t| {
                let (gdr, barrier, buf) = (&gdr, &barrier, &buf);
                s.spawn(move || -> Result<()> {
                    barrier.wait();
                    let (mh, map) = pin_and_map(gdr, buf.ptr, buf.size)?;
                    let half = buf.size / 2;
                    // SAFETY: in bounds: each thread writes its own half.
                    let dst = unsafe { map.add(t * half) };
                    gdr.copy_to(mh, dst, &walking_bit(half))?;
                    barrier.wait();
                    gdr.unmap(mh, map, buf.size)?;
                    Ok(gdr.unpin(mh)?)
                })
            })
            .collect();
        for t in threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a thread panicked"))??;
        }
        Ok(())
    })?;
    let half = walking_bit(buf.size / 2);
    compare("first half", &half, &buf.read(0, buf.size / 2)?)?;
    compare("second half", &half, &buf.read(buf.size / 2, buf.size / 2)?)?;

    note!("gdr_close from another thread");
    let (mh, _map) = pin_and_map(&gdr, buf.ptr, buf.size)?;
    ensure!(mh.h != 0, "null handle");
    std::thread::scope(|s| {
        s.spawn(move || gdr.close())
            .join()
            .map_err(|_| anyhow::anyhow!("the closing thread panicked"))
    })??;
    Ok(())
}

/// For allocations of several sizes, whatever page size backs them, a pin of the whole
/// allocation reports the host page as its granule (both backends round pins to it), with va
/// and mapped_size rounded to it and covering the allocation; starting on that granule, it maps
/// and moves data correctly across every page of the allocation.
pub fn basic_pin_granule_mumemalloc(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let gdr = Gdr::open()?;
    let host = host_page();
    for size in [
        4 * KIB,
        60 * KIB,
        GPU_PAGE,
        200 * KIB,
        MIB + 4 * KIB,
        3 * MIB,
    ] {
        let buf = DevBuf::new(&*gpu, size)?;
        let ptr = buf.ptr;
        let mh = gdr.pin(ptr, size)?;
        let info = gdr.info(mh)?;
        let ps = u64::from(info.page_size);
        note!(
            "{size} bytes at {ptr:#x}: pinned {:#x} bytes at {:#x}, granule {ps}",
            info.mapped_size,
            info.va
        );
        ensure!(
            ps == host as u64,
            "{size} bytes at {ptr:#x}: info.page_size {ps}, not the host page ({host})"
        );
        let end = ptr + size as u64;
        let pinned_end = info.va + info.mapped_size;
        ensure!(
            info.va % ps == 0
                && info.va <= ptr
                && ptr - info.va < ps
                && info.mapped_size % ps == 0
                && pinned_end >= end
                && pinned_end - end < ps,
            "{size} bytes at {ptr:#x}: info.va {:#x} and mapped_size {:#x} are not the range \
             rounded to {ps}",
            info.va,
            info.mapped_size
        );
        if info.va == ptr {
            let map = gdr.map(mh, size)?;
            let data = walking_bit(size);
            gdr.copy_to(mh, map, &data)?;
            compare(
                &format!("{size} bytes written through the mapping"),
                &data,
                &buf.read(0, size)?,
            )?;
            buf.fill(0x5A)?;
            let mut back = vec![0u8; size];
            gdr.copy_from(mh, &mut back, map)?;
            compare(
                &format!("{size} bytes read through the mapping"),
                &vec![0x5A; size],
                &back,
            )?;
            gdr.unmap(mh, map, size)?;
        } else {
            note!("  not mappable: the allocation does not start on the granule");
        }
        gdr.unpin(mh)?;
    }
    Ok(gdr.close()?)
}

/// An allocation that does not start on a 64 KiB boundary (4 KiB pages) pins at the host-page
/// granule (info.page_size = host page, info.va = its start, mapped_size = its size), maps,
/// and moves data correctly.
pub fn basic_host_page_granule_mumemalloc(ctx: &Ctx) -> Result<()> {
    const SIZE: usize = 12 * KIB;
    let host = host_page();
    if host >= GPU_PAGE {
        skip!("the host page ({host} bytes) is not smaller than the 64 KiB GPU page");
    }
    let gpu = ctx.gpu()?;
    let gdr = Gdr::open()?;
    let mut held = Vec::new();
    for _ in 0..8 {
        let buf = DevBuf::new(&*gpu, SIZE)?;
        let unaligned = buf.ptr % GPU_PAGE as u64 != 0;
        held.push(buf);
        if unaligned {
            let buf = held.last().context("no allocation")?;
            note!("muMemAlloc returned {:#x}", buf.ptr);
            return host_granule_pin(
                &gdr,
                buf.ptr,
                SIZE,
                |off, len| buf.read(off, len),
                |v| buf.fill(v),
            );
        }
    }
    #[cfg(feature = "emulator")]
    if emulated() {
        return emulator_host_page_granule(&gdr, SIZE);
    }
    skip!(
        "every allocation the driver returned was 64 KiB aligned (no 4 KiB-page \
         allocations on this device)"
    );
}

/// The device backs allocations with larger pages in this run: ask the emulator for 4 KiB
/// pages directly. Two allocations, so that one starts off a 64 KiB boundary.
#[cfg(feature = "emulator")]
fn emulator_host_page_granule(gdr: &Gdr, size: usize) -> Result<()> {
    let emu = emulator_or_skip("a 4 KiB-page allocation")?;
    let emu_err = |e: Errno| anyhow::anyhow!("emulator: {e}");
    let first = emu.alloc(size as u64, 4096, 4096, false).map_err(emu_err)?;
    let second = emu.alloc(size as u64, 4096, 4096, false).map_err(emu_err)?;
    let va = [first, second]
        .into_iter()
        .find(|va| va % GPU_PAGE as u64 != 0)
        .context("the emulator placed two 4 KiB-page allocations on 64 KiB boundaries")?;
    note!("emulator allocation {va:#x} (4 KiB pages)");
    let result = host_granule_pin(
        gdr,
        va,
        size,
        |off, len| {
            let mut v = vec![0u8; len];
            emu.read(va + off as u64, &mut v).map_err(emu_err)?;
            Ok(v)
        },
        |v| {
            emu.memset(va, size as u64, v).map_err(emu_err)?;
            Ok(())
        },
    );
    for a in [first, second] {
        emu.free(a).map_err(emu_err)?;
    }
    result
}

/// Pins `[va, va + size)`, which is off a 64 KiB boundary, and checks the host-page granule,
/// the mapping and the data through it.
fn host_granule_pin(
    gdr: &Gdr,
    va: DevicePtr,
    size: usize,
    read: impl Fn(usize, usize) -> Result<Vec<u8>>,
    fill: impl Fn(u8) -> Result<()>,
) -> Result<()> {
    let host = host_page() as u64;
    let mh = gdr.pin(va, size)?;
    let info = gdr.info(mh)?;
    ensure!(
        u64::from(info.page_size) == host && info.va == va && info.mapped_size == size as u64,
        "pin of {size} bytes at {va:#x}: info.page_size {}, va {:#x}, mapped_size {:#x}; \
         expected the host page {host}, {va:#x}, {size:#x}",
        info.page_size,
        info.va,
        info.mapped_size
    );
    let map = gdr.map(mh, size)?;
    let data = walking_bit(size);
    // SAFETY: the whole mapping, which starts page aligned.
    unsafe { store_words(map, &data) };
    compare("CPU stores through the mapping", &data, &read(0, size)?)?;
    fill(0xC3)?;
    let mut back = vec![0u8; size];
    gdr.copy_from(mh, &mut back, map)?;
    compare("read through the mapping", &vec![0xC3; size], &back)?;
    gdr.copy_to(mh, map, &data)?;
    compare("gdr_copy_to_mapping", &data, &read(0, size)?)?;
    gdr.unmap(mh, map, size)?;
    Ok(gdr.unpin(mh)?)
}

/// Managed memory (muMemAllocManaged) cannot be pinned: gdr_pin_buffer and _v2 fail with
/// EINVAL and nothing stays pinned.
pub fn basic_managed_memory_refused(ctx: &Ctx) -> Result<()> {
    let gpu = ctx.gpu()?;
    let ptr = match gpu.alloc_managed(DATA_SIZE) {
        Ok(p) => p,
        Err(e) => skip!("the driver gives no managed memory here: {e:#}"),
    };
    note!("managed memory at {ptr:#x}");
    let gdr = Gdr::open()?;
    let before = PinSnapshot::take()?;
    let r1 = gdr.pin(ptr, DATA_SIZE);
    let r2 = gdr.pin_v2(ptr, DATA_SIZE, 0);
    let checked = expect_errno(r1, Errno::EINVAL, "gdr_pin_buffer of managed memory")
        .and_then(|()| expect_errno(r2, Errno::EINVAL, "gdr_pin_buffer_v2 of managed memory"))
        .and_then(|()| before.expect_same("after the refused pins"));
    gpu.free(ptr)?;
    checked?;
    Ok(gdr.close()?)
}

/// A pin over two neighbouring allocations either works completely (every byte readable and
/// writable through the mapping, as the driver's own copies see it) or fails cleanly with
/// nothing pinned, never half.
pub fn basic_pin_spanning_two_allocations_mumemalloc(ctx: &Ctx) -> Result<()> {
    const SIZE: usize = 256 * KIB;
    let gpu = ctx.gpu()?;
    let first = DevBuf::new(&*gpu, SIZE)?;
    let second = DevBuf::new(&*gpu, SIZE)?;
    let (lo, hi) = if first.ptr < second.ptr {
        (&first, &second)
    } else {
        (&second, &first)
    };
    let span = (hi.ptr + SIZE as u64 - lo.ptr) as usize;
    if span > 64 * MIB {
        skip!(
            "the two allocations are {} MiB apart; no span to test",
            span / MIB
        );
    }
    let adjacent = lo.ptr + SIZE as u64 == hi.ptr;
    note!(
        "allocations {:#x} and {:#x}: span {span:#x} bytes ({})",
        lo.ptr,
        hi.ptr,
        if adjacent { "adjacent" } else { "with a gap" }
    );
    let gdr = Gdr::open()?;
    let before = PinSnapshot::take()?;
    match gdr.pin(lo.ptr, span) {
        Err(e) => {
            note!("the spanning pin failed cleanly: {e}");
            before.expect_same("after the refused spanning pin")?;
            for b in [lo, hi] {
                let mh = gdr.pin(b.ptr, SIZE)?;
                gdr.unpin(mh)?;
            }
        }
        Ok(mh) => {
            ensure!(
                adjacent || !emulated(),
                "the pin covered the emulator's unallocated gap between the allocations"
            );
            let info = gdr.info(mh)?;
            ensure!(
                info.va <= lo.ptr && info.va + info.mapped_size >= hi.ptr + SIZE as u64,
                "the spanning pin covers {:#x}+{:#x}, less than asked",
                info.va,
                info.mapped_size
            );
            if info.va != lo.ptr {
                skip!("the spanning pin starts at {:#x}, below the first allocation, so it cannot be mapped", info.va);
            }
            let map = gdr.map(mh, span)?;
            let data = walking_bit(span);
            gdr.copy_to(mh, map, &data)?;
            let mut back = vec![0u8; span];
            gdr.copy_from(mh, &mut back, map)?;
            compare("the whole span through the mapping", &data, &back)?;
            compare("first allocation", &data[..SIZE], &lo.read(0, SIZE)?)?;
            let off = (hi.ptr - lo.ptr) as usize;
            compare(
                "second allocation",
                &data[off..off + SIZE],
                &hi.read(0, SIZE)?,
            )?;
            gdr.unmap(mh, map, span)?;
            gdr.unpin(mh)?;
            before.expect_same("after unpinning the spanning pin")?;
        }
    }
    Ok(gdr.close()?)
}
