// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: memory of the virtual memory management API (muMemCreate, muMemAddressReserve,
 * muMemMap, muMemSetAccess, ...), and how get_pages resolves it.
 *
 * Records (enum emu_kind in emu.h): ALLOC with MTGPU_EMU_ALLOC_VMM makes a PHYS record, whose
 * VA is only a handle; RESERVE makes a range of VA without memory; MAP puts part of a PHYS
 * record at a VA inside a reservation (a MAP record copies the PHYS record's page offsets and
 * holds a reference on it); SET_ACCESS gives mappings access. Only MAP records resolve, for
 * the ioctls and for get_pages. Unmapping a pinned mapping, or releasing mapped memory, keeps
 * the BAR pages reserved until the last put_pages or unmap, as FREE of a pinned allocation.
 *
 * What get_pages does with a VMM VA is an assumption, resting on two facts: the measured
 * mtgpu_p2p_get_pages looks gpu_va up in the driver's table of the process's GPU mappings, an
 * interval search that finds one mapping and refuses a range that goes past its end; and
 * NVIDIA's nvidia_p2p_get_pages pins cuMemCreate memory only when it was created with
 * gpuDirectRDMACapable (GDRCopy issue 257). Whether muMemMap enters such a mapping in mtgpu's
 * table, and what mtgpu does without the RDMA flag, is unknown. So by default a mapping with
 * access resolves like an allocation, memory without the RDMA flag is refused, and a range
 * must lie in one mapping; module parameters make the other choices:
 * - p2p_vmm_any: memory created without the RDMA flag pins too;
 * - p2p_vmm_span: one pin may cover mappings of different allocations that follow each other
 *   in VA (same page size, all with access), as if mtgpu merged them in its table.
 * A mapping without access (before SET_ACCESS, or set to none) is refused either way.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/mm.h>		/* kvfree before 5.16 */
#include <linux/moduleparam.h>
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "emu.h"

static bool emu_vmm_any;
module_param_named(p2p_vmm_any, emu_vmm_any, bool, 0644);
MODULE_PARM_DESC(p2p_vmm_any,
		 "get_pages pins VMM memory created without the GPUDirect RDMA flag too (default: N, refused, as NVIDIA's driver does)");

static bool emu_vmm_span_ok;
module_param_named(p2p_vmm_span, emu_vmm_span_ok, bool, 0644);
MODULE_PARM_DESC(p2p_vmm_span,
		 "One get_pages may cover VA-contiguous mappings of different VMM allocations (default: N, the range must lie in one mapping)");

/* Whether get_pages may pin @a, a record that resolved: mappings need access and the flag. */
bool emu_vmm_pinnable(const struct emu_alloc *a)
{
	lockdep_assert_held(&emu_dev.lock);
	if (a->kind != EMU_KIND_MAP)
		return true;
	return a->access && (a->phys->rdma || READ_ONCE(emu_vmm_any));
}

/* The next record of a span at @va after @prev, if get_pages may take it too. */
static struct emu_alloc *emu_vmm_next(const struct emu_alloc *prev, u64 va)
{
	struct emu_alloc *next = emu_alloc_find_va(prev->owner, va);

	if (!next || next->kind != EMU_KIND_MAP || next->va != va ||
	    next->page_size != prev->page_size || !emu_vmm_pinnable(next))
		return NULL;
	return next;
}

/*
 * The records [gpu_va, gpu_va + length) covers, @a (which holds gpu_va) first, in a new array
 * in *@allocsp: @a alone when the range stays in it, else the mappings that follow it, if
 * p2p_vmm_span allows. -EINVAL when the range goes past what may be pinned.
 */
int emu_vmm_span(struct emu_alloc *a, u64 gpu_va, u64 length, struct emu_alloc ***allocsp,
		 u32 *np)
{
	struct emu_alloc **allocs, *cur = a;
	u64 end, covered = a->va + a->size;
	u32 i, n = 1;

	lockdep_assert_held(&emu_dev.lock);
	if (check_add_overflow(gpu_va, length, &end))
		return -EINVAL;
	while (covered < end) {
		if (a->kind != EMU_KIND_MAP || !READ_ONCE(emu_vmm_span_ok))
			return -EINVAL;
		cur = emu_vmm_next(cur, covered);
		if (!cur)
			return -EINVAL;
		covered += cur->size;
		n++;
	}
	allocs = kcalloc(n, sizeof(*allocs), GFP_KERNEL);
	if (!allocs)
		return -ENOMEM;
	allocs[0] = a;
	for (i = 1; i < n; i++)
		allocs[i] = emu_vmm_next(allocs[i - 1], allocs[i - 1]->va + allocs[i - 1]->size);
	*allocsp = allocs;
	*np = n;
	return 0;
}

/* The live record of @kind of the caller that holds [va, va + size), or NULL. */
static struct emu_alloc *emu_vmm_find(u8 kind, u64 va, u64 size)
{
	const struct pid *owner = task_tgid(current);
	struct emu_alloc *a;

	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (!a->file || a->owner != owner || a->kind != kind)
			continue;
		if (va >= a->va && va - a->va < a->size && size <= a->size - (va - a->va))
			return a;
	}
	return NULL;
}

/* Whether @a is a live mapping of the caller that overlaps [va, end). */
static bool emu_vmm_overlaps(const struct emu_alloc *a, u64 va, u64 end)
{
	return a->file && a->owner == task_tgid(current) && a->kind == EMU_KIND_MAP &&
	       a->va < end && va < a->va + a->size;
}

/*
 * Whether every live mapping of the caller in [va, end) lies wholly inside it; *@bytes gets
 * how many bytes they cover.
 */
static bool emu_vmm_mapped(u64 va, u64 end, u64 *bytes)
{
	struct emu_alloc *a;

	*bytes = 0;
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (!emu_vmm_overlaps(a, va, end))
			continue;
		if (a->va < va || a->va + a->size > end)
			return false;
		*bytes += a->size;
	}
	return true;
}

static int emu_vmm_reserve(const struct file *file, struct mtgpu_emu_vmm *args)
{
	u64 align = max_t(u64, args->align, EMU_UNIT_SIZE);
	struct emu_alloc *r;
	int ret;

	if (!args->size || !IS_ALIGNED(args->size, EMU_UNIT_SIZE) || args->size > EMU_ALIGN_MAX ||
	    (args->align && (!is_power_of_2(args->align) || args->align > EMU_ALIGN_MAX)))
		return -EINVAL;
	r = emu_alloc_new(0);
	if (!r)
		return -ENOMEM;
	ret = emu_va_find(r->owner, args->size, align, &r->va);
	if (ret) {
		kvfree(r);
		return ret;
	}
	r->kind = EMU_KIND_RESERVE;
	r->size = args->size;
	r->page_size = EMU_UNIT_SIZE;
	r->page_shift = EMU_UNIT_SHIFT;
	get_pid(r->owner);
	r->file = file;
	emu_alloc_link(r);
	emu_dev.nr_allocs++;
	args->gpu_va = r->va;
	return 0;
}

static int emu_vmm_unreserve(const struct mtgpu_emu_vmm *args)
{
	struct emu_alloc *r = emu_vmm_find(EMU_KIND_RESERVE, args->gpu_va, args->size);
	u64 mapped;

	if (!r || r->va != args->gpu_va || r->size != args->size ||
	    !emu_vmm_mapped(r->va, r->va + r->size, &mapped) || mapped)
		return -EINVAL;
	emu_alloc_unlink(r);
	return 0;
}

/* The caller's live VMM allocation @handle, or NULL. */
static struct emu_alloc *emu_vmm_phys(u64 handle)
{
	const struct pid *owner = task_tgid(current);
	struct emu_alloc *a;

	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (a->file && a->owner == owner && a->kind == EMU_KIND_PHYS && a->va == handle)
			return a;
	}
	return NULL;
}

static int emu_vmm_map(const struct file *file, const struct mtgpu_emu_vmm *args)
{
	struct emu_alloc *p = emu_vmm_phys(args->handle), *m;
	u64 ps, end, mapped;

	if (!p || !emu_vmm_find(EMU_KIND_RESERVE, args->gpu_va, args->size))
		return -EINVAL;
	ps = p->page_size;
	end = args->gpu_va + args->size;	/* no overflow: inside a reservation */
	if (!args->size || !IS_ALIGNED(args->gpu_va | args->size | args->offset, ps) ||
	    args->offset > p->size || args->size > p->size - args->offset ||
	    !emu_vmm_mapped(args->gpu_va, end, &mapped) || mapped)
		return -EINVAL;

	m = emu_alloc_new(args->size >> p->page_shift);
	if (!m)
		return -ENOMEM;
	m->kind = EMU_KIND_MAP;
	m->va = args->gpu_va;
	m->size = args->size;
	m->page_size = p->page_size;
	m->page_shift = p->page_shift;
	m->npages = args->size >> p->page_shift;
	memcpy(m->bar_off, p->bar_off + (args->offset >> p->page_shift),
	       m->npages * sizeof(m->bar_off[0]));
	m->phys = p;
	p->maps++;
	get_pid(m->owner);
	m->file = file;
	emu_alloc_link(m);
	emu_dev.nr_allocs++;
	return 0;
}

static int emu_vmm_unmap(const struct mtgpu_emu_vmm *args)
{
	u64 va = args->gpu_va, end = va + args->size, mapped;
	struct emu_alloc *a;

	if (!args->size || !emu_vmm_find(EMU_KIND_RESERVE, va, args->size) ||
	    !emu_vmm_mapped(va, end, &mapped) || !mapped)
		return -EINVAL;
	/* An unlink may destroy the mapping's VMM allocation too: start over after each. */
again:
	list_for_each_entry(a, &emu_dev.allocs, node) {
		if (emu_vmm_overlaps(a, va, end)) {
			emu_alloc_unlink(a);
			goto again;
		}
	}
	return 0;
}

static int emu_vmm_set_access(const struct mtgpu_emu_vmm *args)
{
	u64 va = args->gpu_va, end = va + args->size, mapped;
	struct emu_alloc *a;

	if (args->access != MTGPU_EMU_ACCESS_NONE && args->access != MTGPU_EMU_ACCESS_READ &&
	    args->access != MTGPU_EMU_ACCESS_READWRITE)
		return -EINVAL;
	if (!args->size || !emu_vmm_find(EMU_KIND_RESERVE, va, args->size) ||
	    !emu_vmm_mapped(va, end, &mapped) || mapped != args->size)
		return -EINVAL;
	list_for_each_entry(a, &emu_dev.allocs, node)
		if (emu_vmm_overlaps(a, va, end))
			a->access = args->access;
	return 0;
}

static int emu_vmm_op(const struct file *file, struct mtgpu_emu_vmm *args)
{
	lockdep_assert_held(&emu_dev.lock);
	switch (args->op) {
	case MTGPU_EMU_VMM_RESERVE:
		return emu_vmm_reserve(file, args);
	case MTGPU_EMU_VMM_UNRESERVE:
		return emu_vmm_unreserve(args);
	case MTGPU_EMU_VMM_MAP:
		return emu_vmm_map(file, args);
	case MTGPU_EMU_VMM_UNMAP:
		return emu_vmm_unmap(args);
	case MTGPU_EMU_VMM_SET_ACCESS:
		return emu_vmm_set_access(args);
	default:
		return -EINVAL;
	}
}

/* Fields an operation does not use must be 0, so that they can gain a meaning later. */
static bool emu_vmm_unused_zero(const struct mtgpu_emu_vmm *args)
{
	if (args->op != MTGPU_EMU_VMM_SET_ACCESS && args->access)
		return false;
	if (args->op != MTGPU_EMU_VMM_RESERVE && args->align)
		return false;
	return args->op == MTGPU_EMU_VMM_MAP || (!args->handle && !args->offset);
}

/* MTGPU_EMU_IOC_VMM. */
int emu_vmm_ioctl(const struct file *file, struct mtgpu_emu_vmm __user *uarg)
{
	struct mtgpu_emu_vmm args;
	int ret;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!emu_vmm_unused_zero(&args))
		return -EINVAL;
	mutex_lock(&emu_dev.lock);
	ret = emu_bound() ? emu_vmm_op(file, &args) : -ENODEV;
	mutex_unlock(&emu_dev.lock);
	if (ret || args.op != MTGPU_EMU_VMM_RESERVE)
		return ret;
	if (put_user(args.gpu_va, &uarg->gpu_va)) {
		struct mtgpu_emu_vmm undo = { .gpu_va = args.gpu_va, .size = args.size };

		mutex_lock(&emu_dev.lock);
		if (emu_bound())
			emu_vmm_unreserve(&undo);
		mutex_unlock(&emu_dev.lock);
		return -EFAULT;
	}
	return 0;
}
