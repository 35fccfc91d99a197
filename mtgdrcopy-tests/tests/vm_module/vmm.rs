//! Memory of the VMM API (muMemCreate + muMemAddressReserve + muMemMap + muMemSetAccess)
//! through mtgdrdrv and the emulated provider (issue 31): a mapping with access pins as an
//! allocation does; memory without access, without a mapping or (by default) without the
//! GPUDirect RDMA flag does not; a pin across two allocations mapped one after the other is
//! refused by default and works byte-exact with `p2p_vmm_span`; unmap and release of pinned
//! memory keep it until unpin; a dma-buf of it maps. Each unknown of the real driver is an
//! emulator parameter, and each choice is tested.

use super::*;
use mtgpu_emu_abi::{
    MTGPU_EMU_ACCESS_NONE, MTGPU_EMU_ACCESS_READ, MTGPU_EMU_ACCESS_READWRITE, MTGPU_EMU_ALLOC_RDMA,
    MTGPU_EMU_ALLOC_VMM, MTGPU_EMU_PAGE_64K,
};

const PARAMS: &str = "/sys/module/mtgpu_emu/parameters";

/// One VMM parameter of the emulator set for a test; back to its default (N) on drop.
struct Knob(&'static str);

impl Knob {
    fn set(name: &'static str, on: bool) -> Knob {
        let path = format!("{PARAMS}/{name}");
        std::fs::write(&path, if on { "Y" } else { "N" })
            .unwrap_or_else(|e| panic!("writing {path}: {e}"));
        Knob(name)
    }
}

impl Drop for Knob {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("{PARAMS}/{}", self.0), "N");
    }
}

/// A VMM allocation of `size` bytes (`rdma`: created GPUDirect RDMA capable); its handle.
fn create(emu: &Emu, size: u64, page_size: u32, rdma: bool) -> u64 {
    let flags = MTGPU_EMU_ALLOC_VMM | if rdma { MTGPU_EMU_ALLOC_RDMA } else { 0 };
    emu.alloc_flags(size, 0, page_size, flags)
        .expect("VMM alloc")
}

/// upstream's gpu_vmm_alloc on the emulator: create, reserve, map, read-write access.
fn vmm_alloc(emu: &Emu, size: u64, page_size: u32, rdma: bool) -> (u64, u64) {
    let h = create(emu, size, page_size, rdma);
    let va = emu
        .vmm_reserve(size, u64::from(page_size))
        .expect("reserve");
    emu.vmm_map(va, size, h, 0).expect("map");
    emu.vmm_set_access(va, size, MTGPU_EMU_ACCESS_READWRITE)
        .expect("set access");
    (h, va)
}

fn vmm_free(emu: &Emu, h: u64, va: u64, size: u64) {
    emu.vmm_unmap(va, size).expect("unmap");
    emu.free(h).expect("release");
    emu.vmm_unreserve(va, size).expect("address free");
}

/// Pins, maps and checks `[va, va + len)` both ways against what the emulator holds.
fn pin_write_read(emu: &Emu, gdr: &Gdr, va: u64, len: u64, seed: u64) {
    let pin = gdr
        .pin(va, len, PinFlags::DEFAULT)
        .unwrap_or_else(|e| panic!("pin of {len:#x} at {va:#x}: {e}"));
    let map = pin.map(MapRequest::Default).expect("map");
    let data = pattern(seed, len as usize);
    map.write(0, &data).expect("write");
    let mut back = vec![0u8; len as usize];
    emu.read(va, &mut back).expect("dma read");
    assert!(
        back == data,
        "writes through the mapping land in VMM memory"
    );
    let other = pattern(seed + 1, len as usize);
    emu.write(va, &other).expect("dma write");
    map.read(0, &mut back).expect("read");
    assert!(back == other, "the mapping reads what the device holds");
    drop(map);
    pin.unpin().expect("unpin");
}

#[test]
fn vmm_memory_with_the_rdma_flag_pins_maps_and_moves_data_on_every_page_size() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let before = emu.stats().expect("stats");
    for page_size in PAGE_SIZES {
        let size = 2 * u64::from(page_size).max(64 * KIB);
        let (h, va) = vmm_alloc(&emu, size, page_size, true);
        pin_write_read(&emu, &gdr, va, size, u64::from(page_size));
        vmm_free(&emu, h, va, size);
    }
    let after = emu.stats().expect("stats");
    assert_eq!(
        (after.allocations, after.bytes_allocated),
        (before.allocations, before.bytes_allocated),
        "every VMM record went"
    );
    assert_no_pins(&emu);
}

#[test]
fn vmm_va_without_mapping_or_access_is_not_usable() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let size = 128 * KIB;
    let h = create(&emu, size, MTGPU_EMU_PAGE_64K, true);
    let va = emu.vmm_reserve(2 * size, 0).expect("reserve");
    let mut b = [0u8; 8];
    // The handle is not an address; a reserved VA without a mapping is nothing.
    for addr in [h, va] {
        assert_eq!(emu.read(addr, &mut b), Err(Errno::EINVAL), "{addr:#x}");
        assert!(gdr.pin(addr, size, PinFlags::DEFAULT).is_err(), "{addr:#x}");
    }
    emu.vmm_map(va, size, h, 0).expect("map");
    // Mapped, but no access yet.
    assert_eq!(emu.read(va, &mut b), Err(Errno::EINVAL));
    assert!(gdr.pin(va, size, PinFlags::DEFAULT).is_err());
    // Access over a range with an unmapped part is refused.
    assert_eq!(
        emu.vmm_set_access(va, 2 * size, MTGPU_EMU_ACCESS_READ),
        Err(Errno::EINVAL)
    );
    emu.vmm_set_access(va, size, MTGPU_EMU_ACCESS_READ)
        .expect("read access");
    emu.read(va, &mut b).expect("read with read access");
    assert_eq!(
        emu.write(va, &b),
        Err(Errno::EINVAL),
        "write needs READWRITE"
    );
    emu.vmm_set_access(va, size, MTGPU_EMU_ACCESS_NONE)
        .expect("no access");
    assert!(gdr.pin(va, size, PinFlags::DEFAULT).is_err());
    // The reservation cannot go while a mapping is in it.
    assert_eq!(emu.vmm_unreserve(va, 2 * size), Err(Errno::EINVAL));
    emu.vmm_unmap(va, size).expect("unmap");
    assert_eq!(emu.vmm_unmap(va, size), Err(Errno::EINVAL), "nothing left");
    emu.free(h).expect("release");
    emu.vmm_unreserve(va, 2 * size).expect("address free");
    assert_no_pins(&emu);
}

#[test]
fn vmm_memory_without_the_rdma_flag_is_refused_unless_p2p_vmm_any() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let size = 128 * KIB;
    let (h, va) = vmm_alloc(&emu, size, MTGPU_EMU_PAGE_64K, false);
    let refused = emu.stats().expect("stats").get_pages_refused;
    assert!(
        gdr.pin(va, size, PinFlags::DEFAULT).is_err(),
        "refused by default, as NVIDIA refuses it"
    );
    assert!(emu.stats().expect("stats").get_pages_refused > refused);
    assert_no_pins(&emu);
    {
        let _any = Knob::set("p2p_vmm_any", true);
        pin_write_read(&emu, &gdr, va, size, 3);
    }
    vmm_free(&emu, h, va, size);
    assert_no_pins(&emu);
}

/// Two allocations mapped one after the other in one reservation: a pin within either works
/// in both modes; a pin across both is refused by default (the measured driver's lookup finds
/// one mapping) and works byte-exact with `p2p_vmm_span`.
#[test]
fn vmm_pin_spanning_two_allocations_is_refused_or_works_as_configured() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let half = 128 * KIB;
    let (a, b) = (
        create(&emu, half, MTGPU_EMU_PAGE_64K, true),
        create(&emu, half, MTGPU_EMU_PAGE_64K, true),
    );
    let va = emu.vmm_reserve(2 * half, 0).expect("reserve");
    emu.vmm_map(va, half, a, 0).expect("map a");
    emu.vmm_map(va + half, half, b, 0).expect("map b");
    emu.vmm_set_access(va, 2 * half, MTGPU_EMU_ACCESS_READWRITE)
        .expect("access over both");
    // One range of VA, two allocations: copies through the emulator stop at a mapping.
    let mut probe = vec![0u8; 2 * half as usize];
    assert_eq!(emu.read(va, &mut probe), Err(Errno::EINVAL));
    for span in [false, true] {
        let _knob = Knob::set("p2p_vmm_span", span);
        pin_write_read(&emu, &gdr, va, half, 10);
        pin_write_read(&emu, &gdr, va + half, half, 11);
        let across = va + half - 64 * KIB;
        let pinned = gdr.pin(across, 128 * KIB, PinFlags::DEFAULT);
        match (span, pinned) {
            (false, Err(_)) => assert_no_pins(&emu),
            (false, Ok(_)) => panic!("a pin across two allocations worked with p2p_vmm_span=N"),
            (true, Err(e)) => {
                panic!("a pin across two allocations failed with p2p_vmm_span=Y: {e}")
            }
            (true, Ok(pin)) => {
                let map = pin.map(MapRequest::Default).expect("map the span");
                let data = pattern(12, 128 * KIB as usize);
                map.write(0, &data).expect("write");
                let (mut lo, mut hi) = (vec![0u8; 64 * KIB as usize], vec![0u8; 64 * KIB as usize]);
                emu.read(across, &mut lo).expect("read a");
                emu.read(va + half, &mut hi).expect("read b");
                assert!(
                    lo[..] == data[..lo.len()],
                    "first half lands in allocation a"
                );
                assert!(
                    hi[..] == data[lo.len()..],
                    "second half lands in allocation b"
                );
                drop(map);
                pin.unpin().expect("unpin");
            }
        }
    }
    emu.vmm_unmap(va, 2 * half).expect("unmap both");
    emu.free(a).expect("release a");
    emu.free(b).expect("release b");
    emu.vmm_unreserve(va, 2 * half).expect("address free");
    assert_no_pins(&emu);
}

/// Unmap, release and address free of pinned, mapped memory all succeed; the memory stays
/// reserved and usable through the CPU mapping until the unpin, as a free of pinned memory.
#[test]
fn vmm_unmap_and_release_while_pinned_keep_the_memory_until_unpin() {
    let emu = Emu::open().expect("emulator");
    let gdr = Gdr::open().expect("gdr_open");
    let size = 128 * KIB;
    let before = emu.stats().expect("stats");
    let (h, va) = vmm_alloc(&emu, size, MTGPU_EMU_PAGE_64K, true);
    let pin = gdr.pin(va, size, PinFlags::DEFAULT).expect("pin");
    let map = pin.map(MapRequest::Default).expect("map");
    let data = pattern(20, size as usize);
    map.write(0, &data).expect("write");
    let held = emu.stats().expect("stats");
    vmm_free(&emu, h, va, size);
    let after_free = emu.stats().expect("stats");
    assert_eq!(after_free.freed_while_pinned, held.freed_while_pinned + 1);
    assert_eq!(
        after_free.bytes_allocated, held.bytes_allocated,
        "the memory stays reserved while pinned"
    );
    let mut b = [0u8; 8];
    assert_eq!(
        emu.read(va, &mut b),
        Err(Errno::EINVAL),
        "the VA no longer resolves"
    );
    let mut back = vec![0u8; size as usize];
    map.read(0, &mut back).expect("read after free");
    assert!(back == data, "the pinned memory keeps its data");
    drop(map);
    pin.unpin().expect("unpin");
    let after = emu.stats().expect("stats");
    assert_eq!(
        (after.allocations, after.bytes_allocated),
        (before.allocations, before.bytes_allocated),
        "everything went with the unpin"
    );
    assert_no_pins(&emu);
}

/// A dma-buf of mapped VMM memory maps it; closing the emulator's file frees every VMM record
/// of it, whatever order they were made in.
#[test]
fn vmm_memory_exports_a_dma_buf_and_goes_with_its_file() {
    let before = Emu::open().expect("emulator").stats().expect("stats");
    {
        let emu = Emu::open().expect("emulator");
        let size = 128 * KIB;
        let (_h, va) = vmm_alloc(&emu, size, MTGPU_EMU_PAGE_64K, true);
        let data = pattern(30, size as usize);
        emu.write(va, &data).expect("dma write");
        let fd = emu.export_dmabuf(va, size, 0).expect("export");
        // SAFETY: the descriptor was just returned to us and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let addr = mmap_shared(&fd, 0, size as usize).expect("mmap of the dma-buf");
        // SAFETY: a live mapping of `size` bytes.
        let seen = unsafe { std::slice::from_raw_parts(addr as *const u8, size as usize) };
        assert!(seen == &data[..], "the dma-buf maps the VMM memory");
        munmap(addr, size as usize);
        drop(fd);
        // A second, unmapped reservation and a released-but-mapped allocation, left for close.
        let h2 = create(&emu, size, MTGPU_EMU_PAGE_64K, true);
        let va2 = emu.vmm_reserve(size, 0).expect("reserve");
        emu.vmm_map(va2, size, h2, 0).expect("map");
        emu.free(h2).expect("release while mapped");
    }
    let after = Emu::open().expect("emulator").stats().expect("stats");
    assert_eq!(
        (after.allocations, after.bytes_allocated, after.dmabufs_live),
        (
            before.allocations,
            before.bytes_allocated,
            before.dmabufs_live
        ),
        "closing the file freed every VMM record"
    );
}
