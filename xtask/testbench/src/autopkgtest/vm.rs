//! The VM testbed: the tests of debian/tests/control that need a machine of their own
//! (`isolation-machine`: they load kernel modules), run by autopkgtest's `qemu` virt server on
//! the emulated GPU.
//!
//! The image is the host root of the chroot testbed (bookworm, DKMS, the headers of the VM's
//! kernel) with the release's packages installed by apt, so that the postinst has DKMS build
//! mtgdrdrv for the VM's kernel as on a host, plus what stands in for a Moore Threads GPU: the
//! emulated provider's module (in /usr/lib/modules/<release>/extra, depmod run), the emulated
//! libmusa (/usr/lib/mtgdrcopy/emu) and the ivshmem device the provider drives. `mke2fs -d`
//! writes it as an ext4 file system: no partition table, no boot loader.
//!
//! Why not autopkgtest-build-qemu's image: vmdb2 needs loop devices and installs a boot
//! loader, and a full systemd boot costs minutes under TCG. autopkgtest-virt-qemu starts
//! [`QEMU`] instead (its `--qemu-command`), which boots the kernel directly into an initramfs
//! (busybox and the virtio, ext4 and 9p modules of the kernel's own package) that mounts the
//! image and hands over to [`TESTBED_INIT`]. That sets up what systemd would for the tests
//! (the kernel's file systems, udev), prints the login prompt autopkgtest-virt-qemu waits for
//! on ttyS0 and keeps a root shell on ttyS1, where autopkgtest looks for one.
//!
//! The packages are installed when the image is made, not by autopkgtest: given the .debs it
//! reinstalls them in the testbed, and DKMS builds the module once more under TCG. So the
//! tests' Depends are in the image, autopkgtest installs nothing, and its record of the
//! testbed's packages must show this release's versions. The testbed has no network: its apt
//! sources are removed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use xshell::Shell;

use super::Run;
use crate::kernel::{self, Kernel};
use crate::pkgtest::root::{self, Root};
use crate::step::timed;
use crate::vm;
use xtask_pack::stage::Package;

/// The environment the tests get: the emulated provider in place of mtgpu, the emulated
/// libmusa, allowed by the test suite only.
const TEST_ENV: &[&str] = &[
    "MTGDRDRV_PROVIDER=mtgpu_emu",
    "LD_LIBRARY_PATH=/usr/lib/mtgdrcopy/emu",
    "MTGDRCOPY_ALLOW_EMULATED_MUSA=1",
];

/// What the testbed has beside the host root and the packages: autopkgtest's own needs in a
/// testbed (python3 for its helpers, apt-ftparchive for its local archive).
const TESTBED_PACKAGES: &[&str] = &["python3-minimal", "apt-utils"];

/// The kernel's modules the initramfs loads, and the recipe name of that list in the cache.
const BOOT_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "crc32c_generic",
    "ext4",
    "9pnet_virtio",
    "9p",
    "virtio_console",
];
const BOOT_MODULES_RECIPE: &str = "testbed1";

/// The initramfs's /init: the image (autopkgtest's overlay of it) is the first disk.
const INITRAMFS_INIT: &str = r#"#!/bin/sh
# Written by cargo xtask test: mounts the testbed image and hands over to its init.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
modprobe -a @MODULES@
i=0
while [ ! -b /dev/vda ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if ! mount -t ext4 /dev/vda /mnt; then
	echo "testbed: cannot mount /dev/vda"
	poweroff -f
fi
mount --move /dev /mnt/dev
umount /proc /sys
# Through busybox itself: the initramfs links only the applets of /bin.
exec /bin/busybox switch_root /mnt /usr/sbin/testbed-init
"#;

/// PID 1 of the testbed, in the image.
const TESTBED_INIT: &str = r#"#!/bin/sh
# Written by cargo xtask test: PID 1 of the autopkgtest qemu testbed. What systemd would set
# up for the tests, then the login prompt autopkgtest-virt-qemu waits for on ttyS0 and the
# root shell it looks for on ttyS1.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
# Bash's process substitution (DKMS uses it) needs /dev/fd.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
hostname testbed
/usr/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add
udevadm settle --timeout=30
# The shell's rc file prints the login prompt: autopkgtest talks to ttyS1 once it is seen, so
# the shell must be reading by then. No line editing: readline's terminal mode switches stall
# the serial line's output while autopkgtest types ahead.
while :; do
	setsid sh -c 'exec bash --noediting --rcfile /etc/testbed-shellrc -i </dev/ttyS1 >/dev/ttyS1 2>&1'
done
"#;

/// The rc file of the testbed's root shell on ttyS1.
const TESTBED_SHELLRC: &str = r##"# Written by cargo xtask test: the rc file of the testbed's root shell on ttyS1.
[ -e /run/testbed-up ] || { : >/run/testbed-up; echo "testbed login: " >/dev/ttyS0; }
# autopkgtest-virt-qemu (5.28), once it has set its own prompt, sends `type python3` and
# then waits 5 s for a "# " that follows a newline in the same read as the output, or in
# new output. When the host reads the output and the prompt in one go (a loaded host does),
# nothing new comes and the testbed setup fails. A line "# " before each prompt is either in
# that read or the next one. (trixie's 5.49 looks at how the read ends instead: this can go
# once the hosts run it.)
PROMPT_COMMAND='printf "# \n"'
"##;

/// autopkgtest-virt-qemu's QEMU. Named `qemu-system-x86_64`, since autopkgtest reads the
/// architecture from the name.
const QEMU: &str = r#"#!/bin/sh
# Written by cargo xtask test: the QEMU autopkgtest-virt-qemu starts for the VM testbed
# (--qemu-command). It boots the kernel directly (the image has no boot loader), adds the
# emulated GPU's ivshmem device, and runs under TCG as every VM of cargo xtask test: the
# -enable-kvm autopkgtest adds where /dev/kvm exists is dropped.
for arg do
	shift
	[ "$arg" = -enable-kvm ] || set -- "$@" "$arg"
done
exec /usr/bin/qemu-system-x86_64 "$@" -cpu max -kernel @KERNEL@ -initrd @INITRD@ \
	-append "console=ttyS0 printk.time=1 panic=-1" \
	-object memory-backend-ram,id=hostmem,size=256M -device ivshmem-plain,memdev=hostmem
"#;

/// Runs `tests` on the VM testbed with the release's `debs`; their output is in `run.out`.
pub(super) fn test_on_vm(
    sh: &Shell,
    run: &Run,
    debs: &[(Package, PathBuf)],
    tests: &[String],
) -> Result<()> {
    let kernel = kernel::bookworm_kernel()?;
    let dir = &run.base;
    xtask_base::files::fresh_dir(dir)?;
    let t = Instant::now();
    let image = dir.join("testbed.ext4");
    make_image(sh, &kernel, debs, &image)?;
    timed(
        "VM testbed: image (host root, the packages, the emulated GPU)",
        t,
    );
    let qemu = boot_files(&kernel, dir)?;

    let t = Instant::now();
    // autopkgtest-virt-qemu gives the testbed fixed seconds (5, 10, 30) for each step of its
    // setup, sized for KVM. Under TCG, beside the other lane's builds, the testbed misses
    // them; a higher priority for autopkgtest and its QEMU keeps the guest's answers prompt.
    let mut command = Command::new("nice");
    command.args(["-n", "-10", "autopkgtest"]);
    command.arg("--no-built-binaries").args(run.report_args());
    command.args(tests.iter().map(|t| format!("--test-name={t}")));
    command.args(TEST_ENV.iter().map(|e| format!("--env={e}")));
    command.arg(format!("{}/", run.source.display()));
    command
        .args([
            "--",
            "qemu",
            "--timeout-reboot=300",
            "--ram-size=2048",
            "--cpus=2",
        ])
        .arg(format!("--qemu-command={}", qemu.display()))
        .arg(&image);
    let output = command.output().context("running autopkgtest")?;
    timed("VM testbed: autopkgtest", t);
    run.judge(tests, &output)?;
    installed_were_the_release(&run.out, debs)
}

/// The image at `image`: the host root, [`TESTBED_PACKAGES`] and `debs` installed, the emulated
/// GPU's files, [`TESTBED_INIT`], no apt sources.
fn make_image(
    sh: &Shell,
    kernel: &Kernel,
    debs: &[(Package, PathBuf)],
    image: &Path,
) -> Result<()> {
    let root = Root::fresh(root::dkms_layers(sh, kernel)?, "autopkgtest-vm")?;
    let mut install: Vec<String> = TESTBED_PACKAGES.iter().map(|p| p.to_string()).collect();
    for (_, deb) in debs {
        let name = deb.file_name().context("a .deb without a name")?;
        let inside = format!("/tmp/debs/{}", name.to_string_lossy());
        let to = root.new_file(&inside);
        fs::create_dir_all(to.parent().context("no parent")?)?;
        fs::copy(deb, &to).with_context(|| format!("copying {}", deb.display()))?;
        install.push(inside);
    }
    root.apt_install(sh, &install.iter().map(String::as_str).collect::<Vec<_>>())?;

    // Written into the upper directory itself: under /usr, since /lib and /sbin are symlinks
    // in the layers (merged /usr), which a directory of the same name here would hide.
    let (emu, libmusa) = crate::pkgtest::emulated_provider(sh, kernel)?;
    let release = &kernel.release;
    for (from, to, mode) in [
        (
            &emu,
            format!("/usr/lib/modules/{release}/extra/mtgpu_emu.ko"),
            0o644,
        ),
        (
            &libmusa,
            "/usr/lib/mtgdrcopy/emu/libmusa.so.1".to_owned(),
            0o644,
        ),
    ] {
        xtask_base::files::put_file(from, &root.new_file(&to), mode)?;
    }
    let init = root.new_file("/usr/sbin/testbed-init");
    xtask_base::files::put_text(&init, TESTBED_INIT, 0o755)?;
    let shellrc = root.new_file("/etc/testbed-shellrc");
    xtask_base::files::put_text(&shellrc, TESTBED_SHELLRC, 0o644)?;
    root.run(sh, &["depmod", "-a", release])?;
    root.run(sh, &["rm", "-rf", "/tmp/debs", "/etc/apt/sources.list"])?;
    root.run(
        sh,
        &["find", "/etc/apt/sources.list.d", "-type", "f", "-delete"],
    )?;
    root.ext4_image(sh, image, "2G")
}

/// The initramfs and [`QEMU`] in `dir`; returns the latter's path.
fn boot_files(kernel: &Kernel, dir: &Path) -> Result<PathBuf> {
    let modules = kernel::image_modules(kernel, BOOT_MODULES, BOOT_MODULES_RECIPE)?;
    let files = xtask_base::files::files(&modules)?
        .into_iter()
        .map(|host| {
            let guest = host.strip_prefix(&modules).unwrap_or(&host);
            let guest = format!("/{}", guest.display());
            (host, guest)
        })
        .collect::<Vec<_>>();
    let initrd = dir.join("initrd.img");
    let init = INITRAMFS_INIT.replace("@MODULES@", &BOOT_MODULES.join(" "));
    vm::write_initramfs(&files, &init, &initrd)?;
    let qemu = dir.join("bin/qemu-system-x86_64");
    let script = QEMU
        .replace("@KERNEL@", &vm::boot_image(kernel).display().to_string())
        .replace("@INITRD@", &initrd.display().to_string());
    xtask_base::files::put_text(&qemu, &script, 0o755)?;
    Ok(qemu)
}

/// autopkgtest's record of the testbed's packages (`testbed-packages`: name, tab, version)
/// shows each of `debs` at its version: the tests ran on this release's packages.
fn installed_were_the_release(out: &Path, debs: &[(Package, PathBuf)]) -> Result<()> {
    let path = out.join("testbed-packages");
    let listed =
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for (_, deb) in debs {
        let name = deb.file_name().unwrap_or_default().to_string_lossy();
        let mut parts = name.trim_end_matches(".deb").split('_');
        let (package, version) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        ensure!(
            listed.lines().any(|l| l == format!("{package}\t{version}")),
            "the VM testbed did not have {package} {version} installed (autopkgtest's {})",
            path.display()
        );
    }
    Ok(())
}
