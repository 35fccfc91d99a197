//! Commands, parameter structs and enumerations of `/dev/mtgdrdrv`.
//!
//! Field names and layouts are upstream gdrdrv's. Every struct is `#[repr(C)]` with its size and
//! field offsets asserted at compile time, so a change that would break the frozen ABI does not
//! build. Implicit padding of upstream's layouts is spelled out as `_pad` fields so that the
//! generated C header and the Rust side agree byte for byte.
#![allow(non_camel_case_types)]

use core::mem::{offset_of, size_of};

/// Kernel uapi fixed-width types; the generated header takes them from `<linux/types.h>`.
pub type __u32 = u32;
pub type __u64 = u64;
pub type __s32 = i32;
/// A pin handle; per open file, never reused, and `handle << PAGE_SHIFT` is its mmap offset.
pub type gdr_hnd_t = __u64;

/// The ioctl magic (`_IOC_TYPE`) of every command.
pub const GDRDRV_IOCTL: u32 = 0xDA;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_READ_WRITE: u32 = 3;

/// `_IOWR(GDRDRV_IOCTL, nr, T)` with `size == sizeof(T)`, as the generic Linux encoding
/// (x86-64 and arm64) computes it.
pub const fn iowr(nr: u32, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (IOC_READ_WRITE << IOC_DIRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
        | (GDRDRV_IOCTL << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
}

/// Upstream declares seven commands as `_IOWR(0xDA, nr, struct X *)`: the encoded size is that
/// of a pointer, which on the LP64 targets we support is 8. Frozen as such.
const UPSTREAM_POINTER_SIZE: usize = 8;

pub const GDRDRV_IOC_PIN_BUFFER: u32 = iowr(1, size_of::<GDRDRV_IOC_PIN_BUFFER_PARAMS>());
pub const GDRDRV_IOC_UNPIN_BUFFER: u32 = iowr(2, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_GET_CB_FLAG: u32 = iowr(3, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_GET_INFO: u32 = iowr(4, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_GET_INFO_V2: u32 = iowr(5, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_GET_ATTR: u32 = iowr(6, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_PIN_BUFFER_V2: u32 = iowr(7, size_of::<GDRDRV_IOC_PIN_BUFFER_V2_PARAMS>());
pub const GDRDRV_IOC_REQ_MAPPING_TYPE: u32 = iowr(8, UPSTREAM_POINTER_SIZE);
pub const GDRDRV_IOC_GET_VERSION: u32 = iowr(255, UPSTREAM_POINTER_SIZE);

/// Every command, with its name, for generators and tests.
pub const IOCTLS: [(&str, u32); 9] = [
    ("GDRDRV_IOC_PIN_BUFFER", GDRDRV_IOC_PIN_BUFFER),
    ("GDRDRV_IOC_UNPIN_BUFFER", GDRDRV_IOC_UNPIN_BUFFER),
    ("GDRDRV_IOC_GET_CB_FLAG", GDRDRV_IOC_GET_CB_FLAG),
    ("GDRDRV_IOC_GET_INFO", GDRDRV_IOC_GET_INFO),
    ("GDRDRV_IOC_GET_INFO_V2", GDRDRV_IOC_GET_INFO_V2),
    ("GDRDRV_IOC_GET_ATTR", GDRDRV_IOC_GET_ATTR),
    ("GDRDRV_IOC_PIN_BUFFER_V2", GDRDRV_IOC_PIN_BUFFER_V2),
    ("GDRDRV_IOC_REQ_MAPPING_TYPE", GDRDRV_IOC_REQ_MAPPING_TYPE),
    ("GDRDRV_IOC_GET_VERSION", GDRDRV_IOC_GET_VERSION),
];

/// Pin flags of `GDRDRV_IOC_PIN_BUFFER_V2`.
pub const GDRDRV_PIN_BUFFER_FLAG_DEFAULT: u32 = 0x0;
/// Asks for a BAR mapping on coherent platforms; mtgpu has no such mode, so it is refused.
pub const GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE: u32 = 0x1;

/// How the CPU mapping of a pin is (or is to be) made. Values equal `gdr_mapping_type_t`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum gdr_mr_type_t {
    GDR_MR_NONE = 0,
    GDR_MR_WC = 1,
    GDR_MR_CACHING = 2,
    GDR_MR_DEVICE = 3,
}

impl gdr_mr_type_t {
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::GDR_MR_NONE),
            1 => Some(Self::GDR_MR_WC),
            2 => Some(Self::GDR_MR_CACHING),
            3 => Some(Self::GDR_MR_DEVICE),
            _ => None,
        }
    }
}

/// Attributes of `GDRDRV_IOC_GET_ATTR`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum gdrdrv_attr_t {
    /// 1: a pin holds its memory until unpinned (mtgpu has no invalidation callback).
    GDRDRV_ATTR_USE_PERSISTENT_MAPPING = 1,
    /// 0 on mtgpu: `GDRDRV_PIN_BUFFER_FLAG_FORCE_PCIE` is not supported.
    GDRDRV_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_PIN_BUFFER_PARAMS {
    /// in: GPU virtual address of the range to pin.
    pub addr: __u64,
    /// in: length in bytes.
    pub size: __u64,
    /// in: must be 0 (mtgpu has no P2P tokens).
    pub p2p_token: __u64,
    /// in: must be 0 (mtgpu has no VA spaces).
    pub va_space: __u32,
    pub _pad: __u32,
    /// out
    pub handle: gdr_hnd_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
    /// in: GPU virtual address of the range to pin.
    pub addr: __u64,
    /// in: length in bytes.
    pub size: __u64,
    /// in: `GDRDRV_PIN_BUFFER_FLAG_*`.
    pub flags: __u32,
    pub pad: __u32,
    /// out
    pub handle: gdr_hnd_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS {
    /// in
    pub handle: gdr_hnd_t,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_GET_CB_FLAG_PARAMS {
    /// in
    pub handle: gdr_hnd_t,
    /// out: always 0 on mtgpu (no invalidation callback).
    pub flag: __u32,
    pub _pad: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_GET_INFO_PARAMS {
    /// in
    pub handle: gdr_hnd_t,
    /// out: pinned start, rounded down to the GPU page.
    pub va: __u64,
    /// out: pinned length, rounded up to the GPU page.
    pub mapped_size: __u64,
    pub page_size: __u32,
    pub tsc_khz: __u32,
    pub tm_cycles: __u64,
    pub mapped: __u32,
    pub wc_mapping: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_GET_INFO_V2_PARAMS {
    /// in
    pub handle: gdr_hnd_t,
    /// out: pinned start, rounded down to the GPU page.
    pub va: __u64,
    /// out: pinned length, rounded up to the GPU page.
    pub mapped_size: __u64,
    pub page_size: __u32,
    pub tsc_khz: __u32,
    pub tm_cycles: __u64,
    /// out: a `gdr_mr_type_t`.
    pub mapping_type: __u32,
    pub _pad: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_GET_ATTR_PARAMS {
    /// in: a `gdrdrv_attr_t`.
    pub attr: __u32,
    /// out
    pub val: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
    /// in
    pub handle: gdr_hnd_t,
    /// in: a `gdr_mr_type_t`.
    pub mapping_type: __u32,
    pub _pad: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GDRDRV_IOC_GET_VERSION_PARAMS {
    /// out: `MTGDRDRV_VERSION`.
    pub gdrdrv_version: __u32,
    /// out: `MINIMUM_GDR_API_VERSION`.
    pub minimum_gdr_api_version: __u32,
}

macro_rules! assert_layout {
    ($ty:ty, size = $size:expr, $($field:ident @ $off:expr),* $(,)?) => {
        const _: () = assert!(size_of::<$ty>() == $size);
        $(const _: () = assert!(offset_of!($ty, $field) == $off);)*
    };
}

assert_layout!(GDRDRV_IOC_PIN_BUFFER_PARAMS, size = 40,
    addr @ 0, size @ 8, p2p_token @ 16, va_space @ 24, handle @ 32);
assert_layout!(GDRDRV_IOC_PIN_BUFFER_V2_PARAMS, size = 32,
    addr @ 0, size @ 8, flags @ 16, pad @ 20, handle @ 24);
assert_layout!(GDRDRV_IOC_UNPIN_BUFFER_PARAMS, size = 8, handle @ 0);
assert_layout!(GDRDRV_IOC_GET_CB_FLAG_PARAMS, size = 16, handle @ 0, flag @ 8);
assert_layout!(GDRDRV_IOC_GET_INFO_PARAMS, size = 48,
    handle @ 0, va @ 8, mapped_size @ 16, page_size @ 24, tsc_khz @ 28, tm_cycles @ 32,
    mapped @ 40, wc_mapping @ 44);
assert_layout!(GDRDRV_IOC_GET_INFO_V2_PARAMS, size = 48,
    handle @ 0, va @ 8, mapped_size @ 16, page_size @ 24, tsc_khz @ 28, tm_cycles @ 32,
    mapping_type @ 40);
assert_layout!(GDRDRV_IOC_GET_ATTR_PARAMS, size = 8, attr @ 0, val @ 4);
assert_layout!(GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS, size = 16, handle @ 0, mapping_type @ 8);
assert_layout!(GDRDRV_IOC_GET_VERSION_PARAMS, size = 8,
    gdrdrv_version @ 0, minimum_gdr_api_version @ 4);

// The exact command values upstream's libgdrapi issues (its gdrdrv.h, pointer-size quirk
// included).
const _: () = assert!(GDRDRV_IOC_PIN_BUFFER == 0xC028_DA01);
const _: () = assert!(GDRDRV_IOC_UNPIN_BUFFER == 0xC008_DA02);
const _: () = assert!(GDRDRV_IOC_GET_CB_FLAG == 0xC008_DA03);
const _: () = assert!(GDRDRV_IOC_GET_INFO == 0xC008_DA04);
const _: () = assert!(GDRDRV_IOC_GET_INFO_V2 == 0xC008_DA05);
const _: () = assert!(GDRDRV_IOC_GET_ATTR == 0xC008_DA06);
const _: () = assert!(GDRDRV_IOC_PIN_BUFFER_V2 == 0xC020_DA07);
const _: () = assert!(GDRDRV_IOC_REQ_MAPPING_TYPE == 0xC008_DA08);
const _: () = assert!(GDRDRV_IOC_GET_VERSION == 0xC008_DAFF);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_are_distinct_and_carry_the_magic() {
        for (i, (name, a)) in IOCTLS.iter().enumerate() {
            assert_eq!((a >> 8) & 0xff, GDRDRV_IOCTL, "{name}");
            for (other, b) in &IOCTLS[i + 1..] {
                assert_ne!(a, b, "{name} and {other} collide");
            }
        }
    }

    #[test]
    fn mapping_types_round_trip() {
        for v in 0..4 {
            assert_eq!(gdr_mr_type_t::from_u32(v).map(|t| t as u32), Some(v));
        }
        assert_eq!(gdr_mr_type_t::from_u32(4), None);
    }
}
