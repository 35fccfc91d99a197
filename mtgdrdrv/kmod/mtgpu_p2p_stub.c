// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * Build-time CRC stub for mtgpu's P2P API. NEVER INSTALLED, NEVER LOADED.
 *
 * mtgdrdrv links directly against mtgpu's mtgpu_p2p_get_pages() and
 * mtgpu_p2p_put_pages() (plain EXPORT_SYMBOL, so symbol_get() is not an
 * option on >= 6.6 kernels). When mtgpu's Module.symvers is not available
 * (MTGPU_SYMVERS unset and not found), this module is built next to
 * mtgdrdrv so that modpost resolves those imports, with modversion CRCs
 * computed from the same declarations (mtgpu_p2p.h) as mtgpu's own. At load
 * time, mtgdrdrv binds to the real mtgpu module (or to the test emulator).
 *
 * The install target of the Makefile skips this module, and its init
 * refuses to load, so the stub can never stand in for mtgpu by accident.
 * Keep the prototypes exactly as mtgpu_p2p.h declares them.
 */
#include <linux/errno.h>
#include <linux/init.h>
#include <linux/module.h>

#include "mtgpu_p2p.h"

int mtgpu_p2p_get_pages(u64 gpu_va, u64 length,
			struct mtgpu_p2p_page_table **page_table_ptr)
{
	return -EINVAL;
}
EXPORT_SYMBOL(mtgpu_p2p_get_pages);

int mtgpu_p2p_put_pages(u64 gpu_va, struct mtgpu_p2p_page_table *page_table)
{
	return -EINVAL;
}
EXPORT_SYMBOL(mtgpu_p2p_put_pages);

static int __init mtgpu_p2p_stub_init(void)
{
	return -EPERM;
}
module_init(mtgpu_p2p_stub_init);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("Build-time CRC stub for mtgpu_p2p_*; never loaded");
