// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: the provider API mtgdrdrv links against, with mtgpu's exact types and plain
 * EXPORT_SYMBOL, and the faults tests can make it show.
 *
 * By default it behaves as the measured vendor driver (2.7.0) does (README.md, "The provider
 * as measured"):
 * - get_pages resolves gpu_va among the GPU mappings of the calling thread group only;
 * - page_size is the allocation's own (4 KiB, 64 KiB or 2 MiB here);
 * - neither gpu_va nor length need be aligned; the array has
 *   ((gpu_va % ps) + length + ps - 1) / ps entries, and entry 0 is the physical address of
 *   gpu_va itself, in-page offset included; the others are page bases;
 * - holes of sparse allocations are skipped: the array is compacted;
 * - the array is allocated (kcalloc, so a huge length WARNs in the page allocator) before
 *   the range is checked against the allocation;
 * - every refused call logs one line, not rate-limited, and managed memory is refused;
 * - a VMM VA resolves to its mapping (emu_vmm.c says what that rests on, and which choices
 *   the p2p_vmm_* parameters make where the real driver's behaviour is unknown);
 * - put_pages needs no particular context and uses gpu_va only in its messages.
 * Module parameters switch to the other behaviours a driver may have: p2p_entry0_page_base
 * (entry 0 is the base of gpu_va's page) and p2p_short_count (drivers 2.1.2 to 2.6.0:
 * ceil(length / ps) entries, one short when gpu_va is not page aligned). Loaded with
 * disable_driver=1, nothing is initialised, and a get_pages call, which oopses on the real
 * driver, WARNs and fails.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bug.h>
#include <linux/export.h>
#include <linux/io.h>		/* page_to_phys */
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/math64.h>
#include <linux/mm.h>
#include <linux/mm_types.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/printk.h>
#include <linux/rwsem.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sizes.h>
#include <linux/slab.h>

#include "emu.h"

static bool emu_entry0_page_base;
module_param_named(p2p_entry0_page_base, emu_entry0_page_base, bool, 0644);
MODULE_PARM_DESC(p2p_entry0_page_base,
		 "cpu_pa_array[0] is the base of gpu_va's page, not gpu_va's own address (default: N, as the vendor driver)");

static bool emu_short_count;
module_param_named(p2p_short_count, emu_short_count, bool, 0644);
MODULE_PARM_DESC(p2p_short_count,
		 "Entry count ceil(length / page_size), as drivers 2.1.2-2.6.0 (default: N, as 2.7.0)");

#define EMU_PIN_MAGIC 0x6d747032		/* "mtp2" */
#define EMU_BAD_VERSION MTGPU_P2P_VERSION(2, 0)

/* Consumes one get_pages call's worth of the injected fault. */
static u32 emu_fault_take(void)
{
	lockdep_assert_held(&emu_dev.lock);
	if (!emu_dev.fault_count)
		return MTGPU_EMU_FAULT_NONE;
	emu_dev.fault_count--;
	return emu_dev.fault_kind;
}

/* INJECT_FAULT: the next @count get_pages calls show @kind; count 0 (or kind NONE) clears. */
int emu_fault_set(u32 kind, u32 count)
{
	int ret = 0;

	if (kind > MTGPU_EMU_FAULT_MAX)
		return -EINVAL;

	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto out_unlock;
	}
	if (kind == MTGPU_EMU_FAULT_NONE)
		count = 0;
	emu_dev.fault_kind = count ? kind : MTGPU_EMU_FAULT_NONE;
	emu_dev.fault_count = count;
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

/* A page size that is never a power of two: page_size + 4 KiB (+ 4 KiB more for 4 KiB). */
static u32 emu_bad_page_size(u32 page_size)
{
	u32 bad = page_size + SZ_4K;

	return is_power_of_2(bad) ? bad + SZ_4K : bad;
}

/* The page after the last entry's page: a table-sized BAR address that should not be there. */
static u64 emu_next_page(const struct emu_pin *pin, u32 last)
{
	u64 ps = pin->pt.page_size;

	return (pin->pa[last] & ~(ps - 1)) + ps;
}

static void emu_pin_apply_fault(struct emu_pin *pin, u32 fault)
{
	u32 last = pin->pt.array_count - 1;

	switch (fault) {
	case MTGPU_EMU_FAULT_BAD_VERSION:
		pin->issued_version = EMU_BAD_VERSION;
		pin->pt.version = EMU_BAD_VERSION;
		break;
	case MTGPU_EMU_FAULT_BAD_PAGE_SIZE:
		pin->pt.page_size = emu_bad_page_size(pin->pt.page_size);
		break;
	case MTGPU_EMU_FAULT_PA_RAM:
		/*
		 * Aligned to the table's page size (the zero page is in the
		 * kernel image, which is System RAM at least 2 MiB around it),
		 * so that the RAM check, not the alignment check, refuses it
		 * whatever the kernel's layout.
		 */
		pin->pa[last] = page_to_phys(ZERO_PAGE(0)) &
				~((u64)pin->pt.page_size - 1);
		break;
	case MTGPU_EMU_FAULT_PA_ZERO:
		pin->pa[last] = 0;
		break;
	case MTGPU_EMU_FAULT_PA_OUTSIDE_BAR:
		pin->pa[last] = emu_dev.bar_phys + emu_dev.bar_size;
		break;
	case MTGPU_EMU_FAULT_PA_REPEAT:
		if (last)
			pin->pa[last] = pin->pa[0] & ~((u64)pin->pt.page_size - 1);
		break;
	case MTGPU_EMU_FAULT_NULL_ARRAY:
		pin->pt.cpu_pa_array = NULL;
		break;
	case MTGPU_EMU_FAULT_BAD_COUNT:
		/* emu_pin_create() left room for this entry. */
		pin->pa[last + 1] = emu_next_page(pin, last);
		pin->pt.array_count++;
		break;
	}
}

/* Entries a table of [gpu_va, gpu_va + length) has, by the configured driver generation. */
static u64 emu_entry_count(u64 gpu_va, u64 length, u64 ps)
{
	if (READ_ONCE(emu_short_count))
		return div64_u64(length, ps) + !!(length & (ps - 1));
	return div64_u64((gpu_va & (ps - 1)) + length + ps - 1, ps);
}

/*
 * Fills the array of a table of [gpu_va, ...) in @pin's records (VA-contiguous, one page
 * size) with up to @count entries, skipping holes; returns how many it wrote.
 */
static u32 emu_fill_array(const struct emu_pin *pin, u64 gpu_va, u32 count, u64 *pa)
{
	const struct emu_alloc *a = pin->allocs[0];
	u64 ps = a->page_size, va = gpu_va & ~(ps - 1), off;
	bool first_hole = false;
	u32 i, k = 0, n = 0;

	for (i = 0; i < count; i++, va += ps) {
		while (k < pin->nallocs && va - pin->allocs[k]->va >= pin->allocs[k]->size)
			k++;
		if (k == pin->nallocs)
			break;
		a = pin->allocs[k];
		off = a->bar_off[(va - a->va) >> a->page_shift];
		if (off == EMU_BAR_HOLE) {
			first_hole |= !i;
			continue;
		}
		pa[n++] = emu_dev.bar_phys + off;
	}
	/* The vendor driver's entry 0 is gpu_va's own address when its page is backed. */
	if (n && !first_hole && !READ_ONCE(emu_entry0_page_base))
		pa[0] += gpu_va & (ps - 1);
	return n;
}

/*
 * A page table for [gpu_va, gpu_va + length) of @a, which holds gpu_va. As the real driver,
 * the array is allocated before the range is checked: a huge length fails here (with the
 * page allocator's warning), not with -EINVAL.
 */
static int emu_pin_create(struct emu_alloc *a, u64 gpu_va, u64 length, u32 fault,
			  struct emu_pin **pinp)
{
	u64 count = emu_entry_count(gpu_va, length, a->page_size);
	struct emu_pin *pin;
	int ret;
	u32 n;

	lockdep_assert_held(&emu_dev.lock);
	pin = kzalloc(sizeof(*pin), GFP_KERNEL);
	if (!pin)
		return -ENOMEM;

	/* One spare entry for MTGPU_EMU_FAULT_BAD_COUNT. */
	pin->pa = kcalloc(count + 1, sizeof(*pin->pa), GFP_KERNEL);
	if (!pin->pa)
		goto err_free_pin;
	/* The records the range covers: @a alone, or VMM mappings one after the other. */
	ret = emu_vmm_span(a, gpu_va, length, &pin->allocs, &pin->nallocs);
	if (ret) {
		kfree(pin->pa);
		kfree(pin);
		return ret;
	}

	n = emu_fill_array(pin, gpu_va, count, pin->pa);
	pin->magic = EMU_PIN_MAGIC;
	pin->issued_version = MTGPU_P2P_PAGE_TABLE_VERSION;
	pin->pt.version = MTGPU_P2P_PAGE_TABLE_VERSION;
	pin->pt.page_size = a->page_size;
	pin->pt.cpu_pa_array = pin->pa;
	pin->pt.array_count = n;
	if (n)
		emu_pin_apply_fault(pin, fault);
	*pinp = pin;
	return 0;

err_free_pin:
	kfree(pin);
	return -ENOMEM;
}

static void emu_pin_destroy(struct emu_pin *pin)
{
	u32 i;

	lockdep_assert_held(&emu_dev.lock);
	list_del(&pin->node);
	emu_dev.nr_pins--;
	for (i = 0; i < pin->nallocs; i++)
		emu_alloc_unpin(pin->allocs[i]);
	pin->magic = 0;
	kfree(pin->allocs);
	kfree(pin->pa);
	kfree(pin);
}

/* The record behind @pt if we handed @pt out and it was not put yet; @pt is not dereferenced. */
static struct emu_pin *emu_pin_lookup(const struct mtgpu_p2p_page_table *pt)
{
	struct emu_pin *pin;

	lockdep_assert_held(&emu_dev.lock);
	if (!pt)
		return NULL;
	list_for_each_entry(pin, &emu_dev.pins, node) {
		if (&pin->pt == pt)
			return WARN_ON_ONCE(pin->magic != EMU_PIN_MAGIC) ? NULL : pin;
	}
	return NULL;
}

/* Called while disabled: the real driver dereferences NULL here. */
static int emu_get_pages_disabled(void)
{
	mutex_lock(&emu_dev.lock);
	emu_dev.get_pages_while_disabled++;
	mutex_unlock(&emu_dev.lock);
	WARN(1, KBUILD_MODNAME ": mtgpu_p2p_get_pages() called while the driver is disabled; the real mtgpu oopses here\n");
	return -ENODEV;
}

/* Looks the range up and hands out its table; -errno after logging one line. */
static int emu_get_pages_locked(u64 gpu_va, u64 length, u32 fault,
				struct mtgpu_p2p_page_table **page_table_ptr)
{
	struct emu_alloc *a;
	struct emu_pin *pin;
	int ret;
	u32 i;

	lockdep_assert_held(&emu_dev.lock);
	if (fault == MTGPU_EMU_FAULT_ENOMEM) {
		pr_err("[MTGPU P2P][ERROR] injected failure for gpu va:0x%llx\n", gpu_va);
		return -ENOMEM;
	}
	if (fault == MTGPU_EMU_FAULT_EINVAL || !page_table_ptr || !length) {
		pr_err("[MTGPU P2P][ERROR] invalid request for gpu va:0x%llx\n", gpu_va);
		return -EINVAL;
	}
	a = emu_alloc_find_va(task_tgid(current), gpu_va);
	if (!a) {
		pr_err("[MTGPU P2P][ERROR] unable to find device memory mapping for gpu va:0x%llx\n",
		       gpu_va);
		return -EINVAL;
	}
	if (a->managed) {
		pr_err("[MTGPU P2P][ERROR] gpu va:0x%llx is not device memory\n", gpu_va);
		return -EINVAL;
	}
	if (!emu_vmm_pinnable(a)) {
		pr_err("[MTGPU P2P][ERROR] gpu va:0x%llx: VMM memory without access or RDMA flag\n",
		       gpu_va);
		return -EINVAL;
	}
	ret = emu_pin_create(a, gpu_va, length, fault, &pin);
	if (ret) {
		pr_err("[MTGPU P2P][ERROR] cannot pin gpu va:0x%llx length:0x%llx: %d\n",
		       gpu_va, length, ret);
		return ret;
	}
	list_add_tail(&pin->node, &emu_dev.pins);
	emu_dev.nr_pins++;
	for (i = 0; i < pin->nallocs; i++)
		pin->allocs[i]->pins++;
	*page_table_ptr = &pin->pt;
	return 0;
}

int mtgpu_p2p_get_pages(u64 gpu_va, u64 length, struct mtgpu_p2p_page_table **page_table_ptr)
{
	int ret;

	might_sleep();
	if (emu_disable_driver)
		return emu_get_pages_disabled();

	mutex_lock(&emu_dev.lock);
	emu_dev.get_pages_calls++;
	if (!emu_bound()) {
		pr_err("[MTGPU P2P][ERROR] no device for gpu va:0x%llx\n", gpu_va);
		ret = -EINVAL;
	} else {
		ret = emu_get_pages_locked(gpu_va, length, emu_fault_take(), page_table_ptr);
	}
	if (ret)
		emu_dev.get_pages_refused++;
	mutex_unlock(&emu_dev.lock);
	return ret;
}
EXPORT_SYMBOL(mtgpu_p2p_get_pages);

int mtgpu_p2p_put_pages(u64 gpu_va, struct mtgpu_p2p_page_table *page_table)
{
	struct emu_pin *pin;
	int ret = -EINVAL;

	might_sleep();
	mutex_lock(&emu_dev.lock);
	emu_dev.put_pages_calls++;
	/*
	 * The real put_pages takes mtgpu's own locks, which its mmap paths hold around mmap_lock:
	 * a consumer that puts from under mmap_lock (a VMA's close) risks an ABBA deadlock.
	 * Without lockdep, count it; a test checks the count.
	 */
	if (current->mm && rwsem_is_locked(&current->mm->mmap_lock))
		emu_dev.put_pages_mmap_locked++;

	pin = emu_pin_lookup(page_table);
	if (!pin) {
		pr_err_ratelimited("put_pages: page table %p (gpu va:0x%llx) was not handed out\n",
				   page_table, gpu_va);
		goto out_unlock;
	}
	/* The version is checked against what we issued, so injected bad versions still put. */
	if (page_table->version != pin->issued_version) {
		pr_err_ratelimited("put_pages: invalid version 0x%x (gpu va:0x%llx)\n",
				   page_table->version, gpu_va);
		goto out_unlock;
	}
	emu_pin_destroy(pin);
	ret = 0;
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}
EXPORT_SYMBOL(mtgpu_p2p_put_pages);

/* The BAR is going away under outstanding pins: keep the records, forget the memory. */
void emu_p2p_orphan_pins(void)
{
	struct emu_pin *pin;

	lockdep_assert_held(&emu_dev.lock);
	if (emu_dev.nr_pins)
		pr_warn("BAR removed with %llu page tables outstanding\n", emu_dev.nr_pins);
	list_for_each_entry(pin, &emu_dev.pins, node)
		pin->nallocs = 0;
}

/* Module exit: free page tables nobody will put any more. */
void emu_p2p_drop_all(void)
{
	struct emu_pin *pin, *tmp;

	mutex_lock(&emu_dev.lock);
	WARN(!list_empty(&emu_dev.pins), KBUILD_MODNAME ": %llu page tables leaked at exit\n",
	     emu_dev.nr_pins);
	list_for_each_entry_safe(pin, tmp, &emu_dev.pins, node)
		emu_pin_destroy(pin);
	mutex_unlock(&emu_dev.lock);
}
