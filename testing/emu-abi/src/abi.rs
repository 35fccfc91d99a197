//! The ioctl ABI of `/dev/mtgpu_emu`; `cargo xtask codegen` generates the emulator's C header
//! (testing/mtgpu-emu/mtgpu_emu_ioctl.h) from it.
//!
//! The emulator is a kernel module that stands in for the mtgpu driver in tests: it exports
//! `mtgpu_p2p_get_pages`/`mtgpu_p2p_put_pages` and hands out "device memory" carved from a real
//! PCI BAR (QEMU `ivshmem-plain`). This char device lets the test runtime allocate, free, read and
//! write that memory by GPU VA, and inject faults. It is never installed by the production debs.
//!
//! Unlike the frozen gdrdrv ABI, this one follows our own rules: explicit reserved fields, sizes
//! encoded in the command numbers, layouts proven by compile-time assertions.

#![allow(non_camel_case_types)]

use core::mem::{offset_of, size_of};

// The kernel's uapi spellings, so that the generated header reads like one.
type __u32 = u32;
type __u64 = u64;
type __s32 = i32;

/// ioctl magic of `/dev/mtgpu_emu`.
pub const MTGPU_EMU_IOCTL: u32 = 0xDB;
/// Name of the emulator's char device under /dev.
pub const MTGPU_EMU_DEVICE_NAME: &str = "mtgpu_emu";
/// First GPU VA the emulator hands out; GPU VAs are not CPU addresses.
pub const MTGPU_EMU_VA_BASE: u64 = 0x0000_1000_0000_0000;

/// Page sizes the emulator can back an allocation with (`mtgpu_emu_alloc.page_size`).
pub const MTGPU_EMU_PAGE_4K: u32 = 4096;
pub const MTGPU_EMU_PAGE_64K: u32 = 65536;
pub const MTGPU_EMU_PAGE_2M: u32 = 2 * 1024 * 1024;

/// `mtgpu_emu_alloc.flags`: back the allocation with pages in a scattered, non-contiguous order.
pub const MTGPU_EMU_ALLOC_SCATTER: u32 = 0x1;
/// `mtgpu_emu_alloc.flags`: managed (unified) memory, as `muMemAllocManaged` returns. It reads,
/// writes and frees like any allocation, but `mtgpu_p2p_get_pages` refuses it with -EINVAL, as
/// the real driver refuses to pin managed memory.
pub const MTGPU_EMU_ALLOC_MANAGED: u32 = 0x2;
/// `mtgpu_emu_alloc.flags`: a sparse allocation: every odd-numbered page (the second, the
/// fourth, ...) is a hole with no memory behind it. Holes read as zero and ignore writes;
/// `mtgpu_p2p_get_pages` skips them and returns a compacted array (`array_count` smaller than
/// the pages the range spans), as the real driver does for sparse allocations.
pub const MTGPU_EMU_ALLOC_SPARSE: u32 = 0x4;
/// `mtgpu_emu_alloc.flags`: physical memory for the VMM API (what `muMemCreate` makes). The
/// `gpu_va` returned is only a handle: nothing resolves it (READ, WRITE, `get_pages` refuse
/// it) until `MTGPU_EMU_VMM_MAP` maps it into a reserved range. FREE of the handle releases
/// it; its memory lives on while a mapping of it exists.
pub const MTGPU_EMU_ALLOC_VMM: u32 = 0x8;
/// `mtgpu_emu_alloc.flags`, with `MTGPU_EMU_ALLOC_VMM` only: created GPUDirect-RDMA capable
/// (`allocFlags.gpuDirectRDMACapable`). `get_pages` refuses mappings of VMM memory without it
/// unless the `p2p_vmm_any` parameter is set.
pub const MTGPU_EMU_ALLOC_RDMA: u32 = 0x10;

/// `mtgpu_emu_vmm.op`: the VMM calls on GPU VA (`muMemAddressReserve`, `muMemAddressFree`,
/// `muMemMap`, `muMemUnmap`, `muMemSetAccess`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mtgpu_emu_vmm_op {
    /// Reserve `size` bytes of VA (a multiple of 4 KiB) aligned to `align` (0: 4 KiB); out:
    /// `gpu_va`. A reserved range resolves nothing until mapped.
    MTGPU_EMU_VMM_RESERVE = 1,
    /// Free the reservation `[gpu_va, gpu_va + size)` exactly; refused while a mapping is in it.
    MTGPU_EMU_VMM_UNRESERVE = 2,
    /// Map `[offset, offset + size)` of the VMM allocation `handle` at `gpu_va`, inside one
    /// reservation and over no other mapping; all three multiples of its page size. The new
    /// mapping has no access until SET_ACCESS.
    MTGPU_EMU_VMM_MAP = 3,
    /// Unmap every mapping in `[gpu_va, gpu_va + size)`; none may stick out of the range. A
    /// pinned mapping stops resolving at once but keeps its memory until its last put_pages.
    MTGPU_EMU_VMM_UNMAP = 4,
    /// Give `[gpu_va, gpu_va + size)`, which must be mapped throughout by mappings that do not
    /// stick out of it, the access `access` (`MTGPU_EMU_ACCESS_*`).
    MTGPU_EMU_VMM_SET_ACCESS = 5,
}

/// `mtgpu_emu_vmm.access`: CUDA's `CUmemAccess_flags` values, which MUSA is taken to mirror.
/// Without access a mapping refuses READ/WRITE/MEMSET and `get_pages`; READ refuses writes.
pub const MTGPU_EMU_ACCESS_NONE: u32 = 0;
pub const MTGPU_EMU_ACCESS_READ: u32 = 1;
pub const MTGPU_EMU_ACCESS_READWRITE: u32 = 3;

/// Faults the next `mtgpu_p2p_get_pages` call(s) should show (`mtgpu_emu_fault.kind`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mtgpu_emu_fault_kind {
    MTGPU_EMU_FAULT_NONE = 0,
    /// get_pages fails with -ENOMEM.
    MTGPU_EMU_FAULT_ENOMEM = 1,
    /// get_pages fails with -EINVAL.
    MTGPU_EMU_FAULT_EINVAL = 2,
    /// get_pages succeeds but reports a page table version other than 1.0.
    MTGPU_EMU_FAULT_BAD_VERSION = 3,
    /// get_pages succeeds but reports a page size that is not a power of two.
    MTGPU_EMU_FAULT_BAD_PAGE_SIZE = 4,
    /// get_pages succeeds, but the last entry of the array is the address of a page of system
    /// RAM (the kernel's zero page), as for GPU memory backed by host memory.
    MTGPU_EMU_FAULT_PA_RAM = 5,
    /// get_pages succeeds, but the last entry of the array is 0.
    MTGPU_EMU_FAULT_PA_ZERO = 6,
    /// get_pages succeeds, but the last entry of the array is the first page past the BAR.
    MTGPU_EMU_FAULT_PA_OUTSIDE_BAR = 7,
    /// get_pages succeeds, but the last entry of the array repeats the page of the first (no
    /// effect on a table of one entry).
    MTGPU_EMU_FAULT_PA_REPEAT = 8,
    /// get_pages succeeds, but `cpu_pa_array` is NULL (`array_count` unchanged).
    MTGPU_EMU_FAULT_NULL_ARRAY = 9,
    /// get_pages succeeds, but `array_count` is one more than the range needs (the extra entry
    /// exists and holds the page after the last one).
    MTGPU_EMU_FAULT_BAD_COUNT = 10,
}

/// The highest fault kind INJECT_FAULT accepts.
pub const MTGPU_EMU_FAULT_MAX: u32 = mtgpu_emu_fault_kind::MTGPU_EMU_FAULT_BAD_COUNT as u32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_alloc {
    /// in: bytes; rounded up to `page_size`.
    pub size: __u64,
    /// in: GPU VA alignment (power of two, 0 = page_size).
    pub align: __u64,
    /// in: one of `MTGPU_EMU_PAGE_*`.
    pub page_size: __u32,
    /// in: `MTGPU_EMU_ALLOC_*`.
    pub flags: __u32,
    /// out: GPU VA of the allocation, valid in the calling process only.
    pub gpu_va: __u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_free {
    /// in: a VA returned by ALLOC (the start of the allocation).
    pub gpu_va: __u64,
}

/// READ copies device memory into `user_ptr`; WRITE copies `user_ptr` into device memory;
/// MEMSET fills with the low byte of `value` (`user_ptr` unused).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_rw {
    /// in: GPU VA inside one allocation of the calling process.
    pub gpu_va: __u64,
    /// in: bytes; the range must stay inside that allocation.
    pub size: __u64,
    /// in: user buffer address (READ/WRITE).
    pub user_ptr: __u64,
    /// in: fill byte (MEMSET).
    pub value: __u32,
    pub reserved: __u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_fault {
    /// in: an `mtgpu_emu_fault_kind`.
    pub kind: __u32,
    /// in: how many following get_pages calls show the fault (0 clears it).
    pub count: __u32,
}

/// Counters for leak checks; all are system-wide.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_stats {
    /// Live allocations (including freed-but-pinned ones).
    pub allocations: __u64,
    /// Bytes of BAR memory in use.
    pub bytes_allocated: __u64,
    /// Page tables handed out by get_pages and not yet put.
    pub pins_outstanding: __u64,
    pub get_pages_calls: __u64,
    pub put_pages_calls: __u64,
    /// Allocations freed by their owner while still pinned (memory kept until put).
    pub freed_while_pinned: __u64,
    /// Size of the BAR the emulator carves memory from.
    pub bar_size: __u64,
    pub reserved: __u64,
    /// dma-bufs exported by EXPORT_DMABUF and not yet released (their last fd and mapping gone).
    pub dmabufs_live: __u64,
    /// EXPORT_DMABUF calls that returned a dma-buf.
    pub dmabuf_exports: __u64,
    /// CPU mappings of exported dma-bufs that exist now (a split mapping counts twice).
    pub dmabuf_mappings: __u64,
    /// Allocations freed by their owner while a dma-buf of them lived (memory kept until the
    /// dma-buf is released).
    pub freed_while_exported: __u64,
    /// get_pages calls that returned an error; each logged one line, as the real driver does.
    pub get_pages_refused: __u64,
    /// put_pages calls made while the calling process's mmap_lock was held (by it or by
    /// another of its threads). The real driver takes its own locks in put_pages, so a consumer
    /// must not call it from under mmap_lock (e.g. from a VMA's close).
    pub put_pages_mmap_locked: __u64,
    /// get_pages calls while the emulator was loaded with `disable_driver=1`. The real driver
    /// oopses then; the emulator WARNs and returns -ENODEV.
    pub get_pages_while_disabled: __u64,
    pub reserved2: __u64,
}

/// `mtgpu_emu_export_dmabuf.flags`: the dma-buf refuses CPU mmap (its `mmap` fails with
/// EINVAL), as an exporter without CPU access does. Lets tests show how the library reports a
/// refused mmap; whether mtgpu's real dma-bufs accept mmap is unknown.
pub const MTGPU_EMU_EXPORT_NO_MMAP: u32 = 0x1;

/// EXPORT_DMABUF: a dma-buf of `[gpu_va, gpu_va + size)` of one allocation of the calling
/// process, as `muMemGetHandleForAddressRange(MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)` returns.
/// The dma-buf keeps the allocation's memory alive: freeing the allocation while it lives
/// only makes its VA stop resolving; the memory goes with the dma-buf. Its CPU mmap maps the
/// BAR pages write-combined, not inherited across fork (VM_DONTCOPY).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_export_dmabuf {
    /// in: host-page aligned GPU VA inside one allocation of the calling process.
    pub gpu_va: __u64,
    /// in: bytes, a non-zero multiple of the host page; the range stays inside the allocation.
    pub size: __u64,
    /// in: `MTGPU_EMU_EXPORT_*`.
    pub flags: __u32,
    /// out: the dma-buf's file descriptor (close-on-exec) in the calling process.
    pub fd: __s32,
}

/// VMM: one operation on the caller's GPU VA space (`mtgpu_emu_vmm_op`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mtgpu_emu_vmm {
    /// in: an `mtgpu_emu_vmm_op`.
    pub op: __u32,
    /// in: SET_ACCESS's `MTGPU_EMU_ACCESS_*`; 0 for the other operations.
    pub access: __u32,
    /// in (out for RESERVE): start of the range.
    pub gpu_va: __u64,
    /// in: bytes.
    pub size: __u64,
    /// in: RESERVE's alignment (a power of two, 0: 4 KiB); 0 for the others.
    pub align: __u64,
    /// in: MAP's VMM allocation (the `gpu_va` ALLOC returned for it); 0 for the others.
    pub handle: __u64,
    /// in: MAP's offset into that allocation; 0 for the others.
    pub offset: __u64,
}

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (MTGPU_EMU_IOCTL << 8) | nr
}

pub const MTGPU_EMU_IOC_ALLOC: u32 = ioc(IOC_READ | IOC_WRITE, 1, size_of::<mtgpu_emu_alloc>());
pub const MTGPU_EMU_IOC_FREE: u32 = ioc(IOC_WRITE, 2, size_of::<mtgpu_emu_free>());
pub const MTGPU_EMU_IOC_READ: u32 = ioc(IOC_WRITE, 3, size_of::<mtgpu_emu_rw>());
pub const MTGPU_EMU_IOC_WRITE: u32 = ioc(IOC_WRITE, 4, size_of::<mtgpu_emu_rw>());
pub const MTGPU_EMU_IOC_MEMSET: u32 = ioc(IOC_WRITE, 5, size_of::<mtgpu_emu_rw>());
pub const MTGPU_EMU_IOC_INJECT_FAULT: u32 = ioc(IOC_WRITE, 6, size_of::<mtgpu_emu_fault>());
pub const MTGPU_EMU_IOC_GET_STATS: u32 = ioc(IOC_READ, 7, size_of::<mtgpu_emu_stats>());
pub const MTGPU_EMU_IOC_EXPORT_DMABUF: u32 = ioc(
    IOC_READ | IOC_WRITE,
    8,
    size_of::<mtgpu_emu_export_dmabuf>(),
);

pub const MTGPU_EMU_IOC_VMM: u32 = ioc(IOC_READ | IOC_WRITE, 9, size_of::<mtgpu_emu_vmm>());

pub const EMU_IOCTLS: [(&str, u32); 9] = [
    ("MTGPU_EMU_IOC_ALLOC", MTGPU_EMU_IOC_ALLOC),
    ("MTGPU_EMU_IOC_FREE", MTGPU_EMU_IOC_FREE),
    ("MTGPU_EMU_IOC_READ", MTGPU_EMU_IOC_READ),
    ("MTGPU_EMU_IOC_WRITE", MTGPU_EMU_IOC_WRITE),
    ("MTGPU_EMU_IOC_MEMSET", MTGPU_EMU_IOC_MEMSET),
    ("MTGPU_EMU_IOC_INJECT_FAULT", MTGPU_EMU_IOC_INJECT_FAULT),
    ("MTGPU_EMU_IOC_GET_STATS", MTGPU_EMU_IOC_GET_STATS),
    ("MTGPU_EMU_IOC_EXPORT_DMABUF", MTGPU_EMU_IOC_EXPORT_DMABUF),
    ("MTGPU_EMU_IOC_VMM", MTGPU_EMU_IOC_VMM),
];

const _: () = assert!(size_of::<mtgpu_emu_alloc>() == 32);
const _: () = assert!(offset_of!(mtgpu_emu_alloc, gpu_va) == 24);
const _: () = assert!(size_of::<mtgpu_emu_free>() == 8);
const _: () = assert!(size_of::<mtgpu_emu_rw>() == 32);
const _: () = assert!(offset_of!(mtgpu_emu_rw, value) == 24);
const _: () = assert!(size_of::<mtgpu_emu_fault>() == 8);
const _: () = assert!(size_of::<mtgpu_emu_stats>() == 128);
const _: () = assert!(size_of::<mtgpu_emu_export_dmabuf>() == 24);
const _: () = assert!(offset_of!(mtgpu_emu_export_dmabuf, fd) == 20);
const _: () = assert!(size_of::<mtgpu_emu_vmm>() == 48);
const _: () = assert!(offset_of!(mtgpu_emu_vmm, offset) == 40);
