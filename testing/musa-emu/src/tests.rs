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
