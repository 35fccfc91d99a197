/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * mtgdrdrv private header: per-file state, pins, counters, logging and the
 * functions the .c files share. The user-space ABI is mtgdrdrv_ioctl.h
 * (generated), the provider API is mtgpu_p2p.h.
 */
#ifndef MTGDRDRV_H
#define MTGDRDRV_H

#include <linux/atomic.h>
#include <linux/compiler.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/llist.h>
#include <linux/mm_types.h>
#include <linux/mutex.h>
#include <linux/printk.h>
#include <linux/timex.h>
#include <linux/types.h>

#include "mtgdrdrv_ioctl.h"
#include "mtgpu_p2p.h"

#if BITS_PER_LONG != 64
#error "mtgdrdrv needs a 64-bit kernel: handles are 51-bit mmap page offsets"
#endif

/*
 * Largest accepted pin (bytes, before rounding). Far above any GPU's memory;
 * keeps the chunk count and the handle arithmetic far from overflow.
 */
#define MTGDRDRV_MAX_PIN_SIZE		(1ULL << 40)

/*
 * Pins are asked of the provider in chunks of at most this much GPU VA,
 * aligned to it. mtgpu allocates its address array (8 bytes per page) before
 * it checks the range: with 4 KiB pages a chunk's array stays at most 2049
 * entries, an order-3 allocation the page allocator does not fail, whatever
 * length user space asks for.
 */
#define MTGDRDRV_CHUNK_SIZE		(8ULL << 20)

/*
 * Walks over a pin's runs (memtype reserve and free, remap, BAR checks) yield
 * the CPU this often: a fragmented pin has up to max_runs_per_pin runs, each
 * costing a memtype tree operation, under mmap_lock.
 */
#define MTGDRDRV_RUNS_PER_RESCHED	64

/* Name of mtgpu's PCI driver: its devices' BARs are where pins may point. */
#define MTGDRDRV_PROVIDER_DRIVER	"mtgpu"

/*
 * Handles (and handle + pages) stay below this, so that handle << PAGE_SHIFT
 * is a valid, non-negative mmap offset and loff_t.
 */
#define MTGDRDRV_HANDLE_LIMIT		(1ULL << (63 - PAGE_SHIFT))

/* A physically contiguous run of a pin, validated (mtgdrdrv_p2p.c). */
struct mtgdrdrv_extent {
	u64 pa;
	u64 len;
};

/*
 * One provider page table held by a pin, and the runs of the pin's bytes it
 * backs, in order. The table is kept only to be put; mapping uses @extents.
 */
struct mtgdrdrv_chunk {
	u64 gpu_va;		/* what get_pages was asked for; put_pages gets it */
	struct mtgpu_p2p_page_table *pt;
	u32 nr_extents;
	struct mtgdrdrv_extent extents[];
};

/* A range pinned through the provider (mtgdrdrv_p2p.c). */
struct mtgdrdrv_pages {
	u64 va;			/* pinned start: addr rounded down to PAGE_SIZE */
	u64 size;		/* pinned length: a multiple of PAGE_SIZE */
	u32 page_size;		/* the provider's page size (first chunk) */
	u32 nr_runs;		/* extents of all chunks, <= max_runs_per_pin */
	cycles_t tm_cycles;	/* duration of the get_pages calls (x86) */
	u32 nr_chunks;		/* chunks[0..nr_chunks) hold a table */
	struct mtgdrdrv_chunk **chunks;
};

/*
 * One pin. Every field after @handle is protected by the owning file's lock.
 * A pin is destroyed (pages put) when it is unpinned and no VMA maps it: an
 * unpin while mapped only marks it @unpinned (its handle is then unknown to
 * every ioctl and to mmap) and the last VMA close destroys it.
 */
struct mtgdrdrv_pin {
	struct list_head node;		/* in mtgdrdrv_file.pins */
	u64 handle;			/* first mmap page offset of the pin */
	u64 offset;			/* addr - pages.va; mmap needs 0 */
	struct mtgdrdrv_pages pages;
	gdr_mr_type_t req_type;		/* REQ_MAPPING_TYPE, GDR_MR_NONE if unset */
	gdr_mr_type_t map_type;		/* cache mode the live mapping really got,
					 * or NONE (mtgdrdrv_mmap.c) */
	unsigned int map_count;		/* live VMAs mapping this pin */
	u64 memtype_len;		/* bytes with a WC memtype reserved, x86 */
	bool unpinned;
	struct llist_node put_node;	/* on the deferred-put list, see pin.c */
};

/*
 * State of one open file of /dev/mtgdrdrv.
 *
 * @lock protects @pins, @nr_pins, @bytes_pinned, @next_handle,
 * @handle_overflow and every pin's mutable fields. It is taken under mmap_lock (->mmap, vm_ops open/close);
 * never call copy_{from,to}_user(), mtgpu_p2p_{get,put}_pages() or
 * unmap_mapping_range() with it held.
 */
struct mtgdrdrv_file {
	struct mutex lock;
	struct list_head pins;
	u64 next_handle;
	bool handle_overflow;
	/*
	 * Pins on @pins (unpinned-but-mapped ones too) and pins being made,
	 * and their pinned bytes: what max_pins_per_file and
	 * max_bytes_per_file limit (mtgdrdrv_pin.c).
	 */
	unsigned int nr_pins;
	u64 bytes_pinned;
	struct pid *tgid;		/* thread group of the opener */
	/*
	 * The opener's address space (mmgrab'ed): an exec that keeps the file
	 * open (no O_CLOEXEC) gets a new mm and so loses the pins.
	 */
	struct mm_struct *mm;
	/*
	 * This file's own address space (filp->f_mapping), so that
	 * unmap_mapping_range() only reaches this file's VMAs: handles, and
	 * so mmap offsets, are per file.
	 */
	struct address_space mapping;
};

struct mtgdrdrv_counters {
	atomic64_t pins_outstanding;	/* pins whose pages are held */
	atomic64_t bytes_pinned;	/* sum of their pinned lengths */
	atomic64_t mappings;		/* live VMAs (a split VMA counts twice) */
	/* Successful mtgpu_p2p_get_pages(): every one is matched by exactly
	 * one put, so the two are equal whenever nothing is pinned. */
	atomic64_t get_pages_calls;
	atomic64_t put_pages_calls;	/* mtgpu_p2p_put_pages() calls */
	atomic64_t get_pages_refused;	/* get_pages calls that failed */
	atomic64_t bad_tables;		/* tables refused by validation */
	atomic64_t provider_unavailable; /* pins refused: mtgpu not initialised */
	atomic64_t deferred_puts;	/* pins put from the workqueue */
	/* Pins refused by max_pins_per_file, max_bytes_per_file or
	 * max_runs_per_pin (-ENOSPC). */
	atomic64_t pins_over_limit;
	/* mmaps refused: a run of the pin is no longer in a memory BAR of
	 * mtgpu's devices (device removed, BARs moved). */
	atomic64_t stale_maps;
	/* Mappings asked WC that came out uncached (PAT kept another
	 * reservation, or PAT is off), and DEVICE ones that came out WC. */
	atomic64_t wc_came_out_uc;
	atomic64_t device_came_out_wc;
};

extern struct mtgdrdrv_counters mtgdrdrv_counters;
extern int mtgdrdrv_dbg_enabled;
extern int mtgdrdrv_info_enabled;

#define mtgdrdrv_dbg(fmt, ...)						\
	do {								\
		if (unlikely(READ_ONCE(mtgdrdrv_dbg_enabled)))		\
			printk(KERN_DEBUG pr_fmt(fmt), ##__VA_ARGS__);	\
	} while (0)

#define mtgdrdrv_info(fmt, ...)						\
	do {								\
		if (unlikely(READ_ONCE(mtgdrdrv_info_enabled)))		\
			pr_info(fmt, ##__VA_ARGS__);			\
	} while (0)

/* mtgdrdrv_main.c */
bool mtgdrdrv_is_owner(const struct mtgdrdrv_file *priv);

/* mtgdrdrv_bars.c */
struct mtgdrdrv_bars;
struct mtgdrdrv_bars *mtgdrdrv_bars_get(void);
bool mtgdrdrv_bars_contain(const struct mtgdrdrv_bars *bars, u64 pa, u64 len);
u64 mtgdrdrv_bars_total(const struct mtgdrdrv_bars *bars);
bool mtgdrdrv_is_ram(u64 pa, u64 len);
struct mtgdrdrv_pages;
int mtgdrdrv_pages_check_bars(const struct mtgdrdrv_pages *pages, u64 len,
			      const struct mtgdrdrv_bars *bars);
void mtgdrdrv_bars_free(struct mtgdrdrv_bars *bars);
bool mtgdrdrv_provider_registered(void);

/* mtgdrdrv_p2p.c */
struct mtgdrdrv_bars *mtgdrdrv_p2p_bars(void);
int mtgdrdrv_p2p_get(u64 addr, u64 size, const struct mtgdrdrv_bars *bars,
		     struct mtgdrdrv_pages *pages);
extern unsigned int mtgdrdrv_max_runs_per_pin;
void mtgdrdrv_p2p_put(struct mtgdrdrv_pages *pages);
typedef int (*mtgdrdrv_run_fn)(void *ctx, u64 off, phys_addr_t pa, u64 len);
int mtgdrdrv_pages_for_each_run(const struct mtgdrdrv_pages *pages, u64 len,
				mtgdrdrv_run_fn fn, void *ctx);

/* mtgdrdrv_pin.c */
int mtgdrdrv_ioctl_pin_buffer(struct mtgdrdrv_file *priv, void __user *argp);
int mtgdrdrv_ioctl_pin_buffer_v2(struct mtgdrdrv_file *priv,
				 void __user *argp);
int mtgdrdrv_ioctl_unpin_buffer(struct mtgdrdrv_file *priv,
				void __user *argp);
int mtgdrdrv_ioctl_get_cb_flag(struct mtgdrdrv_file *priv, void __user *argp);
int mtgdrdrv_ioctl_get_info(struct mtgdrdrv_file *priv, void __user *argp);
int mtgdrdrv_ioctl_get_info_v2(struct mtgdrdrv_file *priv, void __user *argp);
int mtgdrdrv_ioctl_req_mapping_type(struct mtgdrdrv_file *priv,
				    void __user *argp);
struct mtgdrdrv_pin *mtgdrdrv_pin_lookup(struct mtgdrdrv_file *priv,
					 u64 handle);
struct mtgdrdrv_pin *mtgdrdrv_pin_lookup_any(struct mtgdrdrv_file *priv,
					     u64 handle);
void mtgdrdrv_pin_unlink(struct mtgdrdrv_file *priv, struct mtgdrdrv_pin *pin);
void mtgdrdrv_pin_destroy(struct mtgdrdrv_pin *pin);
void mtgdrdrv_pin_destroy_deferred(struct mtgdrdrv_pin *pin);
void mtgdrdrv_pins_release(struct mtgdrdrv_file *priv);
int mtgdrdrv_pin_init(void);
void mtgdrdrv_pin_exit(void);
extern unsigned int mtgdrdrv_max_pins_per_file;
extern unsigned long long mtgdrdrv_max_bytes_per_file;

/* mtgdrdrv_mmap.c */
int mtgdrdrv_mmap(struct file *filp, struct vm_area_struct *vma);
void mtgdrdrv_memtype_free(struct mtgdrdrv_pin *pin);

#endif /* MTGDRDRV_H */
