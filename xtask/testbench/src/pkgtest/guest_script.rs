//! The shell script the install test's guest runs (step 3), and its placeholders filled in.

use super::installed::{LOAD_SCRIPT, SOFTDEP};

const GUEST_SCRIPT: &str = r#"
step() { echo "MTGDRCOPY-STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
fail() { echo "Bail out! $*"; exit 1; }
KO=/lib/modules/$(uname -r)/updates/dkms/mtgdrdrv.ko
export LD_LIBRARY_PATH=/usr/lib/mtgdrcopy/emu
# The emulated libmusa is used only because the test suite allows it.
export MTGDRCOPY_ALLOW_EMULATED_MUSA=1

step udev
mkdir -p /run/udev
@UDEVD@ --daemon || fail "systemd-udevd did not start"

step boot
# Booted with the package's files and no provider: nothing loaded mtgdrdrv, the kernel never
# heard of it, and no modules-load.d file of ours would have it loaded at boot.
[ -d /sys/module/mtgdrdrv ] && fail "mtgdrdrv is loaded after boot without its provider"
dmesg | grep mtgdrdrv && fail "the kernel log mentions mtgdrdrv after boot without its provider"
ls /usr/lib/modules-load.d /lib/modules-load.d /etc/modules-load.d 2>/dev/null | grep mtgdrdrv && fail "a modules-load.d file of ours is installed"
grep -qx 'softdep mtgpu post: mtgdrdrv' @SOFTDEP@ || fail "@SOFTDEP@ has no softdep on mtgpu"

step messages
# What libgdrapi says without the module (a consumer built against the package's library).
GDRCOPY_ENABLE_LOGGING=1 /opt/mtgdrcopy/consumer 2>&1

step insmod.sh
out=$(sh /opt/mtgdrcopy/insmod.sh "$KO" 2>&1) && fail "insmod.sh loaded mtgdrdrv without mtgpu: $out"
echo "$out"
echo "$out" | grep -q "driver is not loaded" || fail "insmod.sh did not say that mtgpu is missing"
insmod "$KO" 2>/dev/null && fail "mtgdrdrv loaded without a provider of mtgpu_p2p_get_pages"

step disable_driver
# The state Moore Threads' DKMS post_install leaves until reboot: the provider loaded with
# disable_driver=1, its symbols exported but its PCI driver not registered (mtgpu_p2p_get_pages
# would oops). mtgdrdrv-load, as the postinst runs it, must not load mtgdrdrv and must say why
# in one line; insmod.sh, which runs the same script, must refuse.
insmod /lib/mtgdrcopy/mtgpu_emu.ko disable_driver=1 || fail "insmod mtgpu_emu disable_driver=1"
[ "$(cat /sys/module/mtgpu_emu/parameters/disable_driver)" = Y ] || fail "mtgpu_emu's disable_driver does not read Y"
[ -e /sys/bus/pci/drivers/mtgpu ] && fail "mtgpu_emu registered its PCI driver (mtgpu) with disable_driver=1"
rc=0
out=$(MTGDRDRV_PROVIDER=mtgpu_emu @LOAD_SCRIPT@ --if-provider 2>&1) || rc=$?
echo "$out"
[ "$rc" = 3 ] || fail "the postinst's mtgdrdrv-load exited $rc, not 3, with mtgpu_emu's driver disabled"
[ -d /sys/module/mtgdrdrv ] && fail "the postinst's mtgdrdrv-load loaded mtgdrdrv with mtgpu_emu's driver disabled"
lines=$(echo "$out" | wc -l)
[ "$lines" = 1 ] || fail "the postinst's mtgdrdrv-load printed $lines lines, not one"
echo "$out" | grep -q "loaded with disable_driver=1" || fail "the postinst's mtgdrdrv-load did not say why"
rc=0
out=$(MTGDRDRV_PROVIDER=mtgpu_emu sh /opt/mtgdrcopy/insmod.sh "$KO" 2>&1) || rc=$?
echo "$out"
[ "$rc" = 3 ] || fail "insmod.sh exited $rc, not 3, with mtgpu_emu's driver disabled"
[ -d /sys/module/mtgdrdrv ] && fail "insmod.sh loaded mtgdrdrv with mtgpu_emu's driver disabled"
echo "$out" | grep -q "loaded with disable_driver=1" || fail "insmod.sh did not say that mtgpu_emu's driver is disabled"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu (loaded with disable_driver=1)"

step postinst-load
# The provider loaded normally: mtgdrdrv-load as the postinst runs it loads mtgdrdrv (modprobe,
# with the modules.dep DKMS's depmod wrote); insmod.sh, through the same script, reloads it.
insmod /lib/mtgdrcopy/mtgpu_emu.ko || fail "insmod mtgpu_emu"
[ "$(cat /sys/module/mtgpu_emu/parameters/disable_driver)" = N ] || fail "mtgpu_emu's disable_driver does not read N"
[ -d /sys/bus/pci/drivers/mtgpu ] || fail "mtgpu_emu did not register its PCI driver (mtgpu)"
MTGDRDRV_PROVIDER=mtgpu_emu @LOAD_SCRIPT@ --if-provider || fail "the postinst's mtgdrdrv-load failed with mtgpu_emu loaded"
[ -d /sys/module/mtgdrdrv ] || fail "the postinst's mtgdrdrv-load did not load mtgdrdrv with mtgpu_emu loaded"
MTGDRDRV_PROVIDER=mtgpu_emu sh /opt/mtgdrcopy/insmod.sh "$KO" || fail "insmod.sh with the provider loaded"
udevadm settle --timeout=10
node=$(stat -c '%a %G' /dev/mtgdrdrv)
echo "MTGDRCOPY-NODE $node"
[ "$node" = "660 render" ] || fail "/dev/mtgdrdrv is '$node'; the udev rule says 660 render"
for i in $(seq 50); do [ -c /dev/mtgpu_emu ] && break; sleep 0.1; done

step permissions
# The rule's policy: the render group may open the device, others may not.
render=$(grep '^render:' /etc/group | cut -d: -f3)
# Without libmusa for that user, as without GPU access: else the dma-buf backend would serve it
# (the emulator's node is open to all).
out=$(/opt/mtgdrcopy/setpriv --reuid=65534 --regid=65534 --clear-groups env -u LD_LIBRARY_PATH GDRCOPY_ENABLE_LOGGING=1 /opt/mtgdrcopy/consumer 2>&1)
echo "$out"
echo "$out" | grep -q "gdr_open: failed" || fail "a user outside the render group opened /dev/mtgdrdrv"
out=$(/opt/mtgdrcopy/setpriv --reuid=65534 --regid=65534 --groups="$render" /opt/mtgdrcopy/consumer 2>&1)
echo "$out" | grep -q "gdr_open: ok" || fail "a user of the render group could not open /dev/mtgdrdrv: $out"

step sanity
mtgdrcopy_sanity || fail "mtgdrcopy_sanity of the installed package failed"
GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=1 mtgdrcopy_sanity -t basic_unaligned_mapping 2>&1 | grep -i "map" || true

step container
mkdir -p /container/dev /container/proc /container/tmp
for node in mtgdrdrv mtgpu_emu; do
	major=$((0x$(stat -c %t /dev/$node))); minor=$((0x$(stat -c %T /dev/$node)))
	mknod /container/dev/$node c $major $minor || fail "mknod $node"
	chown "$(stat -c %u:%g /dev/$node)" /container/dev/$node
	chmod "$(stat -c %a /dev/$node)" /container/dev/$node
done
mknod -m 666 /container/dev/null c 1 3
mount -t proc proc /container/proc || fail "mounting /proc in the container"
chroot /container /usr/bin/mtgdrcopy_sanity || fail "mtgdrcopy_sanity in the container failed"
chroot /container /usr/bin/mtgdrcopy_copybw -s 64K -w 100 -r 10 || fail "mtgdrcopy_copybw in the container failed"
umount /container/proc

step unload
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

step softdep
# The packaged softdep, with kmod's modprobe as on a host: loading the provider loads mtgdrdrv.
# The provider is the emulated one here, so the softdep is the packaged line with mtgpu renamed,
# and the emulator goes where modprobe finds it. kmod 30 reads /lib/modprobe.d, which merged /usr
# makes /usr/lib/modprobe.d: so the packaged file goes there too, and modprobe -c must show it.
kmod=/opt/mtgdrcopy/kmod
mkdir -p $kmod && for tool in modprobe depmod; do ln -s /usr/bin/kmod $kmod/$tool; done
mods=/lib/modules/$(uname -r)
mkdir -p $mods/extra /lib/modprobe.d /etc/modprobe.d
cp /lib/mtgdrcopy/mtgpu_emu.ko $mods/extra/
touch $mods/modules.order $mods/modules.builtin $mods/modules.builtin.modinfo
$kmod/depmod -a || fail "depmod (kmod)"
cp @SOFTDEP@ /lib/modprobe.d/
$kmod/modprobe -c | grep -qx 'softdep mtgpu post: mtgdrdrv' || fail "kmod does not read the packaged softdep"
sed -n 's/^softdep mtgpu post: /softdep mtgpu_emu post: /p' @SOFTDEP@ >/etc/modprobe.d/mtgdrdrv-emu.conf
grep -qx 'softdep mtgpu_emu post: mtgdrdrv' /etc/modprobe.d/mtgdrdrv-emu.conf || fail "no softdep for mtgpu_emu"
# What kmod does, as debian/mtgdrdrv.modprobe.conf says: each MTGDRCOPY-KMOD line is printed
# by the test (the module state after each command) and checked.
loaded() { for m in mtgpu_emu mtgdrdrv; do [ -d /sys/module/$m ] && printf ' %s' $m; done; }
try() {
	what=$1; shift
	rc=0; out=$("$@" 2>&1) || rc=$?
	echo "MTGDRCOPY-KMOD $what: exit $rc, loaded after:$(loaded)${out:+; $out}"
}
try "modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)" = "0  mtgpu_emu mtgdrdrv" ] || fail "modprobe mtgpu_emu did not load mtgdrdrv (softdep)"
# Unloading the provider unloads mtgdrdrv first (kmod removes post softdeps), then kmod 30
# tries mtgpu_emu again, which the removal of mtgdrdrv's unused dependency already took: exit 1.
try "modprobe -r mtgpu_emu, mtgdrdrv loaded" $kmod/modprobe -r mtgpu_emu
[ "$rc$(loaded)" = 1 ] || fail "modprobe -r mtgpu_emu: exit $rc (kmod 30 says 1), left:$(loaded)"
echo "$out" | grep -q "could not remove 'mtgpu_emu'" || fail "modprobe -r mtgpu_emu said: $out"
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
try "modprobe -r mtgdrdrv, mtgpu_emu loaded by modprobe" $kmod/modprobe -r mtgdrdrv
rmmod mtgdrdrv 2>/dev/null; rmmod mtgpu_emu 2>/dev/null
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
try "modprobe -r mtgdrdrv mtgpu_emu" $kmod/modprobe -r mtgdrdrv mtgpu_emu
[ "$rc$(loaded)" = 0 ] || fail "modprobe -r mtgdrdrv mtgpu_emu: exit $rc, left:$(loaded)"
$kmod/modprobe mtgpu_emu || fail "modprobe mtgpu_emu"
rmmod mtgdrdrv || fail "rmmod mtgdrdrv"
try "modprobe -r mtgpu_emu, mtgdrdrv not loaded" $kmod/modprobe -r mtgpu_emu
[ "$rc$(loaded)" = 0 ] || fail "modprobe -r mtgpu_emu without mtgdrdrv loaded failed"

# mtgdrdrv not built for this kernel: the provider loads, modprobe succeeds and says nothing.
mv $mods/updates/dkms/mtgdrdrv.ko /tmp/mtgdrdrv.ko && $kmod/depmod -a || fail "depmod without mtgdrdrv"
try "mtgdrdrv not built: modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)${out}" = "0  mtgpu_emu" ] || fail "a softdep on a missing mtgdrdrv changed modprobe mtgpu_emu"
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

# mtgdrdrv there but its load fails (an invalid parameter stands in for any failure, e.g. a
# symbol version mtgpu disagrees with): the same, the kernel log says why.
mv /tmp/mtgdrdrv.ko $mods/updates/dkms/mtgdrdrv.ko && $kmod/depmod -a || fail "depmod with mtgdrdrv"
echo "options mtgdrdrv max_pins_per_file=bogus" >/etc/modprobe.d/mtgdrdrv-bogus.conf
try "mtgdrdrv fails to load: modprobe mtgpu_emu" $kmod/modprobe mtgpu_emu
[ "$rc $(loaded)${out}" = "0  mtgpu_emu" ] || fail "a failing mtgdrdrv changed modprobe mtgpu_emu"
dmesg | grep -q "mtgdrdrv: .bogus' invalid for parameter .max_pins_per_file'" || fail "the kernel did not say why mtgdrdrv failed"
rm /etc/modprobe.d/mtgdrdrv-bogus.conf
rmmod mtgpu_emu || fail "rmmod mtgpu_emu"

# The provider loaded with disable_driver=1 through modprobe: the softdep loads mtgdrdrv anyway
# (mtgdrdrv-load's check is not on that path); mtgdrdrv says it refuses every pin.
try "modprobe mtgpu_emu disable_driver=1" $kmod/modprobe mtgpu_emu disable_driver=1
[ "$rc $(loaded)" = "0  mtgpu_emu mtgdrdrv" ] || fail "modprobe mtgpu_emu disable_driver=1: exit $rc, loaded:$(loaded)"
dmesg | grep -q "mtgdrdrv: mtgpu is loaded but not initialised" || fail "mtgdrdrv loaded with its provider disabled, silently"
rmmod mtgdrdrv; rmmod mtgpu_emu || fail "rmmod mtgpu_emu (disable_driver=1)"
step done
"#;

/// GUEST_SCRIPT with the paths filled in.
pub(super) fn guest_script(udevd: &str) -> String {
    GUEST_SCRIPT
        .replace("@UDEVD@", udevd)
        .replace("@LOAD_SCRIPT@", LOAD_SCRIPT)
        .replace("@SOFTDEP@", SOFTDEP)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use xtask_base::paths;

    /// The VM runs mtgdrdrv-load exactly as the postinst does, and the postinst loads mtgdrdrv
    /// only through it.
    #[test]
    fn guest_runs_mtgdrdrv_load_as_the_postinst_does() {
        let call = "@LOAD_SCRIPT@ --if-provider";
        let postinst =
            fs::read_to_string(paths::root().join("debian/mtgdrdrv-dkms.postinst.in")).unwrap();
        // The code, not the comments.
        let code: String = postinst
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(code.matches(call).count(), 1);
        assert!(
            !code.contains("modprobe"),
            "the postinst loads mtgdrdrv itself"
        );
        assert_eq!(GUEST_SCRIPT.matches(call).count(), 2);
        let script = guest_script("/usr/lib/systemd/systemd-udevd");
        // `"$@"` is shell; `@NAME@` would be a placeholder left.
        let parts: Vec<&str> = script.split('@').collect();
        let left = parts[1..parts.len() - 1].iter().find(|name| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        });
        assert!(left.is_none(), "a placeholder is left: @{left:?}@");
        assert!(script.contains(&format!(
            "grep -qx 'softdep mtgpu post: mtgdrdrv' {SOFTDEP}"
        )));
        assert!(script.contains(&format!("{LOAD_SCRIPT} --if-provider")));
    }
}
