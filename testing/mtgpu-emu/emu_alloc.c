// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: allocations ("device memory") and the GPU VA spaces they live in.
 *
 * Each process (thread group) has its own GPU VA space starting at MTGPU_EMU_VA_BASE, as on a
 * real GPU: two processes may get the same VA for different memory, and a VA resolves only
 * in the process that allocated it. VAs are assigned first fit, keeping EMU_VA_GAP unmapped
 * on both sides of every allocation; a range is reused only once the allocation that had it
 * is completely gone (freed and, if pinned, put).
 *
 * Ownership: an allocation belongs to the file that made it. Closing that file frees it as
 * FREE would (pinned or exported ones linger until their last put_pages or dma-buf release). Any file of the owning process
 * may FREE, READ or WRITE it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/mm.h>		/* kv*alloc before 5.16 */
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sizes.h>
#include <linux/slab.h>

#include "emu.h"

/* Unmapped GPU VA kept before and after every allocation. */
#define EMU_VA_GAP SZ_2M
/* End of the GPU VA space handed out. */
#define EMU_VA_LIMIT (1ULL << 56)

static struct pid *emu_caller(void)
{
	return task_tgid(current);
}

/*
 * Finds the caller-visible allocation of @owner that holds @va, or NULL. Freed-but-pinned
 * allocations are invisible, and so are VMM allocations and reservations: a VMM VA resolves
 * to its mapping (EMU_KIND_MAP).
 */
struct emu_alloc *emu_alloc_find_va(const struct pid *owner, u64 va)
{
	struct emu_alloc *a;

	lockdep_assert_held(&emu_dev.lock);
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (!a->file || a->owner != owner)
			continue;
		if (a->kind == EMU_KIND_PHYS || a->kind == EMU_KIND_RESERVE)
			continue;
		if (va >= a->va && va - a->va < a->size)
			return a;
	}
	return NULL;
}

/* The same, holding all of [va, va + len). */
struct emu_alloc *emu_alloc_find(const struct pid *owner, u64 va, u64 len)
{
	struct emu_alloc *a = emu_alloc_find_va(owner, va);

	return a && len <= a->size - (va - a->va) ? a : NULL;
}

/* Lowest free VA of @owner for @size bytes at @align (see the top of this file). */
int emu_va_find(const struct pid *owner, u64 size, u64 align, u64 *va)
{
	u64 cand = ALIGN((u64)MTGPU_EMU_VA_BASE, align);
	struct emu_alloc *a;

	lockdep_assert_held(&emu_dev.lock);
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (a->owner != owner)
			continue;
		if (cand + size + EMU_VA_GAP <= a->va)
			break;
		cand = max(cand, ALIGN(a->va + a->size + EMU_VA_GAP, align));
	}
	if (cand + size > EMU_VA_LIMIT)
		return -ENOMEM;
	*va = cand;
	return 0;
}

/* Inserts @new into emu_dev.allocs, keeping it sorted by VA. */
void emu_alloc_link(struct emu_alloc *new)
{
	struct emu_alloc *a;

	lockdep_assert_held(&emu_dev.lock);
	list_for_each_entry(a, &emu_dev.allocs, node)
		if (a->va > new->va)
			break;
	list_add_tail(&new->node, &a->node);
}

/* A hole of a sparse allocation reads as zero and ignores writes. */
static void emu_hole_io(size_t len, struct emu_io *io)
{
	if (io->op == EMU_IO_READ)
		memset(io->buf, 0, len);
	if (io->op != EMU_IO_FILL)
		io->buf += len;
}

/*
 * The physically contiguous run of @a at byte @off, at most @max bytes: returns its length and
 * puts its BAR offset in *@bar, or EMU_BAR_HOLE for a hole (whose run ends with its page).
 */
u64 emu_alloc_run(const struct emu_alloc *a, u64 off, u64 max, u64 *bar)
{
	u64 ps = a->page_size;
	u32 page = off >> a->page_shift, last = page;
	u64 in_page = off & (ps - 1);
	u64 run = ps - in_page;

	lockdep_assert_held(&emu_dev.lock);
	if (a->bar_off[page] == EMU_BAR_HOLE) {
		*bar = EMU_BAR_HOLE;
		return min(run, max);
	}
	while (run < max && last + 1 < a->npages &&
	       a->bar_off[last + 1] == a->bar_off[last] + ps) {
		last++;
		run += ps;
	}
	*bar = a->bar_off[page] + in_page;
	return min(run, max);
}

/*
 * Copies, reads or fills [off, off + len) of @a, one physically contiguous piece at a time.
 * The caller holds the lock for up to a whole allocation (zero-fill of a new one), so it
 * yields between pieces.
 */
static int emu_alloc_io(const struct emu_alloc *a, u64 off, u64 len, struct emu_io *io)
{
	u64 piece, bar;
	int ret;

	lockdep_assert_held(&emu_dev.lock);
	while (len) {
		piece = emu_alloc_run(a, off, min_t(u64, len, EMU_IO_CHUNK), &bar);
		if (bar == EMU_BAR_HOLE) {
			emu_hole_io(piece, io);
		} else {
			ret = emu_bar_io(bar, piece, io);
			if (ret)
				return ret;
		}
		off += piece;
		len -= piece;
		cond_resched();
	}
	return 0;
}

/*
 * Sparse allocations: bar_off[] holds the backed (even) pages compacted at its start; spread
 * them to their VA positions and mark the odd ones as holes.
 */
static void emu_alloc_spread(struct emu_alloc *a)
{
	u32 i = a->npages;

	while (i--)
		a->bar_off[i] = i & 1 ? EMU_BAR_HOLE : a->bar_off[i / 2];
}

/* The inverse: compacts the backed pages to the start, for emu_bar_free_pages(). */
static u32 emu_alloc_compact(struct emu_alloc *a)
{
	u32 i, n = 0;

	for (i = 0; i < a->npages; i++)
		if (a->bar_off[i] != EMU_BAR_HOLE)
			a->bar_off[n++] = a->bar_off[i];
	return n;
}

static void emu_alloc_free_pages(struct emu_alloc *a)
{
	u32 backed;

	if (a->kind != EMU_KIND_MEM && a->kind != EMU_KIND_PHYS)
		return;		/* a MAP's pages are its PHYS record's; a RESERVE has none */
	backed = a->sparse ? emu_alloc_compact(a) : a->npages;
	emu_bar_free_pages(a->page_size, backed, a->bar_off);
}

static int emu_alloc_zero(const struct emu_alloc *a)
{
	struct emu_io io = { .op = EMU_IO_FILL, .fill = 0 };

	return emu_alloc_io(a, 0, a->size, &io);
}

/* Checks ALLOC's arguments; @align gets the effective VA alignment. */
static int emu_alloc_check(const struct mtgpu_emu_alloc *args, u64 *align)
{
	switch (args->page_size) {
	case MTGPU_EMU_PAGE_4K:
	case MTGPU_EMU_PAGE_64K:
	case MTGPU_EMU_PAGE_2M:
		break;
	default:
		return -EINVAL;
	}
	if (!args->size || args->flags & ~(MTGPU_EMU_ALLOC_SCATTER | MTGPU_EMU_ALLOC_MANAGED |
					   MTGPU_EMU_ALLOC_SPARSE | MTGPU_EMU_ALLOC_VMM |
					   MTGPU_EMU_ALLOC_RDMA))
		return -EINVAL;
	/* VMM memory is plain device memory; only it has the RDMA attribute. */
	if (args->flags & MTGPU_EMU_ALLOC_VMM ?
	    args->flags & (MTGPU_EMU_ALLOC_MANAGED | MTGPU_EMU_ALLOC_SPARSE) :
	    args->flags & MTGPU_EMU_ALLOC_RDMA)
		return -EINVAL;
	if (args->align && (!is_power_of_2(args->align) || args->align > EMU_ALIGN_MAX))
		return -EINVAL;
	*align = max_t(u64, args->align, args->page_size);
	return 0;
}

/* Takes VA and BAR pages for @a (size and page fields set) and zeroes its memory. */
static int emu_alloc_back(struct emu_alloc *a, u64 align, bool scatter)
{
	int ret;

	ret = emu_va_find(a->owner, a->size, align, &a->va);
	if (ret)
		return ret;

	ret = emu_bar_alloc_pages(a->page_size, a->sparse ? (a->npages + 1) / 2 : a->npages,
				  scatter, a->bar_off);
	if (ret)
		return ret;
	if (a->sparse)
		emu_alloc_spread(a);

	ret = emu_alloc_zero(a);
	if (ret)
		goto err_free_pages;
	return 0;

err_free_pages:
	emu_alloc_free_pages(a);
	return ret;
}

/* A zeroed record for @npages pages, owned by the caller's thread group (no reference yet). */
struct emu_alloc *emu_alloc_new(u32 npages)
{
	struct emu_alloc *a = kvzalloc(struct_size(a, bar_off, npages), GFP_KERNEL);

	if (a)
		a->owner = emu_caller();
	return a;
}

/* ALLOC: on success args->gpu_va is the new allocation's VA in the caller's VA space. */
int emu_alloc_create(const struct file *file, struct mtgpu_emu_alloc *args)
{
	struct emu_alloc *a;
	u64 size, align;
	u32 npages;
	int ret;

	ret = emu_alloc_check(args, &align);
	if (ret)
		return ret;

	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto err_unlock;
	}
	if (args->size > emu_dev.bar_size) {
		ret = -ENOMEM;
		goto err_unlock;
	}
	size = round_up(args->size, (u64)args->page_size);
	npages = size >> ilog2(args->page_size);

	a = emu_alloc_new(npages);
	if (!a) {
		ret = -ENOMEM;
		goto err_unlock;
	}
	a->kind = args->flags & MTGPU_EMU_ALLOC_VMM ? EMU_KIND_PHYS : EMU_KIND_MEM;
	a->rdma = args->flags & MTGPU_EMU_ALLOC_RDMA;
	a->size = size;
	a->page_size = args->page_size;
	a->page_shift = ilog2(args->page_size);
	a->npages = npages;
	a->managed = args->flags & MTGPU_EMU_ALLOC_MANAGED;
	a->sparse = args->flags & MTGPU_EMU_ALLOC_SPARSE;

	ret = emu_alloc_back(a, align, args->flags & MTGPU_EMU_ALLOC_SCATTER);
	if (ret)
		goto err_free_alloc;

	get_pid(a->owner);
	a->file = file;
	emu_alloc_link(a);
	emu_dev.nr_allocs++;
	emu_dev.bytes_allocated += size;
	args->gpu_va = a->va;
	mutex_unlock(&emu_dev.lock);
	return 0;

err_free_alloc:
	kvfree(a);
err_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

static void emu_alloc_destroy(struct emu_alloc *a)
{
	lockdep_assert_held(&emu_dev.lock);
	list_del(&a->node);
	emu_alloc_free_pages(a);
	emu_dev.nr_allocs--;
	if (a->kind == EMU_KIND_MEM || a->kind == EMU_KIND_PHYS)
		emu_dev.bytes_allocated -= a->size;
	put_pid(a->owner);
	if (a->kind == EMU_KIND_MAP)
		emu_vmm_phys_put(a->phys);
	kvfree(a);
}

/*
 * The owner lets go of @a: its VA stops resolving; its memory goes with the last pin (and,
 * for a VMM allocation, the last mapping of it). This may destroy another record (the PHYS
 * of a MAP): callers iterating emu_dev.allocs start over after it.
 */
void emu_alloc_unlink(struct emu_alloc *a)
{
	lockdep_assert_held(&emu_dev.lock);
	a->file = NULL;
	if (a->pins)
		emu_dev.freed_while_pinned++;
	if (a->exports)
		emu_dev.freed_while_exported++;
	if (a->pins || a->exports || a->maps)
		return;
	emu_alloc_destroy(a);
}

/* A MAP record dropped its reference on @phys. */
void emu_vmm_phys_put(struct emu_alloc *phys)
{
	lockdep_assert_held(&emu_dev.lock);
	if (WARN_ON_ONCE(!phys->maps))
		return;
	if (--phys->maps == 0 && !phys->file)
		emu_alloc_destroy(phys);
}

/* FREE: @va must start an allocation of the caller. */
int emu_alloc_free(u64 va)
{
	struct pid *owner = emu_caller();
	struct emu_alloc *a;
	int ret = -EINVAL;

	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto out_unlock;
	}
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (a->kind != EMU_KIND_MEM && a->kind != EMU_KIND_PHYS)
			continue;	/* VMM ranges go with their own operations */
		if (a->file && a->owner == owner && a->va == va) {
			emu_alloc_unlink(a);
			ret = 0;
			break;
		}
	}
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

/*
 * @file is being released: free what it allocated. An unlink may destroy a record other than
 * the one unlinked (see emu_alloc_unlink), so the walk starts over after each.
 */
void emu_alloc_release_file(const struct file *file)
{
	struct emu_alloc *a;

	mutex_lock(&emu_dev.lock);
again:
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (a->file == file) {
			emu_alloc_unlink(a);
			cond_resched();
			goto again;
		}
	}
	mutex_unlock(&emu_dev.lock);
}

/*
 * One step of READ/WRITE/MEMSET: [va, va + size) must lie in one allocation of the caller;
 * accesses [va + off, va + off + len) of it. Looked up again at every step, so a concurrent
 * FREE makes the next step fail instead of touching released memory.
 */
int emu_alloc_access(u64 va, u64 size, u64 off, size_t len, struct emu_io *io)
{
	struct emu_alloc *a;
	int ret;

	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto out_unlock;
	}
	a = emu_alloc_find(emu_caller(), va, size);
	/* A VMM mapping without access faults on the GPU; without write access, on writes. */
	if (a && a->kind == EMU_KIND_MAP &&
	    (!a->access || (io->op != EMU_IO_READ && a->access != MTGPU_EMU_ACCESS_READWRITE)))
		a = NULL;
	if (!a || off > size || len > size - off) {
		ret = -EINVAL;
		goto out_unlock;
	}
	ret = emu_alloc_io(a, va - a->va + off, len, io);
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

/* put_pages dropped a pin on @a. */
void emu_alloc_unpin(struct emu_alloc *a)
{
	lockdep_assert_held(&emu_dev.lock);
	if (WARN_ON_ONCE(!a->pins))
		return;
	if (--a->pins == 0 && !a->exports && !a->maps && !a->file)
		emu_alloc_destroy(a);
}

/* The last reference of a dma-buf on @a went. */
void emu_alloc_unexport(struct emu_alloc *a)
{
	lockdep_assert_held(&emu_dev.lock);
	if (WARN_ON_ONCE(!a->exports))
		return;
	if (--a->exports == 0 && !a->pins && !a->maps && !a->file)
		emu_alloc_destroy(a);
}

/*
 * The BAR is going away: free every allocation, pinned or not. Mappings first, as each one's
 * destruction may take its VMM allocation with it; then the rest, which references nothing.
 */
void emu_alloc_drop_all(void)
{
	struct emu_alloc *a, *tmp;

	lockdep_assert_held(&emu_dev.lock);
	emu_p2p_orphan_pins();
	emu_dmabuf_orphan_all();
again:
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (a->kind == EMU_KIND_MAP) {
			emu_alloc_destroy(a);
			goto again;
		}
	}
	list_for_each_entry_safe(a, tmp, &emu_dev.allocs, node)
		emu_alloc_destroy(a);
}
