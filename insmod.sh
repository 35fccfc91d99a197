#!/bin/sh
# Loads mtgdrdrv built from this tree (`cargo xtask build driver`), for use without the packages.
#
#   sudo ./insmod.sh [MODULE.ko] [PARAM=VALUE...]
#
# MODULE.ko defaults to build/driver/$(uname -r)/mtgdrdrv.ko; parameters such as dbg_enabled=1
# info_enabled=1 are passed to insmod. A loaded mtgdrdrv is unloaded first. The mtgpu driver
# must be loaded (mtgdrdrv links against it). /dev/mtgdrdrv is created by udev with the mode of
# debian/60-mtgdrdrv.rules once that rule is installed (cargo xtask install drv, or the
# mtgdrdrv-dkms package); without it, udev's default is root-only (0600).
#
# MTGDRDRV_PROVIDER names the module that provides mtgpu_p2p_get_pages (default mtgpu; the
# tests use mtgpu_emu, the emulated provider).
set -eu

provider=${MTGDRDRV_PROVIDER:-mtgpu}
here=$(cd "$(dirname "$0")" && pwd)

ko=$here/build/driver/$(uname -r)/mtgdrdrv.ko
case "${1:-}" in
*.ko)
	ko=$1
	shift
	;;
esac

if [ ! -f "$ko" ]; then
	echo "insmod.sh: $ko does not exist; build it with: cargo xtask build driver" >&2
	exit 1
fi
if ! grep -q "^$provider " /proc/modules; then
	echo "insmod.sh: the $provider driver is not loaded, and mtgdrdrv needs its" \
		"mtgpu_p2p_get_pages: load it first (modprobe $provider)" >&2
	exit 1
fi
if grep -q '^mtgdrdrv ' /proc/modules; then
	rmmod mtgdrdrv
fi
insmod "$ko" "$@"

# udev creates the node; give it up to 10 s.
i=0
while [ ! -c /dev/mtgdrdrv ]; do
	i=$((i + 1))
	if [ "$i" -gt 100 ]; then
		echo "insmod.sh: mtgdrdrv is loaded but /dev/mtgdrdrv did not appear within 10 s;" \
			"is udev running?" >&2
		exit 1
	fi
	sleep 0.1
done
if command -v udevadm >/dev/null 2>&1; then
	udevadm settle --timeout=10 || true
fi
ls -l /dev/mtgdrdrv
