// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: carving pages out of the BAR, and the emulator's own access path to them.
 *
 * Allocator: a bitmap of 4 KiB units. A page of size P is P/4K units whose *physical* address
 * is P-aligned, so 64 KiB and 2 MiB pages are naturally aligned chunks of the BAR even if the
 * BAR itself were less aligned than that.
 *
 * Access path: the BAR is mapped write-combined only for the duration of one access, never
 * kept mapped. x86 PAT gives every later mapping of a physical range the memory type of a
 * mapping that already exists there, so a permanent WC kernel mapping of the whole BAR would
 * silently turn mtgdrdrv's user mappings WC too (even UC- or forgotten-WB ones) and hide its
 * memory-type bugs from the tests. A transient mapping instead adopts whatever type a user
 * mapping already has.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/bug.h>
#include <linux/io.h>
#include <linux/sort.h>

#include "emu.h"

static unsigned long emu_units_per_page(u32 page_size)
{
	return page_size >> EMU_UNIT_SHIFT;
}

/*
 * Reserves @nr free units at or after unit @start, the first one @upp-aligned in physical
 * address space. Returns false if there is no such run.
 */
static bool emu_bar_take(unsigned long start, unsigned int nr, unsigned long upp,
			 unsigned long *first)
{
	unsigned long mask = upp - 1;
	unsigned long phase = (emu_dev.bar_phys >> EMU_UNIT_SHIFT) & mask;
	unsigned long i;

	i = bitmap_find_next_zero_area_off(emu_dev.bar_map, emu_dev.bar_units, start, nr,
					   mask, phase);
	if (i + nr > emu_dev.bar_units)
		return false;
	bitmap_set(emu_dev.bar_map, i, nr);
	*first = i;
	return true;
}

/* All pages in one physically contiguous run, in order. */
static int emu_bar_alloc_run(u32 page_size, u32 npages, u64 *bar_off)
{
	unsigned long upp = emu_units_per_page(page_size);
	unsigned long first;
	u32 i;

	if (!emu_bar_take(0, npages * upp, upp, &first))
		return -ENOMEM;
	for (i = 0; i < npages; i++)
		bar_off[i] = (u64)(first + i * upp) << EMU_UNIT_SHIFT;
	return 0;
}

/*
 * Page by page: the search for each page starts @stride pages after the previous one and
 * wraps to the start of the BAR when that fails.
 */
static int emu_bar_alloc_each(u32 page_size, u32 npages, unsigned long stride, u64 *bar_off)
{
	unsigned long upp = emu_units_per_page(page_size);
	unsigned long hint = 0, first;
	u32 i;

	for (i = 0; i < npages; i++) {
		if (!emu_bar_take(hint, upp, upp, &first) && !emu_bar_take(0, upp, upp, &first))
			goto err_free_taken;
		bar_off[i] = (u64)first << EMU_UNIT_SHIFT;
		hint = first + stride * upp;
	}
	return 0;

err_free_taken:
	emu_bar_free_pages(page_size, i, bar_off);
	return -ENOMEM;
}

static int emu_cmp_u64_desc(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/*
 * Fills bar_off[0..npages) with the BAR offsets backing an allocation, in VA order.
 * Default: one contiguous run, else whatever pages are free (first fit). @scatter: each page
 * on its own with a free page-sized hole after it where the BAR has room, then in descending
 * physical order, so no page is followed in VA by the page physically after it.
 */
int emu_bar_alloc_pages(u32 page_size, u32 npages, bool scatter, u64 *bar_off)
{
	int ret;

	lockdep_assert_held(&emu_dev.lock);
	if (scatter) {
		ret = emu_bar_alloc_each(page_size, npages, 2, bar_off);
		if (!ret)
			sort(bar_off, npages, sizeof(*bar_off), emu_cmp_u64_desc, NULL);
		return ret;
	}
	if (!emu_bar_alloc_run(page_size, npages, bar_off))
		return 0;
	return emu_bar_alloc_each(page_size, npages, 1, bar_off);
}

void emu_bar_free_pages(u32 page_size, u32 npages, const u64 *bar_off)
{
	unsigned long upp = emu_units_per_page(page_size);
	unsigned long first;
	u32 i;

	lockdep_assert_held(&emu_dev.lock);
	for (i = 0; i < npages; i++) {
		first = bar_off[i] >> EMU_UNIT_SHIFT;
		WARN_ON_ONCE(find_next_zero_bit(emu_dev.bar_map, first + upp, first) <
			     first + upp);
		bitmap_clear(emu_dev.bar_map, first, upp);
	}
}

/* Reads, writes or fills [off, off + len) of the BAR through one transient WC mapping. */
static int emu_bar_io_mapped(u64 off, size_t len, struct emu_io *io)
{
	void __iomem *p;

	p = ioremap_wc(emu_dev.bar_phys + off, len);
	if (!p)
		return -ENOMEM;

	switch (io->op) {
	case EMU_IO_READ:
		memcpy_fromio(io->buf, p, len);
		io->buf += len;
		break;
	case EMU_IO_WRITE:
		memcpy_toio(p, io->buf, len);
		io->buf += len;
		break;
	case EMU_IO_FILL:
		memset_io(p, io->fill, len);
		break;
	}
	/* Drain write-combining buffers before anyone else looks at the memory. */
	wmb();
	iounmap(p);
	return 0;
}

/*
 * Reads, writes or fills [off, off + len) of the BAR, as the GPU's copy engine would: whatever
 * CPU mappings users hold. One mapping of the whole range fails when pages in it are mapped
 * by users with different memory types (x86 PAT refuses a range spanning a write-combined and
 * an uncached user mapping), so then it goes page by page: a page has one type at a time.
 */
int emu_bar_io(u64 off, size_t len, struct emu_io *io)
{
	size_t piece;
	int ret;

	lockdep_assert_held(&emu_dev.lock);
	if (WARN_ON_ONCE(off > emu_dev.bar_size || len > emu_dev.bar_size - off))
		return -EINVAL;

	if (!emu_bar_io_mapped(off, len, io))
		return 0;
	while (len) {
		piece = min_t(size_t, len, PAGE_SIZE - (off & (PAGE_SIZE - 1)));
		ret = emu_bar_io_mapped(off, piece, io);
		if (ret)
			return ret;
		off += piece;
		len -= piece;
	}
	return 0;
}
