//! Lifetimes and teardown order: gdr_close, memory freed while pinned, process exit and SIGKILL,
//! mappings that outlive their fd or are split by a partial munmap, unpin while mapped, and
//! unloading the modules while they are busy.

use super::*;

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

/// [`counter`] once it reads `want`, or after 2 s: for the put the module defers to a work
/// item when the last mapping of an unpinned pin goes.
fn settled_counter(name: &str, want: i64) -> i64 {
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

/// The VmFlags of the VMA that starts at `addr`, as /proc/self/smaps lists them.
fn vma_flags(addr: usize) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let start = format!("{addr:x}-");
    smaps
        .lines()
        .skip_while(|l| !l.starts_with(&start))
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .unwrap_or_else(|| panic!("no VMA at {addr:#x}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// No mapping is marked VM_PAT ("ar" among its VmFlags on x86), a one-page one neither, with
/// PAT on or off (`cargo xtask test` boots 6.1 a second time with `nopat`), and each gives its
/// memory type back at munmap after an unpin while mapped. A VM_PAT VMA (one
/// remap call over all of it, on x86 kernels before VM_PAT's removal) finds its reservation
/// again at munmap from its first PTE; an unpin racing the munmap had zapped it: a kernel
/// warning and a leaked reservation (the fuzzer met it on 6.1).
#[test]
fn mappings_are_never_vm_pat_and_release_their_memtype() {
    let emu = Emu::open().expect("emulator");
    let memtypes = || pat::enabled().then(pat::bar_memtypes);
    let before = memtypes();
    for len in [4096, 8192, 65536] {
        let va = emu.alloc(65536, 0, 65536, false).expect("alloc");
        let dev = RawDev::open();
        let h = dev.pin(va, 65536).expect("pin");
        let map = dev.mmap(h, len).expect("mmap");
        let flags = vma_flags(map);
        assert!(
            flags.iter().any(|f| f == "pf") && !flags.iter().any(|f| f == "ar"),
            "{len} bytes: a PFN map, not VM_PAT: {flags:?}"
        );
        assert!(kernel_can_read(map + len - 1), "{len} bytes mapped");
        dev.unpin(h).expect("unpin while mapped");
        assert!(!kernel_can_read(map), "{len} bytes: zapped");
        munmap(map, len);
        assert_eq!(settled_counter("pins_outstanding", 0), 0);
        drop(dev);
        emu.free(va).expect("free");
        assert_eq!(
            memtypes(),
            before,
            "{len} bytes: no memory type left reserved"
        );
    }
    assert_no_pins(&emu);
}
