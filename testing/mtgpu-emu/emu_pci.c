// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: binding to QEMU's ivshmem-plain device, whose BAR 2 plays the GPU's VRAM BAR.
 *
 * Only one device is served; a second one fails probe with -EBUSY. While none is bound the
 * char device answers -ENODEV. Manual unbind through sysfs is disabled: the device goes away
 * only on module exit (or hot-unplug), when pins still outstanding are reported and orphaned.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/limits.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/sizes.h>

#include "emu.h"

#define EMU_IVSHMEM_DEVICE_ID 0x1110	/* ivshmem; vendor is Red Hat/Qumranet */

static int emu_pci_check_bar(struct pci_dev *pdev)
{
	resource_size_t start = pci_resource_start(pdev, EMU_BAR);
	resource_size_t len = pci_resource_len(pdev, EMU_BAR);

	if (!(pci_resource_flags(pdev, EMU_BAR) & IORESOURCE_MEM)) {
		dev_err(&pdev->dev, "BAR%d is not a memory BAR\n", EMU_BAR);
		return -ENODEV;
	}
	if (!len || !IS_ALIGNED(start, EMU_UNIT_SIZE) || !IS_ALIGNED(len, EMU_UNIT_SIZE) ||
	    len >> EMU_UNIT_SHIFT > UINT_MAX) {
		dev_err(&pdev->dev, "BAR%d %pR: unusable size or alignment\n", EMU_BAR,
			&pdev->resource[EMU_BAR]);
		return -ENODEV;
	}
	return 0;
}

/* Publishes the BAR to the rest of the module; @map becomes its allocation bitmap. */
static int emu_bar_bind(struct pci_dev *pdev, unsigned long *map)
{
	int ret = 0;

	mutex_lock(&emu_dev.lock);
	if (emu_bound()) {
		ret = -EBUSY;
		goto out_unlock;
	}
	emu_dev.pdev = pdev;
	emu_dev.bar_phys = pci_resource_start(pdev, EMU_BAR);
	emu_dev.bar_size = pci_resource_len(pdev, EMU_BAR);
	emu_dev.bar_units = emu_dev.bar_size >> EMU_UNIT_SHIFT;
	emu_dev.bar_map = map;
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

/* Frees every allocation in the BAR, unpublishes it and returns its bitmap to free. */
static unsigned long *emu_bar_unbind(struct pci_dev *pdev)
{
	unsigned long *map;

	mutex_lock(&emu_dev.lock);
	WARN_ON(emu_dev.pdev != pdev);
	emu_test_unbind();
	emu_alloc_drop_all();
	map = emu_dev.bar_map;
	emu_dev.pdev = NULL;
	emu_dev.bar_phys = 0;
	emu_dev.bar_size = 0;
	emu_dev.bar_units = 0;
	emu_dev.bar_map = NULL;
	mutex_unlock(&emu_dev.lock);
	return map;
}

static int emu_pci_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	unsigned long *map;
	int ret;

	ret = emu_pci_check_bar(pdev);
	if (ret)
		return ret;

	ret = pci_enable_device(pdev);
	if (ret)
		return ret;

	ret = pci_request_region(pdev, EMU_BAR, KBUILD_MODNAME);
	if (ret)
		goto err_disable_device;

	map = bitmap_zalloc(pci_resource_len(pdev, EMU_BAR) >> EMU_UNIT_SHIFT, GFP_KERNEL);
	if (!map) {
		ret = -ENOMEM;
		goto err_release_region;
	}

	ret = emu_bar_bind(pdev, map);
	if (ret) {
		dev_err(&pdev->dev, "another ivshmem device is already bound\n");
		goto err_free_map;
	}

	dev_info(&pdev->dev, "BAR%d %pR (%llu MiB) backs /dev/%s\n", EMU_BAR,
		 &pdev->resource[EMU_BAR],
		 (unsigned long long)pci_resource_len(pdev, EMU_BAR) / SZ_1M,
		 MTGPU_EMU_DEVICE_NAME);
	return 0;

err_free_map:
	bitmap_free(map);
err_release_region:
	pci_release_region(pdev, EMU_BAR);
err_disable_device:
	pci_disable_device(pdev);
	return ret;
}

static void emu_pci_remove(struct pci_dev *pdev)
{
	bitmap_free(emu_bar_unbind(pdev));
	pci_release_region(pdev, EMU_BAR);
	pci_disable_device(pdev);
}

static const struct pci_device_id emu_pci_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_REDHAT_QUMRANET, EMU_IVSHMEM_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, emu_pci_ids);

static struct pci_driver emu_pci_driver = {
	.name = "mtgpu",
	.id_table = emu_pci_ids,
	.probe = emu_pci_probe,
	.remove = emu_pci_remove,
	.driver.suppress_bind_attrs = true,
};

int emu_pci_register(void)
{
	return pci_register_driver(&emu_pci_driver);
}

void emu_pci_unregister(void)
{
	pci_unregister_driver(&emu_pci_driver);
}
