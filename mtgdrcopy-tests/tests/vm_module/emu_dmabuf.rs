//! The CPU mappings of the emulator's dma-bufs (EXPORT_DMABUF, testing/mtgpu-emu/emu_dmabuf.c):
//! their x86 PAT memory type, VMA splits, revocation when the device goes away, and sparse
//! allocations. Root in the test VM: the kernel's memtype reservations are read through `pat`.
//!
//! A PTE of these mappings takes the memtype that the kernel's list records for its page, so
//! "every page is reserved write-combining" is what makes the mapping WC. The physical pages of
//! an allocation come from mtgdrdrv, independently of the code under test: a WC mapping of a
//! pin of the allocation reserves exactly its pages (see `allocation_pages`). /proc/self/pagemap
//! cannot tell them: it shows VM_PFNMAP mappings as holes.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

use mtgpu_emu_abi::device_path;
use mtgpu_emu_abi::{
    mtgpu_emu_export_dmabuf, MTGPU_EMU_IOC_EXPORT_DMABUF, MTGPU_EMU_PAGE_2M, MTGPU_EMU_PAGE_4K,
    MTGPU_EMU_PAGE_64K,
};
use nix::sys::signal::Signal;

use super::pat::{self, added, bar_memtypes, ivshmem, memtypes_in, pages_of, Memtype, PAGE};
use super::*;

nix::ioctl_readwrite_bad!(
    ioc_export,
    MTGPU_EMU_IOC_EXPORT_DMABUF,
    mtgpu_emu_export_dmabuf
);

/// Every odd page a hole.
const ALLOC_SPARSE: u32 = mtgpu_emu_abi::MTGPU_EMU_ALLOC_SPARSE;

/// The physical host pages of `[va, va + size)` of an allocation (64 KiB aligned), in ascending
/// order, as mtgdrdrv sees them: a WC mapping of a pin reserves WC for the pin's physical runs,
/// and nothing else, until it is unmapped.
fn allocation_pages(gdr: &Gdr, va: u64, size: u64) -> Vec<u64> {
    let before = bar_memtypes();
    let pin = gdr.pin(va, size, PinFlags::DEFAULT).expect("pin");
    let map = pin.map(MapRequest::Default).expect("map");
    assert_eq!(map.mapping_type(), MappingType::WriteCombining);
    let reserved = added(&before, &bar_memtypes());
    drop(map);
    pin.unpin().expect("unpin");
    assert_eq!(bar_memtypes(), before, "mtgdrdrv released its reservation");
    let pages = pages_of(&reserved);
    assert_eq!(
        pages.len() as u64,
        size / PAGE as u64,
        "one entry page per page"
    );
    pages.into_iter().collect()
}

/// Asserts that every page at `phys` lies in the BAR and is reserved write-combining, so that
/// its PTE (which takes the reserved type) is WC, and that nothing reserves it otherwise.
fn assert_write_combining<'a>(phys: impl IntoIterator<Item = &'a u64>, what: &str) {
    let (_, lo, hi) = ivshmem();
    let list = pat::pat_list();
    for &pa in phys {
        assert!(
            (lo..hi).contains(&pa),
            "{what}: page {pa:#x} lies in the BAR"
        );
        let over: Vec<&Memtype> = list
            .iter()
            .filter(|m| m.start < pa + PAGE as u64 && pa < m.end)
            .collect();
        assert!(
            !over.is_empty() && over.iter().all(|m| m.kind == "write-combining"),
            "{what}: page {pa:#x} is reserved write-combining, and only so; its entries: {over:?}"
        );
    }
}

/// The emulator's dma-bufs and their mappings that exist now. Tests compare it with what it
/// was when they started, so that one that failed and left some does not fail the next ones.
fn live(emu: &Emu) -> (u64, u64) {
    let s = emu.stats().expect("stats");
    (s.dmabufs_live, s.dmabuf_mappings)
}

/// A second descriptor of the emulator, for the ioctls `Emu` has no method for. Allocations
/// are the process's, so its exports see those made through any `Emu`.
fn emu_fd() -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(device_path())
        .expect("emulator")
}

fn export(dev: &File, gpu_va: u64, size: u64) -> Result<OwnedFd, Errno> {
    let mut e = mtgpu_emu_export_dmabuf {
        gpu_va,
        size,
        ..Default::default()
    };
    // SAFETY: `e` is a live struct of the type the command copies in and out.
    unsafe { ioc_export(dev.as_raw_fd(), &mut e) }?;
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(e.fd) })
}

/// `MAP_SHARED`, read-write, `len` bytes from byte `offset` of the dma-buf.
fn mmap(fd: &OwnedFd, offset: u64, len: usize) -> Result<usize, Errno> {
    mmap_shared(fd, offset, len)
}

/// Writes `data` through the mapping at `addr` (faulting every page in) and makes it visible.
fn write_through(addr: usize, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        // SAFETY: `addr` maps at least `data.len()` bytes read-write.
        unsafe { ptr::write_volatile((addr + i) as *mut u8, b) };
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

fn read_through(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: `addr` maps at least `len` readable bytes.
    (0..len)
        .map(|i| unsafe { ptr::read_volatile((addr + i) as *const u8) })
        .collect()
}

/// Every mapping comes out write-combining, whatever the physical layout: each page of a
/// scattered allocation (where each piece of the mapping is its own physical run) as much as
/// a contiguous one, mapped whole or from an offset; and the data goes where it should.
/// Without the per-export WC reservation, remapping a run that is only part of the VMA took the
/// BAR's tracked type, uncached-minus, and reserved nothing: the scattered cases fail here.
#[test]
fn mappings_are_write_combining_for_every_layout() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let dev = emu_fd();
    let at_start = live(&emu);
    let cases = [
        (MTGPU_EMU_PAGE_4K, true, 256 * KIB),
        (MTGPU_EMU_PAGE_64K, true, MIB),
        (MTGPU_EMU_PAGE_2M, true, 4 * MIB),
        (MTGPU_EMU_PAGE_4K, false, MIB),
        (MTGPU_EMU_PAGE_2M, false, 4 * MIB),
    ];
    for (page_size, scatter, size) in cases {
        let what = format!("{} KiB pages, scatter {scatter}", page_size / 1024);
        let va = emu
            .alloc(size, 64 * KIB, page_size, scatter)
            .expect("alloc");
        let phys = allocation_pages(&gdr, va, size);
        let before = bar_memtypes();
        let buf = export(&dev, va, size).expect("export");
        let len = size as usize;
        let map = mmap(&buf, 0, len).expect("mmap");

        let data = pattern(u64::from(page_size), len);
        write_through(map, &data);
        let mut back = vec![0u8; len];
        emu.read(va, &mut back).expect("dma read");
        assert!(back == data, "{what}: CPU writes reach device memory");
        emu.write(va, &pattern(7, len)).expect("dma write");
        assert!(
            read_through(map, len) == pattern(7, len),
            "{what}: device memory reads back through the mapping"
        );
        let ours = added(&before, &bar_memtypes());
        assert!(
            ours.iter().all(|m| m.kind == "write-combining"),
            "{what}: the mapping reserved write-combining only: {ours:?}"
        );
        assert!(
            pages_of(&ours) == phys.iter().copied().collect(),
            "{what}: the mapping reserved the allocation's pages, {} of them; it reserved {ours:?}",
            phys.len()
        );
        assert_write_combining(&phys, &what);

        // A second mapping from an offset into the buffer shares the reservation.
        let off = u64::from(page_size).min(size / 2);
        let map2 = mmap(&buf, off, PAGE * 3).expect("mmap at an offset");
        assert!(
            read_through(map2, PAGE * 3) == pattern(7, len)[off as usize..off as usize + PAGE * 3],
            "{what}: the mapping at offset {off:#x} shows that part"
        );
        assert_eq!(added(&before, &bar_memtypes()), ours, "{what}: shared");

        munmap(map, len);
        munmap(map2, PAGE * 3);
        assert_eq!(
            bar_memtypes(),
            before,
            "{what}: the last munmap releases the reservation, the dma-buf still open"
        );
        drop(buf);
        emu.free(va).expect("free");
    }
    assert_eq!(live(&emu), at_start, "dma-bufs and mappings left");
}

/// Partial munmaps split the mapping; the reservation lives while any piece, of this mapping
/// or another one of the same dma-buf, is left, and goes with the last. With the whole VMA
/// remapped at once (VM_PAT), a split made the kernel free pieces that were never reserved
/// ("freeing invalid memtype") and leak the whole reservation: that fails the last check here.
#[test]
fn partial_munmap_keeps_the_rest_write_combining_and_leaks_no_memtype() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let dev = emu_fd();
    let at_start = live(&emu);
    for page_size in [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_2M] {
        let size = 2 * MIB;
        let len = size as usize;
        let va = emu.alloc(size, 0, page_size, false).expect("alloc");
        // Contiguous: host page i of the allocation is the i-th physical page.
        let phys = allocation_pages(&gdr, va, size);
        let before = bar_memtypes();
        let buf = export(&dev, va, size).expect("export");
        let map = mmap(&buf, 0, len).expect("mmap");
        let data = pattern(3, len);
        write_through(map, &data);
        assert_write_combining(&phys, "whole mapping");

        let mappings = |n: u64| assert_eq!(live(&emu).1 - at_start.1, n, "mappings");
        // Three pieces: [0, 100) [110, 300) [310, 512) in host pages.
        munmap(map + 100 * PAGE, 10 * PAGE);
        munmap(map + 300 * PAGE, 10 * PAGE);
        mappings(3);
        let pieces = [(0, 100), (110, 300), (310, len / PAGE)];
        for (lo, hi) in pieces {
            let (a, n) = (map + lo * PAGE, (hi - lo) * PAGE);
            assert!(
                read_through(a, n) == data[lo * PAGE..hi * PAGE],
                "piece [{lo}, {hi}) still maps its pages"
            );
        }
        assert_write_combining(&phys[..100], "first piece");
        assert_write_combining(&phys[110..300], "middle piece");
        assert_write_combining(&phys[310..], "last piece");

        // Another mapping of the same dma-buf outlives all of the first one.
        let other = mmap(&buf, 0, 4 * PAGE).expect("second mmap");
        mappings(4);
        munmap(map + 110 * PAGE, 190 * PAGE);
        munmap(map, 100 * PAGE);
        munmap(map + 310 * PAGE, len - 310 * PAGE);
        mappings(1);
        assert!(read_through(other, 4 * PAGE) == data[..4 * PAGE]);
        assert_write_combining(&phys[..4], "second mapping");
        munmap(other, 4 * PAGE);
        mappings(0);
        assert_eq!(
            bar_memtypes(),
            before,
            "page {page_size}: no memtype of the BAR is left once every piece is unmapped"
        );
        drop(buf);
        emu.free(va).expect("free");
    }
}

/// Forks a child that runs `setup`, reports back and waits; the parent then runs `meanwhile`,
/// lets the child go on with `then` (given what `setup` returned) and returns how it ended
/// (exit status 0, 101 on a panic, or the signal that killed it).
fn fork_synced(
    setup: impl FnOnce() -> usize,
    then: impl FnOnce(usize),
    meanwhile: impl FnOnce(),
) -> WaitStatus {
    let (to_parent_rd, to_parent_wr) = nix::unistd::pipe().expect("pipe");
    let (to_child_rd, to_child_wr) = nix::unistd::pipe().expect("pipe");
    // SAFETY: the child only makes system calls, touches memory and leaves with _exit; the
    // tests run one at a time (--test-threads=1).
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let value = setup();
                nix::unistd::write(&to_parent_wr, b"r").expect("report ready");
                let mut go = [0u8; 1];
                nix::unistd::read(to_child_rd.as_raw_fd(), &mut go).expect("wait for go");
                then(value);
            }));
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(if run.is_ok() { 0 } else { 101 }) }
        }
        ForkResult::Parent { child } => {
            let mut ready = [0u8; 1];
            let n = nix::unistd::read(to_parent_rd.as_raw_fd(), &mut ready).expect("read");
            assert_eq!(n, 1, "the child set up");
            meanwhile();
            nix::unistd::write(&to_child_wr, b"g").expect("go");
            waitpid(child, None).expect("waitpid")
        }
    }
}

fn write_sysfs(path: &Path, value: &str) {
    std::fs::write(path, value).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Waits until the emulator serves a BAR again after a PCI rescan.
fn wait_bound(emu: &Emu) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while emu.stats().is_err() {
        assert!(
            Instant::now() < deadline,
            "the emulator rebinds after rescan"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removing the device (PCI remove through sysfs, the software form of hot-unplug) revokes
/// every dma-buf mapping: its PTEs go, so an access raises SIGBUS, its memtype goes although
/// the VMAs are still there, and new mmaps fail with ENODEV, also after the device is back.
/// Covers a mapping whose dma-buf fd is still open, one whose fd was closed (only the VMA holds
/// the file) and a dma-buf with no mapping.
#[test]
fn device_removal_revokes_every_mapping() {
    let emu = Emu::open().expect("emulator");
    let dev = emu_fd();
    let (sysfs, bar_lo, bar_hi) = ivshmem();
    let before = bar_memtypes();
    let (bufs, maps) = live(&emu);
    let len = 4 * PAGE;

    let va = emu.alloc(MIB, 0, MTGPU_EMU_PAGE_4K, true).expect("alloc");
    let open_buf = export(&dev, va, MIB).expect("export");
    let map_open = mmap(&open_buf, 0, len).expect("mmap");
    write_through(map_open, &pattern(1, len));
    let closed_buf = export(&dev, va + 64 * KIB, 64 * KIB).expect("export");
    let map_closed = mmap(&closed_buf, 0, len).expect("mmap");
    write_through(map_closed, &pattern(2, len));
    drop(closed_buf);
    let unmapped_buf = export(&dev, va, 64 * KIB).expect("export");
    assert_eq!(live(&emu), (bufs + 3, maps + 2));
    assert_ne!(bar_memtypes(), before, "the mappings reserved WC");

    // A child maps the dma-buf itself (VM_DONTCOPY: it does not inherit our mappings), reads
    // it, and reads it again once the device is gone: that must kill it with SIGBUS.
    let status = fork_synced(
        || {
            let m = mmap(&open_buf, 0, PAGE).expect("child mmap");
            assert_eq!(read_through(m, 16), pattern(1, 16));
            m
        },
        |m| {
            assert_eq!(mmap(&open_buf, 0, PAGE).err(), Some(Errno::ENODEV));
            read_through(m, 1);
        },
        || write_sysfs(&sysfs.join("remove"), "1"),
    );
    assert!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGBUS, _)),
        "the child's access after removal raises SIGBUS: {status:?}"
    );

    assert_eq!(emu.stats().err(), Some(Errno::ENODEV), "no device now");
    assert_eq!(
        memtypes_in(bar_lo, bar_hi),
        before,
        "no memtype the mappings took in the BAR [{bar_lo:#x}, {bar_hi:#x}) survives removal"
    );
    assert!(
        !kernel_can_read(map_open),
        "the open dma-buf's mapping is zapped"
    );
    assert!(!kernel_can_read(map_closed), "the closed one's too");
    assert_eq!(mmap(&open_buf, 0, PAGE).err(), Some(Errno::ENODEV));
    assert_eq!(mmap(&unmapped_buf, 0, PAGE).err(), Some(Errno::ENODEV));

    write_sysfs(Path::new("/sys/bus/pci/rescan"), "1");
    wait_bound(&emu);
    assert!(
        !kernel_can_read(map_open),
        "still revoked with the device back"
    );
    assert_eq!(
        mmap(&open_buf, 0, PAGE).err(),
        Some(Errno::ENODEV),
        "a dma-buf of the old device never maps again"
    );
    assert_eq!(
        live(&emu),
        (bufs + 3, maps + 2),
        "the dma-bufs outlive the device"
    );
    let s = emu.stats().expect("stats");
    assert_eq!((s.allocations, s.bytes_allocated), (0, 0), "{s:?}");

    munmap(map_open, len);
    munmap(map_closed, len);
    drop((open_buf, unmapped_buf));
    assert_eq!(live(&emu), (bufs, maps));
    assert_eq!(memtypes_in(bar_lo, bar_hi), before);

    // The device works again.
    let gdr = Gdr::open().expect("gdr_open");
    let va = emu
        .alloc(MIB, 0, MTGPU_EMU_PAGE_4K, true)
        .expect("alloc after rescan");
    let phys = allocation_pages(&gdr, va, MIB);
    let buf = export(&dev, va, MIB).expect("export after rescan");
    let map = mmap(&buf, 0, len).expect("mmap after rescan");
    write_through(map, &pattern(9, len));
    assert_write_combining(&phys, "after rescan");
    munmap(map, len);
    drop(buf);
    emu.free(va).expect("free");
}

/// A range that touches a hole of a sparse allocation is refused (EINVAL); ranges of its
/// backed pages alone are exported.
#[test]
fn export_refuses_a_range_with_a_hole() {
    let emu = Emu::open().expect("emulator");
    let dev = emu_fd();
    let at_start = live(&emu);
    for page_size in [MTGPU_EMU_PAGE_4K, MTGPU_EMU_PAGE_64K] {
        let ps = u64::from(page_size);
        let va = emu
            .alloc_flags(4 * ps, 0, page_size, ALLOC_SPARSE)
            .expect("sparse alloc");
        // Pages 1 and 3 are holes.
        let first = export(&dev, va, ps).expect("the first page is backed");
        let third = export(&dev, va + 2 * ps, ps).expect("the third page is backed");
        let host = PAGE as u64;
        for (off, size) in [
            (ps, ps),
            (ps, host),
            (2 * ps - host, host),
            (ps - host, 2 * host),
            (0, 4 * ps),
            (2 * ps, 2 * ps),
        ] {
            assert_eq!(
                export(&dev, va + off, size).err(),
                Some(Errno::EINVAL),
                "page {page_size}: [{off:#x} +{size:#x}) touches a hole"
            );
        }
        let map = mmap(&third, 0, ps as usize).expect("mmap of a backed page");
        write_through(map, &pattern(4, ps as usize));
        let mut back = vec![0u8; ps as usize];
        emu.read(va + 2 * ps, &mut back).expect("dma read");
        assert!(back == pattern(4, ps as usize));
        munmap(map, ps as usize);
        drop((first, third));
        emu.free(va).expect("free");
    }
    assert_eq!(live(&emu), at_start, "dma-bufs and mappings left");
}
