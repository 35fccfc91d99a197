//! Where mtgdrdrv-dkms installs the files that the install test checks, runs and gives its guest.

/// Where mtgdrdrv-dkms installs debian/scripts/mtgdrdrv-load (debian/scripts/install-tree),
/// which decides whether mtgdrdrv may be loaded and loads it; the postinst runs it from there
/// (`@LOAD_SCRIPT@`, filled in by debian/rules).
pub(super) const LOAD_SCRIPT: &str = "/usr/lib/mtgdrdrv/mtgdrdrv-load";

/// Where mtgdrdrv-dkms installs debian/mtgdrdrv.modprobe.conf, the softdep on mtgpu.
pub(super) const SOFTDEP: &str = "/usr/lib/modprobe.d/mtgdrdrv.conf";
