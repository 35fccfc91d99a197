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
    assert_eq!(gdr.driver_version(), (0, 1));
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
    assert_eq!(info.mapped_size, 65536);
    assert_eq!(info.page_size, 65536);
    let err = pin
        .map(MapRequest::Default)
        .err()
        .expect("unaligned pin cannot be mapped");
    assert_eq!(err.errno(), Errno::EINVAL);
    drop(pin);
    // A range crossing a GPU page is rounded on both sides.
    let pin = gdr.pin(va + 65536 - 8, 16, PinFlags::DEFAULT).expect("pin");
    let info = pin.info().expect("info");
    assert_eq!((info.va, info.mapped_size), (va, 2 * 65536));
    drop(pin);
    emu.free(va).expect("free");
    assert_no_pins(&emu);
}

/// An allocation of 4 KiB pages that is not 64 KiB aligned: the module falls back to the host
/// page granule (gdrapi.h documents it) and the pin can be mapped and used.
#[test]
fn small_page_allocation_not_64k_aligned() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    // Two allocations so the second starts off a 64 KiB boundary.
    let first = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let va = emu.alloc(12 * KIB, 4096, 4096, false).expect("alloc");
    let target = if !va.is_multiple_of(65536) { va } else { first };
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

/// A device fd passed to another process over a unix socket is refused there.
#[test]
fn fd_passed_to_another_process_is_refused() {
    use nix::sys::socket::{
        sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
    };
    let (parent_sock, child_sock) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )
    .expect("socketpair");
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mtgdrdrv")
        .expect("open device");
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
    let fds = [device.as_raw_fd()];
    let iov = [std::io::IoSlice::new(b"x")];
    sendmsg::<()>(
        parent_sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg");
    match waitpid(child, None).expect("waitpid") {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("receiving process was not refused: {other:?}"),
    }
}

fn receive_and_probe(sock: OwnedFd) -> i32 {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
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
    // SAFETY: the received descriptor is ours to own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut params = mtgdrdrv::GDRDRV_IOC_GET_VERSION_PARAMS::default();
    // SAFETY: GET_VERSION with a live params struct of the right type.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            mtgdrdrv::GDRDRV_IOC_GET_VERSION as _,
            &mut params,
        )
    };
    if rc != -1 || Errno::last() != Errno::EACCES {
        return 22;
    }
    // SAFETY: a shared mapping request on the received fd; it must be refused.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            65536,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p != libc::MAP_FAILED || Errno::last() != Errno::EACCES {
        return 23;
    }
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

#[test]
fn eight_threads_pin_map_copy_unmap_unpin_concurrently() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let per_thread = 4 * 65536;
    let va = emu.alloc(8 * per_thread, 0, 65536, false).expect("alloc");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let gdr = &gdr;
            let emu = &emu;
            s.spawn(move || {
                let base = va + t * per_thread;
                for round in 0..50u64 {
                    let pin = gdr.pin(base, per_thread, PinFlags::DEFAULT).expect("pin");
                    let map = pin.map(MapRequest::Default).expect("map");
                    let data = pattern(t * 1000 + round, 4096);
                    map.write((round as usize % 64) * 4096, &data)
                        .expect("write");
                    let mut back = vec![0u8; 4096];
                    emu.read(base + (round % 64) * 4096, &mut back)
                        .expect("dma");
                    assert!(back == data, "thread {t} round {round}");
                    drop(map);
                    pin.unpin().expect("unpin");
                }
            });
        }
    });
    // The same through the C API on one shared gdr_t.
    let g = SharedGdr(gdr_open());
    assert!(!g.0.is_null());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let g = &g;
            s.spawn(move || {
                let base = va + t * per_thread;
                for _ in 0..50 {
                    // SAFETY: valid pointers; the shared gdr_t outlives the scope.
                    unsafe {
                        let mut mh = gdr_mh_t::default();
                        assert_eq!(
                            gdr_pin_buffer_v2(g.0, base as _, per_thread as usize, 0, &mut mh),
                            0
                        );
                        let mut map: *mut c_void = ptr::null_mut();
                        assert_eq!(gdr_map(g.0, mh, &mut map, per_thread as usize), 0);
                        let word = t.to_le_bytes();
                        assert_eq!(gdr_copy_to_mapping(mh, map, word.as_ptr().cast(), 8), 0);
                        assert_eq!(gdr_unmap(g.0, mh, map, per_thread as usize), 0);
                        assert_eq!(gdr_unpin_buffer(g.0, mh), 0);
                    }
                }
            });
        }
    });
    // SAFETY: no thread uses it anymore.
    assert_eq!(unsafe { gdr_close(g.0) }, 0);
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
