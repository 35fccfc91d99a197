#!/bin/bash
# The README's install from source, as its reader runs it: a user who is not root, who has sudo,
# runs `cargo xtask install lib exes --prefix P` for a prefix only root may write. The install
# must build as that user, copy through sudo, and leave no root-owned file in the user's tree.
#
# Shell, not Rust: it is a sequence of the system's own tools (unshare, useradd, sudo, setpriv).
# It changes nothing on this machine: it runs in a mount namespace of its own, where /etc and
# /root are overlays whose writes land under WORK (the user and its sudoers entry exist only
# there; /root is opened to the user there so that it finds rustup's toolchain, which stays
# read-only to it).
#
# usage: install-as-user.sh REPO WORK   (as root; WORK: an empty directory, removed by the caller)
set -euo pipefail

if [[ ${MTGDRCOPY_IN_NAMESPACE:-} != 1 ]]; then
	MTGDRCOPY_IN_NAMESPACE=1 exec unshare --mount --propagation private -- "$0" "$@"
fi

repo=$1 work=$2
user=mtgbuild uid=4242
home=$work/home prefix=$work/prefix

overlay() { # DIR: writes under DIR go to $work from now on, in this namespace only
	local name=${1//\//_}
	mkdir -p "$work/$name.upper" "$work/$name.work"
	mount -t overlay overlay -o "lowerdir=$1,upperdir=$work/$name.upper,workdir=$work/$name.work" "$1"
}
overlay /etc
overlay /root
chmod 0711 /root

useradd --uid "$uid" --user-group --home-dir "$home" --create-home --shell /bin/bash "$user"
printf '%s ALL=(root) NOPASSWD: ALL\n' "$user" >/etc/sudoers.d/mtgdrcopy-test
chmod 0440 /etc/sudoers.d/mtgdrcopy-test

# The user's own cargo home (cargo writes its locks there), with this machine's registry so that
# nothing is downloaded again; its own clone of the tree.
mkdir -p "$home/.cargo"
cp -a /root/.cargo/registry "$home/.cargo/"
git clone --quiet "$repo" "$home/src"
chown -R "$user:$user" "$home"
install -d -m 0755 "$prefix" # root's, 0755: the user cannot write it

as_user() {
	setpriv --reuid="$uid" --regid="$uid" --init-groups \
		env -i HOME="$home" USER="$user" LOGNAME="$user" PATH="/root/.cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		RUSTUP_HOME=/root/.rustup CARGO_HOME="$home/.cargo" RUSTUP_AUTO_INSTALL=0 \
		bash -c "cd '$home/src' && $1"
}

as_user "test ! -w '$prefix'"
as_user "cargo xtask install lib exes --prefix '$prefix'" 2>&1 | tee "$work/install.log"

fail() { echo "install-as-user: $*" >&2; exit 1; }
grep -q 'is not writable by you: building and staging as you, then installing with sudo' "$work/install.log" ||
	fail "the install did not take the sudo path"
for f in lib/libgdrapi.so.1.0.0 include/gdrapi.h bin/mtgdrcopy_sanity bin/mtgdrcopy_doctor \
	share/man/man1/mtgdrcopy_doctor.1 share/man/man3/gdrapi.3; do
	[[ -f $prefix/$f ]] || fail "$prefix/$f missing"
	[[ $(stat -c %U "$prefix/$f") == root ]] || fail "$prefix/$f not owned by root"
done
[[ $(readlink "$prefix/lib/libgdrapi.so.1") == libgdrapi.so.1.0.0 ]] || fail "libgdrapi.so.1 link"
[[ $(readlink "$prefix/lib/libgdrapi.so") == libgdrapi.so.1 ]] || fail "libgdrapi.so link"
LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/mtgdrcopy_sanity" --version >/dev/null ||
	fail "the installed mtgdrcopy_sanity does not run"
owned_by_root=$(find "$home/src" -user root -print -quit)
[[ -z $owned_by_root ]] || fail "root-owned files in the user's tree: $owned_by_root"
echo "install-as-user: built as $user, installed into $prefix through sudo"
