//! The everyday contract: data through the mapping and back through the emulator's DMA path,
//! versions and attributes, mapping types, how pins are rounded, and the C API's handle checks.

use super::*;

/// Writes through the WC mapping and reads back through the emulator's DMA path, then the
/// reverse, for every page size, contiguous and scattered.
#[test]
fn write_through_mapping_read_back_through_dma_and_reverse() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    for page_size in PAGE_SIZES {
        for scatter in [false, true] {
            let size = 4 * MIB;
            let va = emu.alloc(size, 0, page_size, scatter).expect("alloc");
            let pin = gdr.pin(va, size, PinFlags::DEFAULT).expect("pin");
            let info = pin.info().expect("info");
            assert_eq!(info.va, va, "page {page_size}");
            assert_eq!(info.mapped_size, size);
            let map = pin.map(MapRequest::Default).expect("map");
            assert_eq!(map.mapping_type(), wc_as_mapped());
            assert_eq!(map.len() as u64, size);

            let data = pattern(u64::from(page_size), size as usize);
            map.write(0, &data).expect("write");
            let mut back = vec![0u8; size as usize];
            emu.read(va, &mut back).expect("dma read");
            assert!(
                back == data,
                "CPU writes reach device memory (page {page_size}, scatter {scatter})"
            );

            let data2 = pattern(99 + u64::from(page_size), size as usize);
            emu.write(va, &data2).expect("dma write");
            map.read(0, &mut back).expect("read");
            assert!(back == data2, "device memory reads back through the mapping (page {page_size}, scatter {scatter})");

            // Small, odd-sized and misaligned copies in the middle of a page boundary.
            let off = page_size as usize - 3;
            map.write(off, &[1, 2, 3, 4, 5, 6, 7]).expect("write");
            let mut seven = [0u8; 7];
            emu.read(va + off as u64, &mut seven).expect("dma read");
            assert_eq!(seven, [1, 2, 3, 4, 5, 6, 7]);

            drop(map);
            pin.unpin().expect("unpin");
            emu.free(va).expect("free");
        }
    }
    assert_no_pins(&emu);
}

#[test]
fn versions_attributes_and_callback_flag() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    assert_eq!(gdr.driver_version(), Ok((0, 1)));
    assert_eq!(Gdr::runtime_version(), (1, 0));
    assert_eq!(
        gdr.attribute(Attribute::UsePersistentMapping)
            .expect("attr"),
        1
    );
    assert_eq!(
        gdr.attribute(Attribute::SupportPinFlagForcePcie)
            .expect("attr"),
        0
    );
    assert_eq!(gdr.attribute(Attribute::UsingDmaBufMmap).expect("attr"), 0);
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    assert!(!pin.callback_flag().expect("cb flag"));
    let err = gdr
        .pin(va, MIB, PinFlags::FORCE_PCIE)
        .err()
        .expect("FORCE_PCIE is refused");
    assert_eq!(err.errno(), Errno::EINVAL);
    let err = gdr
        .pin_with_tokens(va, MIB, 1, 0)
        .err()
        .expect("tokens are refused");
    assert_eq!(err.errno(), Errno::EINVAL);
    let legacy = gdr
        .pin_with_tokens(va, MIB, 0, 0)
        .expect("legacy pin without tokens");
    drop(legacy);
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn mapping_types_device_and_caching() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    let err = pin
        .map(MapRequest::Caching)
        .err()
        .expect("caching is refused");
    assert_eq!(err.errno(), Errno::EOPNOTSUPP);
    let map = pin.map(MapRequest::Device).expect("device mapping");
    assert_eq!(map.mapping_type(), MappingType::Device);
    assert_eq!(pin.info().expect("info").mapping_type, MappingType::Device);
    map.write(8, &0xdead_beef_u32.to_le_bytes()).expect("write");
    let mut four = [0u8; 4];
    emu.read(va + 8, &mut four).expect("dma");
    assert_eq!(u32::from_le_bytes(four), 0xdead_beef);
    drop(map);
    let wc = pin.map(MapRequest::WriteCombining);
    if wc_as_mapped() == MappingType::WriteCombining {
        let map = wc.expect("wc after device");
        assert_eq!(map.mapping_type(), MappingType::WriteCombining);
        drop(map);
    } else {
        // Without PAT the pages come out uncached: an explicit WC request is refused.
        assert_eq!(wc.err().expect("wc without PAT").errno(), Errno::EINVAL);
    }
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// The emulator's DMA path reaches device memory whatever CPU mappings users hold, as the GPU's
/// copy engine does: here one page is mapped uncached (device) and the next write-combined,
/// which x86 PAT refuses to cover with one transient mapping (a fuzzer finding).
#[test]
fn dma_spans_pages_mapped_with_different_memory_types() {
    const PAGE: u64 = 65536;
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(2 * PAGE, 0, PAGE as u32, false).expect("alloc");
    let first = gdr
        .pin(va, PAGE, PinFlags::DEFAULT)
        .expect("pin first page");
    let second = gdr
        .pin(va + PAGE, PAGE, PinFlags::DEFAULT)
        .expect("pin second page");
    let device = first.map(MapRequest::Device).expect("device mapping");
    // Without x86 PAT (the nopat boot) WC pages come out uncached and an explicit WC request
    // is refused: the default request maps what the platform gives.
    let wc_request = if pat::enabled() {
        MapRequest::WriteCombining
    } else {
        MapRequest::Default
    };
    let wc = second.map(wc_request).expect("wc mapping");
    let data = pattern(7, 2 * PAGE as usize);
    device
        .write(0, &data[..PAGE as usize])
        .expect("write first");
    wc.write(0, &data[PAGE as usize..]).expect("write second");
    let mut back = vec![0u8; 2 * PAGE as usize];
    emu.read(va, &mut back).expect("dma read across both pages");
    assert!(back == data, "the DMA read sees both pages");
    let data2 = pattern(8, 2 * PAGE as usize);
    emu.write(va, &data2).expect("dma write across both pages");
    let mut page = vec![0u8; PAGE as usize];
    device.read(0, &mut page).expect("read first");
    assert!(page[..] == data2[..PAGE as usize], "first page");
    wc.read(0, &mut page).expect("read second");
    assert!(page[..] == data2[PAGE as usize..], "second page");
    drop((device, wc));
    drop((first, second));
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn unaligned_pin_reports_rounded_range_and_cannot_be_mapped() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(2 * MIB, 0, 65536, false).expect("alloc");
    let addr = va + 65536 + 100;
    let pin = gdr
        .pin(addr, 1000, PinFlags::DEFAULT)
        .expect("pin inside the allocation");
    let info = pin.info().expect("info");
    assert_eq!(info.va, va + 65536);
    assert_eq!(info.mapped_size, 4096);
    assert_eq!(info.page_size, 4096);
    let err = pin
        .map(MapRequest::Default)
        .err()
        .expect("unaligned pin cannot be mapped");
    assert_eq!(err.errno(), Errno::EINVAL);
    drop(pin);
    // A range crossing a host page is rounded on both sides.
    let pin = gdr.pin(va + 65536 - 8, 16, PinFlags::DEFAULT).expect("pin");
    let info = pin.info().expect("info");
    assert_eq!((info.va, info.mapped_size), (va + 65536 - 4096, 2 * 4096));
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// An allocation of 4 KiB pages that is not 64 KiB aligned pins on the host page like any other
/// and can be mapped and used.
#[test]
fn small_page_allocation_not_64k_aligned() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    // Two allocations so the second starts off a 64 KiB boundary.
    let first = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let va = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let target = if va % 65536 != 0 { va } else { first };
    assert_ne!(
        target % 65536,
        0,
        "the emulator placed both allocations 64 KiB aligned"
    );
    let pin = gdr.pin(target, 12 * KIB, PinFlags::DEFAULT).expect("pin");
    let info = pin.info().expect("info");
    assert_eq!(info.va, target);
    assert_eq!(info.mapped_size, 12 * KIB);
    assert_eq!(info.page_size, 4096);
    let map = pin.map(MapRequest::Default).expect("map");
    let data = pattern(5, 12 * KIB as usize);
    map.write(0, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    emu.read(target, &mut back).expect("dma");
    assert!(back == data);
    drop(map);
    drop(pin);
    emu.free(first).expect("free");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn c_api_double_unpin_unknown_and_foreign_handles() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    // SAFETY: plain C API use with valid pointers; every handle is unpinned before close.
    unsafe {
        let g = gdr_open();
        let other = gdr_open();
        assert!(!g.is_null() && !other.is_null());
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        assert_ne!(mh.h, 0);
        let mut info = std::mem::zeroed::<gdr_info_v2>();
        assert_eq!(
            gdr_get_info_v2(other, mh, &mut info),
            libc::EINVAL,
            "a handle of another gdr_t"
        );
        assert_eq!(
            gdr_get_info_v2(g, gdr_mh_t { h: 12345 }, &mut info),
            libc::EINVAL,
            "unknown handle"
        );
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), 0);
        assert_eq!(info.va, va);
        let mut v1 = std::mem::zeroed::<gdr_info_v1>();
        assert_eq!(gdr_get_info_v1(g, mh, &mut v1), 0);
        assert_eq!((v1.va, v1.mapped_size, v1.flags), (va, MIB, 0));

        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize),
            libc::EAGAIN,
            "one mapping per handle"
        );
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), 0);
        let wc_bit = if wc_as_mapped() == MappingType::WriteCombining {
            2
        } else {
            0
        };
        assert_eq!(info.flags & 3, 1 | wc_bit, "mapped and wc_mapping bits");
        let word = 0x0123_4567_89ab_cdef_u64.to_le_bytes();
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(64), word.as_ptr().cast(), 8),
            0
        );
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), map.add(64), 8),
            0
        );
        assert_eq!(back, word);
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(MIB as usize - 4), word.as_ptr().cast(), 8),
            libc::EINVAL,
            "past the end"
        );
        assert_eq!(
            gdr_unmap(g, mh, map, 4096),
            libc::EINVAL,
            "size must match the mapping"
        );
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), 0);
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8),
            libc::EINVAL,
            "after unmap"
        );
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), libc::EINVAL, "double unpin");
        assert_eq!(gdr_close(other), 0);
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}
