/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * mtgpu_emu: shims for kernel API differences between 5.10 and 7.2. mtgdrdrv's compat.h (which
 * this includes) holds the shims both modules need; the ones here only the emulator needs. Each
 * is chosen by a build-time probe (see Kbuild) and names the kernel change.
 */
#ifndef MTGPU_EMU_COMPAT_H
#define MTGPU_EMU_COMPAT_H

/* This module's conftest.h (mtgdrdrv's probes and its own) before mtgdrdrv's compat.h asks. */
#include "conftest.h"
#include "../../mtgdrdrv/kmod/compat.h"

/*
 * A reference on *f if it still has one, else NULL: the file may be on its way to release.
 * Linux 6.7, "file: convert to SLAB_TYPESAFE_BY_RCU", added get_file_active() for that and
 * made get_file_rcu() take the address of an RCU-protected pointer; before, get_file_rcu(file)
 * was the same increment-unless-zero of f_count. Probe: get_file_active.c.
 */
#ifndef MTGDRDRV_HAVE_GET_FILE_ACTIVE
static inline struct file *get_file_active(struct file **f)
{
	return get_file_rcu(*f) ? *f : NULL;
}
#endif

/*
 * The dma-buf symbols live in the DMA_BUF namespace since 5.16 (importing it before is
 * harmless). Linux 6.13 turned namespace names into string literals. Probe:
 * module_import_ns_identifier.c.
 */
#ifdef MTGDRDRV_HAVE_MODULE_IMPORT_NS_IDENTIFIER
#define EMU_DMA_BUF_NS DMA_BUF
#else
#define EMU_DMA_BUF_NS "DMA_BUF"
#endif

/*
 * Not shimmed, because unchanged from 5.10 to 7.2 as used here (the kernel matrix builds prove
 * it): DEFINE_DMA_BUF_EXPORT_INFO(), dma_buf_export(), dma_buf_put(), and the dma_buf_ops
 * members map_dma_buf, unmap_dma_buf, release and mmap with their 5.10 signatures. (vmap,
 * begin_cpu_access and pin did change, and are not implemented.)
 */

#endif /* MTGPU_EMU_COMPAT_H */
