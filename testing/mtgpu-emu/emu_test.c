// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: knobs that put the host in states the in-VM tests of mtgdrdrv must reach, and
 * that QEMU cannot produce on its own. Module parameters under
 * /sys/module/mtgpu_emu/parameters/ (root only):
 *
 * - bar_state (normal, nonprefetch, unset, disabled): how the PCI core describes the served
 *   BAR. A BAR the core could not assign carries IORESOURCE_UNSET, one it turned off
 *   IORESOURCE_DISABLED, and a device's register BARs are not prefetchable; mtgdrdrv must take
 *   none of them for device memory. Only the resource's flags change, and they are restored
 *   (at "normal" and when the device goes away): the BAR itself keeps working.
 * - bar_kernel_map (none, uc, wc): keeps a kernel mapping of the whole BAR, uncached (ioremap)
 *   or write-combined (ioremap_wc), as a driver that maps its VRAM BAR for itself does. On x86
 *   with PAT that reserves the BAR's memtype, which every later mapping of its pages then gets,
 *   whatever it asks for: the case of a WC mapping that comes out UC-, or a DEVICE one that
 *   comes out WC.
 * - split_failure_at (write only, a user address of the writer): does to the VMA there what
 *   Linux 6.1 and 6.2's __split_vma() does when the split fails after the new VMA was opened
 *   (vma_adjust() out of memory): ->open on a copy of the VMA, then ->close on that copy with
 *   vm_start = vm_end and vm_pgoff = 0. The copy is never linked into the address space. The
 *   real failure needs an allocation of the maple tree to fail, which a stock kernel does not
 *   let a test force (no fault injection).
 *
 * Locking: emu_dev.lock for bar_state and bar_kernel_map; the writer's mmap_lock (write) for
 * split_failure_at, taken with no lock of ours held.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "emu.h"
#include "compat.h"

enum emu_bar_state { EMU_BAR_NORMAL, EMU_BAR_NONPREFETCH, EMU_BAR_UNSET, EMU_BAR_DISABLED };
static const char *const emu_bar_states[] = { "normal", "nonprefetch", "unset", "disabled" };

enum emu_kmap { EMU_KMAP_NONE, EMU_KMAP_UC, EMU_KMAP_WC };
static const char *const emu_kmaps[] = { "none", "uc", "wc" };

static int emu_bar_state;
static unsigned long emu_bar_saved_flags;	/* the resource's flags before bar_state */
static int emu_kmap;
static void __iomem *emu_kmap_addr;

static struct resource *emu_test_res(void)
{
	lockdep_assert_held(&emu_dev.lock);
	return &emu_dev.pdev->resource[EMU_BAR];
}

/* Gives the served BAR's resource the flags of @state; caller holds emu_dev.lock. */
static void emu_apply_bar_state(int state)
{
	struct resource *res = emu_test_res();

	if (emu_bar_state == EMU_BAR_NORMAL)
		emu_bar_saved_flags = res->flags;
	res->flags = emu_bar_saved_flags;
	switch (state) {
	case EMU_BAR_NONPREFETCH:
		res->flags &= ~IORESOURCE_PREFETCH;
		break;
	case EMU_BAR_UNSET:
		res->flags |= IORESOURCE_UNSET;
		break;
	case EMU_BAR_DISABLED:
		res->flags |= IORESOURCE_DISABLED;
		break;
	}
	emu_bar_state = state;
}

/*
 * Maps the whole BAR for the kernel as @kmap says, after dropping the old mapping (whose
 * reservation would otherwise decide the new one's type); caller holds emu_dev.lock. A
 * reservation of part of the BAR that exists already (a WC user mapping) decides the type too:
 * x86 gives the new mapping that type, or refuses it.
 */
static int emu_apply_kmap(int kmap)
{
	void __iomem *addr = NULL;

	if (emu_kmap_addr)
		iounmap(emu_kmap_addr);
	emu_kmap_addr = NULL;
	emu_kmap = EMU_KMAP_NONE;
	if (kmap == EMU_KMAP_UC)
		addr = ioremap(emu_dev.bar_phys, emu_dev.bar_size);
	else if (kmap == EMU_KMAP_WC)
		addr = ioremap_wc(emu_dev.bar_phys, emu_dev.bar_size);
	if (kmap != EMU_KMAP_NONE && !addr)
		return -ENOMEM;
	emu_kmap_addr = addr;
	emu_kmap = kmap;
	return 0;
}

/* The served device goes away: its resource gets its flags back, the kernel mapping goes. */
void emu_test_unbind(void)
{
	lockdep_assert_held(&emu_dev.lock);
	if (emu_bar_state != EMU_BAR_NORMAL)
		emu_apply_bar_state(EMU_BAR_NORMAL);
	emu_apply_kmap(EMU_KMAP_NONE);
}

static int emu_parse(const char *val, const char *const *names, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		if (sysfs_streq(val, names[i]))
			return i;
	}
	return -EINVAL;
}

static int emu_set_bar_state(const char *val, const struct kernel_param *kp)
{
	int state = emu_parse(val, emu_bar_states, ARRAY_SIZE(emu_bar_states));
	int ret = 0;

	if (state < 0)
		return state;
	mutex_lock(&emu_dev.lock);
	if (emu_bound())
		emu_apply_bar_state(state);
	else
		ret = -ENODEV;
	mutex_unlock(&emu_dev.lock);
	return ret;
}

static int emu_get_bar_state(char *buf, const struct kernel_param *kp)
{
	return sprintf(buf, "%s\n", emu_bar_states[READ_ONCE(emu_bar_state)]);
}

static const struct kernel_param_ops emu_bar_state_ops = {
	.set = emu_set_bar_state,
	.get = emu_get_bar_state,
};
module_param_cb(bar_state, &emu_bar_state_ops, NULL, 0600);
MODULE_PARM_DESC(bar_state,
		 "Test only: the served BAR's resource flags: normal, nonprefetch, unset or disabled");

static int emu_set_kmap(const char *val, const struct kernel_param *kp)
{
	int kmap = emu_parse(val, emu_kmaps, ARRAY_SIZE(emu_kmaps));
	int ret;

	if (kmap < 0)
		return kmap;
	mutex_lock(&emu_dev.lock);
	ret = emu_bound() ? emu_apply_kmap(kmap) : -ENODEV;
	mutex_unlock(&emu_dev.lock);
	return ret;
}

static int emu_get_kmap(char *buf, const struct kernel_param *kp)
{
	return sprintf(buf, "%s\n", emu_kmaps[READ_ONCE(emu_kmap)]);
}

static const struct kernel_param_ops emu_kmap_ops = {
	.set = emu_set_kmap,
	.get = emu_get_kmap,
};
module_param_cb(bar_kernel_map, &emu_kmap_ops, NULL, 0600);
MODULE_PARM_DESC(bar_kernel_map,
		 "Test only: keep a kernel mapping of the whole BAR: none, uc or wc");

/* __split_vma()'s failure path of 6.1/6.2 on a copy of the VMA at @addr. */
static int emu_split_failure(unsigned long addr)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma, *copy;
	int ret = 0;

	if (!mm)
		return -EINVAL;
	mmap_write_lock(mm);
	vma = find_vma(mm, addr);
	if (!vma || vma->vm_start > addr || !vma->vm_ops || !vma->vm_ops->close) {
		ret = -EINVAL;
		goto out;
	}
	copy = kmemdup(vma, sizeof(*vma), GFP_KERNEL);
	if (!copy) {
		ret = -ENOMEM;
		goto out;
	}
	/* The new VMA of a split above @addr, opened as __split_vma() opens it. */
	copy->vm_pgoff += (addr - vma->vm_start) >> PAGE_SHIFT;
	copy->vm_start = addr;
	if (copy->vm_ops->open)
		copy->vm_ops->open(copy);
	/* "Avoid vm accounting in close() operation", then close. */
	copy->vm_start = copy->vm_end;
	copy->vm_pgoff = 0;
	copy->vm_ops->close(copy);
	kfree(copy);
out:
	mmap_write_unlock(mm);
	return ret;
}

static int emu_set_split_failure(const char *val, const struct kernel_param *kp)
{
	unsigned long addr;
	int ret = kstrtoul(val, 0, &addr);

	return ret ?: emu_split_failure(addr);
}

static const struct kernel_param_ops emu_split_failure_ops = {
	.set = emu_set_split_failure,
};
module_param_cb(split_failure_at, &emu_split_failure_ops, NULL, 0200);
MODULE_PARM_DESC(split_failure_at,
		 "Test only: run a 6.1 VMA split failure (->open, then ->close with vm_pgoff 0) on the writer's VMA at this address");
