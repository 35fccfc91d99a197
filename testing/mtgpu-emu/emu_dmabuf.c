// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: dma-buf export of device memory, the emulated muMemGetHandleForAddressRange
 * (MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) that libgdrapi's dma-buf backend maps instead of
 * going through mtgdrdrv.
 *
 * EXPORT_DMABUF wraps [gpu_va, gpu_va + size) of one allocation of the caller (host-page
 * aligned) in a dma-buf and returns a close-on-exec fd for it. The dma-buf holds a reference
 * on the allocation (emu_alloc.exports): freeing the allocation while the dma-buf lives only
 * makes its VA stop resolving (counted in freed_while_exported); its BAR pages stay reserved
 * until the dma-buf is released, i.e. when its last fd is closed and its last mapping gone.
 *
 * CPU mmap of the fd maps the BAR pages write-combined, VM_DONTCOPY (a forked child inherits
 * the fd but not the mapping, as with mtgdrdrv's mappings). If the BAR goes away under a live
 * dma-buf (device removal; rmmod cannot happen, the dma-buf holds a module reference), its
 * mappings are zapped and their memtype released, so a later access raises SIGBUS, and new
 * mmaps fail with -ENODEV.
 *
 * x86 PAT (the problems mtgdrdrv_mmap.c describes, solved the same way): remap_pfn_range()
 * over a whole VMA reserves its cache mode and marks the VMA VM_PAT, which a partial munmap
 * then frees wrongly ("freeing invalid memtype") and leaks; over part of a VMA it takes the
 * mode the memtype tree records, UC- for the untracked BAR. So the first mmap of an export
 * reserves WC for every physically contiguous run of its range with
 * arch_io_reserve_memtype_wc(), the export counts the VMAs of its mappings through vm_ops
 * open/close (splits included), and the last close releases the reservation. The pages are
 * inserted one at a time, by ->fault, with vmf_insert_pfn(), which takes the reserved WC and
 * never marks the VMA VM_PAT.
 *
 * Why on fault rather than all at mmap time: the core links a new VMA into the file's address
 * space only after ->mmap returns, so a zap at device removal in between would miss PTEs that
 * ->mmap had installed. A PTE now exists only once ->fault, under emu_dev.lock, found the
 * memory still there, and a VMA can fault only once it is linked, where the zap finds it.
 *
 * Device import (map_dma_buf) is refused with -EOPNOTSUPP: the emulated device has no peer
 * DMA to offer, and the library only needs CPU mmap.
 *
 * Locking: emu_dev.lock (see emu.h) protects the export list, each export's alloc pointer,
 * VMA count and reservation, and the counters. The dma-buf core calls ->mmap, and the mm core
 * ->fault, ->open and ->close, with mmap_lock (or the VMA's lock) held, so mmap_lock ->
 * emu_dev.lock, as for get_pages; nothing here takes mmap_lock under emu_dev.lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/err.h>
#include <linux/fcntl.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pfn.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "emu.h"
#include "compat.h"

/* One exported dma-buf. */
struct emu_export {
	struct list_head node;		/* in emu_dev.exports */
	struct emu_alloc *alloc;	/* NULL once the BAR went away */
	struct dma_buf *dmabuf;
	u64 offset;			/* of the range in the allocation */
	u64 size;
	unsigned int map_count;		/* VMAs of its mappings */
	bool wc_reserved;		/* WC memtype reserved for the range (needs alloc) */
};

static void emu_export_forget(struct emu_export *exp)
{
	lockdep_assert_held(&emu_dev.lock);
	/* Each VMA holds a reference on the dma-buf's file: none can be left. */
	WARN_ON_ONCE(exp->map_count || exp->wc_reserved);
	list_del(&exp->node);
	emu_dev.nr_dmabufs--;
	if (exp->alloc)
		emu_alloc_unexport(exp->alloc);
}

static struct sg_table *emu_dmabuf_map(struct dma_buf_attachment *attach,
				       enum dma_data_direction dir)
{
	return ERR_PTR(-EOPNOTSUPP);
}

static void emu_dmabuf_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
			     enum dma_data_direction dir)
{
}

/* The last fd and the last mapping are gone. */
static void emu_dmabuf_release(struct dma_buf *dmabuf)
{
	struct emu_export *exp = dmabuf->priv;

	mutex_lock(&emu_dev.lock);
	emu_export_forget(exp);
	mutex_unlock(&emu_dev.lock);
	kfree(exp);
}

/*
 * How many bytes from @off in @exp's range, at most @len, are physically contiguous in the BAR;
 * @pa gets the address of @off.
 */
static u64 emu_export_run(const struct emu_export *exp, u64 off, u64 len, phys_addr_t *pa)
{
	u64 bar, run;

	/* EXPORT_DMABUF refused ranges with holes: every run has memory. */
	run = emu_alloc_run(exp->alloc, exp->offset + off, len, &bar);
	*pa = emu_dev.bar_phys + bar;
	return run;
}

/* Releases the WC memtype of the runs in bytes [0, len) of @exp's range. */
static void emu_export_memtype_release(const struct emu_export *exp, u64 len)
{
	phys_addr_t pa;
	u64 off, run;

	for (off = 0; off < len; off += run) {
		run = emu_export_run(exp, off, len - off, &pa);
		arch_io_free_memtype_wc(pa, run);
	}
}

/*
 * Reserves WC for every run of @exp's range, all or nothing, so that the PTEs ->fault inserts
 * come out WC. A reservation of the BAR with another mode that exists already wins (x86 allows
 * no aliases): the pages then come out in that mode, as mtgdrdrv's do.
 */
static int emu_export_memtype_reserve(struct emu_export *exp)
{
	phys_addr_t pa;
	u64 off, run;
	int ret;

	lockdep_assert_held(&emu_dev.lock);
	for (off = 0; off < exp->size; off += run) {
		run = emu_export_run(exp, off, exp->size - off, &pa);
		ret = arch_io_reserve_memtype_wc(pa, run);
		if (ret) {
			pr_err_ratelimited("cannot reserve WC memtype for [%pa +0x%llx]: %d\n",
					   &pa, run, ret);
			emu_export_memtype_release(exp, off);
			return ret;
		}
	}
	exp->wc_reserved = true;
	return 0;
}

/* Undoes emu_export_memtype_reserve(); no-op if nothing is reserved. */
static void emu_export_memtype_free(struct emu_export *exp)
{
	lockdep_assert_held(&emu_dev.lock);
	if (!exp->wc_reserved)
		return;
	emu_export_memtype_release(exp, exp->size);
	exp->wc_reserved = false;
}

/*
 * A VMA of a mapping was copied (split by a partial munmap or mprotect, or moved by mremap).
 * vm_private_data needs no reference: the VMA holds one on the dma-buf's file, whose release
 * frees the export.
 */
static void emu_dmabuf_vm_open(struct vm_area_struct *vma)
{
	struct emu_export *exp = vma->vm_private_data;

	mutex_lock(&emu_dev.lock);
	exp->map_count++;
	emu_dev.nr_dmabuf_mappings++;
	mutex_unlock(&emu_dev.lock);
}

/* A VMA went, its PTEs zapped already; the last one releases the memtype. */
static void emu_dmabuf_vm_close(struct vm_area_struct *vma)
{
	struct emu_export *exp = vma->vm_private_data;

	mutex_lock(&emu_dev.lock);
	emu_dev.nr_dmabuf_mappings--;
	if (!WARN_ON_ONCE(!exp->map_count) && !--exp->map_count)
		emu_export_memtype_free(exp);
	mutex_unlock(&emu_dev.lock);
}

/* Inserts the page at vmf->address, or SIGBUS once the BAR went away. */
static vm_fault_t emu_dmabuf_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct emu_export *exp = vma->vm_private_data;
	u64 off = (u64)vmf->pgoff << PAGE_SHIFT;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	phys_addr_t pa;

	mutex_lock(&emu_dev.lock);
	if (exp->alloc && off < exp->size) {
		emu_export_run(exp, off, PAGE_SIZE, &pa);
		ret = vmf_insert_pfn(vma, vmf->address, PHYS_PFN(pa));
	}
	mutex_unlock(&emu_dev.lock);
	return ret;
}

/* Counts the VMAs of each export (and of all, so tests can tell none leaked). */
static const struct vm_operations_struct emu_dmabuf_vm_ops = {
	.open = emu_dmabuf_vm_open,
	.close = emu_dmabuf_vm_close,
	.fault = emu_dmabuf_vm_fault,
};

/*
 * CPU mmap of the fd. The dma-buf core has checked that vm_pgoff and the length stay inside
 * the buffer. No page is mapped here: ->fault maps them (see the top of this file).
 */
static int emu_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct emu_export *exp = dmabuf->priv;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	int ret = 0;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (off > exp->size || len > exp->size - off)
		return -EINVAL;

	mutex_lock(&emu_dev.lock);
	if (!exp->alloc) {
		ret = -ENODEV;
		goto out_unlock;
	}
	if (!exp->wc_reserved) {
		ret = emu_export_memtype_reserve(exp);
		if (ret)
			goto out_unlock;
	}
	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vma->vm_private_data = exp;
	/* From here the core's munmap (or a failed mmap's unwind) calls ->close. */
	vma->vm_ops = &emu_dmabuf_vm_ops;
	exp->map_count++;
	emu_dev.nr_dmabuf_mappings++;
out_unlock:
	mutex_unlock(&emu_dev.lock);
	return ret;
}

static const struct dma_buf_ops emu_dmabuf_ops = {
	.map_dma_buf = emu_dmabuf_map,
	.unmap_dma_buf = emu_dmabuf_unmap,
	.release = emu_dmabuf_release,
	.mmap = emu_dmabuf_mmap,
};

/* The same, for MTGPU_EMU_EXPORT_NO_MMAP: the core then refuses mmap with -EINVAL. */
static const struct dma_buf_ops emu_dmabuf_ops_no_mmap = {
	.map_dma_buf = emu_dmabuf_map,
	.unmap_dma_buf = emu_dmabuf_unmap,
	.release = emu_dmabuf_release,
};

/* Whether [off, off + size) of @a, size > 0, touches a hole of a sparse allocation. */
static bool emu_range_has_hole(const struct emu_alloc *a, u64 off, u64 size)
{
	u32 last = (off + size - 1) >> a->page_shift;
	u32 i;

	for (i = off >> a->page_shift; i <= last; i++)
		if (a->bar_off[i] == EMU_BAR_HOLE)
			return true;
	return false;
}

/*
 * Records an export of @args' range and takes its reference on the allocation. A range that
 * touches a hole is refused: no memory lies behind a hole, so its mapping could offer none.
 */
static struct emu_export *emu_export_create(const struct mtgpu_emu_export_dmabuf *args)
{
	struct emu_export *exp;
	struct emu_alloc *a;
	int ret;

	exp = kzalloc(sizeof(*exp), GFP_KERNEL);
	if (!exp)
		return ERR_PTR(-ENOMEM);

	mutex_lock(&emu_dev.lock);
	if (!emu_bound()) {
		ret = -ENODEV;
		goto err_unlock;
	}
	a = emu_alloc_find(task_tgid(current), args->gpu_va, args->size);
	if (!a || a->managed || emu_range_has_hole(a, args->gpu_va - a->va, args->size)) {
		ret = -EINVAL;
		goto err_unlock;
	}
	exp->alloc = a;
	exp->offset = args->gpu_va - a->va;
	exp->size = args->size;
	a->exports++;
	list_add_tail(&exp->node, &emu_dev.exports);
	emu_dev.nr_dmabufs++;
	mutex_unlock(&emu_dev.lock);
	return exp;

err_unlock:
	mutex_unlock(&emu_dev.lock);
	kfree(exp);
	return ERR_PTR(ret);
}

static void emu_export_destroy(struct emu_export *exp)
{
	mutex_lock(&emu_dev.lock);
	emu_export_forget(exp);
	mutex_unlock(&emu_dev.lock);
	kfree(exp);
}

/* EXPORT_DMABUF: on success the fd is installed in the caller and written to @uarg. */
int emu_dmabuf_export(struct mtgpu_emu_export_dmabuf __user *uarg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct mtgpu_emu_export_dmabuf args;
	struct emu_export *exp;
	struct dma_buf *dmabuf;
	int fd;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.flags & ~MTGPU_EMU_EXPORT_NO_MMAP || args.fd)
		return -EINVAL;
	if (!args.size || !PAGE_ALIGNED(args.gpu_va) || !PAGE_ALIGNED(args.size) ||
	    args.size > U64_MAX - args.gpu_va)
		return -EINVAL;

	exp = emu_export_create(&args);
	if (IS_ERR(exp))
		return PTR_ERR(exp);

	info.ops = args.flags & MTGPU_EMU_EXPORT_NO_MMAP ? &emu_dmabuf_ops_no_mmap
							 : &emu_dmabuf_ops;
	info.size = args.size;
	info.flags = O_RDWR;
	info.priv = exp;
	dmabuf = dma_buf_export(&info);
	if (IS_ERR(dmabuf)) {
		emu_export_destroy(exp);
		return PTR_ERR(dmabuf);
	}
	mutex_lock(&emu_dev.lock);
	exp->dmabuf = dmabuf;
	mutex_unlock(&emu_dev.lock);

	/* From here the dma-buf owns exp: dma_buf_put() releases both. */
	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	args.fd = fd;
	if (copy_to_user(uarg, &args, sizeof(args))) {
		put_unused_fd(fd);
		dma_buf_put(dmabuf);
		return -EFAULT;
	}
	fd_install(fd, dmabuf->file);

	mutex_lock(&emu_dev.lock);
	emu_dev.dmabuf_exports++;
	mutex_unlock(&emu_dev.lock);
	return 0;
}

/*
 * A reference on the file of @exp's dma-buf, or NULL if it has none left or none yet.
 *
 * The file's memory is still there: the dma-buf core calls our ->release, which takes
 * emu_dev.lock to unlist @exp, before it frees the dma-buf and its file. But its last
 * reference may be gone already, the release under way and waiting for our lock, and its
 * inode (the address space of its mappings) freed: hence a reference only if one is left.
 * None left means no mapping either, since each VMA holds one.
 */
static struct file *emu_export_get_file(struct emu_export *exp)
{
	lockdep_assert_held(&emu_dev.lock);
	if (!exp->dmabuf)	/* EXPORT_DMABUF is still creating it */
		return NULL;
	return get_file_active(&exp->dmabuf->file);
}

/* Zaps every PTE of @exp's mappings; a later access faults again. */
static void emu_export_zap(struct emu_export *exp)
{
	struct file *file;

	lockdep_assert_held(&emu_dev.lock);
	file = emu_export_get_file(exp);
	if (!file)
		return;
	unmap_mapping_range(file->f_mapping, 0, 0, 1);
	/*
	 * Never the release itself, even if ours was the last reference: fput() leaves __fput()
	 * to task work or to the delayed-fput worker, so the dma-buf's ->release, which takes
	 * emu_dev.lock, runs after our caller dropped it.
	 */
	fput(file);
}

/*
 * The BAR is going away: revoke every export's mappings. Their PTEs are zapped before the
 * memtype goes; ->fault and ->mmap, which run under emu_dev.lock like us, find no memory from
 * here on (SIGBUS, -ENODEV). Their VMAs stay until munmap, counted as before.
 */
void emu_dmabuf_orphan_all(void)
{
	struct emu_export *exp;

	lockdep_assert_held(&emu_dev.lock);
	if (emu_dev.nr_dmabufs)
		pr_warn("BAR removed with %llu dma-bufs exported\n", emu_dev.nr_dmabufs);
	list_for_each_entry(exp, &emu_dev.exports, node) {
		emu_export_zap(exp);
		emu_export_memtype_free(exp);
		exp->alloc = NULL;
	}
}

MODULE_IMPORT_NS(EMU_DMA_BUF_NS);
