// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * mtgdrdrv's only contact with the provider: mtgpu_p2p_get_pages() and
 * mtgpu_p2p_put_pages(), the rounding of pinned ranges, and the validation
 * of the page tables the provider returns.
 *
 * Pin rounding rule (for gdrapi.h):
 *
 *   A pin of [addr, addr + size) is first tried on the range rounded to
 *   64 KiB: va = addr & ~0xFFFF, end = round_up(addr + size, 64 KiB). If the
 *   provider refuses that range with -EINVAL (typically because a 4 KiB-page
 *   allocation does not cover the rounded range), the pin is retried on the
 *   range rounded to the host page (PAGE_SIZE), when that range differs.
 *   GET_INFO reports the range actually pinned: va, mapped_size = end - va,
 *   and page_size = the rounding granule used (65536 or PAGE_SIZE; not the
 *   provider's page size). mmap needs addr == va (offset 0), as upstream.
 *
 * The provider's page_size may be anything from PAGE_SIZE up (a power of
 * two): its first page contains va and may start below it (2 MiB pages), so
 * byte @off of the pin lives at cpu_pa_array[i] + (pos % page_size), with
 * pos = (va % page_size) + off and i = pos / page_size.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/overflow.h>
#include <linux/sched.h>

#include "mtgdrdrv.h"
#include "mtgdrdrv_arch.h"

/* Rounds [addr, addr + size) out to @granule; false on overflow. */
static bool mtgdrdrv_round(u64 addr, u64 size, u64 granule,
			   u64 *start, u64 *len)
{
	u64 end;

	if (check_add_overflow(addr, size, &end) ||
	    check_add_overflow(end, granule - 1, &end))
		return false;
	*start = addr & ~(granule - 1);
	*len = (end & ~(granule - 1)) - *start;
	return true;
}

static void mtgdrdrv_put_table(u64 va, struct mtgpu_p2p_page_table *pt)
{
	int ret;

	ret = mtgpu_p2p_put_pages(va, pt);
	atomic64_inc(&mtgdrdrv_counters.put_pages_calls);
	if (ret)
		pr_err_ratelimited("mtgpu_p2p_put_pages(0x%llx) failed: %d\n",
				   va, ret);
}

/* Asks the provider for [va, va + len); @pages is filled on success. */
static int mtgdrdrv_get_table(u64 va, u64 len, u32 granule,
			      struct mtgdrdrv_pages *pages)
{
	struct mtgpu_p2p_page_table *pt = NULL;
	cycles_t t0;
	int ret;

	t0 = mtgdrdrv_cycles();
	ret = mtgpu_p2p_get_pages(va, len, &pt);
	pages->tm_cycles = mtgdrdrv_cycles() - t0;
	if (ret) {
		mtgdrdrv_dbg("mtgpu_p2p_get_pages(0x%llx, 0x%llx): %d\n",
			     va, len, ret);
		return ret;
	}
	if (!pt) {
		pr_err_ratelimited("mtgpu_p2p_get_pages(0x%llx, 0x%llx) returned no page table\n",
				   va, len);
		return -EPROTO;
	}
	atomic64_inc(&mtgdrdrv_counters.get_pages_calls);
	pages->va = va;
	pages->size = len;
	pages->granule = granule;
	pages->pt = pt;
	return 0;
}

static int mtgdrdrv_check_entries(const struct mtgpu_p2p_page_table *pt)
{
	u64 mask = (u64)pt->page_size - 1;
	u32 i;

	for (i = 0; i < pt->array_count; i++) {
		if (pt->cpu_pa_array[i] & mask)
			return -EINVAL;
		if (!(i & 0xfff))
			cond_resched();
	}
	return 0;
}

/*
 * Validates the page table of @pages. -EPROTO: a table this driver cannot
 * read (wrong major version). -EINVAL: a table inconsistent with the range
 * asked for.
 */
static int mtgdrdrv_check_table(struct mtgdrdrv_pages *pages)
{
	const struct mtgpu_p2p_page_table *pt = pages->pt;
	u64 ps, count;

	if (MTGPU_P2P_MAJOR_VERSION(pt->version) !=
	    MTGPU_P2P_MAJOR_VERSION(MTGPU_P2P_PAGE_TABLE_VERSION)) {
		pr_err_ratelimited("page table version 0x%x, expected 0x%x\n",
				   pt->version, MTGPU_P2P_PAGE_TABLE_VERSION);
		return -EPROTO;
	}
	ps = pt->page_size;
	if (!is_power_of_2(ps) || ps < PAGE_SIZE) {
		pr_err_ratelimited("page table with page_size 0x%llx\n", ps);
		return -EINVAL;
	}
	count = ((pages->va & (ps - 1)) + pages->size + ps - 1) / ps;
	if (!pt->cpu_pa_array || pt->array_count != count) {
		pr_err_ratelimited("page table with %u entries for 0x%llx@0x%llx, expected %llu\n",
				   pt->array_count, pages->size, pages->va,
				   count);
		return -EINVAL;
	}
	if (mtgdrdrv_check_entries(pt)) {
		pr_err_ratelimited("page table with an address not aligned to 0x%llx\n",
				   ps);
		return -EINVAL;
	}
	pages->page_shift = ilog2(ps);
	return 0;
}

/* Pins [start, start + len) rounded to @granule. */
static int mtgdrdrv_get_rounded(u64 addr, u64 size, u64 granule,
				struct mtgdrdrv_pages *pages)
{
	u64 start, len;

	if (!mtgdrdrv_round(addr, size, granule, &start, &len))
		return -EINVAL;
	return mtgdrdrv_get_table(start, len, granule, pages);
}

/* True when rounding to the host page gives another range than to 64 KiB. */
static bool mtgdrdrv_can_retry(u64 addr, u64 size)
{
	u64 s64k, l64k, s, l;

	if (PAGE_SIZE >= MTGDRDRV_PIN_GRANULE)
		return false;
	if (!mtgdrdrv_round(addr, size, MTGDRDRV_PIN_GRANULE, &s64k, &l64k) ||
	    !mtgdrdrv_round(addr, size, PAGE_SIZE, &s, &l))
		return false;
	return s != s64k || l != l64k;
}

/**
 * mtgdrdrv_p2p_get() - pin [addr, addr + size) through the provider
 * @addr: GPU virtual address, non-zero
 * @size: length, non-zero, at most MTGDRDRV_MAX_PIN_SIZE, no overflow
 * @pages: filled on success
 *
 * Runs in the context of the process that owns the GPU allocation (the pin
 * ioctl) and may sleep; the caller holds no lock. Applies the rounding rule
 * above. Returns 0 or the provider's error, -EPROTO or -EINVAL for a bad
 * page table (which is put again).
 */
int mtgdrdrv_p2p_get(u64 addr, u64 size, struct mtgdrdrv_pages *pages)
{
	int ret;

	might_sleep();
	ret = mtgdrdrv_get_rounded(addr, size, MTGDRDRV_PIN_GRANULE, pages);
	if (ret == -EINVAL && mtgdrdrv_can_retry(addr, size))
		ret = mtgdrdrv_get_rounded(addr, size, PAGE_SIZE, pages);
	if (ret)
		return ret;

	ret = mtgdrdrv_check_table(pages);
	if (ret) {
		mtgdrdrv_put_table(pages->va, pages->pt);
		pages->pt = NULL;
		return ret;
	}
	atomic64_inc(&mtgdrdrv_counters.pins_outstanding);
	atomic64_add(pages->size, &mtgdrdrv_counters.bytes_pinned);
	mtgdrdrv_dbg("pinned 0x%llx@0x%llx, granule 0x%x, page size 0x%x\n",
		     pages->size, pages->va, pages->granule,
		     pages->pt->page_size);
	return 0;
}

/* Puts what mtgdrdrv_p2p_get() pinned. May sleep; no lock held. */
void mtgdrdrv_p2p_put(struct mtgdrdrv_pages *pages)
{
	might_sleep();
	mtgdrdrv_put_table(pages->va, pages->pt);
	pages->pt = NULL;
	atomic64_dec(&mtgdrdrv_counters.pins_outstanding);
	atomic64_sub(pages->size, &mtgdrdrv_counters.bytes_pinned);
}

/* CPU physical address of byte @off (< pages->size) of the pin. */
phys_addr_t mtgdrdrv_pages_phys(const struct mtgdrdrv_pages *pages, u64 off)
{
	u64 mask = (1ULL << pages->page_shift) - 1;
	u64 pos = (pages->va & mask) + off;

	return pages->pt->cpu_pa_array[pos >> pages->page_shift] + (pos & mask);
}

/*
 * Length of the physically contiguous run that starts at byte @off of the
 * pin, at most @max (off + max <= pages->size).
 */
u64 mtgdrdrv_pages_run(const struct mtgdrdrv_pages *pages, u64 off, u64 max)
{
	const u64 *pa = pages->pt->cpu_pa_array;
	u64 ps = 1ULL << pages->page_shift;
	u64 pos = (pages->va & (ps - 1)) + off;
	u64 i = pos >> pages->page_shift;
	u64 run = ps - (pos & (ps - 1));

	while (run < max && pa[i + 1] == pa[i] + ps) {
		run += ps;
		i++;
	}
	return min(run, max);
}
