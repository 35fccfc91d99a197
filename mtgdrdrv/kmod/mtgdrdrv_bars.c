// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * Where a pin may point: the memory BARs of the PCI devices bound to mtgpu's
 * PCI driver ("mtgpu").
 *
 * mtgpu_p2p_get_pages() does not check what kind of memory backs a GPU
 * address: for host-backed memory it would return system RAM, and nothing
 * stops a bad table from holding 0 or an address past a BAR. Mapping such
 * pages write-combined into user space would hand out RAM (and, on x86,
 * change the cache mode of the kernel's own mapping of it). So every address
 * of a table is checked against a snapshot of those BARs, taken at each pin.
 *
 * The same driver tells whether mtgpu is initialised at all: loaded with
 * disable_driver=1 (as its vendor's DKMS post_install leaves it until
 * reboot), mtgpu exports its symbols but never registers its PCI driver, and
 * mtgpu_p2p_get_pages() then dereferences NULL. Pins are refused before the
 * call while the driver is not registered.
 *
 * driver_find() returns the driver without a reference. It stays valid while
 * mtgpu is loaded, and mtgpu cannot be unloaded while this module links to
 * it; device binding may change, which only makes a snapshot stale, never
 * invalid memory.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/ioport.h>
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/slab.h>

#include "mtgdrdrv.h"
#include "compat.h"

/* Memory BARs of the provider's devices, [start, end] inclusive. */
struct mtgdrdrv_bars {
	unsigned int nr;
	unsigned int max;
	struct mtgdrdrv_bar {
		u64 start;
		u64 end;
	} bar[];
};

static struct device_driver *mtgdrdrv_provider_driver(void)
{
	return driver_find(MTGDRDRV_PROVIDER_DRIVER, &pci_bus_type);
}

/* Whether mtgpu's PCI driver is registered, i.e. mtgpu was initialised. */
bool mtgdrdrv_provider_registered(void)
{
	return mtgdrdrv_provider_driver();
}

static int mtgdrdrv_count_device(struct device *dev, void *data)
{
	(*(unsigned int *)data)++;
	return 0;
}

/* An assigned, enabled, prefetchable memory BAR: device memory. */
static bool mtgdrdrv_bar_usable(const struct resource *res)
{
	if (resource_type(res) != IORESOURCE_MEM ||
	    !(res->flags & IORESOURCE_PREFETCH))
		return false;
	if (res->flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED) ||
	    !res->parent)
		return false;
	return resource_size(res) && res->end >= res->start;
}

static int mtgdrdrv_add_device(struct device *dev, void *data)
{
	struct mtgdrdrv_bars *bars = data;
	struct pci_dev *pdev = to_pci_dev(dev);
	int i;

	for (i = 0; i < PCI_STD_NUM_BARS; i++) {
		const struct resource *res = &pdev->resource[i];

		if (!mtgdrdrv_bar_usable(res))
			continue;
		if (bars->nr == bars->max)
			return -ENOSPC;	/* a device bound since we counted */
		bars->bar[bars->nr].start = res->start;
		bars->bar[bars->nr].end = res->end;
		bars->nr++;
	}
	return 0;
}

/**
 * mtgdrdrv_bars_get() - snapshot the memory BARs pins may point into
 *
 * Returns the snapshot (free it with mtgdrdrv_bars_free()), ERR_PTR(-ENODEV)
 * when mtgpu's PCI driver is not registered or has no device, or
 * ERR_PTR(-ENOMEM).
 */
struct mtgdrdrv_bars *mtgdrdrv_bars_get(void)
{
	struct device_driver *drv = mtgdrdrv_provider_driver();
	struct mtgdrdrv_bars *bars;
	unsigned int devices = 0;
	int ret;

	if (!drv)
		return ERR_PTR(-ENODEV);
	ret = driver_for_each_device(drv, NULL, &devices, mtgdrdrv_count_device);
	if (ret)
		return ERR_PTR(ret);
	if (!devices)
		return ERR_PTR(-ENODEV);

	bars = kzalloc(struct_size(bars, bar, devices * PCI_STD_NUM_BARS),
		       GFP_KERNEL_ACCOUNT);
	if (!bars)
		return ERR_PTR(-ENOMEM);
	bars->max = devices * PCI_STD_NUM_BARS;
	/* -ENOSPC: a device bound since the count is not in this snapshot. */
	ret = driver_for_each_device(drv, NULL, bars, mtgdrdrv_add_device);
	if (ret && ret != -ENOSPC) {
		kfree(bars);
		return ERR_PTR(ret);
	}
	if (!bars->nr) {
		kfree(bars);
		return ERR_PTR(-ENODEV);
	}
	return bars;
}

/* Whether [pa, pa + len) lies inside one BAR of @bars. */
bool mtgdrdrv_bars_contain(const struct mtgdrdrv_bars *bars, u64 pa, u64 len)
{
	u64 last;
	unsigned int i;

	if (!len || check_add_overflow(pa, len - 1, &last))
		return false;
	for (i = 0; i < bars->nr; i++) {
		if (pa >= bars->bar[i].start && last <= bars->bar[i].end)
			return true;
	}
	return false;
}

/* The bytes of all BARs of @bars: the default of max_bytes_per_file. */
u64 mtgdrdrv_bars_total(const struct mtgdrdrv_bars *bars)
{
	u64 total = 0;
	unsigned int i;

	for (i = 0; i < bars->nr; i++)
		total += bars->bar[i].end - bars->bar[i].start + 1;
	return total;
}

/* Whether any byte of [pa, pa + len) is System RAM (len > 0). */
bool mtgdrdrv_is_ram(u64 pa, u64 len)
{
	return region_intersects(pa, len, IORESOURCE_SYSTEM_RAM,
				 IORES_DESC_NONE) != REGION_DISJOINT;
}

static int mtgdrdrv_check_run(void *ctx, u64 off, phys_addr_t pa, u64 len)
{
	const struct mtgdrdrv_bars *bars = ctx;

	return mtgdrdrv_bars_contain(bars, pa, len) ? 0 : -ENODEV;
}

/*
 * Whether bytes [0, len) of the pin still lie in the memory BARs @bars: 0 or
 * -ENODEV. A PCI remove (and rescan) may have taken or moved the BARs after
 * the pin was made; the pin then holds addresses of nothing, or of another
 * device.
 */
int mtgdrdrv_pages_check_bars(const struct mtgdrdrv_pages *pages, u64 len,
			      const struct mtgdrdrv_bars *bars)
{
	return mtgdrdrv_pages_for_each_run(pages, len, mtgdrdrv_check_run,
					   (void *)bars);
}

void mtgdrdrv_bars_free(struct mtgdrdrv_bars *bars)
{
	kfree(bars);
}
