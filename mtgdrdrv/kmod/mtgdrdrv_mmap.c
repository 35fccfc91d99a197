// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * mmap of a pin, and its VMA callbacks.
 *
 * The pages come from the pin's validated extents (mtgdrdrv_p2p.c), never from
 * the provider's array. A fatal signal stops a long remap (-EINTR).
 *
 * The mmap offset selects the pin: vm_pgoff must be a live handle (the
 * library passes handle << PAGE_SHIFT as offset). The mapping starts at the
 * pin's first byte, may be shorter than the pin, must be MAP_SHARED, and
 * there is one mapping per pin at a time. The pages are remapped at mmap
 * time; there is no fault handler, so an access after unpin gets SIGBUS.
 *
 * x86 PAT: io_remap_pfn_range() over a whole VMA reserves the requested
 * cache mode for the range and marks the VMA VM_PAT; over part of a VMA it
 * takes the mode the memtype tree records for each page instead, and fails
 * if the pages differ (upstream's "errors in gdr_map due to PAT"). A VM_PAT
 * VMA must not be split: the pieces are untracked one by one ("freeing
 * invalid memtype", seen on 6.1) and the reservation leaks. So with PAT on,
 * every VMA is remapped page by page (host page); for WC, write-combining is
 * first reserved for the pin's runs with arch_io_reserve_memtype_wc(), so the
 * pages do come out WC, and that reservation lives until the pin's last VMA
 * closes. DEVICE pages take the tracked mode, UC- for an untracked BAR.
 * Either way, an existing reservation of the BAR with another mode (by
 * mtgpu) wins, as x86 forbids aliases. Without PAT, each physically
 * contiguous run is one call.
 *
 * No VMA may become VM_PAT, with PAT on or off (compat.h): at munmap such a
 * VMA finds its reservation by reading its first PTE back, and an unpin while
 * mapped has zapped the PTEs (untrack_pfn() WARNs, the reservation leaks).
 * So where the flag exists no remap call covers a whole VMA: the first page
 * of such a run is remapped alone, and a one-page VMA takes its page with
 * vmf_insert_pfn_prot(), which looks up the tracked mode and never marks the
 * VMA.
 *
 * VMA accounting: a munmap, mprotect or mremap of part of the mapping
 * splits the VMA; the mm core calls vm_ops->open for each new VMA and
 * ->close for each one that goes away, and never merges VMAs that have a
 * ->close. The pin counts its VMAs (map_count); it is "mapped" until the
 * last one closes. The callbacks find the pin again, under the file's lock,
 * by its handle, which mmap stores in vm_private_data (an integer, copied to
 * every piece by splits and mremap); they never keep a pin pointer (upstream
 * 2.4.4 use-after-free). Not by vm_pgoff: on 6.1 and 6.2 a split that fails
 * after ->open of the new VMA calls its ->close with vm_pgoff = 0, which
 * would take a mapping count from another pin.
 *
 * mmap checks the pin's runs against the memory BARs of mtgpu's devices as
 * they are now: a PCI remove (and rescan) after the pin may have taken the
 * device away or moved its BARs (-ENODEV, counted in stale_maps).
 *
 * The type a mapping reports (GET_INFO, map_type) is the cache mode its PTEs
 * really got, read back after the remap: PAT gives a WC request the mode
 * another reservation of the pages already has (UC- if mtgpu mapped them
 * so), a DEVICE request WC if they are reserved WC, and without PAT a WC
 * request is uncached. The weakest ordering of all pages counts: any
 * write-back page makes it CACHING, else any WC page WC, else DEVICE.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/errno.h>
#include <linux/io.h>
#include <linux/lockdep.h>
#include <linux/mm.h>
#include <linux/pfn.h>
#include <linux/sched.h>

#include "mtgdrdrv.h"
#include "mtgdrdrv_arch.h"
#include "compat.h"

static pgprot_t mtgdrdrv_pgprot(gdr_mr_type_t type, pgprot_t prot)
{
	if (type == GDR_MR_DEVICE)
		return mtgdrdrv_pgprot_device(prot);
	return pgprot_writecombine(prot);
}

static int mtgdrdrv_memtype_release_run(void *ctx, u64 off, phys_addr_t pa,
					u64 len)
{
	arch_io_free_memtype_wc(pa, len);
	return 0;
}

/* Releases the WC memtype of the runs in bytes [0, len) of the pin. */
static void mtgdrdrv_memtype_release(struct mtgdrdrv_pin *pin, u64 len)
{
	mtgdrdrv_pages_for_each_run(&pin->pages, len,
				    mtgdrdrv_memtype_release_run, NULL);
}

/* Reserves one run; on failure, the byte offset reached is in *ctx. */
static int mtgdrdrv_memtype_reserve_run(void *ctx, u64 off, phys_addr_t pa,
					u64 len)
{
	int ret = arch_io_reserve_memtype_wc(pa, len);

	if (ret)
		*(u64 *)ctx = off;
	return ret;
}

/* Reserves WC for the runs in bytes [0, len) of the pin, all or nothing. */
static int mtgdrdrv_memtype_reserve_wc(struct mtgdrdrv_pin *pin, u64 len)
{
	u64 reached = 0;
	int ret;

	ret = mtgdrdrv_pages_for_each_run(&pin->pages, len,
					  mtgdrdrv_memtype_reserve_run,
					  &reached);
	if (ret) {
		pr_err_ratelimited("cannot reserve WC memtype: %d\n", ret);
		mtgdrdrv_memtype_release(pin, reached);
		return ret;
	}
	pin->memtype_len = len;
	return 0;
}

/* Undoes mtgdrdrv_memtype_reserve_wc(); no-op if nothing is reserved. */
void mtgdrdrv_memtype_free(struct mtgdrdrv_pin *pin)
{
	mtgdrdrv_memtype_release(pin, pin->memtype_len);
	pin->memtype_len = 0;
}

/* The handle of the pin @vma maps (set by mtgdrdrv_mmap_pin()). */
static u64 mtgdrdrv_vma_handle(const struct vm_area_struct *vma)
{
	return (uintptr_t)vma->vm_private_data;
}

static void mtgdrdrv_vm_open(struct vm_area_struct *vma)
{
	struct mtgdrdrv_file *priv = vma->vm_file->private_data;
	u64 handle = mtgdrdrv_vma_handle(vma);
	struct mtgdrdrv_pin *pin;

	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup_any(priv, handle);
	if (pin && pin->map_count) {
		pin->map_count++;
		atomic64_inc(&mtgdrdrv_counters.mappings);
	} else {
		pr_err_ratelimited("vm open of handle 0x%llx: no mapped pin\n",
				   handle);
	}
	mutex_unlock(&priv->lock);
}

static void mtgdrdrv_vm_close(struct vm_area_struct *vma)
{
	struct mtgdrdrv_file *priv = vma->vm_file->private_data;
	u64 handle = mtgdrdrv_vma_handle(vma);
	struct mtgdrdrv_pin *pin, *dead = NULL;

	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup_any(priv, handle);
	if (!pin || !pin->map_count) {
		pr_err_ratelimited("vm close of handle 0x%llx: no mapped pin\n",
				   handle);
		goto out;
	}
	atomic64_dec(&mtgdrdrv_counters.mappings);
	if (--pin->map_count)
		goto out;
	mtgdrdrv_memtype_free(pin);
	pin->map_type = GDR_MR_NONE;
	if (pin->unpinned) {
		mtgdrdrv_pin_unlink(priv, pin);
		dead = pin;
	}
out:
	mutex_unlock(&priv->lock);
	/* Unpinned while mapped: its last VMA puts the pages, later. */
	if (dead)
		mtgdrdrv_pin_destroy_deferred(dead);
}

static const struct vm_operations_struct mtgdrdrv_vm_ops = {
	.open	= mtgdrdrv_vm_open,
	.close	= mtgdrdrv_vm_close,
};

struct mtgdrdrv_remap {
	struct vm_area_struct *vma;
	bool per_page;
};

/* One remap call over all of @vma would make it VM_PAT (see the top). */
static bool mtgdrdrv_remap_tracks(const struct vm_area_struct *vma, u64 len)
{
	return MTGDRDRV_WHOLE_VMA_REMAP_TRACKS &&
	       len == vma->vm_end - vma->vm_start;
}

/* How much of the @left bytes at the run's current place one call maps. */
static u64 mtgdrdrv_remap_step(const struct mtgdrdrv_remap *r, u64 left)
{
	if (r->per_page || mtgdrdrv_remap_tracks(r->vma, left))
		return PAGE_SIZE;
	return left;
}

/* Maps @len bytes from @pa at @addr; never marks the VMA VM_PAT. */
static int mtgdrdrv_remap_pages(struct vm_area_struct *vma,
				unsigned long addr, phys_addr_t pa, u64 len)
{
	vm_fault_t fault;

	if (!mtgdrdrv_remap_tracks(vma, len))
		return io_remap_pfn_range(vma, addr, PHYS_PFN(pa), len,
					  vma->vm_page_prot);
	/* A one-page VMA: io_remap_pfn_range() would track it. */
	fault = vmf_insert_pfn_prot(vma, addr, PHYS_PFN(pa),
				    pgprot_decrypted(vma->vm_page_prot));
	return fault == VM_FAULT_NOPAGE ? 0 : -ENOMEM;
}

/* Maps one run at its place in the VMA; stops for a fatal signal. */
static int mtgdrdrv_remap_run(void *ctx, u64 off, phys_addr_t pa, u64 len)
{
	const struct mtgdrdrv_remap *r = ctx;
	u64 done, step;
	int ret;

	for (done = 0; done < len; done += step) {
		step = mtgdrdrv_remap_step(r, len - done);
		ret = mtgdrdrv_remap_pages(r->vma, r->vma->vm_start + off + done,
					   pa + done, step);
		if (ret) {
			pr_err_ratelimited("remap of 0x%llx bytes failed: %d\n",
					   step, ret);
			return -EAGAIN;
		}
		if (fatal_signal_pending(current))
			return -EINTR;
		cond_resched();
	}
	return 0;
}

/* Fills the whole VMA with the pin's pages, from the pin's first byte. */
static int mtgdrdrv_remap(struct mtgdrdrv_pin *pin, struct vm_area_struct *vma,
			  bool per_page)
{
	struct mtgdrdrv_remap r = { .vma = vma, .per_page = per_page };

	return mtgdrdrv_pages_for_each_run(&pin->pages,
					   vma->vm_end - vma->vm_start,
					   mtgdrdrv_remap_run, &r);
}

static int mtgdrdrv_mmap_check(const struct mtgdrdrv_pin *pin,
			       const struct vm_area_struct *vma)
{
	if (!pin)
		return -EINVAL;
	if (pin->map_count)
		return -EBUSY;
	/* The pinned address was not aligned to the host page. */
	if (pin->offset)
		return -EINVAL;
	if (vma->vm_end - vma->vm_start > pin->pages.size)
		return -EINVAL;
	return 0;
}

/* Worst (weakest ordering) cache mode of the PTEs seen so far. */
static int mtgdrdrv_pte_type(pte_t *pte, unsigned long addr, void *data)
{
	gdr_mr_type_t *worst = data;
	gdr_mr_type_t type;

	if (pte_none(ptep_get(pte)))
		return 0;
	type = mtgdrdrv_pte_cache_type(ptep_get(pte), *worst);
	if (type == GDR_MR_CACHING ||
	    (type == GDR_MR_WC && *worst == GDR_MR_DEVICE))
		*worst = type;
	return 0;
}

/*
 * The cache mode the PTEs of @vma really have. @asked is the type that was
 * asked for; where the architecture has no tracked modes (no PAT), that is
 * what the PTEs have. Walked 2 MiB at a time: a page-table lock is held
 * inside each step.
 */
static gdr_mr_type_t mtgdrdrv_mapped_type(struct vm_area_struct *vma,
					  gdr_mr_type_t asked)
{
	gdr_mr_type_t worst = GDR_MR_DEVICE;
	unsigned long addr, next;

	if (!mtgdrdrv_cache_type_readable())
		return asked;
	for (addr = vma->vm_start; addr < vma->vm_end; addr = next) {
		next = min(round_down(addr, PMD_SIZE) + PMD_SIZE, vma->vm_end);
		apply_to_page_range(vma->vm_mm, addr, next - addr,
				    mtgdrdrv_pte_type, &worst);
		cond_resched();
	}
	return worst;
}

/* Records the type @vma got, counting and naming a change. */
static void mtgdrdrv_set_map_type(struct mtgdrdrv_pin *pin,
				  struct vm_area_struct *vma, gdr_mr_type_t asked)
{
	gdr_mr_type_t got = mtgdrdrv_mapped_type(vma, asked);

	pin->map_type = got;
	if (got == asked)
		return;
	if (asked == GDR_MR_WC && got == GDR_MR_DEVICE)
		atomic64_inc(&mtgdrdrv_counters.wc_came_out_uc);
	else if (asked == GDR_MR_DEVICE && got == GDR_MR_WC)
		atomic64_inc(&mtgdrdrv_counters.device_came_out_wc);
	pr_info_ratelimited("handle 0x%llx: asked for mapping type %u, the pages are mapped as type %u (x86 PAT keeps another reservation of them, or PAT is off); GET_INFO reports %u\n",
			    pin->handle, asked, got, got);
}

/* The pin's runs must still lie in mtgpu's BARs (-ENODEV otherwise). */
static int mtgdrdrv_mmap_check_bars(const struct mtgdrdrv_pin *pin, u64 len,
				    const struct mtgdrdrv_bars *bars)
{
	int ret = IS_ERR(bars) ? PTR_ERR(bars) :
		  mtgdrdrv_pages_check_bars(&pin->pages, len, bars);

	if (!ret)
		return 0;
	atomic64_inc(&mtgdrdrv_counters.stale_maps);
	pr_warn_ratelimited("mmap refused: handle 0x%llx points outside the memory BARs of mtgpu's devices as they are now (device removed, or BARs moved by a PCI rescan): unpin and pin again\n",
			    pin->handle);
	return -ENODEV;
}

static int mtgdrdrv_mmap_pin(struct mtgdrdrv_file *priv,
			     struct mtgdrdrv_pin *pin,
			     struct vm_area_struct *vma)
{
	u64 len = vma->vm_end - vma->vm_start;
	gdr_mr_type_t type;
	bool per_page;
	int ret;

	lockdep_assert_held(&priv->lock);
	type = pin->req_type == GDR_MR_DEVICE ? GDR_MR_DEVICE : GDR_MR_WC;
	per_page = mtgdrdrv_pat_enabled();
	if (per_page && type == GDR_MR_WC) {
		ret = mtgdrdrv_memtype_reserve_wc(pin, len);
		if (ret)
			return ret;
	}

	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTCOPY | VM_DONTEXPAND |
		     VM_DONTDUMP);
	vma->vm_page_prot = mtgdrdrv_pgprot(type, vma->vm_page_prot);
	ret = mtgdrdrv_remap(pin, vma, per_page);
	if (ret) {
		/* No PTE may outlive the memtype; the core frees the VMA. */
		zap_vma_ptes(vma, vma->vm_start, len);
		mtgdrdrv_memtype_free(pin);
		return ret;
	}

	vma->vm_ops = &mtgdrdrv_vm_ops;
	vma->vm_private_data = (void *)(uintptr_t)pin->handle;
	pin->map_count = 1;
	mtgdrdrv_set_map_type(pin, vma, type);
	atomic64_inc(&mtgdrdrv_counters.mappings);
	return 0;
}

int mtgdrdrv_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct mtgdrdrv_file *priv = filp->private_data;
	struct mtgdrdrv_bars *bars;
	struct mtgdrdrv_pin *pin;
	int ret;

	if (!mtgdrdrv_is_owner(priv))
		return -EACCES;
	/* MAP_SHARED (VM_SHARED is clear for a read-only fd; VM_MAYSHARE is not). */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;

	/* Taken before the file's lock: it allocates and walks the PCI core. */
	bars = mtgdrdrv_bars_get();
	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup(priv, vma->vm_pgoff);
	ret = mtgdrdrv_mmap_check(pin, vma);
	if (!ret)
		ret = mtgdrdrv_mmap_check_bars(pin, vma->vm_end - vma->vm_start,
					       bars);
	if (!ret)
		ret = mtgdrdrv_mmap_pin(priv, pin, vma);
	mutex_unlock(&priv->lock);
	if (!IS_ERR(bars))
		mtgdrdrv_bars_free(bars);

	if (ret)
		mtgdrdrv_dbg("mmap of 0x%lx bytes at handle 0x%lx: %d\n",
			     vma->vm_end - vma->vm_start, vma->vm_pgoff, ret);
	else
		mtgdrdrv_info("mapped handle 0x%lx, 0x%lx bytes\n",
			      vma->vm_pgoff, vma->vm_end - vma->vm_start);
	return ret;
}
