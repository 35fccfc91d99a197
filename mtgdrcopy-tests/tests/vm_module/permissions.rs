//! Device permissions: the packaged udev policy for /dev/mtgdrdrv, and what another user may open
//! or reach.

use super::*;

/// Another user, without access to the device node, gets EACCES and, with logging on, a line
/// naming the permission policy.
#[test]
fn another_user_without_access_is_refused() {
    let code = in_child(|| {
        // SAFETY: plain system calls in the forked child.
        if unsafe { libc::setgid(65534) } != 0 || unsafe { libc::setuid(65534) } != 0 {
            return 40;
        }
        match Gdr::open() {
            Err(e) if e.errno() == Errno::EACCES => 0,
            Err(_) => 41,
            Ok(_) => 42,
        }
    });
    assert_eq!(
        code,
        0,
        "nobody must not open /dev/mtgdrdrv (mode {:o})",
        device_mode()
    );
}

fn device_mode() -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata("/dev/mtgdrdrv")
        .map(|m| m.permissions().mode())
        .unwrap_or(0)
}

/// The packaged policy (debian/60-mtgdrdrv.rules, installed by the dkms package as
/// /usr/lib/udev/rules.d/60-mtgdrdrv.rules) is group render, mode 0660. The test VM runs no
/// udev, so the node keeps devtmpfs's default, root:root 0600, which is stricter; the test
/// accepts either, then applies the rule as udev would and checks who may open the node: a
/// member of the rule's group may, another user may not.
#[test]
fn device_node_mode_follows_the_packaged_policy() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let rule = include_str!("../../../debian/60-mtgdrdrv.rules");
    let line = rule
        .lines()
        .find(|l| l.starts_with("KERNEL==\"mtgdrdrv\""))
        .expect("the rule line");
    assert!(
        line.contains("GROUP=\"render\"") && line.contains("MODE=\"0660\""),
        "{line}"
    );
    let meta = std::fs::metadata("/dev/mtgdrdrv").expect("node");
    let mode = meta.permissions().mode() & 0o777;
    let devtmpfs_default = mode == 0o600 && meta.uid() == 0 && meta.gid() == 0;
    assert!(
        mode == 0o660 || devtmpfs_default,
        "mode {mode:o}, gid {}",
        meta.gid()
    );
    // Apply the policy by hand; "render" has no fixed gid, any non-root one does.
    const RENDER_GID: u32 = 109;
    std::os::unix::fs::chown("/dev/mtgdrdrv", Some(0), Some(RENDER_GID)).expect("chown");
    std::fs::set_permissions("/dev/mtgdrdrv", std::fs::Permissions::from_mode(0o660))
        .expect("chmod");
    let try_open_as = |groups: &'static [u32]| {
        in_child(move || {
            let gids: Vec<libc::gid_t> = groups.to_vec();
            // SAFETY: plain system calls in the forked child.
            unsafe {
                if libc::setgroups(gids.len(), gids.as_ptr()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return 40;
                }
            }
            match Gdr::open() {
                Ok(_) => 0,
                Err(e) if e.errno() == Errno::EACCES => 1,
                Err(_) => 41,
            }
        })
    };
    let member = try_open_as(&[RENDER_GID]);
    let other = try_open_as(&[]);
    // Back to what the VM had.
    std::os::unix::fs::chown("/dev/mtgdrdrv", Some(meta.uid()), Some(meta.gid())).expect("chown");
    std::fs::set_permissions("/dev/mtgdrdrv", std::fs::Permissions::from_mode(mode))
        .expect("chmod");
    assert_eq!(member, 0, "a member of the rule's group opens the device");
    assert_eq!(other, 1, "another user gets EACCES");
}

/// Even where the node were world-accessible, another user's process reaches nothing of ours:
/// handles are per open file (its own file has none of them), GPU VAs resolve only in the
/// process that allocated them, and an fd inherited from us is refused by tgid.
#[test]
fn another_user_cannot_use_someone_elses_handles_or_memory() {
    use std::os::unix::fs::PermissionsExt;
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let dev = RawDev::open();
    let h = dev.pin(va, MIB).expect("pin");
    let map = dev.mmap(h, MIB as usize).expect("mmap");
    let old = std::fs::metadata("/dev/mtgdrdrv")
        .expect("node")
        .permissions();
    std::fs::set_permissions("/dev/mtgdrdrv", std::fs::Permissions::from_mode(0o666))
        .expect("chmod 0666 for the test");
    let code = in_child(|| {
        // SAFETY: plain system calls in the forked child.
        if unsafe { libc::setgid(65534) } != 0 || unsafe { libc::setuid(65534) } != 0 {
            return 40;
        }
        // The inherited fd: refused before anything else.
        if dev.info(h).err() != Some(Errno::EACCES)
            || dev.unpin(h).err() != Some(Errno::EACCES)
            || dev.mmap(h, 4096).err() != Some(Errno::EACCES)
        {
            return 41;
        }
        // Its own fd: our handle means nothing there, our VA is not its memory.
        let own = RawDev::open();
        if own.info(h).err() != Some(Errno::EINVAL)
            || own.unpin(h).err() != Some(Errno::EINVAL)
            || own.mmap(h, 4096).err() != Some(Errno::EINVAL)
            || own.pin(va, MIB).err() != Some(Errno::EINVAL)
        {
            return 42;
        }
        let mut b = [0u8; 8];
        if emu.read(va, &mut b).err() != Some(Errno::EINVAL) {
            return 43;
        }
        if kernel_can_read(map) {
            return 44;
        }
        0
    });
    std::fs::set_permissions("/dev/mtgdrdrv", old).expect("restore the mode");
    assert_eq!(code, 0, "another user's process reached our pin");
    assert!(dev.info(h).is_ok(), "our pin is intact");
    munmap(map, MIB as usize);
    drop(dev);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}
