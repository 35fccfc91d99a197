//! Step 4, the VM: one boot in which each root's module, library and tools run mtgdrcopy_sanity.

use std::time::Duration;

use anyhow::Result;
use xshell::Shell;

use super::next::major_minor;
use xtask_base::paths;

use crate::kernel::Kernel;
use crate::pkgtest::guest::{emulated_provider, host_libraries, package_files, root_files};
use crate::pkgtest::root::Root;
use crate::{vm, vmtest};

/// A root whose installed module, library and tools the guest runs, in `dir`.
pub(super) struct Guest<'a> {
    pub(super) root: &'a Root,
    pub(super) dir: &'a str,
    /// What /sys/module/mtgdrdrv/srcversion must say once the root's module is loaded.
    pub(super) srcversion: String,
    /// The library version gdr_runtime_get_version must report (major.minor.patch).
    pub(super) library: &'a str,
    pub(super) what: &'a str,
}

const GUEST_SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
fail() { echo "Bail out! $*"; exit 1; }
export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy/emu
# The emulated libmusa is used only because the test suite allows it.
export MTGDRCOPY_ALLOW_EMULATED_MUSA=1
KO=lib/modules/$(uname -r)/updates/dkms/mtgdrdrv.ko

step provider
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
for i in $(seq 50); do [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done

# check DIR SRCVERSION LIBRARY WHAT: DIR's module loads, is the build expected, and DIR's
# mtgdrcopy_sanity passes against it, chrooted in DIR.
check() {
	dir=$1
	step "$dir"
	insmod "$dir/$KO" || fail "$dir: insmod mtgdrdrv ($4)"
	got=$(cat /sys/module/mtgdrdrv/srcversion)
	echo "MTGDRCOPY-UPGRADE $dir: mtgdrdrv $(cat /sys/module/mtgdrdrv/version) srcversion $got"
	[ "$got" = "$2" ] || fail "$dir: the loaded mtgdrdrv has srcversion $got, expected $2 ($4)"
	for i in $(seq 50); do [ -c /dev/mtgdrdrv ] && break; sleep 0.1; done
	mkdir -p "$dir/dev" "$dir/proc" "$dir/tmp"
	for node in mtgdrdrv mtgpu_emu; do
		major=$((0x$(stat -c %t /dev/$node))); minor=$((0x$(stat -c %T /dev/$node)))
		rm -f "$dir/dev/$node"
		mknod "$dir/dev/$node" c $major $minor || fail "mknod $dir/dev/$node"
	done
	[ -e "$dir/dev/null" ] || mknod -m 666 "$dir/dev/null" c 1 3
	mount -t proc proc "$dir/proc" || fail "mounting /proc in $dir"
	rc=0
	out=$(chroot "$dir" /usr/bin/mtgdrcopy_sanity -v 2>&1) || rc=$?
	# What the tools report of the library and the module they use (--version's lines
	# "libgdrapi:   X.Y (path)" and "driver:      mtgdrdrv X.Y (/dev/mtgdrdrv)").
	ver=$(chroot "$dir" /usr/bin/mtgdrcopy_sanity --version 2>&1)
	umount "$dir/proc"
	lib=$(echo "$ver" | sed -n 's/^libgdrapi: *\([0-9.]*\) .*/\1/p')
	drv=$(echo "$ver" | sed -n 's/^driver: *mtgdrdrv \([0-9.]*\) .*/\1/p')
	versions="libgdrapi $lib, mtgdrdrv $drv"
	echo "MTGDRCOPY-UPGRADE $dir: $versions"
	echo "$out" | tail -n 3
	[ "$rc" = 0 ] || { echo "$out" | grep -v '^&&&& PASSED' | tail -n 40; fail "$dir: mtgdrcopy_sanity failed ($4)"; }
	case "$versions" in
	"libgdrapi $3, "*) ;;
	*) fail "$dir: mtgdrcopy_sanity reported '$versions', expected libgdrapi $3 ($4)" ;;
	esac
	rmmod mtgdrdrv || fail "$dir: rmmod mtgdrdrv"
}
@CHECKS@
step unload
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"
step done
"#;

pub(super) fn run_vm(sh: &Shell, kernel: &Kernel, guests: &[Guest]) -> Result<()> {
    let (emu, libmusa) = emulated_provider(sh, kernel)?;

    let release = &kernel.release;
    let mut files = vec![(emu, "/lib/mtgdrcopy/mtgpu_emu.ko".to_owned())];
    let mut checks = String::new();
    for guest in guests {
        let mut paths = package_files(sh, guest.root, &["libgdrapi", "mtgdrcopy-tests"])?;
        paths.retain(|p| p.starts_with("/usr/bin/") || p.contains("/libgdrapi.so.1"));
        paths.push(format!("/lib/modules/{release}/updates/dkms/mtgdrdrv.ko"));
        // The emulated libmusa's own libraries (libgcc_s.so.1), which the zig-linked
        // programs do not pull in.
        paths.extend(host_libraries(sh, &libmusa)?);
        files.extend(root_files(sh, guest.root, &paths, guest.dir, "vm-files")?);
        files.push((
            libmusa.clone(),
            format!("{}/usr/lib/mtgdrcopy/emu/libmusa.so.1", guest.dir),
        ));
        let (major, minor) = major_minor(guest.library)?;
        checks.push_str(&format!(
            "check {} {} {major}.{minor} \"{}\"\n",
            guest.dir, guest.srcversion, guest.what
        ));
    }
    let mut spec = vm::VmSpec::new(kernel.clone());
    spec.files = files;
    spec.script = GUEST_SCRIPT.replace("@CHECKS@", &checks);
    spec.ivshmem_mb = 256;
    spec.timeout = Duration::from_secs(600);
    let log = paths::build_dir()
        .join("pkgtest")
        .join(format!("vm-upgrade-{release}.log"));
    let outcome = vm::run(&spec, &log)?;
    let console = outcome.console.replace('\r', "");
    vmtest::print_guest_steps(&console);
    for rest in vmtest::marked(&console, "MTGDRCOPY-UPGRADE ") {
        eprintln!("      {rest}");
    }
    outcome.ensure_passed("the VM part of the upgrade test", &log)?;
    Ok(())
}
