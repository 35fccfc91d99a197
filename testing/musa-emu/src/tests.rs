use super::*;

#[test]
fn error_strings_and_version_work_without_init() {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: `s` is a valid out pointer.
    assert_eq!(unsafe { muGetErrorName(MUSA_ERROR_NO_DEVICE, &mut s) }, 0);
    // SAFETY: the library returned a static C string.
    let name = unsafe { std::ffi::CStr::from_ptr(s) };
    assert_eq!(name.to_str().unwrap(), "MUSA_ERROR_NO_DEVICE");
    // SAFETY: as above.
    assert_eq!(unsafe { muGetErrorString(4242, &mut s) }, 1);
    assert!(s.is_null());
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer.
    assert_eq!(unsafe { muDriverGetVersion(&mut v) }, 0);
    assert_eq!(v, DRIVER_VERSION);
    // SAFETY: NULL is allowed and rejected.
    assert_eq!(unsafe { muDriverGetVersion(std::ptr::null_mut()) }, 1);
}

#[test]
fn calls_before_init_fail_with_not_initialized() {
    // No test calls muInit: without /dev/mtgpu_emu it would fail anyway.
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer.
    assert_eq!(
        unsafe { muDeviceGetCount(&mut n) },
        MUSA_ERROR_NOT_INITIALIZED
    );
    let mut p = 0;
    // SAFETY: `p` is a valid out pointer.
    assert_eq!(
        unsafe { muMemAlloc(&mut p, 4096) },
        MUSA_ERROR_NOT_INITIALIZED
    );
}

#[test]
fn names_are_truncated_and_terminated() {
    let mut buf = [0x7f as c_char; 5];
    // SAFETY: `buf` holds 5 bytes.
    unsafe { store_str(buf.as_mut_ptr(), 5, DEVICE_NAME) }.unwrap();
    assert_eq!(buf.map(|c| c as u8), *b"MTT \0");
    // SAFETY: a zero length is rejected before any write.
    assert!(unsafe { store_str(buf.as_mut_ptr(), 0, "x") }.is_err());
}

#[test]
fn vmm_calls_before_init_fail_with_not_initialized() {
    let mut h = 0u64;
    let mut va = 0u64;
    let mut g = 0usize;
    // SAFETY: valid out pointers; NULL prop is rejected after the init check.
    unsafe {
        assert_eq!(
            vmm::muMemCreate(&mut h, 65536, std::ptr::null(), 0),
            MUSA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            vmm::muMemAddressReserve(&mut va, 65536, 0, 0, 0),
            MUSA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            vmm::muMemGetAllocationGranularity(&mut g, std::ptr::null(), 0),
            MUSA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            vmm::muMemMap(va, 65536, 0, h, 0),
            MUSA_ERROR_NOT_INITIALIZED
        );
    }
}

#[test]
fn copies_are_cut_at_vmm_mapping_boundaries() {
    let mut v = vmm::Vmm::default();
    v.insert_mapping_for_test(0x10000, 0x10000);
    v.insert_mapping_for_test(0x20000, 0x10000);
    // Two mappings that follow each other: one piece each.
    assert_eq!(
        v.pieces(0x18000, 0x10000),
        [(0x18000, 0x8000), (0x20000, 0x8000)]
    );
    // Outside any mapping: whole (the emulator says whether it is valid).
    assert_eq!(v.pieces(0x5000, 0x100), [(0x5000, 0x100)]);
    // Past the last mapping: the rest in one piece.
    assert_eq!(
        v.pieces(0x2f000, 0x2000),
        [(0x2f000, 0x1000), (0x30000, 0x1000)]
    );
    assert!(v.is_mapped(0x1ffff) && v.is_mapped(0x20000) && !v.is_mapped(0x30000));
}
