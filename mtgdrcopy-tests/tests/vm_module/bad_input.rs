//! Bad input: provider faults, invalid pins, and every C entry point given hostile arguments;
//! a refused call leaves nothing pinned or mapped.

use super::*;

#[test]
fn provider_faults_fail_the_pin_and_leak_nothing() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    for (kind, errno) in [
        (FaultKind::MTGPU_EMU_FAULT_ENOMEM, None),
        (FaultKind::MTGPU_EMU_FAULT_EINVAL, None),
        (FaultKind::MTGPU_EMU_FAULT_BAD_VERSION, None),
        (
            FaultKind::MTGPU_EMU_FAULT_BAD_PAGE_SIZE,
            Some(Errno::EINVAL),
        ),
    ] {
        emu.inject_fault(kind, 1).expect("inject");
        let err = gdr
            .pin(va, MIB, PinFlags::DEFAULT)
            .err()
            .unwrap_or_else(|| panic!("{kind:?} must fail the pin"));
        if let Some(errno) = errno {
            assert_eq!(err.errno(), errno, "{kind:?}");
        }
        assert_no_pins(&emu);
    }
    let pin = gdr
        .pin(va, MIB, PinFlags::DEFAULT)
        .expect("pin works again once the fault is spent");
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn invalid_pins_are_refused() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    for (addr, size) in [
        (va, 0),
        (0, MIB),
        (u64::MAX - 4095, 8192),
        (va, u64::MAX),
        (va + MIB, 65536),
        (0x1234_0000, 65536),
    ] {
        assert!(
            gdr.pin(addr, size, PinFlags::DEFAULT).is_err(),
            "pin({addr:#x}, {size:#x}) must fail"
        );
    }
    assert!(gdr.pin(va, MIB, PinFlags(0x80)).is_err(), "unknown flag");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// Every C entry point given hostile input returns its documented error (gdrapi.h), and a
/// failed call leaves the module's pins and mappings exactly as they were.
#[test]
fn c_api_bad_input_returns_documented_errors_and_pins_nothing() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let null: gdr_t = ptr::null_mut();
    let held = |pins: i64, maps: i64| {
        assert_eq!(
            (counter("pins_outstanding"), counter("mappings")),
            (pins, maps),
            "pins and mappings after a refused call"
        );
    };
    // SAFETY: every pointer is NULL or valid; `g` and `other` live until closed at the end.
    unsafe {
        let g = gdr_open();
        let other = gdr_open();
        assert!(!g.is_null() && !other.is_null());
        let mut mh = gdr_mh_t::default();
        let mut map: *mut c_void = ptr::null_mut();
        let mut info = gdr_info_v2::default();
        let mut v1 = gdr_info_v1::default();
        let mut flag = 0;
        let (mut ma, mut mi) = (0, 0);
        let mut s: *const std::ffi::c_char = ptr::null();
        let e = libc::EINVAL;

        // NULL gdr_t.
        assert_eq!(
            gdr_pin_buffer_v2(null, va as _, MIB as usize, 0, &mut mh),
            e
        );
        assert_eq!(
            gdr_pin_buffer(null, va as _, MIB as usize, 0, 0, &mut mh),
            e
        );
        assert_eq!(gdr_unpin_buffer(null, mh), e);
        assert_eq!(gdr_map(null, mh, &mut map, 4096), e);
        assert_eq!(gdr_unmap(null, mh, map, 4096), e);
        assert_eq!(gdr_get_info_v2(null, mh, &mut info), e);
        assert_eq!(gdr_get_info_v1(null, mh, &mut v1), e);
        assert_eq!(gdr_get_callback_flag(null, mh, &mut flag), e);
        assert_eq!(gdr_get_attribute(null, 1, &mut flag), e);
        assert_eq!(gdr_driver_get_version(null, &mut ma, &mut mi), e);
        assert_eq!(gdr_close(null), e);
        held(0, 0);

        // NULL out-pointers.
        assert_eq!(
            gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, ptr::null_mut()),
            e
        );
        assert_eq!(
            gdr_pin_buffer(g, va as _, MIB as usize, 0, 0, ptr::null_mut()),
            e
        );
        held(0, 0);
        assert_eq!(gdr_get_attribute(g, 1, ptr::null_mut()), e);
        assert_eq!(gdr_driver_get_version(g, ptr::null_mut(), &mut mi), e);
        assert_eq!(gdr_driver_get_version(g, &mut ma, ptr::null_mut()), e);
        assert_eq!(gdr_get_mapping_type_string(1, ptr::null_mut()), e);
        assert_eq!(gdr_get_mapping_type_string(7, &mut s), e);
        gdr_runtime_get_version(ptr::null_mut(), ptr::null_mut());

        // Sizes: 0, overflowing, past the allocation; addresses: 0, wrapping.
        for (addr, size) in [
            (va, 0usize),
            (va, usize::MAX),
            (va, MIB as usize + 1),
            (0, 65536),
            (u64::MAX - 4095, 8192),
        ] {
            assert_eq!(
                gdr_pin_buffer_v2(g, addr as _, size, 0, &mut mh),
                e,
                "{addr:#x}+{size:#x}"
            );
        }
        assert_eq!(
            gdr_pin_buffer_v2(g, va as _, MIB as usize, 2, &mut mh),
            e,
            "unknown flag"
        );
        assert_eq!(
            gdr_pin_buffer(g, va as _, MIB as usize, 1, 0, &mut mh),
            e,
            "a token"
        );
        held(0, 0);

        // A good pin, then bad maps of it.
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        held(1, 0);
        assert_eq!(gdr_map(g, mh, ptr::null_mut(), MIB as usize), e, "NULL va");
        assert_eq!(gdr_map(g, mh, &mut map, 0), e, "size 0");
        assert_eq!(gdr_map(g, mh, &mut map, usize::MAX), e, "overflowing size");
        // Page-aligned and too long for any address space: mmap itself would say ENOMEM.
        assert_eq!(
            gdr_map(g, mh, &mut map, usize::MAX & !4095),
            e,
            "size beyond the address space"
        );
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize + 1),
            e,
            "past the pin"
        );
        assert_eq!(gdr_map_v2(g, mh, &mut map, 4096, 9), e, "unknown map flag");
        assert_eq!(
            gdr_map_v2(g, mh, &mut map, 4096, 2),
            libc::EOPNOTSUPP,
            "caching"
        );
        assert_eq!(gdr_get_info_v2(g, mh, ptr::null_mut()), e);
        assert_eq!(gdr_get_callback_flag(g, mh, ptr::null_mut()), e);
        held(1, 0);

        // An unaligned pin cannot be mapped.
        let mut odd = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, (va + 100) as _, 1000, 0, &mut odd), 0);
        assert_eq!(gdr_map(g, odd, &mut map, 4096), e, "unaligned pin");
        held(2, 0);
        assert_eq!(gdr_unpin_buffer(g, odd), 0);

        // Wrong handles: zero, garbage, another gdr_t's, stale.
        for bad in [
            gdr_mh_t { h: 0 },
            gdr_mh_t { h: u64::MAX as _ },
            gdr_mh_t {
                h: mh.h ^ (1 << 40),
            },
        ] {
            assert_eq!(gdr_unpin_buffer(g, bad), e);
            assert_eq!(gdr_map(g, bad, &mut map, 4096), e);
            assert_eq!(gdr_get_info_v2(g, bad, &mut info), e);
        }
        assert_eq!(gdr_unpin_buffer(other, mh), e, "another gdr_t's handle");
        assert_eq!(
            gdr_map(other, mh, &mut map, 4096),
            e,
            "another gdr_t's handle"
        );
        assert_eq!(gdr_get_callback_flag(other, mh, &mut flag), e);
        held(1, 0);

        // Map, then bad unmaps and copies.
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        held(1, 1);
        let word = [7u8; 8];
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize),
            libc::EAGAIN,
            "mapped twice"
        );
        assert_eq!(gdr_unmap(other, mh, map, MIB as usize), e, "another gdr_t");
        assert_eq!(
            gdr_unmap(g, mh, map.cast::<u8>().add(4096).cast(), MIB as usize),
            e,
            "wrong va"
        );
        assert_eq!(gdr_unmap(g, mh, map, 4096), e, "wrong size");
        assert_eq!(gdr_copy_to_mapping(mh, map, ptr::null(), 8), e, "NULL host");
        assert_eq!(
            gdr_copy_to_mapping(mh, ptr::null_mut(), word.as_ptr().cast(), 8),
            e
        );
        assert_eq!(
            gdr_copy_from_mapping(mh, ptr::null_mut(), map, 8),
            e,
            "NULL host"
        );
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), usize::MAX),
            e,
            "overflow"
        );
        assert_eq!(
            gdr_copy_to_mapping(
                mh,
                map.cast::<u8>().add(MIB as usize - 4).cast(),
                word.as_ptr().cast(),
                8
            ),
            e,
            "past the end"
        );
        assert_eq!(
            gdr_copy_from_mapping(
                mh,
                back.as_mut_ptr().cast(),
                map.cast::<u8>().sub(8).cast(),
                8
            ),
            e,
            "before the start"
        );
        assert_eq!(
            gdr_copy_to_mapping(gdr_mh_t { h: 0 }, map, word.as_ptr().cast(), 8),
            e
        );
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 0),
            0,
            "size 0 is a no-op"
        );
        held(1, 1);
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), 0);
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), e, "double unmap");
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8),
            e,
            "after unmap"
        );
        held(1, 0);
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), e, "double unpin");
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), e, "stale handle");
        held(0, 0);
        assert_eq!(gdr_close(other), 0);
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}
