//! The library's version and the driver versions it accepts: one source, this crate's
//! version (libgdrapi/Cargo.toml), checked at compile time against the driver's.

/// Library version, `major << 16 | minor` as exchanged with the driver: this crate's
/// major.minor (libgdrapi/Cargo.toml).
pub const GDR_API_MAJOR_VERSION: u32 = mtgdrdrv::version_part(env!("CARGO_PKG_VERSION_MAJOR"));
pub const GDR_API_MINOR_VERSION: u32 = mtgdrdrv::version_part(env!("CARGO_PKG_VERSION_MINOR"));
pub const GDR_API_VERSION: u32 = mtgdrdrv::pack(GDR_API_MAJOR_VERSION, GDR_API_MINOR_VERSION);

/// The oldest driver this library works with.
pub const MINIMUM_GDRDRV_MAJOR_VERSION: u32 = 0;
pub const MINIMUM_GDRDRV_MINOR_VERSION: u32 = 1;
pub const MINIMUM_GDRDRV_VERSION: u32 =
    mtgdrdrv::pack(MINIMUM_GDRDRV_MAJOR_VERSION, MINIMUM_GDRDRV_MINOR_VERSION);

// The compatibility promise, for this release's pair: the library accepts the driver built from
// the same tree, and the driver accepts the library (same major, minor at least the minimum).
const _: () = assert!(
    mtgdrdrv::accepts(MINIMUM_GDRDRV_VERSION, mtgdrdrv::MTGDRDRV_VERSION),
    "libgdrapi's MINIMUM_GDRDRV_* refuse this tree's driver (mtgdrdrv/Cargo.toml)"
);
const _: () = assert!(
    mtgdrdrv::accepts(mtgdrdrv::MINIMUM_GDR_API_VERSION, GDR_API_VERSION),
    "mtgdrdrv's MINIMUM_GDR_API_* refuse this tree's library (libgdrapi/Cargo.toml)"
);

/// The package version, which names the shared library file (`libgdrapi.so.<VERSION>`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

const _: () = assert!(
    GDR_API_MAJOR_VERSION == 1,
    "the soname (build.rs) follows the major"
);

#[cfg(test)]
mod tests {
    #[test]
    fn package_version_matches_the_api_version() {
        let expected = format!(
            "{}.{}.",
            super::GDR_API_MAJOR_VERSION,
            super::GDR_API_MINOR_VERSION
        );
        assert!(
            super::VERSION.starts_with(&expected),
            "{} vs {expected}",
            super::VERSION
        );
    }
}
