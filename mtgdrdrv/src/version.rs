//! Versions exchanged by `GDRDRV_IOC_GET_VERSION`: `major << 16 | minor`.
//!
//! Compatibility promise: every library 1.x works with every driver 0.x whose minor is at least
//! the library's minimum; the driver reports the oldest library it accepts.

pub const MAJOR_VERSION_SHIFT: u32 = 16;
pub const MINOR_VERSION_MASK: u32 = (1 << MAJOR_VERSION_SHIFT) - 1;

/// Packs a version the way the driver and library exchange it.
pub const fn pack(major: u32, minor: u32) -> u32 {
    (major << MAJOR_VERSION_SHIFT) | (minor & MINOR_VERSION_MASK)
}

pub const fn major(version: u32) -> u32 {
    version >> MAJOR_VERSION_SHIFT
}

pub const fn minor(version: u32) -> u32 {
    version & MINOR_VERSION_MASK
}

/// The compatibility promise: `have` satisfies `minimum` when their majors are equal and its
/// minor is at least the minimum's.
pub const fn accepts(minimum: u32, have: u32) -> bool {
    major(have) == major(minimum) && minor(have) >= minor(minimum)
}

/// A version part as cargo passes it (`CARGO_PKG_VERSION_MAJOR`: ASCII digits), as a number,
/// at compile time: the crate's version is the one place a version is written.
pub const fn version_part(digits: &str) -> u32 {
    let bytes = digits.as_bytes();
    assert!(!bytes.is_empty(), "an empty version part");
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(
            bytes[i].is_ascii_digit(),
            "a version part that is not a number"
        );
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

/// The driver's version: this crate's major.minor (mtgdrdrv/Cargo.toml).
pub const MTGDRDRV_MAJOR_VERSION: u32 = version_part(env!("CARGO_PKG_VERSION_MAJOR"));
pub const MTGDRDRV_MINOR_VERSION: u32 = version_part(env!("CARGO_PKG_VERSION_MINOR"));
/// The driver version this tree builds.
pub const MTGDRDRV_VERSION: u32 = pack(MTGDRDRV_MAJOR_VERSION, MTGDRDRV_MINOR_VERSION);

pub const MINIMUM_GDR_API_MAJOR_VERSION: u32 = 1;
pub const MINIMUM_GDR_API_MINOR_VERSION: u32 = 0;
/// The oldest library this driver accepts; reported by `GDRDRV_IOC_GET_VERSION`.
pub const MINIMUM_GDR_API_VERSION: u32 =
    pack(MINIMUM_GDR_API_MAJOR_VERSION, MINIMUM_GDR_API_MINOR_VERSION);

/// Driver version from which each command exists. All nine exist since 0.1; later commands
/// get their own constant so the library can gate them on the driver's minor.
pub const MTGDRDRV_MINIMUM_VERSION_WITH_GET_INFO_V2: u32 = pack(0, 1);
pub const MTGDRDRV_MINIMUM_VERSION_WITH_GET_ATTR: u32 = pack(0, 1);
pub const MTGDRDRV_MINIMUM_VERSION_WITH_PIN_BUFFER_V2: u32 = pack(0, 1);
pub const MTGDRDRV_MINIMUM_VERSION_WITH_REQ_MAPPING_TYPE: u32 = pack(0, 1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parts_are_the_crates() {
        assert_eq!(version_part("0"), 0);
        assert_eq!(version_part("17"), 17);
        let mut parts = env!("CARGO_PKG_VERSION").split('.').map(str::parse::<u32>);
        assert_eq!(parts.next(), Some(Ok(MTGDRDRV_MAJOR_VERSION)));
        assert_eq!(parts.next(), Some(Ok(MTGDRDRV_MINOR_VERSION)));
        assert!(accepts(pack(1, 2), pack(1, 2)) && accepts(pack(1, 2), pack(1, 9)));
        assert!(!accepts(pack(1, 2), pack(1, 1)) && !accepts(pack(1, 2), pack(2, 2)));
    }

    #[test]
    fn versions_pack_as_upstream() {
        assert_eq!(MTGDRDRV_VERSION, 0x0000_0001);
        assert_eq!(MINIMUM_GDR_API_VERSION, 0x0001_0000);
        assert_eq!(major(pack(3, 7)), 3);
        assert_eq!(minor(pack(3, 7)), 7);
    }
}
