// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: the provider API mtgdrdrv links against, with mtgpu's exact types and plain
 * EXPORT_SYMBOL, and the faults tests can make it show.
 *
 * Behaviour follows what is known of the real driver (reference/musa.md section 1.3):
 * get_pages resolves gpu_va in the calling process, refuses managed memory (-EINVAL), pins the
 * whole allocation and returns one CPU physical address per page of the allocation's page size,
 * the first being the page that holds gpu_va; put_pages unpins and frees, using gpu_va only for
 * logging. Both may sleep.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bug.h>
#include <linux/export.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/mm.h>		/* kv*alloc before 5.16 */
#include <linux/pid.h>
#include <linux/printk.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sizes.h>
#include <linux/slab.h>

#include "emu.h"

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

	if (kind > MTGPU_EMU_FAULT_BAD_PAGE_SIZE)
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

static void emu_pin_apply_fault(struct emu_pin *pin, u32 fault)
{
	switch (fault) {
	case MTGPU_EMU_FAULT_BAD_VERSION:
		pin->issued_version = EMU_BAD_VERSION;
		pin->pt.version = EMU_BAD_VERSION;
		break;
	case MTGPU_EMU_FAULT_BAD_PAGE_SIZE:
		pin->pt.page_size = emu_bad_page_size(pin->pt.page_size);
		break;
	}
}

/* A page table for [gpu_va, gpu_va + length), which lies inside @a. */
static struct emu_pin *emu_pin_create(struct emu_alloc *a, u64 gpu_va, u64 length)
{
	u64 ps = a->page_size;
	u32 first = (gpu_va - a->va) >> a->page_shift;
	u32 count = ((gpu_va & (ps - 1)) + length + ps - 1) >> a->page_shift;
	struct emu_pin *pin;
	u32 i;

	lockdep_assert_held(&emu_dev.lock);
	pin = kzalloc(sizeof(*pin), GFP_KERNEL);
	if (!pin)
		return NULL;

	pin->pa = kvcalloc(count, sizeof(*pin->pa), GFP_KERNEL);
	if (!pin->pa)
		goto err_free_pin;

	for (i = 0; i < count; i++)
		pin->pa[i] = emu_dev.bar_phys + a->bar_off[first + i];
	pin->magic = EMU_PIN_MAGIC;
	pin->issued_version = MTGPU_P2P_PAGE_TABLE_VERSION;
	pin->alloc = a;
	pin->pt.version = MTGPU_P2P_PAGE_TABLE_VERSION;
	pin->pt.page_size = a->page_size;
	pin->pt.cpu_pa_array = pin->pa;
	pin->pt.array_count = count;
	return pin;

err_free_pin:
	kfree(pin);
	return NULL;
}

static void emu_pin_destroy(struct emu_pin *pin)
{
	lockdep_assert_held(&emu_dev.lock);
	list_del(&pin->node);
	emu_dev.nr_pins--;
	if (pin->alloc)
		emu_alloc_unpin(pin->alloc);
	pin->magic = 0;
	kvfree(pin->pa);
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

int mtgpu_p2p_get_pages(u64 gpu_va, u64 length, struct mtgpu_p2p_page_table **page_table_ptr)
{
	struct emu_alloc *a;
	struct emu_pin *pin;
	u32 fault;
	int ret;

	might_sleep();
	mutex_lock(&emu_dev.lock);
	emu_dev.get_pages_calls++;

	fault = emu_fault_take();
	if (fault == MTGPU_EMU_FAULT_ENOMEM) {
		ret = -ENOMEM;
		goto out_unlock;
	}
	ret = -EINVAL;
	if (fault == MTGPU_EMU_FAULT_EINVAL)
		goto out_unlock;
	if (!page_table_ptr || !length || length > U64_MAX - gpu_va)
		goto out_unlock;

	a = emu_alloc_find(task_tgid(current), gpu_va, length);
	if (!a) {
		pr_err_ratelimited("unable to find device memory mapping for gpu va:0x%llx length:0x%llx\n",
				   gpu_va, length);
		goto out_unlock;
	}
	if (a->managed) {
		pr_err_ratelimited("gpu va:0x%llx is managed memory, which cannot be pinned\n",
				   gpu_va);
		goto out_unlock;
	}

	pin = emu_pin_create(a, gpu_va, length);
	if (!pin) {
		ret = -ENOMEM;
		goto out_unlock;
	}
	emu_pin_apply_fault(pin, fault);
	list_add_tail(&pin->node, &emu_dev.pins);
	emu_dev.nr_pins++;
	a->pins++;
	*page_table_ptr = &pin->pt;
	ret = 0;
out_unlock:
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
		pin->alloc = NULL;
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
