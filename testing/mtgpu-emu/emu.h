/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * mtgpu_emu: a test-only stand-in for Moore Threads' mtgpu driver.
 *
 * It exports mtgpu_p2p_get_pages()/mtgpu_p2p_put_pages() with mtgpu's exact types, carves
 * "device memory" out of BAR 2 of a QEMU ivshmem-plain device, and serves /dev/mtgpu_emu so
 * tests can allocate, free, read and write that memory by GPU VA and inject faults.
 *
 * Private state shared by the module's files.
 *
 * Locking
 * -------
 * One mutex, emu_dev.lock, protects every field of emu_dev and everything reachable from it
 * (allocations, pins, the BAR bitmap, fault state, counters). It is a leaf lock:
 *
 *   mmap_lock -> mtgdrdrv's locks -> emu_dev.lock        (get/put_pages from a pin ioctl)
 *   mmap_lock -> emu_dev.lock                            (mmap of an exported dma-buf)
 *   emu_dev.lock -> i_mmap_rwsem                         (zapping dma-buf mappings at unbind)
 *   device_lock (PCI core)        -> emu_dev.lock        (probe/remove)
 *   emu_dev.lock -> vmap/PAT locks                       (transient ioremap of the BAR)
 *
 * So while holding it: never touch user memory (copy_*_user, get_user, ...): a fault on a
 * mapping served by mtgdrdrv would take mmap_lock and mtgdrdrv's locks inside ours. Sleeping
 * allocations (GFP_KERNEL) and ioremap are fine. Functions that need the lock say so with
 * lockdep_assert_held().
 */
#ifndef MTGPU_EMU_H
#define MTGPU_EMU_H

#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/types.h>

#include "../../mtgdrdrv/kmod/mtgpu_p2p.h"
#include "mtgpu_emu_ioctl.h"

struct file;
struct pci_dev;
struct pid;

/* The ivshmem BAR that plays the GPU's VRAM BAR. */
#define EMU_BAR 2

/* The BAR is handed out in units of 4 KiB, the smallest page size. */
#define EMU_UNIT_SHIFT 12
#define EMU_UNIT_SIZE (1UL << EMU_UNIT_SHIFT)

/* Largest GPU VA alignment ALLOC accepts. */
#define EMU_ALIGN_MAX (1ULL << 40)

/* bar_off[] of a hole of a sparse allocation (MTGPU_EMU_ALLOC_SPARSE): no memory behind it. */
#define EMU_BAR_HOLE ((u64)-1)

/* Largest piece of BAR one ioctl step maps and copies while holding the lock. */
#define EMU_IO_CHUNK (256 * 1024)

/*
 * What a record of emu_dev.allocs is. MEM and PHYS own BAR pages; a PHYS record (a VMM
 * allocation, muMemCreate) resolves nothing itself, its VA being only a handle: its pages are
 * reached through MAP records, which copy their bar_off[] and hold a reference on it (maps).
 * A RESERVE record is a range of VA with no pages (muMemAddressReserve); MAP records lie in
 * it but are not part of it.
 */
enum emu_kind {
	EMU_KIND_MEM,			/* ALLOC: VA and memory in one */
	EMU_KIND_PHYS,			/* ALLOC with MTGPU_EMU_ALLOC_VMM */
	EMU_KIND_RESERVE,		/* VMM RESERVE */
	EMU_KIND_MAP,			/* VMM MAP of part of a PHYS record */
};

/*
 * One ALLOC (or VMM record, see enum emu_kind). Lives in emu_dev.allocs until its owner frees it, its last pin is put and its
 * last dma-buf released.
 * file != NULL: the owner has not freed it yet and its VA resolves (in owner's VA space).
 * file == NULL: freed while pinned or exported; its VA no longer resolves but is not reused and
 * its BAR pages stay reserved until pins and exports drop to 0.
 */
struct emu_alloc {
	struct list_head node;		/* in emu_dev.allocs, sorted by va */
	struct pid *owner;		/* thread group whose VA space holds it (ref held) */
	const struct file *file;	/* file that allocated it; NULL once freed */
	u64 va;
	u64 size;			/* multiple of page_size */
	u32 page_size;
	u32 page_shift;
	u32 npages;
	bool managed;			/* MTGPU_EMU_ALLOC_MANAGED: get_pages refuses it */
	bool sparse;			/* MTGPU_EMU_ALLOC_SPARSE: odd pages are holes */
	bool rdma;			/* PHYS: created with MTGPU_EMU_ALLOC_RDMA */
	u8 kind;			/* enum emu_kind */
	u32 access;			/* MAP: MTGPU_EMU_ACCESS_* */
	unsigned int maps;		/* PHYS: MAP records of it not yet destroyed */
	struct emu_alloc *phys;		/* MAP: the PHYS record it maps (reference held) */
	unsigned int pins;		/* page tables handed out and not yet put */
	unsigned int exports;		/* dma-bufs of it not yet released */
	u64 bar_off[];			/* BAR offset of each page in VA order, or EMU_BAR_HOLE */
};

/*
 * One page table handed out by get_pages. The consumer only sees pt; put_pages finds the
 * record by looking pt up in emu_dev.pins, never by trusting the pointer it is given.
 */
struct emu_pin {
	u32 magic;			/* EMU_PIN_MAGIC while on emu_dev.pins */
	u32 issued_version;		/* pt.version as handed out (faults may change it) */
	struct list_head node;		/* in emu_dev.pins */
	struct emu_alloc **allocs;	/* records pinned, in VA order (a span has several) */
	u32 nallocs;			/* 0 once the BAR went away under the pin */
	u64 *pa;			/* the array we allocated, whatever pt says now */
	struct mtgpu_p2p_page_table pt;
};

struct emu_device {
	struct mutex lock;		/* see "Locking" above */

	/* BAR 2 of the bound ivshmem device; pdev == NULL while none is bound. */
	struct pci_dev *pdev;
	phys_addr_t bar_phys;
	u64 bar_size;
	unsigned long *bar_map;		/* one bit per 4 KiB unit, set = in use */
	unsigned long bar_units;

	struct list_head allocs;	/* struct emu_alloc, sorted by va */
	struct list_head pins;		/* struct emu_pin */
	struct list_head exports;	/* struct emu_export (emu_dmabuf.c) */

	u32 fault_kind;			/* enum mtgpu_emu_fault_kind */
	u32 fault_count;		/* get_pages calls still to show it */

	/* Counters reported by GET_STATS. */
	u64 nr_allocs;
	u64 bytes_allocated;
	u64 nr_pins;
	u64 get_pages_calls;
	u64 put_pages_calls;
	u64 freed_while_pinned;
	u64 nr_dmabufs;			/* exported and not yet released */
	u64 dmabuf_exports;
	u64 nr_dmabuf_mappings;
	u64 freed_while_exported;
	u64 get_pages_refused;
	u64 put_pages_mmap_locked;
	u64 get_pages_while_disabled;
};

extern struct emu_device emu_dev;

/*
 * Loaded with disable_driver=1, as mtgpu after its vendor's DKMS post_install: the p2p symbols
 * are exported but the PCI driver is not registered, so nothing was initialised.
 */
extern bool emu_disable_driver;

/* Caller holds emu_dev.lock. */
static inline bool emu_bound(void)
{
	lockdep_assert_held(&emu_dev.lock);
	return emu_dev.pdev;
}

/* emu_main.c */
int emu_stats_get(struct mtgpu_emu_stats *st);

/* emu_pci.c: binding to the ivshmem device, as PCI driver "mtgpu" */
int emu_pci_register(void);
void emu_pci_unregister(void);

/* emu_bar.c: carving pages out of the BAR and touching them */
enum emu_io_op {
	EMU_IO_READ,			/* BAR -> buf */
	EMU_IO_WRITE,			/* buf -> BAR */
	EMU_IO_FILL,			/* fill -> BAR */
};

struct emu_io {
	enum emu_io_op op;
	u8 *buf;			/* advanced past what was copied */
	u8 fill;
};

int emu_bar_alloc_pages(u32 page_size, u32 npages, bool scatter, u64 *bar_off);
void emu_bar_free_pages(u32 page_size, u32 npages, const u64 *bar_off);
int emu_bar_io(u64 off, size_t len, struct emu_io *io);

/* emu_alloc.c: allocations and the per-process GPU VA spaces */
int emu_alloc_create(const struct file *file, struct mtgpu_emu_alloc *args);
int emu_alloc_free(u64 va);
void emu_alloc_release_file(const struct file *file);
int emu_alloc_access(u64 va, u64 size, u64 off, size_t len, struct emu_io *io);
struct emu_alloc *emu_alloc_find(const struct pid *owner, u64 va, u64 len);
struct emu_alloc *emu_alloc_find_va(const struct pid *owner, u64 va);
u64 emu_alloc_run(const struct emu_alloc *a, u64 off, u64 max, u64 *bar);
struct emu_alloc *emu_alloc_new(u32 npages);
void emu_alloc_link(struct emu_alloc *new);
void emu_alloc_unlink(struct emu_alloc *a);
int emu_va_find(const struct pid *owner, u64 size, u64 align, u64 *va);
void emu_alloc_unpin(struct emu_alloc *a);
void emu_alloc_unexport(struct emu_alloc *a);
void emu_alloc_drop_all(void);

/* emu_p2p.c: the exported provider API and fault injection */
int emu_fault_set(u32 kind, u32 count);
void emu_p2p_orphan_pins(void);
void emu_p2p_drop_all(void);

/* emu_vmm.c: the VMM ioctl, and which mappings one get_pages may cover */
int emu_vmm_ioctl(const struct file *file, struct mtgpu_emu_vmm __user *uarg);
int emu_vmm_span(struct emu_alloc *a, u64 gpu_va, u64 length, struct emu_alloc ***allocsp,
		 u32 *np);
void emu_vmm_phys_put(struct emu_alloc *phys);
bool emu_vmm_pinnable(const struct emu_alloc *a);

/* emu_dmabuf.c: EXPORT_DMABUF */
int emu_dmabuf_export(struct mtgpu_emu_export_dmabuf __user *uarg);
void emu_dmabuf_orphan_all(void);

/* emu_test.c: test knobs (bar_state, bar_kernel_map, split_failure_at) */
void emu_test_unbind(void);

/* emu_chardev.c: /dev/mtgpu_emu */
int emu_chardev_register(void);
void emu_chardev_unregister(void);

#endif /* MTGPU_EMU_H */
