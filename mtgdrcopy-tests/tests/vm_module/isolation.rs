//! Isolation between processes: a forked child, or a process handed the device fd, reaches none
//! of the parent's pins, mappings or handles, and the parent's stay intact.

use super::*;

/// Whether `addr` is inside any mapping of the calling process.
fn is_mapped_here(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    maps.lines().any(|l| {
        let range = l.split_whitespace().next().unwrap_or("");
        let (lo, hi) = range.split_once('-').unwrap_or(("0", "0"));
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap_or(0),
            usize::from_str_radix(hi, 16).unwrap_or(0),
        );
        (lo..hi).contains(&addr)
    })
}

#[test]
fn forked_child_cannot_use_the_parents_device_and_sees_no_mapping() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    // SAFETY: valid pointers throughout.
    unsafe {
        let g = gdr_open();
        assert!(!g.is_null());
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        let addr = map as usize;
        let code = in_child(|| {
            if is_mapped_here(addr) {
                return 10;
            }
            let mut info = std::mem::zeroed::<gdr_info_v2>();
            if gdr_get_info_v2(g, mh, &mut info) != libc::EACCES {
                return 11;
            }
            let mut mh2 = gdr_mh_t::default();
            if gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh2) != libc::EACCES {
                return 12;
            }
            // The child may close its copy without touching the parent's pins.
            if gdr_close(g) != 0 {
                return 13;
            }
            0
        });
        assert_eq!(code, 0, "child check failed");
        assert!(is_mapped_here(addr), "the parent keeps its mapping");
        let mut info = std::mem::zeroed::<gdr_info_v2>();
        assert_eq!(
            gdr_get_info_v2(g, mh, &mut info),
            0,
            "the parent's pin survived the child"
        );
        assert_eq!(info.mapping_type, GDR_MAPPING_TYPE_WC_VALUE);
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

const GDR_MAPPING_TYPE_WC_VALUE: i32 = MappingType::WriteCombining as i32;

/// A device fd passed to another process over a unix socket is refused there, for each of the
/// nine commands and mmap, with a live pin of the sender's in it; and when that process holds the
/// last reference (the sender closed its own), its exit releases the sender's pin (upstream
/// issue 313: release does no owner check).
#[test]
fn fd_passed_to_another_process_is_refused() {
    use nix::sys::socket::{
        sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
    };
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let (parent_sock, child_sock) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )
    .expect("socketpair");
    let device = RawDev::open();
    let handle = device.pin(va, MIB).expect("pin");
    // SAFETY: single-threaded test process (--test-threads=1); the child only makes system calls.
    let child = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(parent_sock);
            let code = std::panic::catch_unwind(|| receive_and_probe(child_sock)).unwrap_or(101);
            // SAFETY: leaving the child without the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(child_sock);
    let fds = [device.0.as_raw_fd()];
    let payload = handle.to_le_bytes();
    let iov = [std::io::IoSlice::new(&payload)];
    sendmsg::<()>(
        parent_sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg");
    // The receiver (and the forked copy, closed in the child) now hold the only references;
    // the receiver keeps its descriptor until this socket closes.
    drop(device);
    assert_eq!(counter("pins_outstanding"), 1);
    drop(parent_sock);
    match waitpid(child, None).expect("waitpid") {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("receiving process was not refused: {other:?}"),
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

fn receive_and_probe(sock: OwnedFd) -> i32 {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::RawFd;
    let mut payload = [0u8; 8];
    let mut iov = [std::io::IoSliceMut::new(&mut payload)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let Ok(msg) = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    ) else {
        return 20;
    };
    let fd = match msg.cmsgs().ok().and_then(|mut c| c.next()) {
        Some(ControlMessageOwned::ScmRights(fds)) if fds.len() == 1 => fds[0],
        _ => return 21,
    };
    let handle = u64::from_le_bytes(payload);
    // SAFETY: the received descriptor is ours to own.
    let dev = RawDev(unsafe { OwnedFd::from_raw_fd(fd) });
    let refused = |r: Result<(), Errno>| r == Err(Errno::EACCES);
    let mut pin1 = mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_PARAMS::default();
    let mut cb = mtgdrdrv::GDRDRV_IOC_GET_CB_FLAG_PARAMS {
        handle,
        ..Default::default()
    };
    let mut info1 = mtgdrdrv::GDRDRV_IOC_GET_INFO_PARAMS {
        handle,
        ..Default::default()
    };
    let mut attr = mtgdrdrv::GDRDRV_IOC_GET_ATTR_PARAMS { attr: 1, val: 0 };
    let mut req = mtgdrdrv::GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS {
        handle,
        mapping_type: 1,
        _pad: 0,
    };
    let mut ver = mtgdrdrv::GDRDRV_IOC_GET_VERSION_PARAMS::default();
    let all = [
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_PIN_BUFFER, &mut pin1)),
        refused(dev.pin(0x1000_0000_0000, 65536).map(drop)),
        refused(dev.unpin(handle)),
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_GET_CB_FLAG, &mut cb)),
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_GET_INFO, &mut info1)),
        refused(dev.info(handle).map(drop)),
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_GET_ATTR, &mut attr)),
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_REQ_MAPPING_TYPE, &mut req)),
        refused(dev.ioctl(mtgdrdrv::GDRDRV_IOC_GET_VERSION, &mut ver)),
        refused(dev.mmap(handle, 65536).map(drop)),
    ];
    let code = all.iter().position(|ok| !ok).map_or(0, |i| 30 + i as i32);
    // Hold the received descriptor until the sender has counted its pin with this the only
    // reference (it closes the socket then); exiting with it releases that reference.
    let mut eof = [0u8; 1];
    let _ = nix::unistd::read(sock.as_raw_fd(), &mut eof);
    code
}

/// Regression (library): a forked child has no mapping of the parent's (VM_DONTCOPY), but it
/// inherits the library's handle table; a copy through an inherited handle must fail with
/// EINVAL instead of storing to an address that is unmapped (SIGSEGV) or, worse, mapped to
/// something else in the child. The same for the safe API's `Mapping`.
#[test]
fn forked_child_copy_through_the_parents_handle_fails_cleanly() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let gdr = Gdr::open().expect("gdr_open");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    let mapping = pin.map(MapRequest::Default).expect("map");
    // SAFETY: valid pointers; everything is released at the end.
    unsafe {
        let g = gdr_open();
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        let code = in_child(|| {
            // Something else where the parent's mapping was, as an allocator might put there.
            let filler = libc::mmap(
                map,
                MIB as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if filler != map {
                return 50;
            }
            let word = [0xa5u8; 8];
            let mut back = [0u8; 8];
            if gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8) != libc::EINVAL {
                return 51;
            }
            if gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), map, 8) != libc::EINVAL {
                return 52;
            }
            if *(map as *const u8) != 0 {
                return 53;
            }
            if mapping.write(0, &word).is_ok() || mapping.read(0, &mut back).is_ok() {
                return 54;
            }
            0
        });
        assert_eq!(code, 0, "the child copied through the parent's handle");
        let word = [1u8, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8),
            0,
            "the parent still can"
        );
        assert_eq!(gdr_close(g), 0);
    }
    mapping
        .write(0, b"parent")
        .expect("the parent's Mapping still works");
    drop(mapping);
    drop(pin);
    drop(gdr);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}
