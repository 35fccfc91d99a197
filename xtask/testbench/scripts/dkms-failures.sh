#!/bin/sh
# mtgdrdrv-dkms's postinst with the real DKMS where module builds fail: step 1b of the package
# install test (xtask/testbench/src/pkgtest/dkms.rs runs it inside a bookworm root with dkms and the
# VM kernel's headers, one phase per call, and checks the installed module between phases).
#
#   dkms-failures.sh PHASE RELEASE VERSION DEB
#
# RELEASE is the kernel the root believes it runs, VERSION the module's, DEB mtgdrdrv-dkms's
# .deb inside the root. Phases, in order:
#   setup           uname -r says RELEASE; a newer kernel whose build fails (BROKEN), one
#                   without headers, one older than BUILD_EXCLUSIVE_KERNEL allows (EXCLUDED)
#   no-autoinstall  /etc/dkms/no-autoinstall: registered, nothing built, said so; purged
#   newest-broken   (autoinstall_all_kernels set to "", i.e. unset) the newest kernel's build
#                   fails: one warning naming its kept make.log, apt succeeds, nothing half
#                   configured; EXCLUDED not built. Leaves the module installed.
#   running-broken  autoinstall_all_kernels=yes and the running kernel's build broken: configure
#                   fails saying so, EXCLUDED is skipped (DKMS exit 77), the kernel without
#                   headers is named with its headers package; once repaired,
#                   `dpkg --configure -a` succeeds. Leaves the module installed.
#   cleanup         purged, the configuration as it was.
# Every message checked is the postinst's (debian/mtgdrdrv-dkms.postinst.in); nothing here loads
# the module (a chroot, and mtgpu is absent anyway).
set -eu

phase=$1 release=$2 version=$3 deb=${4:-}
broken=6.1.0-9999-amd64
headerless=6.1.0-9998-amd64
excluded=5.3.0-1-amd64
conf_d=/etc/dkms/framework.conf.d/mtgdrcopy-test.conf
kept=/var/lib/dkms/mtgdrdrv/$version/make-$broken.log
warning="mtgdrdrv: warning: the DKMS build failed for kernel $broken (not the running one; dkms exit 10), which stays without mtgdrdrv: see $kept"

fail() {
	echo "dkms-failures.sh $phase: $*" >&2
	exit 1
}

# $1/Makefile fails every build; $1/include makes it a kernel with headers.
break_build() {
	mkdir -p "$1/include"
	printf 'modules clean:\n\t@echo "broken on purpose by the package install test" >&2; exit 1\n' \
		>"$1/Makefile"
}

# apt-get install of the .deb: its output (also printed, for the log) in $out, its status in
# $rc. The postinst must not try to load the module.
install() {
	rc=0
	out=$(apt-get install -y -q --no-install-recommends "$deb" 2>&1) || rc=$?
	printf '%s\n' "$out"
	for line in "could not load the module now" "driver is not loaded" \
		"loaded with disable_driver=1"; do
		case $out in
		*"$line"*) fail "the postinst tried to load mtgdrdrv in a chroot without mtgpu" ;;
		esac
	done
}

said() {
	printf '%s\n' "$out" | grep -qxF -- "$1" || fail "apt-get did not say: $1"
}

audit_clean() {
	left=$(dpkg --audit)
	[ -z "$left" ] || fail "dpkg --audit: $left"
}

purge() {
	apt-get purge -y -q mtgdrdrv-dkms
}

case $phase in
setup)
	# In /usr/sbin, since apt runs dpkg with PATH=/usr/sbin:/usr/bin:/sbin:/bin (DPkg::Path).
	printf '#!/bin/sh\n# The package install test: this root runs the VM kernel.\n%s\n' \
		"if [ \"\$1\" = -r ]; then echo $release; else exec /usr/bin/uname \"\$@\"; fi" \
		>/usr/sbin/uname
	chmod 755 /usr/sbin/uname
	[ "$(uname -r)" = "$release" ] || fail "uname -r says $(uname -r), not $release"
	break_build "/lib/modules/$broken/build"
	mkdir -p "/lib/modules/$headerless/kernel" "/lib/modules/$excluded/build/include"
	;;
no-autoinstall)
	touch /etc/dkms/no-autoinstall
	install
	[ "$rc" = 0 ] || fail "with /etc/dkms/no-autoinstall, the install failed"
	said "mtgdrdrv: DKMS autoinstall is disabled (/etc/dkms/no-autoinstall), so the module is not built; build it by hand: dkms install mtgdrdrv/$version -k <kernel>"
	case $out in *"Building module"*) fail "DKMS built the module" ;; esac
	status=$(dkms status -m mtgdrdrv)
	[ "$status" = "mtgdrdrv/$version: added" ] || fail "dkms status says: $status"
	purge
	rm /etc/dkms/no-autoinstall
	;;
newest-broken)
	# An empty value is unset, as DKMS reads it.
	echo 'autoinstall_all_kernels=""' >"$conf_d"
	install
	[ "$rc" = 0 ] || fail "a failed build for $broken, which is not running, failed the install"
	said "mtgdrdrv: building for kernel(s) $broken $release (the newest installed kernel and the running one)"
	said "$warning"
	case $out in
	*"$excluded"* | *"$headerless"*) fail "built for a kernel neither running nor newest" ;;
	esac
	audit_clean
	grep -q "broken on purpose" "$kept" || fail "$kept is not $broken's make.log"
	;;
running-broken)
	apt-get -f install -y -q
	purge
	rm "$conf_d"
	cp -p /etc/dkms/framework.conf /etc/dkms/framework.conf.test-saved
	echo autoinstall_all_kernels=yes >>/etc/dkms/framework.conf
	build=/lib/modules/$release/build
	mv "$build" "$build.real"
	break_build "$build"
	install
	[ "$rc" != 0 ] || fail "a failed build for the running kernel $release did not fail the install"
	# Oldest first (sort -V), the running kernel last.
	said "mtgdrdrv: building for kernel(s) $excluded $headerless $broken $release (DKMS's autoinstall_all_kernels is set)"
	said "mtgdrdrv: not supported by kernel $excluded (BUILD_EXCLUSIVE_* in dkms.conf), skipped"
	said "mtgdrdrv: no headers for kernel $headerless, not building for it (install linux-headers-$headerless, then: dkms install mtgdrdrv/$version -k $headerless)"
	said "$warning"
	said "mtgdrdrv: the DKMS build failed for the running kernel $release (dkms exit 10): see /var/lib/dkms/mtgdrdrv/$version/build/make.log; once the cause is fixed, retry with: dpkg --configure -a"
	case $(dpkg --audit) in
	*mtgdrdrv-dkms*) ;;
	*) fail "after the failed configure, dpkg --audit does not list mtgdrdrv-dkms" ;;
	esac
	rm -r "$build"
	mv "$build.real" "$build"
	# The retry replaces the registration the failed run left (DKMS 3's add refuses a second).
	dpkg --configure -a || fail "dpkg --configure -a failed once the running kernel's build was fixed"
	audit_clean
	;;
cleanup)
	purge
	mv /etc/dkms/framework.conf.test-saved /etc/dkms/framework.conf
	;;
*) fail "no such phase" ;;
esac
