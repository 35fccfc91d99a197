//! Packaging only: this crate carries the version of the `mtgdrcopy` metapackage, which installs
//! `libgdrapi`, `mtgdrcopy-tests` and `mtgdrdrv-dkms`. It has no code.
