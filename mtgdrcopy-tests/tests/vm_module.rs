//! libgdrapi against the real mtgdrdrv module and the emulated mtgpu provider. Runs inside the
//! test VM (`cargo xtask test`), one test at a time (`--test-threads=1`), because several tests
//! check system-wide counters.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use gdrapi::capi::*;
use gdrapi::{Attribute, Gdr, MapRequest, MappingType, PinFlags};
use mtgdrcopy_tests::emu::{Emu, FaultKind, PAGE_SIZES};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

#[path = "vm_module/emu_dmabuf.rs"]
mod emu_dmabuf;
#[path = "vm_module/provider.rs"]
mod provider;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The module's always-present counters.
fn module_counters() -> std::collections::HashMap<String, u64> {
    let text = std::fs::read_to_string("/proc/driver/mtgdrdrv/counters").expect("counters file");
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.trim_end_matches(':').to_string(),
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Both modules hold no pin and no mapping.
fn assert_no_pins(emu: &Emu) {
    let c = module_counters();
    assert_eq!(c.get("pins_outstanding"), Some(&0), "module counters {c:?}");
    assert_eq!(c.get("mappings"), Some(&0), "module counters {c:?}");
    assert_eq!(c.get("bytes_pinned"), Some(&0), "module counters {c:?}");
    let s = emu.stats().expect("stats");
    assert_eq!(s.pins_outstanding, 0, "emulator {s:?}");
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 7 + seed * 13 + 3) % 253) as u8)
        .collect()
}

/// Writes through the WC mapping and reads back through the emulator's DMA path, then the
/// reverse, for every page size, contiguous and scattered.
#[test]
fn write_through_mapping_read_back_through_dma_and_reverse() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    for page_size in PAGE_SIZES {
        for scatter in [false, true] {
            let size = 4 * MIB;
            let va = emu.alloc(size, 0, page_size, scatter).expect("alloc");
            let pin = gdr.pin(va, size, PinFlags::DEFAULT).expect("pin");
            let info = pin.info().expect("info");
            assert_eq!(info.va, va, "page {page_size}");
            assert_eq!(info.mapped_size, size);
            let map = pin.map(MapRequest::Default).expect("map");
            assert_eq!(map.mapping_type(), MappingType::WriteCombining);
            assert_eq!(map.len() as u64, size);

            let data = pattern(u64::from(page_size), size as usize);
            map.write(0, &data).expect("write");
            let mut back = vec![0u8; size as usize];
            emu.read(va, &mut back).expect("dma read");
            assert!(
                back == data,
                "CPU writes reach device memory (page {page_size}, scatter {scatter})"
            );

            let data2 = pattern(99 + u64::from(page_size), size as usize);
            emu.write(va, &data2).expect("dma write");
            map.read(0, &mut back).expect("read");
            assert!(back == data2, "device memory reads back through the mapping (page {page_size}, scatter {scatter})");

            // Small, odd-sized and misaligned copies in the middle of a page boundary.
            let off = page_size as usize - 3;
            map.write(off, &[1, 2, 3, 4, 5, 6, 7]).expect("write");
            let mut seven = [0u8; 7];
            emu.read(va + off as u64, &mut seven).expect("dma read");
            assert_eq!(seven, [1, 2, 3, 4, 5, 6, 7]);

            drop(map);
            pin.unpin().expect("unpin");
            emu.free(va).expect("free");
        }
    }
    assert_no_pins(&emu);
}

#[test]
fn versions_attributes_and_callback_flag() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    assert_eq!(gdr.driver_version(), Ok((0, 1)));
    assert_eq!(Gdr::runtime_version(), (1, 0));
    assert_eq!(
        gdr.attribute(Attribute::UsePersistentMapping)
            .expect("attr"),
        1
    );
    assert_eq!(
        gdr.attribute(Attribute::SupportPinFlagForcePcie)
            .expect("attr"),
        0
    );
    assert_eq!(gdr.attribute(Attribute::UsingDmaBufMmap).expect("attr"), 0);
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    assert!(!pin.callback_flag().expect("cb flag"));
    let err = gdr
        .pin(va, MIB, PinFlags::FORCE_PCIE)
        .err()
        .expect("FORCE_PCIE is refused");
    assert_eq!(err.errno(), Errno::EINVAL);
    let err = gdr
        .pin_with_tokens(va, MIB, 1, 0)
        .err()
        .expect("tokens are refused");
    assert_eq!(err.errno(), Errno::EINVAL);
    let legacy = gdr
        .pin_with_tokens(va, MIB, 0, 0)
        .expect("legacy pin without tokens");
    drop(legacy);
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn mapping_types_device_and_caching() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    let err = pin
        .map(MapRequest::Caching)
        .err()
        .expect("caching is refused");
    assert_eq!(err.errno(), Errno::EOPNOTSUPP);
    let map = pin.map(MapRequest::Device).expect("device mapping");
    assert_eq!(map.mapping_type(), MappingType::Device);
    assert_eq!(pin.info().expect("info").mapping_type, MappingType::Device);
    map.write(8, &0xdead_beef_u32.to_le_bytes()).expect("write");
    let mut four = [0u8; 4];
    emu.read(va + 8, &mut four).expect("dma");
    assert_eq!(u32::from_le_bytes(four), 0xdead_beef);
    drop(map);
    let map = pin
        .map(MapRequest::WriteCombining)
        .expect("wc after device");
    assert_eq!(map.mapping_type(), MappingType::WriteCombining);
    drop(map);
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn unaligned_pin_reports_rounded_range_and_cannot_be_mapped() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(2 * MIB, 0, 65536, false).expect("alloc");
    let addr = va + 65536 + 100;
    let pin = gdr
        .pin(addr, 1000, PinFlags::DEFAULT)
        .expect("pin inside the allocation");
    let info = pin.info().expect("info");
    assert_eq!(info.va, va + 65536);
    assert_eq!(info.mapped_size, 4096);
    assert_eq!(info.page_size, 4096);
    let err = pin
        .map(MapRequest::Default)
        .err()
        .expect("unaligned pin cannot be mapped");
    assert_eq!(err.errno(), Errno::EINVAL);
    drop(pin);
    // A range crossing a host page is rounded on both sides.
    let pin = gdr.pin(va + 65536 - 8, 16, PinFlags::DEFAULT).expect("pin");
    let info = pin.info().expect("info");
    assert_eq!((info.va, info.mapped_size), (va + 65536 - 4096, 2 * 4096));
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// An allocation of 4 KiB pages that is not 64 KiB aligned pins on the host page like any other
/// and can be mapped and used.
#[test]
fn small_page_allocation_not_64k_aligned() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    // Two allocations so the second starts off a 64 KiB boundary.
    let first = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let va = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let target = if va % 65536 != 0 { va } else { first };
    assert_ne!(
        target % 65536,
        0,
        "the emulator placed both allocations 64 KiB aligned"
    );
    let pin = gdr.pin(target, 12 * KIB, PinFlags::DEFAULT).expect("pin");
    let info = pin.info().expect("info");
    assert_eq!(info.va, target);
    assert_eq!(info.mapped_size, 12 * KIB);
    assert_eq!(info.page_size, 4096);
    let map = pin.map(MapRequest::Default).expect("map");
    let data = pattern(5, 12 * KIB as usize);
    map.write(0, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    emu.read(target, &mut back).expect("dma");
    assert!(back == data);
    drop(map);
    drop(pin);
    emu.free(first).expect("free");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn c_api_double_unpin_unknown_and_foreign_handles() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    // SAFETY: plain C API use with valid pointers; every handle is unpinned before close.
    unsafe {
        let g = gdr_open();
        let other = gdr_open();
        assert!(!g.is_null() && !other.is_null());
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        assert_ne!(mh.h, 0);
        let mut info = std::mem::zeroed::<gdr_info_v2>();
        assert_eq!(
            gdr_get_info_v2(other, mh, &mut info),
            libc::EINVAL,
            "a handle of another gdr_t"
        );
        assert_eq!(
            gdr_get_info_v2(g, gdr_mh_t { h: 12345 }, &mut info),
            libc::EINVAL,
            "unknown handle"
        );
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), 0);
        assert_eq!(info.va, va);
        let mut v1 = std::mem::zeroed::<gdr_info_v1>();
        assert_eq!(gdr_get_info_v1(g, mh, &mut v1), 0);
        assert_eq!((v1.va, v1.mapped_size, v1.flags), (va, MIB, 0));

        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize),
            libc::EAGAIN,
            "one mapping per handle"
        );
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), 0);
        assert_eq!(info.flags & 3, 3, "mapped and wc_mapping bits");
        let word = 0x0123_4567_89ab_cdef_u64.to_le_bytes();
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(64), word.as_ptr().cast(), 8),
            0
        );
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), map.add(64), 8),
            0
        );
        assert_eq!(back, word);
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(MIB as usize - 4), word.as_ptr().cast(), 8),
            libc::EINVAL,
            "past the end"
        );
        assert_eq!(
            gdr_unmap(g, mh, map, 4096),
            libc::EINVAL,
            "size must match the mapping"
        );
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), 0);
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8),
            libc::EINVAL,
            "after unmap"
        );
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), libc::EINVAL, "double unpin");
        assert_eq!(gdr_close(other), 0);
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn gdr_close_releases_everything_it_owns() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(4 * MIB, 0, 65536, false).expect("alloc");
    // SAFETY: valid pointers; the handles are deliberately left for gdr_close.
    unsafe {
        let g = gdr_open();
        assert!(!g.is_null());
        for i in 0..4 {
            let mut mh = gdr_mh_t::default();
            assert_eq!(
                gdr_pin_buffer_v2(g, (va + i * MIB) as _, MIB as usize, 0, &mut mh),
                0
            );
            let mut map: *mut c_void = ptr::null_mut();
            assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        }
        assert_eq!(module_counters().get("pins_outstanding"), Some(&4));
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn provider_faults_fail_the_pin_and_leak_nothing() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    for (kind, errno) in [
        (FaultKind::MTGPU_EMU_FAULT_ENOMEM, None),
        (FaultKind::MTGPU_EMU_FAULT_EINVAL, None),
        (FaultKind::MTGPU_EMU_FAULT_BAD_VERSION, None),
        (
            FaultKind::MTGPU_EMU_FAULT_BAD_PAGE_SIZE,
            Some(Errno::EINVAL),
        ),
    ] {
        emu.inject_fault(kind, 1).expect("inject");
        let err = gdr
            .pin(va, MIB, PinFlags::DEFAULT)
            .err()
            .unwrap_or_else(|| panic!("{kind:?} must fail the pin"));
        if let Some(errno) = errno {
            assert_eq!(err.errno(), errno, "{kind:?}");
        }
        assert_no_pins(&emu);
    }
    let pin = gdr
        .pin(va, MIB, PinFlags::DEFAULT)
        .expect("pin works again once the fault is spent");
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

#[test]
fn invalid_pins_are_refused() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    for (addr, size) in [
        (va, 0),
        (0, MIB),
        (u64::MAX - 4095, 8192),
        (va, u64::MAX),
        (va + MIB, 65536),
        (0x1234_0000, 65536),
    ] {
        assert!(
            gdr.pin(addr, size, PinFlags::DEFAULT).is_err(),
            "pin({addr:#x}, {size:#x}) must fail"
        );
    }
    assert!(gdr.pin(va, MIB, PinFlags(0x80)).is_err(), "unknown flag");
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// Memory freed while pinned stays reserved and readable through the mapping until unpinned.
#[test]
fn free_while_pinned_keeps_the_memory() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    let map = pin.map(MapRequest::Default).expect("map");
    let data = pattern(77, 4096);
    map.write(0, &data).expect("write");
    emu.free(va).expect("free while pinned");
    let mut back = vec![0u8; 4096];
    map.read(0, &mut back).expect("read after free");
    assert!(back == data);
    assert!(
        gdr.pin(va, MIB, PinFlags::DEFAULT).is_err(),
        "a freed VA no longer resolves"
    );
    drop(map);
    drop(pin);
    let s = emu.stats().expect("stats");
    assert_eq!(s.allocations, 0, "memory released at the last put: {s:?}");
    assert_no_pins(&emu);
}

/// Runs `child` in a forked process and returns its exit code.
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and exits with _exit; the test runs single-
    // threaded (--test-threads=1).
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).expect("waitpid") {
            WaitStatus::Exited(_, code) => code,
            other => panic!("child ended with {other:?}"),
        },
    }
}

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
    // The receiver (and the forked copy, closed in the child) now hold the only references.
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
    if let Some(i) = all.iter().position(|ok| !ok) {
        return 30 + i as i32;
    }
    // Exit with the received descriptor: the last reference, released here.
    0
}

#[test]
fn process_exit_without_unpin_leaves_no_pins() {
    let emu = Emu::open().expect("emulator");
    let code = in_child(|| {
        let Ok(emu) = Emu::open() else { return 30 };
        let Ok(gdr) = Gdr::open() else { return 31 };
        let Ok(va) = emu.alloc(2 * MIB, 0, 65536, false) else {
            return 32;
        };
        let Ok(pin) = gdr.pin(va, 2 * MIB, PinFlags::DEFAULT) else {
            return 33;
        };
        let Ok(map) = pin.map(MapRequest::Default) else {
            return 34;
        };
        if map.write(0, b"left behind").is_err() {
            return 35;
        }
        // Exit with the pin, the mapping and both files live.
        std::mem::forget(map);
        std::mem::forget(pin);
        std::mem::forget(gdr);
        std::mem::forget(emu);
        0
    });
    assert_eq!(code, 0);
    assert_no_pins(&emu);
    let s = emu.stats().expect("stats");
    assert_eq!(
        s.allocations, 0,
        "the exited process's allocations were released: {s:?}"
    );
}

/// Cycles per thread of the concurrency tests: MTGDRCOPY_STRESS_CYCLES, default 10,000, which
/// `cargo xtask test` runs. Under TCG (2 vCPUs) 8 × 2,000 cycles on one gdr_t plus 8 × 2,000 with
/// a gdr_t per thread took 11 s on an idle host, so 10,000 take about a minute; on a loaded
/// host up to four times that.
fn stress_cycles() -> u64 {
    std::env::var("MTGDRCOPY_STRESS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// One pin/map/copy/verify/unmap/unpin cycle through the C API on `g`, in `[base, base+64K)`.
///
/// # Safety
/// `g` is a live gdr_t.
unsafe fn c_api_cycle(g: gdr_t, base: u64, word: u64) {
    let size = 65536usize;
    // SAFETY: valid pointers; the caller vouches for `g`.
    unsafe {
        let mut mh = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, base as _, size, 0, &mut mh), 0);
        let mut map: *mut c_void = ptr::null_mut();
        assert_eq!(gdr_map(g, mh, &mut map, size), 0);
        let off = (word as usize * 8) % size;
        let bytes = word.to_le_bytes();
        assert_eq!(
            gdr_copy_to_mapping(mh, map.add(off), bytes.as_ptr().cast(), 8),
            0
        );
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_copy_from_mapping(mh, back.as_mut_ptr().cast(), map.add(off), 8),
            0
        );
        assert_eq!(back, bytes, "a thread reads back what it wrote");
        assert_eq!(gdr_unmap(g, mh, map, size), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
    }
}

/// 8 threads × N pin/map/copy/unmap/unpin cycles: through the safe API on one shared `Gdr`,
/// through the C API on one shared `gdr_t`, and through the C API with a `gdr_t` per thread.
/// Each thread works in its own 64 KiB of one allocation; at the end the emulator's DMA path
/// sees exactly the last word each thread wrote, and nothing is pinned.
#[test]
fn eight_threads_pin_map_copy_unmap_unpin_concurrently() {
    let cycles = stress_cycles();
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let per_thread = 65536u64;
    let va = emu.alloc(8 * per_thread, 0, 65536, false).expect("alloc");
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let gdr = &gdr;
            let emu = &emu;
            s.spawn(move || {
                let base = va + t * per_thread;
                for round in 0..cycles.min(500) {
                    let pin = gdr.pin(base, per_thread, PinFlags::DEFAULT).expect("pin");
                    let map = pin.map(MapRequest::Default).expect("map");
                    let data = pattern(t * 1000 + round, 256);
                    map.write((round as usize % 256) * 256, &data)
                        .expect("write");
                    let mut back = vec![0u8; 256];
                    emu.read(base + (round % 256) * 256, &mut back)
                        .expect("dma");
                    assert!(back == data, "thread {t} round {round}");
                    drop(map);
                    pin.unpin().expect("unpin");
                }
            });
        }
    });
    let safe_api = t0.elapsed();
    for shared in [true, false] {
        let t0 = std::time::Instant::now();
        let one = SharedGdr(if shared { gdr_open() } else { ptr::null_mut() });
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let one = &one;
                s.spawn(move || {
                    let own = SharedGdr(if shared { ptr::null_mut() } else { gdr_open() });
                    let g = if shared { one.0 } else { own.0 };
                    assert!(!g.is_null());
                    let base = va + t * per_thread;
                    for round in 0..cycles {
                        // SAFETY: `g` is live until closed below.
                        unsafe { c_api_cycle(g, base, t << 32 | round) };
                    }
                    if !shared {
                        // SAFETY: this thread's own gdr_t, not used again.
                        assert_eq!(unsafe { gdr_close(own.0) }, 0);
                    }
                });
            }
        });
        if shared {
            // SAFETY: no thread uses it any more.
            assert_eq!(unsafe { gdr_close(one.0) }, 0);
        }
        for t in 0..8u64 {
            let last = t << 32 | (cycles - 1);
            let mut word = [0u8; 8];
            emu.read(
                va + t * per_thread + (last as usize * 8 % 65536) as u64,
                &mut word,
            )
            .expect("dma");
            assert_eq!(u64::from_le_bytes(word), last, "thread {t}'s last write");
        }
        eprintln!(
            "8 threads x {cycles} C API cycles on {}: {:.1} s",
            if shared { "one gdr_t" } else { "a gdr_t each" },
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "8 threads x {} safe API cycles: {:.1} s",
        cycles.min(500),
        safe_api.as_secs_f64()
    );
    drop(gdr);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

struct SharedGdr(gdr_t);
// SAFETY: libgdrapi documents gdr_t as safe to use from several threads at once.
unsafe impl Sync for SharedGdr {}

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

// -------------------------------------------------------------------------------------------
// The adversarial suite (issue 7): isolation, lifetimes, unload, bad input. The random side is
// mtgdrdrv_fuzz (mtgdrdrv/fuzz), which `cargo xtask test` runs after these tests.

/// `/dev/mtgdrdrv` opened directly, for what the library never does.
struct RawDev(OwnedFd);

impl RawDev {
    fn open() -> RawDev {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/mtgdrdrv")
            .expect("open /dev/mtgdrdrv");
        RawDev(f.into())
    }

    fn ioctl<T>(&self, cmd: u32, arg: &mut T) -> Result<(), Errno> {
        // SAFETY: `arg` is a live struct of the type `cmd` copies in and out.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), cmd as _, arg as *mut T) };
        if r < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    fn pin(&self, addr: u64, size: u64) -> Result<u64, Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2_PARAMS {
            addr,
            size,
            ..Default::default()
        };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_PIN_BUFFER_V2, &mut p)?;
        Ok(p.handle)
    }

    fn unpin(&self, handle: u64) -> Result<(), Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_UNPIN_BUFFER_PARAMS { handle };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_UNPIN_BUFFER, &mut p)
    }

    fn info(&self, handle: u64) -> Result<mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS, Errno> {
        let mut p = mtgdrdrv::GDRDRV_IOC_GET_INFO_V2_PARAMS {
            handle,
            ..Default::default()
        };
        self.ioctl(mtgdrdrv::GDRDRV_IOC_GET_INFO_V2, &mut p)?;
        Ok(p)
    }

    fn mmap(&self, handle: u64, len: usize) -> Result<usize, Errno> {
        mmap_shared(&self.0, handle * 4096, len)
    }
}

/// A new `MAP_SHARED`, read-write mapping of `len` bytes of `fd` from byte `offset`.
fn mmap_shared(fd: &OwnedFd, offset: u64, len: usize) -> Result<usize, Errno> {
    // SAFETY: a new shared mapping chosen by the kernel; nothing else is at its address.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(Errno::last())
    } else {
        Ok(p as usize)
    }
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: only ranges of device or dma-buf mappings the test made.
    assert_eq!(
        unsafe { libc::munmap(addr as *mut c_void, len) },
        0,
        "munmap"
    );
}

/// Whether the kernel can read a byte at `addr` (write(2) into a pipe: EFAULT on an unmapped or
/// zapped page instead of a signal).
fn kernel_can_read(addr: usize) -> bool {
    let (rd, wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: the kernel validates the source address.
    let n = unsafe { libc::write(wr.as_raw_fd(), addr as *const c_void, 1) };
    drop((rd, wr));
    n == 1
}

fn counter(name: &str) -> u64 {
    module_counters().get(name).copied().unwrap_or(u64::MAX)
}

/// [`counter`] once it reads `want`, or after 2 s: for the put the module defers to a work
/// item when the last mapping of an unpinned pin goes.
fn settled_counter(name: &str, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let v = counter(name);
        if v == want || std::time::Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Closing the descriptor does not end its mappings: they keep the file, and so its pins,
/// until munmap; then the pins go.
#[test]
fn closing_the_fd_keeps_live_mappings_until_munmap() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let dev = RawDev::open();
    let h = dev.pin(va, MIB).expect("pin");
    let map = dev.mmap(h, MIB as usize).expect("mmap");
    drop(dev);
    assert_eq!((counter("pins_outstanding"), counter("mappings")), (1, 1));
    let word = 0x5a5a_1234_u32;
    // SAFETY: the mapping is live (its file is held by the VMA).
    unsafe { ptr::write_volatile((map + 128) as *mut u32, word) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let mut four = [0u8; 4];
    emu.read(va + 128, &mut four).expect("dma");
    assert_eq!(
        u32::from_le_bytes(four),
        word,
        "the mapping still works after close"
    );
    munmap(map, MIB as usize);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// A partial munmap splits the mapping (two VMAs, one pin); unpinning then zaps every piece at
/// once, and the pages are put when the last piece goes.
#[test]
fn partial_munmap_splits_and_unpin_zaps_every_piece() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(65536, 0, 65536, false).expect("alloc");
    let dev = RawDev::open();
    let h = dev.pin(va, 65536).expect("pin");
    let map = dev.mmap(h, 65536).expect("mmap");
    munmap(map + 4 * 4096, 4 * 4096);
    assert_eq!(counter("mappings"), 2, "split into two VMAs");
    let (a, b) = (map, map + 8 * 4096);
    assert!(kernel_can_read(a) && kernel_can_read(b));
    dev.unpin(h).expect("unpin while mapped");
    assert_eq!(dev.info(h).err(), Some(Errno::EINVAL), "the handle is gone");
    assert_eq!(
        counter("pins_outstanding"),
        1,
        "pages held until the last piece goes"
    );
    assert!(
        !kernel_can_read(a) && !kernel_can_read(b),
        "both pieces are zapped"
    );
    assert_eq!(
        dev.mmap(h, 4096).err(),
        Some(Errno::EINVAL),
        "no new mapping"
    );
    munmap(a, 4 * 4096);
    assert_eq!(counter("pins_outstanding"), 1);
    munmap(b, 8 * 4096);
    // The last piece's close hands the put to the module's work item.
    assert_eq!(settled_counter("pins_outstanding", 0), 0);
    drop(dev);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

fn delete_module(name: &std::ffi::CStr) -> Result<(), Errno> {
    // SAFETY: a NUL-terminated name; O_NONBLOCK: fail instead of waiting for users.
    let r = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Unloading while an fd or only a mapping holds the module, and unloading the provider under
/// mtgdrdrv, are refused (EWOULDBLOCK); the device keeps working.
#[test]
fn unload_while_busy_is_refused_and_nothing_breaks() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let dev = RawDev::open();
    let h = dev.pin(va, MIB).expect("pin");
    assert_eq!(
        delete_module(c"mtgdrdrv"),
        Err(Errno::EWOULDBLOCK),
        "an open fd"
    );
    assert_eq!(
        delete_module(c"mtgpu_emu"),
        Err(Errno::EWOULDBLOCK),
        "the provider in use"
    );
    let map = dev.mmap(h, MIB as usize).expect("mmap");
    drop(dev);
    assert_eq!(
        delete_module(c"mtgdrdrv"),
        Err(Errno::EWOULDBLOCK),
        "only a mapping left"
    );
    assert!(kernel_can_read(map), "the mapping survived the attempts");
    munmap(map, MIB as usize);
    // Still fully usable.
    let gdr = Gdr::open().expect("gdr_open after the attempts");
    let pin = gdr.pin(va, MIB, PinFlags::DEFAULT).expect("pin");
    let m = pin.map(MapRequest::Default).expect("map");
    m.write(0, b"still here").expect("write");
    drop(m);
    drop(pin);
    drop(gdr);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// A process killed with SIGKILL in the middle of copying leaves nothing pinned or mapped, and
/// the emulator frees its memory.
#[test]
fn kill_9_during_copies_leaves_nothing_pinned() {
    let emu = Emu::open().expect("emulator");
    let before = emu.stats().expect("stats");
    let (rd, wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: single-threaded test process; the child only runs the copy loop.
    let child = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(rd);
            let emu = Emu::open().expect("emulator");
            let va = emu.alloc(4 * MIB, 0, 65536, false).expect("alloc");
            // SAFETY: plain C API use with valid pointers.
            unsafe {
                let g = gdr_open();
                let mut mh = gdr_mh_t::default();
                assert_eq!(
                    gdr_pin_buffer_v2(g, va as _, 4 * MIB as usize, 0, &mut mh),
                    0
                );
                let mut map: *mut c_void = ptr::null_mut();
                assert_eq!(gdr_map(g, mh, &mut map, 4 * MIB as usize), 0);
                let data = pattern(1, 4 * MIB as usize);
                let _ = nix::unistd::write(&wr, b"go");
                loop {
                    gdr_copy_to_mapping(mh, map, data.as_ptr().cast(), data.len());
                    gdr_copy_from_mapping(mh, data.as_ptr() as *mut c_void, map, 4096);
                }
            }
        }
        ForkResult::Parent { child } => child,
    };
    drop(wr);
    let mut go = [0u8; 2];
    assert_eq!(
        nix::unistd::read(rd.as_raw_fd(), &mut go),
        Ok(2),
        "child started copying"
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: kills our own child.
    assert_eq!(
        unsafe { libc::kill(child.as_raw(), libc::SIGKILL) },
        0,
        "kill"
    );
    match waitpid(child, None).expect("waitpid") {
        WaitStatus::Signaled(_, sig, _) if sig as i32 == libc::SIGKILL => {}
        other => panic!("child ended with {other:?}"),
    }
    assert_no_pins(&emu);
    let after = emu.stats().expect("stats");
    assert_eq!(after.allocations, before.allocations, "{after:?}");
}

/// The packaged policy (debian/60-mtgdrdrv.rules, installed by the dkms package as
/// /usr/lib/udev/rules.d/60-mtgdrdrv.rules) is group render, mode 0660. The test VM runs no
/// udev, so the node keeps devtmpfs's default, root:root 0600, which is stricter; the test
/// accepts either, then applies the rule as udev would and checks who may open the node: a
/// member of the rule's group may, another user may not.
#[test]
fn device_node_mode_follows_the_packaged_policy() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let rule = include_str!("../../debian/60-mtgdrdrv.rules");
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

/// Every C entry point given hostile input returns its documented error (gdrapi.h), and a
/// failed call leaves the module's pins and mappings exactly as they were.
#[test]
fn c_api_bad_input_returns_documented_errors_and_pins_nothing() {
    let emu = Emu::open().expect("emulator");
    let va = emu.alloc(MIB, 0, 65536, false).expect("alloc");
    let null: gdr_t = ptr::null_mut();
    let held = |pins: u64, maps: u64| {
        assert_eq!(
            (counter("pins_outstanding"), counter("mappings")),
            (pins, maps),
            "pins and mappings after a refused call"
        );
    };
    // SAFETY: every pointer is NULL or valid; `g` and `other` live until closed at the end.
    unsafe {
        let g = gdr_open();
        let other = gdr_open();
        assert!(!g.is_null() && !other.is_null());
        let mut mh = gdr_mh_t::default();
        let mut map: *mut c_void = ptr::null_mut();
        let mut info = gdr_info_v2::default();
        let mut v1 = gdr_info_v1::default();
        let mut flag = 0;
        let (mut ma, mut mi) = (0, 0);
        let mut s: *const std::ffi::c_char = ptr::null();
        let e = libc::EINVAL;

        // NULL gdr_t.
        assert_eq!(
            gdr_pin_buffer_v2(null, va as _, MIB as usize, 0, &mut mh),
            e
        );
        assert_eq!(
            gdr_pin_buffer(null, va as _, MIB as usize, 0, 0, &mut mh),
            e
        );
        assert_eq!(gdr_unpin_buffer(null, mh), e);
        assert_eq!(gdr_map(null, mh, &mut map, 4096), e);
        assert_eq!(gdr_unmap(null, mh, map, 4096), e);
        assert_eq!(gdr_get_info_v2(null, mh, &mut info), e);
        assert_eq!(gdr_get_info_v1(null, mh, &mut v1), e);
        assert_eq!(gdr_get_callback_flag(null, mh, &mut flag), e);
        assert_eq!(gdr_get_attribute(null, 1, &mut flag), e);
        assert_eq!(gdr_driver_get_version(null, &mut ma, &mut mi), e);
        assert_eq!(gdr_close(null), e);
        held(0, 0);

        // NULL out-pointers.
        assert_eq!(
            gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, ptr::null_mut()),
            e
        );
        assert_eq!(
            gdr_pin_buffer(g, va as _, MIB as usize, 0, 0, ptr::null_mut()),
            e
        );
        held(0, 0);
        assert_eq!(gdr_get_attribute(g, 1, ptr::null_mut()), e);
        assert_eq!(gdr_driver_get_version(g, ptr::null_mut(), &mut mi), e);
        assert_eq!(gdr_driver_get_version(g, &mut ma, ptr::null_mut()), e);
        assert_eq!(gdr_get_mapping_type_string(1, ptr::null_mut()), e);
        assert_eq!(gdr_get_mapping_type_string(7, &mut s), e);
        gdr_runtime_get_version(ptr::null_mut(), ptr::null_mut());

        // Sizes: 0, overflowing, past the allocation; addresses: 0, wrapping.
        for (addr, size) in [
            (va, 0usize),
            (va, usize::MAX),
            (va, MIB as usize + 1),
            (0, 65536),
            (u64::MAX - 4095, 8192),
        ] {
            assert_eq!(
                gdr_pin_buffer_v2(g, addr as _, size, 0, &mut mh),
                e,
                "{addr:#x}+{size:#x}"
            );
        }
        assert_eq!(
            gdr_pin_buffer_v2(g, va as _, MIB as usize, 2, &mut mh),
            e,
            "unknown flag"
        );
        assert_eq!(
            gdr_pin_buffer(g, va as _, MIB as usize, 1, 0, &mut mh),
            e,
            "a token"
        );
        held(0, 0);

        // A good pin, then bad maps of it.
        assert_eq!(gdr_pin_buffer_v2(g, va as _, MIB as usize, 0, &mut mh), 0);
        held(1, 0);
        assert_eq!(gdr_map(g, mh, ptr::null_mut(), MIB as usize), e, "NULL va");
        assert_eq!(gdr_map(g, mh, &mut map, 0), e, "size 0");
        assert_eq!(gdr_map(g, mh, &mut map, usize::MAX), e, "overflowing size");
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize + 1),
            e,
            "past the pin"
        );
        assert_eq!(gdr_map_v2(g, mh, &mut map, 4096, 9), e, "unknown map flag");
        assert_eq!(
            gdr_map_v2(g, mh, &mut map, 4096, 2),
            libc::EOPNOTSUPP,
            "caching"
        );
        assert_eq!(gdr_get_info_v2(g, mh, ptr::null_mut()), e);
        assert_eq!(gdr_get_callback_flag(g, mh, ptr::null_mut()), e);
        held(1, 0);

        // An unaligned pin cannot be mapped.
        let mut odd = gdr_mh_t::default();
        assert_eq!(gdr_pin_buffer_v2(g, (va + 100) as _, 1000, 0, &mut odd), 0);
        assert_eq!(gdr_map(g, odd, &mut map, 4096), e, "unaligned pin");
        held(2, 0);
        assert_eq!(gdr_unpin_buffer(g, odd), 0);

        // Wrong handles: zero, garbage, another gdr_t's, stale.
        for bad in [
            gdr_mh_t { h: 0 },
            gdr_mh_t { h: u64::MAX as _ },
            gdr_mh_t {
                h: mh.h ^ (1 << 40),
            },
        ] {
            assert_eq!(gdr_unpin_buffer(g, bad), e);
            assert_eq!(gdr_map(g, bad, &mut map, 4096), e);
            assert_eq!(gdr_get_info_v2(g, bad, &mut info), e);
        }
        assert_eq!(gdr_unpin_buffer(other, mh), e, "another gdr_t's handle");
        assert_eq!(
            gdr_map(other, mh, &mut map, 4096),
            e,
            "another gdr_t's handle"
        );
        assert_eq!(gdr_get_callback_flag(other, mh, &mut flag), e);
        held(1, 0);

        // Map, then bad unmaps and copies.
        assert_eq!(gdr_map(g, mh, &mut map, MIB as usize), 0);
        held(1, 1);
        let word = [7u8; 8];
        let mut back = [0u8; 8];
        assert_eq!(
            gdr_map(g, mh, &mut map, MIB as usize),
            libc::EAGAIN,
            "mapped twice"
        );
        assert_eq!(gdr_unmap(other, mh, map, MIB as usize), e, "another gdr_t");
        assert_eq!(
            gdr_unmap(g, mh, map.cast::<u8>().add(4096).cast(), MIB as usize),
            e,
            "wrong va"
        );
        assert_eq!(gdr_unmap(g, mh, map, 4096), e, "wrong size");
        assert_eq!(gdr_copy_to_mapping(mh, map, ptr::null(), 8), e, "NULL host");
        assert_eq!(
            gdr_copy_to_mapping(mh, ptr::null_mut(), word.as_ptr().cast(), 8),
            e
        );
        assert_eq!(
            gdr_copy_from_mapping(mh, ptr::null_mut(), map, 8),
            e,
            "NULL host"
        );
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), usize::MAX),
            e,
            "overflow"
        );
        assert_eq!(
            gdr_copy_to_mapping(
                mh,
                map.cast::<u8>().add(MIB as usize - 4).cast(),
                word.as_ptr().cast(),
                8
            ),
            e,
            "past the end"
        );
        assert_eq!(
            gdr_copy_from_mapping(
                mh,
                back.as_mut_ptr().cast(),
                map.cast::<u8>().sub(8).cast(),
                8
            ),
            e,
            "before the start"
        );
        assert_eq!(
            gdr_copy_to_mapping(gdr_mh_t { h: 0 }, map, word.as_ptr().cast(), 8),
            e
        );
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 0),
            0,
            "size 0 is a no-op"
        );
        held(1, 1);
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), 0);
        assert_eq!(gdr_unmap(g, mh, map, MIB as usize), e, "double unmap");
        assert_eq!(
            gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8),
            e,
            "after unmap"
        );
        held(1, 0);
        assert_eq!(gdr_unpin_buffer(g, mh), 0);
        assert_eq!(gdr_unpin_buffer(g, mh), e, "double unpin");
        assert_eq!(gdr_get_info_v2(g, mh, &mut info), e, "stale handle");
        held(0, 0);
        assert_eq!(gdr_close(other), 0);
        assert_eq!(gdr_close(g), 0);
    }
    emu.free(va).expect("free");
    assert_no_pins(&emu);
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

/// Regression (library): gdr_unmap (or gdr_unpin_buffer, gdr_close) racing a copy through the
/// same handle in another thread. Defined outcome: the copy either completes before the unmap
/// releases the mapping, or returns EINVAL; it never faults and never touches the address after
/// the unmap returned (where a new mapping may already live). Run in a child process so that a
/// fault shows as a failure instead of killing the test binary.
#[test]
fn unmap_racing_a_copy_completes_or_fails_with_einval() {
    let emu = Emu::open().expect("emulator");
    let code = in_child(|| {
        // GPU VAs are per process: the child allocates its own.
        let Ok(emu) = Emu::open() else { return 67 };
        let Ok(va) = emu.alloc(MIB, 0, 65536, false) else {
            return 68;
        };
        let mut outcomes = [0u64; 2];
        for round in 0..60u32 {
            // SAFETY: valid pointers; the racing thread is joined before the next round.
            unsafe {
                let g = SharedGdr(gdr_open());
                let mut mh = gdr_mh_t::default();
                if gdr_pin_buffer_v2(g.0, va as _, MIB as usize, 0, &mut mh) != 0 {
                    return 60;
                }
                let mut map: *mut c_void = ptr::null_mut();
                if gdr_map(g.0, mh, &mut map, MIB as usize) != 0 {
                    return 61;
                }
                let addr = map as usize;
                let stop = std::sync::atomic::AtomicBool::new(false);
                let result = std::thread::scope(|s| {
                    let copier = s.spawn(|| {
                        let data = vec![0x3cu8; 256 * 1024];
                        let (mut ok, mut refused) = (0u64, 0u64);
                        loop {
                            match gdr_copy_to_mapping(
                                mh,
                                addr as *mut c_void,
                                data.as_ptr().cast(),
                                data.len(),
                            ) {
                                0 => ok += 1,
                                libc::EINVAL => refused += 1,
                                _ => return Err(62),
                            }
                            if stop.load(std::sync::atomic::Ordering::Acquire) && refused > 0 {
                                return Ok((ok, refused));
                            }
                        }
                    });
                    std::thread::sleep(std::time::Duration::from_micros(
                        500 + u64::from(round) * 97,
                    ));
                    let rc = match round % 3 {
                        0 => gdr_unmap(g.0, mh, addr as *mut c_void, MIB as usize),
                        1 => gdr_unpin_buffer(g.0, mh),
                        _ => gdr_close(g.0),
                    };
                    // The address is free now: take it, so a late store would land here.
                    let filler = libc::mmap(
                        addr as *mut c_void,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    );
                    stop.store(true, std::sync::atomic::Ordering::Release);
                    let r = copier.join().unwrap_or(Err(63));
                    (rc, filler, r)
                });
                let (rc, filler, r) = result;
                if rc != 0 {
                    return 64;
                }
                match r {
                    Ok((ok, refused)) => {
                        outcomes[0] += ok;
                        outcomes[1] += refused;
                    }
                    Err(code) => return code,
                }
                if filler == addr as *mut c_void && *(addr as *const u8) != 0 {
                    return 65;
                }
                if filler != libc::MAP_FAILED {
                    libc::munmap(filler, 4096);
                }
                if round % 3 != 2 && gdr_close(g.0) != 0 {
                    return 66;
                }
            }
        }
        eprintln!(
            "racing copies: {} completed, {} refused",
            outcomes[0], outcomes[1]
        );
        0
    });
    assert_eq!(code, 0, "a copy racing an unmap did something undefined");
    assert_no_pins(&emu);
}
