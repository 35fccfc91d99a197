//! Unit tests of what the packages run on the user's machine, on the host with stand-ins: the
//! mtgdrdrv-dkms postinst and prerm (as staging fills them in, xtask-pack's
//! `stage::maintainer_script`) and mtgdrdrv-load. The install test runs the shipped ones.

mod mtgdrdrv_load;
mod postinst;
