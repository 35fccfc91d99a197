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

pub const MTGDRDRV_MAJOR_VERSION: u32 = 0;
pub const MTGDRDRV_MINOR_VERSION: u32 = 1;
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
    fn versions_pack_as_upstream() {
        assert_eq!(MTGDRDRV_VERSION, 0x0000_0001);
        assert_eq!(MINIMUM_GDR_API_VERSION, 0x0001_0000);
        assert_eq!(major(pack(3, 7)), 3);
        assert_eq!(minor(pack(3, 7)), 7);
    }
}
