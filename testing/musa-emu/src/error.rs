//! `MUresult` codes. MUSA's driver API mirrors CUDA's numbering (docs/musa-abi.md: SUCCESS
//! 0, NO_DEVICE 100, UNKNOWN 999 are confirmed); the others use CUDA's values likewise.

use std::ffi::{c_char, c_int, CStr};

use crate::{ffi, store, MuResult};

use nix::errno::Errno;

pub type MUresult = c_int;

pub const MUSA_SUCCESS: MUresult = 0;
pub const MUSA_ERROR_INVALID_VALUE: MUresult = 1;
pub const MUSA_ERROR_OUT_OF_MEMORY: MUresult = 2;
pub const MUSA_ERROR_NOT_INITIALIZED: MUresult = 3;
pub const MUSA_ERROR_NO_DEVICE: MUresult = 100;
pub const MUSA_ERROR_INVALID_DEVICE: MUresult = 101;
pub const MUSA_ERROR_INVALID_CONTEXT: MUresult = 201;
pub const MUSA_ERROR_OPERATING_SYSTEM: MUresult = 304;
pub const MUSA_ERROR_NOT_FOUND: MUresult = 500;
pub const MUSA_ERROR_NOT_SUPPORTED: MUresult = 801;
pub const MUSA_ERROR_UNKNOWN: MUresult = 999;

/// Name and description of each code the library can return, NUL-terminated for C.
const ERRORS: &[(MUresult, &CStr, &CStr)] = &[
    (MUSA_SUCCESS, c"MUSA_SUCCESS", c"no error"),
    (
        MUSA_ERROR_INVALID_VALUE,
        c"MUSA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        MUSA_ERROR_OUT_OF_MEMORY,
        c"MUSA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        MUSA_ERROR_NOT_INITIALIZED,
        c"MUSA_ERROR_NOT_INITIALIZED",
        c"initialization error (muInit was not called or failed)",
    ),
    (
        MUSA_ERROR_NO_DEVICE,
        c"MUSA_ERROR_NO_DEVICE",
        c"no MUSA-capable device is detected (is mtgpu_emu loaded and bound to an ivshmem device?)",
    ),
    (
        MUSA_ERROR_INVALID_DEVICE,
        c"MUSA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        MUSA_ERROR_INVALID_CONTEXT,
        c"MUSA_ERROR_INVALID_CONTEXT",
        c"invalid device context (no current context in this thread, or it was released)",
    ),
    (
        MUSA_ERROR_OPERATING_SYSTEM,
        c"MUSA_ERROR_OPERATING_SYSTEM",
        c"OS call failed or operation not supported on this OS",
    ),
    (
        MUSA_ERROR_NOT_FOUND,
        c"MUSA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        MUSA_ERROR_NOT_SUPPORTED,
        c"MUSA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (MUSA_ERROR_UNKNOWN, c"MUSA_ERROR_UNKNOWN", c"unknown error"),
];

/// `(name, description)` of `code`, if it is one of ours.
pub fn describe(code: MUresult) -> Option<(*const c_char, *const c_char)> {
    ERRORS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, name, text)| (name.as_ptr(), text.as_ptr()))
}

/// The code for an errno of `/dev/mtgpu_emu`.
pub fn from_errno(e: Errno) -> MUresult {
    match e {
        Errno::ENOMEM => MUSA_ERROR_OUT_OF_MEMORY,
        Errno::EINVAL | Errno::EFAULT => MUSA_ERROR_INVALID_VALUE,
        Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => MUSA_ERROR_NO_DEVICE,
        _ => MUSA_ERROR_OPERATING_SYSTEM,
    }
}

/// Shared body of `muGetErrorName` / `muGetErrorString`.
///
/// # Safety
/// `out` is NULL or valid for a write of a pointer.
unsafe fn error_text(code: MUresult, out: *mut *const c_char, name: bool) -> MuResult {
    let text = describe(code).map(|(n, s)| if name { n } else { s });
    // SAFETY: per this function's contract.
    unsafe { store(out, text.unwrap_or(std::ptr::null())) }?;
    text.map(drop).ok_or(MUSA_ERROR_INVALID_VALUE)
}

/// `*name` = the code's name (`"MUSA_ERROR_..."`, static); unknown code: NULL and INVALID_VALUE.
///
/// # Safety
/// `name` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn muGetErrorName(code: MUresult, name: *mut *const c_char) -> MUresult {
    // SAFETY: per this function's contract.
    ffi(|| unsafe { error_text(code, name, true) })
}

/// `*text` = the code's description (static); unknown code: NULL and INVALID_VALUE.
///
/// # Safety
/// `text` is NULL or valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn muGetErrorString(code: MUresult, text: *mut *const c_char) -> MUresult {
    // SAFETY: per this function's contract.
    ffi(|| unsafe { error_text(code, text, false) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_described() {
        for (i, (code, name, text)) in ERRORS.iter().enumerate() {
            assert!(ERRORS[i + 1..].iter().all(|(c, _, _)| c != code));
            assert!(name.to_str().unwrap().starts_with("MUSA_"));
            assert!(!text.is_empty());
        }
        assert!(describe(12345).is_none());
    }
}
