//! Unit tests of what the packages run on the user's machine, on the host with stand-ins: the
//! mtgdrdrv-dkms postinst and prerm (as debian/rules fills them in,
//! `maintainer_script` in postinst.rs) and mtgdrdrv-load. piuparts, autopkgtest (debian/tests)
//! and the upgrade test run the shipped ones.

mod mtgdrdrv_load;
mod postinst;
