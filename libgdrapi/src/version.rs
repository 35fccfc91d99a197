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

// The promise of the 1.x line (README.md, "Versions"; docs/releasing.md): library 1.x works with
// every driver 0.x from 0.1.0 on. New driver features are gated on the driver's minor
// (`mtgdrdrv::MTGDRDRV_MINIMUM_VERSION_WITH_*`), never by raising this minimum, which would
// strand hosts that hold mtgdrdrv-dkms while upgrading the library.
const _: () = assert!(
    keeps_the_promise(GDR_API_MAJOR_VERSION, MINIMUM_GDRDRV_VERSION),
    "a 1.x libgdrapi must accept every driver 0.x from 0.1 on: gate the new feature on the \
     driver's minor instead of raising MINIMUM_GDRDRV_*"
);

// The driver's side of it: a driver 0.x accepts every library 1.x (its minimum stays 1.0).
const _: () = assert!(
    mtgdrdrv::MTGDRDRV_MAJOR_VERSION != 0
        || mtgdrdrv::MINIMUM_GDR_API_VERSION == mtgdrdrv::pack(1, 0),
    "a driver 0.x must accept every libgdrapi 1.x: keep MINIMUM_GDR_API_* at 1.0"
);

/// Whether a library of major `library_major` requiring driver `minimum` keeps the 1.x line's
/// promise (other majors promise nothing yet).
const fn keeps_the_promise(library_major: u32, minimum: u32) -> bool {
    library_major != 1 || (mtgdrdrv::major(minimum) == 0 && mtgdrdrv::minor(minimum) <= 1)
}

/// The package version, which names the shared library file (`libgdrapi.so.<VERSION>`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

const _: () = assert!(
    GDR_API_MAJOR_VERSION == 1,
    "the soname (build.rs) follows the major"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The promise as the library applies it: every driver 0.x from 0.1 on is accepted (the
    /// same check as `backend::module`'s handshake), and the rule refuses a 1.x that raises
    /// the minimum.
    #[test]
    fn library_1_x_accepts_every_driver_0_x_from_0_1() {
        assert!(keeps_the_promise(
            GDR_API_MAJOR_VERSION,
            MINIMUM_GDRDRV_VERSION
        ));
        for minor in [1, 2, 7, 0xffff] {
            let driver = mtgdrdrv::pack(0, minor);
            assert!(
                mtgdrdrv::accepts(MINIMUM_GDRDRV_VERSION, driver),
                "driver 0.{minor} refused"
            );
        }
        assert!(keeps_the_promise(1, mtgdrdrv::pack(0, 0)));
        assert!(!keeps_the_promise(1, mtgdrdrv::pack(0, 2)));
        assert!(!keeps_the_promise(1, mtgdrdrv::pack(1, 0)));
        assert!(keeps_the_promise(2, mtgdrdrv::pack(1, 0)));
    }

    #[test]
    fn package_version_matches_the_api_version() {
        let expected = format!("{GDR_API_MAJOR_VERSION}.{GDR_API_MINOR_VERSION}.");
        assert!(VERSION.starts_with(&expected), "{VERSION} vs {expected}");
    }
}
