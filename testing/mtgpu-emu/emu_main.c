// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: module entry points, the shared state and its counters.
 *
 * Test-only. Never install it next to the real mtgpu driver: both export the same symbols.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bug.h>
#include <linux/module.h>
#include <linux/string.h>

#include "emu.h"

bool emu_disable_driver;
module_param_named(disable_driver, emu_disable_driver, bool, 0444);
MODULE_PARM_DESC(disable_driver,
		 "Load without initialising, as mtgpu with disable_driver=1: p2p symbols exported, PCI driver not registered (default: N)");

struct emu_device emu_dev = {
	.lock = __MUTEX_INITIALIZER(emu_dev.lock),
	.allocs = LIST_HEAD_INIT(emu_dev.allocs),
	.pins = LIST_HEAD_INIT(emu_dev.pins),
	.exports = LIST_HEAD_INIT(emu_dev.exports),
};

int emu_stats_get(struct mtgpu_emu_stats *st)
{
	int ret = 0;

	memset(st, 0, sizeof(*st));
	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto out_unlock;
	}
	st->allocations = emu_dev.nr_allocs;
	st->bytes_allocated = emu_dev.bytes_allocated;
	st->pins_outstanding = emu_dev.nr_pins;
	st->get_pages_calls = emu_dev.get_pages_calls;
	st->put_pages_calls = emu_dev.put_pages_calls;
	st->freed_while_pinned = emu_dev.freed_while_pinned;
	st->bar_size = emu_dev.bar_size;
	st->dmabufs_live = emu_dev.nr_dmabufs;
	st->dmabuf_exports = emu_dev.dmabuf_exports;
	st->dmabuf_mappings = emu_dev.nr_dmabuf_mappings;
	st->freed_while_exported = emu_dev.freed_while_exported;
	st->get_pages_refused = emu_dev.get_pages_refused;
	st->put_pages_mmap_locked = emu_dev.put_pages_mmap_locked;
	st->get_pages_while_disabled = emu_dev.get_pages_while_disabled;
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

static int __init emu_init(void)
{
	int ret;

	ret = emu_chardev_register();
	if (ret)
		return ret;

	if (emu_disable_driver) {
		pr_notice("loaded with disable_driver=1: PCI driver not registered\n");
		return 0;
	}
	ret = emu_pci_register();
	if (ret)
		goto err_chardev_unregister;

	return 0;

err_chardev_unregister:
	emu_chardev_unregister();
	return ret;
}

/*
 * Runs only once nothing can call in: open files hold a module reference (fops.owner) and
 * mtgdrdrv holds one by linking our symbols, so it is unloaded first.
 */
static void __exit emu_exit(void)
{
	if (!emu_disable_driver)
		emu_pci_unregister();
	emu_chardev_unregister();
	emu_p2p_drop_all();

	WARN(!list_empty(&emu_dev.allocs), KBUILD_MODNAME ": allocations leaked at exit\n");
}

module_init(emu_init);
module_exit(emu_exit);

MODULE_DESCRIPTION("Test-only emulation of the Moore Threads mtgpu p2p provider on QEMU ivshmem");
MODULE_LICENSE("Dual MIT/GPL");
