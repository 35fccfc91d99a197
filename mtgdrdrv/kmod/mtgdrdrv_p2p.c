// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * mtgdrdrv's only contact with the provider: mtgpu_p2p_get_pages() and
 * mtgpu_p2p_put_pages(), and the validation of the page tables they return.
 *
 * Pin rounding rule (for gdrapi.h): a pin of [addr, addr + size) pins the
 * range rounded out to the host page: va = addr & PAGE_MASK, end =
 * PAGE_ALIGN(addr + size). GET_INFO reports va, mapped_size = end - va and
 * page_size = PAGE_SIZE. mmap needs addr == va (offset 0), as upstream.
 *
 * What the provider returns, as measured on mtgpu (see the kmod README):
 * - page_size is per allocation (any power of two, default the host page);
 * - entry 0 of cpu_pa_array is the address of gpu_va itself, in-page offset
 *   included; entries 1.. are page bases. A page base in entry 0 is accepted
 *   too: entry 0 is valid when its low bits equal gpu_va's or are zero;
 * - drivers 2.7 return ((gpu_va % ps) + length + ps - 1) / ps entries;
 *   2.1.2 to 2.6 return ceil(length / ps), one short when gpu_va is not
 *   page aligned. Such a short table is put and the range asked for again,
 *   aligned to ps (inside the allocation: mtgpu allocations are aligned and
 *   sized to their contiguity);
 * - a sparse allocation gives a compacted array, which cannot be mapped:
 *   any count other than the two above refuses the pin;
 * - the array is allocated before the range is checked, so a pin is asked
 *   for in chunks of MTGDRDRV_CHUNK_SIZE, each its own table;
 * - nothing is checked about the memory kind: every run must be disjoint
 *   from System RAM, lie in an assigned prefetchable memory BAR of an mtgpu
 *   device (mtgdrdrv_bars.c), be page aligned (but entry 0) and appear once.
 *
 * A pin holds at most max_runs_per_pin physically contiguous runs (16 bytes
 * each here, and one x86 memtype entry each while mapped WC): more fail with
 * -ENOSPC, counted in pins_over_limit, before anything is allocated for them.
 *
 * A refused call is not retried (mtgpu logs every refusal, unrated). The
 * validated table is kept as runs of physical addresses (extents) in module
 * memory, charged to the caller's memory cgroup; mmap never reads the
 * provider's array.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/math64.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/overflow.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/sort.h>

#include "mtgdrdrv.h"
#include "mtgdrdrv_arch.h"

/*
 * 1 Mi runs: 4 GiB of memory fragmented into 4 KiB pieces, 16 MiB of run
 * records. mtgpu hands out memory in large contiguous blocks; only a broken
 * or hostile table comes near this.
 */
unsigned int mtgdrdrv_max_runs_per_pin = 1U << 20;
module_param_named(max_runs_per_pin, mtgdrdrv_max_runs_per_pin, uint, 0644);
MODULE_PARM_DESC(max_runs_per_pin,
		 "Physically contiguous runs one pin may have (default: 1048576)");

/* Why a table was refused; named in the (rate-limited) log line. */
#define mtgdrdrv_bad_table(fmt, ...)					\
	do {								\
		atomic64_inc(&mtgdrdrv_counters.bad_tables);		\
		pr_err_ratelimited("pin refused: mtgpu page table " fmt, \
				   ##__VA_ARGS__);			\
	} while (0)

static void mtgdrdrv_put_table(u64 va, struct mtgpu_p2p_page_table *pt)
{
	int ret;

	ret = mtgpu_p2p_put_pages(va, pt);
	atomic64_inc(&mtgdrdrv_counters.put_pages_calls);
	if (ret)
		pr_err_ratelimited("mtgpu_p2p_put_pages(0x%llx) failed: %d\n",
				   va, ret);
}

/* One get_pages call; the provider has logged its own refusal. */
static int mtgdrdrv_get_table(u64 va, u64 len, struct mtgpu_p2p_page_table **ptp,
			      cycles_t *cycles)
{
	struct mtgpu_p2p_page_table *pt = NULL;
	cycles_t t0;
	int ret;

	t0 = mtgdrdrv_cycles();
	ret = mtgpu_p2p_get_pages(va, len, &pt);
	*cycles += mtgdrdrv_cycles() - t0;
	if (ret) {
		atomic64_inc(&mtgdrdrv_counters.get_pages_refused);
		mtgdrdrv_dbg("mtgpu_p2p_get_pages(0x%llx, 0x%llx): %d\n",
			     va, len, ret);
		return ret;
	}
	if (!pt) {
		/* Nothing to put back: count it as a call that failed. */
		atomic64_inc(&mtgdrdrv_counters.get_pages_refused);
		mtgdrdrv_bad_table("missing for 0x%llx bytes\n", len);
		return -EPROTO;
	}
	atomic64_inc(&mtgdrdrv_counters.get_pages_calls);
	*ptp = pt;
	return 0;
}

/*
 * The header of a table: a version this driver reads (-EPROTO otherwise),
 * a power-of-two page size of at least the host page, an array.
 */
static int mtgdrdrv_check_header(const struct mtgpu_p2p_page_table *pt)
{
	if (MTGPU_P2P_MAJOR_VERSION(pt->version) !=
	    MTGPU_P2P_MAJOR_VERSION(MTGPU_P2P_PAGE_TABLE_VERSION)) {
		mtgdrdrv_bad_table("version 0x%x, expected 0x%x\n",
				   pt->version, MTGPU_P2P_PAGE_TABLE_VERSION);
		return -EPROTO;
	}
	if (!is_power_of_2(pt->page_size) || pt->page_size < PAGE_SIZE) {
		mtgdrdrv_bad_table("page size 0x%x\n", pt->page_size);
		return -EINVAL;
	}
	if (!pt->cpu_pa_array || !pt->array_count) {
		mtgdrdrv_bad_table("without addresses\n");
		return -EINVAL;
	}
	return 0;
}

/* Entries of a table of [va, va + len) with page size @ps. */
static u64 mtgdrdrv_full_count(u64 va, u64 len, u64 ps)
{
	return div64_u64((va & (ps - 1)) + len + ps - 1, ps);
}

/* The same, as drivers 2.1.2 to 2.6 count them. */
static u64 mtgdrdrv_short_count(u64 len, u64 ps)
{
	return div64_u64(len + ps - 1, ps);
}

/* A table being turned into a chunk: what was asked, what came back. */
struct mtgdrdrv_table {
	u64 va;			/* asked for [va, va + len) */
	u64 len;
	struct mtgpu_p2p_page_table *pt;
};

/*
 * Gets a table for [va, va + len), or for the range around it aligned to
 * the provider's page size when the provider counts the short way. @tbl
 * holds a table exactly when 0 is returned.
 */
static int mtgdrdrv_get_full_table(u64 va, u64 len, struct mtgdrdrv_table *tbl,
				   cycles_t *cycles)
{
	u64 ps, start, end;
	int ret;

	tbl->va = va;
	tbl->len = len;
	ret = mtgdrdrv_get_table(va, len, &tbl->pt, cycles);
	if (ret)
		return ret;
	ret = mtgdrdrv_check_header(tbl->pt);
	if (ret)
		goto err_put;

	ps = tbl->pt->page_size;
	if (tbl->pt->array_count == mtgdrdrv_full_count(va, len, ps))
		return 0;
	if (!(va & (ps - 1)) ||
	    tbl->pt->array_count != mtgdrdrv_short_count(len, ps)) {
		mtgdrdrv_bad_table("with %u entries for 0x%llx bytes of 0x%x pages (sparse memory?)\n",
				   tbl->pt->array_count, len, tbl->pt->page_size);
		ret = -EINVAL;
		goto err_put;
	}

	/* A 2.1.2-2.6 driver: ask for whole pages, where both counts agree. */
	pr_info_once("mtgpu returns one entry short for unaligned addresses (driver before 2.7); asking for whole pages\n");
	mtgdrdrv_put_table(tbl->va, tbl->pt);
	start = va & ~(ps - 1);
	end = round_up(va + len, ps);
	tbl->va = start;
	tbl->len = end - start;
	ret = mtgdrdrv_get_table(tbl->va, tbl->len, &tbl->pt, cycles);
	if (ret)
		return ret;
	ret = mtgdrdrv_check_header(tbl->pt);
	if (ret)
		goto err_put;
	if (tbl->pt->page_size != ps ||
	    tbl->pt->array_count != mtgdrdrv_full_count(start, tbl->len, ps)) {
		mtgdrdrv_bad_table("with %u entries for 0x%llx aligned bytes of 0x%x pages\n",
				   tbl->pt->array_count, tbl->len,
				   tbl->pt->page_size);
		ret = -EINVAL;
		goto err_put;
	}
	return 0;

err_put:
	mtgdrdrv_put_table(tbl->va, tbl->pt);
	return ret;
}

/*
 * The physical address of byte @pos of the table's range counted from the
 * start of its first page, or an error: entry 0 may carry gpu_va's in-page
 * offset or none, every other entry is a page base.
 */
static int mtgdrdrv_entry_base(const struct mtgdrdrv_table *tbl, u32 i,
			       u64 *base)
{
	u64 ps = tbl->pt->page_size;
	u64 pa = tbl->pt->cpu_pa_array[i];
	u64 low = pa & (ps - 1);

	if (i == 0 && low && low != (tbl->va & (ps - 1))) {
		mtgdrdrv_bad_table("entry 0 with an offset other than the address's\n");
		return -EINVAL;
	}
	if (i != 0 && low) {
		mtgdrdrv_bad_table("entry %u not aligned to its page size\n", i);
		return -EINVAL;
	}
	*base = pa - low;
	return 0;
}

/*
 * Calls @fn for each physically contiguous run of bytes [va, va + len) of
 * the table (len > 0, inside the table's range); stops at the first error.
 */
static int mtgdrdrv_table_runs(const struct mtgdrdrv_table *tbl, u64 va,
			       u64 len, mtgdrdrv_run_fn fn, void *ctx)
{
	u64 ps = tbl->pt->page_size;
	u64 pos = (tbl->va & (ps - 1)) + (va - tbl->va);
	u64 off = 0, run_off = 0, run_pa = 0, run_len = 0;
	u64 base, piece;
	int ret;

	while (off < len) {
		ret = mtgdrdrv_entry_base(tbl, div64_u64(pos, ps), &base);
		if (ret)
			return ret;
		piece = min(ps - (pos & (ps - 1)), len - off);
		base += pos & (ps - 1);
		if (run_len && base == run_pa + run_len) {
			run_len += piece;
		} else {
			if (run_len) {
				ret = fn(ctx, run_off, run_pa, run_len);
				if (ret)
					return ret;
			}
			run_off = off;
			run_pa = base;
			run_len = piece;
		}
		off += piece;
		pos += piece;
	}
	return fn(ctx, run_off, run_pa, run_len);
}

/* Building a chunk's extents: counted first, then stored. */
struct mtgdrdrv_extent_sink {
	const struct mtgdrdrv_bars *bars;
	struct mtgdrdrv_chunk *chunk;	/* NULL while counting */
	u32 nr;
	u32 max;			/* runs this chunk may still add */
};

/* Says why a pin has too many runs; -ENOSPC. */
static int mtgdrdrv_too_many_runs(void)
{
	atomic64_inc(&mtgdrdrv_counters.pins_over_limit);
	pr_warn_ratelimited("pin refused: more than %u physically contiguous runs (module parameter max_runs_per_pin)\n",
			    READ_ONCE(mtgdrdrv_max_runs_per_pin));
	return -ENOSPC;
}

static int mtgdrdrv_sink_run(void *ctx, u64 off, phys_addr_t pa, u64 len)
{
	struct mtgdrdrv_extent_sink *sink = ctx;

	if (!sink->chunk && mtgdrdrv_is_ram(pa, len)) {
		mtgdrdrv_bad_table("address in System RAM\n");
		mtgdrdrv_dbg("run 0x%llx@0x%llx is System RAM\n", len, (u64)pa);
		return -EINVAL;
	}
	if (!mtgdrdrv_bars_contain(sink->bars, pa, len)) {
		mtgdrdrv_bad_table("address outside the memory BARs of mtgpu's devices (0, past a BAR, or a BAR that is unassigned, disabled or not prefetchable)\n");
		mtgdrdrv_dbg("run 0x%llx@0x%llx is in no BAR\n", len, (u64)pa);
		return -EINVAL;
	}
	if (!sink->chunk && sink->nr >= sink->max)
		return mtgdrdrv_too_many_runs();
	if (sink->chunk) {
		sink->chunk->extents[sink->nr].pa = pa;
		sink->chunk->extents[sink->nr].len = len;
	}
	sink->nr++;
	return 0;
}

/*
 * Pins [va, va + len), one chunk, and validates its addresses; the chunk
 * may have at most @max runs.
 */
static int mtgdrdrv_chunk_get(u64 va, u64 len, const struct mtgdrdrv_bars *bars,
			      u32 max, struct mtgdrdrv_chunk **chunkp,
			      cycles_t *cycles)
{
	struct mtgdrdrv_extent_sink sink = { .bars = bars, .max = max };
	struct mtgdrdrv_chunk *chunk;
	struct mtgdrdrv_table tbl;
	int ret;

	ret = mtgdrdrv_get_full_table(va, len, &tbl, cycles);
	if (ret)
		return ret;
	ret = mtgdrdrv_table_runs(&tbl, va, len, mtgdrdrv_sink_run, &sink);
	if (ret)
		goto err_put;

	chunk = kvmalloc(struct_size(chunk, extents, sink.nr),
			 GFP_KERNEL_ACCOUNT | __GFP_NOWARN);
	if (!chunk) {
		ret = -ENOMEM;
		goto err_put;
	}
	chunk->gpu_va = tbl.va;
	chunk->pt = tbl.pt;
	chunk->nr_extents = sink.nr;
	sink.chunk = chunk;
	sink.nr = 0;
	mtgdrdrv_table_runs(&tbl, va, len, mtgdrdrv_sink_run, &sink);
	*chunkp = chunk;
	return 0;

err_put:
	mtgdrdrv_put_table(tbl.va, tbl.pt);
	return ret;
}

static void mtgdrdrv_chunk_put(struct mtgdrdrv_chunk *chunk)
{
	mtgdrdrv_put_table(chunk->gpu_va, chunk->pt);
	kvfree(chunk);
}

/* Puts every chunk of @pages and frees its chunk array. */
static void mtgdrdrv_pages_release(struct mtgdrdrv_pages *pages)
{
	u32 i;

	for (i = 0; i < pages->nr_chunks; i++) {
		mtgdrdrv_chunk_put(pages->chunks[i]);
		cond_resched();
	}
	kvfree(pages->chunks);
	pages->chunks = NULL;
	pages->nr_chunks = 0;
}

static int mtgdrdrv_cmp_extent(const void *a, const void *b)
{
	const struct mtgdrdrv_extent *x = a, *y = b;

	return x->pa < y->pa ? -1 : x->pa > y->pa;
}

/* Copies @chunk's extents to @out, widened to whole blocks of @gran. */
static size_t mtgdrdrv_chunk_blocks(const struct mtgdrdrv_chunk *chunk,
				    struct mtgdrdrv_extent *out)
{
	u64 gran = min_t(u64, chunk->pt->page_size, MTGDRDRV_CHUNK_SIZE);
	u64 start, end;
	u32 e;

	for (e = 0; e < chunk->nr_extents; e++) {
		start = round_down(chunk->extents[e].pa, gran);
		end = round_up(chunk->extents[e].pa + chunk->extents[e].len, gran);
		out[e].pa = start;
		out[e].len = end - start;
	}
	return chunk->nr_extents;
}

/*
 * Whether a page appears twice in the pin. Pages are compared as blocks of
 * the page size, or of the chunk size for larger pages: a page larger than a
 * chunk is legitimately shared by neighbouring chunks, each using its own
 * chunk-aligned part. The runs were capped while the chunks were built; the
 * cap is checked again before the allocation, which must never be asked for
 * more than kvmalloc() serves without a warning.
 */
static int mtgdrdrv_check_repeats(const struct mtgdrdrv_pages *pages)
{
	struct mtgdrdrv_extent *all;
	size_t n = 0, i;
	u32 c;
	int ret = 0;

	for (c = 0; c < pages->nr_chunks; c++)
		n += pages->chunks[c]->nr_extents;
	if (n < 2)
		return 0;
	if (n > READ_ONCE(mtgdrdrv_max_runs_per_pin))
		return mtgdrdrv_too_many_runs();
	all = kvmalloc_array(n, sizeof(*all),
			     GFP_KERNEL_ACCOUNT | __GFP_NOWARN);
	if (!all)
		return -ENOMEM;
	for (c = 0, n = 0; c < pages->nr_chunks; c++)
		n += mtgdrdrv_chunk_blocks(pages->chunks[c], &all[n]);
	cond_resched();
	sort(all, n, sizeof(*all), mtgdrdrv_cmp_extent, NULL);
	for (i = 1; i < n; i++) {
		if (all[i].pa - all[i - 1].pa < all[i - 1].len) {
			mtgdrdrv_bad_table("maps one page twice\n");
			ret = -EINVAL;
			break;
		}
	}
	kvfree(all);
	return ret;
}

/*
 * The BARs pins may point into; ERR_PTR(-ENODEV), counted and logged, while
 * mtgpu is not initialised (its get_pages would oops) or has no device.
 */
struct mtgdrdrv_bars *mtgdrdrv_p2p_bars(void)
{
	struct mtgdrdrv_bars *bars = mtgdrdrv_bars_get();

	if (PTR_ERR_OR_ZERO(bars) != -ENODEV)
		return bars;
	atomic64_inc(&mtgdrdrv_counters.provider_unavailable);
	if (!mtgdrdrv_provider_registered())
		pr_warn_ratelimited("pin refused: mtgpu is loaded but not initialised (its PCI driver is not registered; disable_driver=1?): reload mtgpu without disable_driver=1, or reboot\n");
	else
		pr_warn_ratelimited("pin refused: no device bound to mtgpu has an assigned, enabled, prefetchable memory BAR\n");
	return bars;
}

/* Bytes from @va to the end of its chunk or to @end, whichever is first. */
static u64 mtgdrdrv_chunk_len(u64 va, u64 end)
{
	u64 to_boundary = MTGDRDRV_CHUNK_SIZE - (va & (MTGDRDRV_CHUNK_SIZE - 1));

	return min(to_boundary, end - va);
}

/* Pins the chunks of [pages->va, pages->va + pages->size). */
static int mtgdrdrv_get_chunks(struct mtgdrdrv_pages *pages,
			       const struct mtgdrdrv_bars *bars)
{
	u64 end = pages->va + pages->size;
	u64 n = div64_u64(end - 1, MTGDRDRV_CHUNK_SIZE) -
		div64_u64(pages->va, MTGDRDRV_CHUNK_SIZE) + 1;
	u32 max_runs = READ_ONCE(mtgdrdrv_max_runs_per_pin);
	struct mtgdrdrv_chunk **chunk;
	u64 va, len;
	int ret;

	pages->chunks = kvcalloc(n, sizeof(*pages->chunks),
				 GFP_KERNEL_ACCOUNT | __GFP_NOWARN);
	if (!pages->chunks)
		return -ENOMEM;
	for (va = pages->va; va < end; va += len) {
		len = mtgdrdrv_chunk_len(va, end);
		chunk = &pages->chunks[pages->nr_chunks];
		ret = mtgdrdrv_chunk_get(va, len, bars,
					 max_runs - pages->nr_runs, chunk,
					 &pages->tm_cycles);
		if (ret)
			return ret;
		pages->nr_chunks++;
		pages->nr_runs += (*chunk)->nr_extents;
		if (fatal_signal_pending(current))
			return -EINTR;
		cond_resched();
	}
	pages->page_size = pages->chunks[0]->pt->page_size;
	return 0;
}

/**
 * mtgdrdrv_p2p_get() - pin [addr, addr + size) through the provider
 * @addr: GPU virtual address, non-zero
 * @size: length, non-zero, at most MTGDRDRV_MAX_PIN_SIZE, no overflow
 * @bars: from mtgdrdrv_p2p_bars(), just taken
 * @pages: zeroed; filled on success
 *
 * Runs in the context of the process that owns the GPU allocation (the pin
 * ioctl) and may sleep; the caller holds no lock. Applies the rounding rule
 * above. Returns 0; the provider's error; -EPROTO or -EINVAL for a bad
 * page table; -ENOSPC for more than max_runs_per_pin runs; -ENOMEM; -EINTR.
 * On error every table taken is put again.
 */
int mtgdrdrv_p2p_get(u64 addr, u64 size, const struct mtgdrdrv_bars *bars,
		     struct mtgdrdrv_pages *pages)
{
	u64 end;
	int ret;

	might_sleep();
	if (check_add_overflow(addr, size, &end) || end > (U64_MAX & PAGE_MASK))
		return -EINVAL;

	pages->va = addr & PAGE_MASK;
	pages->size = PAGE_ALIGN(end) - pages->va;
	ret = mtgdrdrv_get_chunks(pages, bars);
	if (!ret)
		ret = mtgdrdrv_check_repeats(pages);
	if (ret) {
		mtgdrdrv_pages_release(pages);
		return ret;
	}
	atomic64_inc(&mtgdrdrv_counters.pins_outstanding);
	atomic64_add(pages->size, &mtgdrdrv_counters.bytes_pinned);
	mtgdrdrv_dbg("pinned 0x%llx@0x%llx in %u chunks, page size 0x%x\n",
		     pages->size, pages->va, pages->nr_chunks, pages->page_size);
	return 0;
}

/* Puts what mtgdrdrv_p2p_get() pinned. May sleep; no lock held. */
void mtgdrdrv_p2p_put(struct mtgdrdrv_pages *pages)
{
	might_sleep();
	mtgdrdrv_pages_release(pages);
	atomic64_dec(&mtgdrdrv_counters.pins_outstanding);
	atomic64_sub(pages->size, &mtgdrdrv_counters.bytes_pinned);
}

/**
 * mtgdrdrv_pages_for_each_run() - walk the physical runs of a pin
 * @pages: the pin
 * @len: walk bytes [0, len) of the pin (len <= pages->size)
 * @fn: called with (ctx, offset in the pin, physical address, length) for
 *      each physically contiguous run, in order; a non-zero return stops
 *      the walk and is returned
 * @ctx: passed to @fn
 *
 * May sleep: a pin may have a million runs, and the walk runs under
 * mmap_lock and the file's mutex (memtype reserve and free, remap), so it
 * yields the CPU every MTGDRDRV_RUNS_PER_RESCHED runs. No caller holds a
 * spinlock.
 */
int mtgdrdrv_pages_for_each_run(const struct mtgdrdrv_pages *pages, u64 len,
				mtgdrdrv_run_fn fn, void *ctx)
{
	const struct mtgdrdrv_chunk *chunk;
	u64 off = 0, piece;
	u32 c, e, n = 0;
	int ret;

	might_sleep();
	for (c = 0; c < pages->nr_chunks && off < len; c++) {
		chunk = pages->chunks[c];
		for (e = 0; e < chunk->nr_extents && off < len; e++) {
			piece = min(chunk->extents[e].len, len - off);
			ret = fn(ctx, off, chunk->extents[e].pa, piece);
			if (ret)
				return ret;
			off += piece;
			if (++n % MTGDRDRV_RUNS_PER_RESCHED == 0)
				cond_resched();
		}
	}
	return 0;
}
