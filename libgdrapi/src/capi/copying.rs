//! The copy entry points: checked against the handle table without a lock or a system call.

use std::ffi::{c_int, c_void};

use nix::errno::Errno;

use super::gdr_mh_t;
use crate::{copy, handles};

/// Which way a copy goes. Both entry points take the destination before the source, so the
/// pointers pass through in the registers they arrived in; the device side is the mapping.
pub(super) trait Direction {
    fn device(dst: *mut c_void, src: *mut c_void) -> *mut c_void;
    fn host(dst: *mut c_void, src: *mut c_void) -> *mut c_void;
    /// # Safety
    /// The device side lies inside a live mapping for `n` bytes; the host side is valid for `n`.
    unsafe fn copy(dst: *mut c_void, src: *mut c_void, n: usize);
}

pub(super) struct ToDevice;
pub(super) struct FromDevice;

impl Direction for ToDevice {
    #[inline(always)]
    fn device(dst: *mut c_void, _: *mut c_void) -> *mut c_void {
        dst
    }
    #[inline(always)]
    fn host(_: *mut c_void, src: *mut c_void) -> *mut c_void {
        src
    }
    #[inline(always)]
    unsafe fn copy(dst: *mut c_void, src: *mut c_void, n: usize) {
        // SAFETY: forwarded caller guarantee.
        unsafe { copy::to_device(dst.cast(), src.cast(), n) }
    }
}

impl Direction for FromDevice {
    #[inline(always)]
    fn device(_: *mut c_void, src: *mut c_void) -> *mut c_void {
        src
    }
    #[inline(always)]
    fn host(dst: *mut c_void, _: *mut c_void) -> *mut c_void {
        dst
    }
    #[inline(always)]
    unsafe fn copy(dst: *mut c_void, src: *mut c_void, n: usize) {
        // SAFETY: forwarded caller guarantee.
        unsafe { copy::from_device(dst.cast(), src.cast(), n) }
    }
}

/// Both entry points: 0 after the copy, or `EINVAL` without touching anything. The common path
/// calls nothing but tail calls, so it saves no registers.
#[inline(always)]
pub(super) unsafe fn checked_copy<D: Direction>(
    handle: gdr_mh_t,
    dst: *mut c_void,
    src: *mut c_void,
    size: usize,
) -> c_int {
    if size == 0 {
        return 0;
    }
    if D::host(dst, src).is_null() {
        return Errno::EINVAL as c_int;
    }
    let device = D::device(dst, src) as usize;
    let copying = match handles::enter(handle.key(), device, size) {
        handles::Entry::Inside(copying) => copying,
        handles::Entry::Outside => return Errno::EINVAL as c_int,
        // SAFETY: forwarded caller guarantee.
        handles::Entry::NoHazard => return unsafe { copy_cold::<D>(handle, dst, src, size) },
    };
    if size >= copy::INLINE_BELOW {
        // SAFETY: forwarded caller guarantee; `copying` moves along.
        return unsafe { copy_large::<D>(copying, dst, src, size) };
    }
    // SAFETY: the device range is inside a live mapping that stays mapped while `copying`
    // lives (checked and announced by `enter`); the host range is the caller's guarantee.
    unsafe { D::copy(dst, src, size) };
    drop(copying);
    0
}

/// Copies of `copy::INLINE_BELOW` bytes or more call the variant's routine: out of line, so that
/// small copies need no registers saved around that call.
#[inline(never)]
unsafe extern "C" fn copy_large<D: Direction>(
    _copying: handles::Copying,
    dst: *mut c_void,
    src: *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: as in `checked_copy`.
    unsafe { D::copy(dst, src, size) };
    0
}

/// A thread's first copy (it takes the thread a hazard), and every copy where membarrier is
/// missing: out of line.
#[cold]
#[inline(never)]
unsafe extern "C" fn copy_cold<D: Direction>(
    handle: gdr_mh_t,
    dst: *mut c_void,
    src: *mut c_void,
    size: usize,
) -> c_int {
    let device = D::device(dst, src) as usize;
    let Some(_copying) = handles::enter_cold(handle.key(), device, size) else {
        return Errno::EINVAL as c_int;
    };
    // SAFETY: as in `checked_copy`.
    unsafe { D::copy(dst, src, size) };
    0
}
