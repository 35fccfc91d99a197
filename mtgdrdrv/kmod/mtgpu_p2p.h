/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * The peer-to-peer page API exported by Moore Threads' mtgpu driver, restated from its public
 * header (inc/mtgpu/mtgpu_p2p.h). Types and prototypes must stay exactly as mtgpu declares them:
 * the modversion CRCs computed from this file (by the co-built stub) must equal the real ones.
 *
 * Semantics relied upon: get_pages resolves gpu_va in the calling process and may sleep; it
 * returns one CPU physical address per page of page_size (a per-allocation power of two), the
 * first entry being the page that contains gpu_va. A pin holds the memory until put_pages;
 * there is no invalidation callback. put_pages ignores gpu_va except for logging.
 */
#ifndef MTGPU_P2P_H
#define MTGPU_P2P_H

#include <linux/types.h>

#define MTGPU_P2P_MAJOR_VERSION_OFFSET 16
#define MTGPU_P2P_MAJOR_VERSION_MASK 0xffff0000
#define MTGPU_P2P_MINOR_VERSION_MASK 0x0000ffff
#define MTGPU_P2P_VERSION(major, minor) \
	((((major) << MTGPU_P2P_MAJOR_VERSION_OFFSET) & MTGPU_P2P_MAJOR_VERSION_MASK) | \
	 ((minor) & MTGPU_P2P_MINOR_VERSION_MASK))
#define MTGPU_P2P_MAJOR_VERSION(v) \
	(((v) & MTGPU_P2P_MAJOR_VERSION_MASK) >> MTGPU_P2P_MAJOR_VERSION_OFFSET)
#define MTGPU_P2P_MINOR_VERSION(v) ((v) & MTGPU_P2P_MINOR_VERSION_MASK)

#define MTGPU_P2P_PAGE_TABLE_VERSION MTGPU_P2P_VERSION(1, 0)

struct mtgpu_p2p_page_table {
	u32 version;
	u32 page_size;
	u64 *cpu_pa_array;
	u32 array_count;
};

int mtgpu_p2p_get_pages(u64 gpu_va, u64 length,
			struct mtgpu_p2p_page_table **page_table_ptr);
int mtgpu_p2p_put_pages(u64 gpu_va, struct mtgpu_p2p_page_table *page_table);

#endif /* MTGPU_P2P_H */
