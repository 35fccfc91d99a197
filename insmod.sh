#!/bin/sh
# Loads mtgdrdrv built from this tree (`cargo xtask build driver`), for use without the packages.
#
#   sudo ./insmod.sh [MODULE.ko] [PARAM=VALUE...]
#
# MODULE.ko defaults to build/driver/$(uname -r)/mtgdrdrv.ko; parameters such as dbg_enabled=1
# info_enabled=1 are passed to insmod. A loaded mtgdrdrv is unloaded first. The mtgpu driver
# must be loaded (mtgdrdrv links against it), and not with disable_driver=1 (its GPU driver is
# then not initialised, and using mtgdrdrv would oops the kernel): debian/scripts/mtgdrdrv-load, which
# the mtgdrdrv-dkms postinst runs too, decides and loads; it refuses with one line saying why.
# /dev/mtgdrdrv gets the group and mode of debian/60-mtgdrdrv.rules: from udev where that rule
# is installed (the mtgdrdrv-dkms package, or cargo xtask install drv with --prefix /usr), else
# from this script, which applies the rule's GROUP and MODE itself (udev's default is root-only
# 0600, and a user's tools would silently fall back to the slower dma-buf backend).
#
# MTGDRDRV_PROVIDER names the module that provides mtgpu_p2p_get_pages (default mtgpu; the
# tests use mtgpu_emu, the emulated provider).
set -eu

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
# Exits 2 (provider not loaded) or 3 (loaded with disable_driver=1) without loading anything.
sh "$here/debian/scripts/mtgdrdrv-load" "$ko" "$@"

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

rule_installed() {
	for dir in /etc/udev/rules.d /run/udev/rules.d /usr/lib/udev/rules.d /lib/udev/rules.d; do
		[ -e "$dir/60-mtgdrdrv.rules" ] && return 0
	done
	return 1
}

if ! rule_installed; then
	rule=$here/debian/60-mtgdrdrv.rules
	group=$(sed -n 's/^[^#]*GROUP="\([^"]*\)".*/\1/p' "$rule")
	mode=$(sed -n 's/^[^#]*MODE="\([^"]*\)".*/\1/p' "$rule")
	if [ -z "$group" ] || [ -z "$mode" ]; then
		echo "insmod.sh: $rule names no GROUP and MODE" >&2
		exit 1
	fi
	chgrp "$group" /dev/mtgdrdrv
	chmod "$mode" /dev/mtgdrdrv
	echo "insmod.sh: no udev rule for mtgdrdrv is installed: set /dev/mtgdrdrv to group" \
		"$group, mode $mode, as debian/60-mtgdrdrv.rules says (until the module is reloaded)"
fi
ls -l /dev/mtgdrdrv
