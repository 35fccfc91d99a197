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
 * dma-buf (device unbind; rmmod cannot happen, the dma-buf holds a module reference), its
 * mappings are zapped, so a later access raises SIGBUS, and new mmaps fail with -ENODEV.
 *
 * Device import (map_dma_buf) is refused with -EOPNOTSUPP: the emulated device has no peer
 * DMA to offer, and the library only needs CPU mmap.
 *
 * Locking: emu_dev.lock (see emu.h) protects the export list, each export's alloc pointer and
 * the counters. The dma-buf core calls ->mmap with mmap_lock held, so mmap_lock ->
 * emu_dev.lock, as for get_pages; nothing here takes mmap_lock under emu_dev.lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/err.h>
#include <linux/fcntl.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
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
};

static void emu_export_forget(struct emu_export *exp)
{
	lockdep_assert_held(&emu_dev.lock);
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

static void emu_dmabuf_vm_open(struct vm_area_struct *vma)
{
	mutex_lock(&emu_dev.lock);
	emu_dev.nr_dmabuf_mappings++;
	mutex_unlock(&emu_dev.lock);
}

static void emu_dmabuf_vm_close(struct vm_area_struct *vma)
{
	mutex_lock(&emu_dev.lock);
	emu_dev.nr_dmabuf_mappings--;
	mutex_unlock(&emu_dev.lock);
}

/* Counts the mappings that exist, so tests can tell none leaked. */
static const struct vm_operations_struct emu_dmabuf_vm_ops = {
	.open = emu_dmabuf_vm_open,
	.close = emu_dmabuf_vm_close,
};

/* Maps [off, off + len) of @a at @addr, one physically contiguous piece at a time. */
static int emu_dmabuf_remap(struct vm_area_struct *vma, const struct emu_alloc *a,
			    unsigned long addr, u64 off, u64 len)
{
	u64 ps = a->page_size;
	u64 piece, in_page;
	u32 first, last;
	int ret;

	lockdep_assert_held(&emu_dev.lock);
	while (len) {
		first = off >> a->page_shift;
		last = first;
		in_page = off & (ps - 1);
		piece = ps - in_page;
		while (piece < len && last + 1 < a->npages &&
		       a->bar_off[last + 1] == a->bar_off[last] + ps) {
			last++;
			piece += ps;
		}
		piece = min(piece, len);
		ret = io_remap_pfn_range(vma, addr,
					 (emu_dev.bar_phys + a->bar_off[first] + in_page) >> PAGE_SHIFT,
					 piece, vma->vm_page_prot);
		if (ret)
			return ret;
		addr += piece;
		off += piece;
		len -= piece;
	}
	return 0;
}

/*
 * CPU mmap of the fd. The dma-buf core has checked that vm_pgoff and the length stay inside
 * the buffer.
 */
static int emu_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct emu_export *exp = dmabuf->priv;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 len = vma->vm_end - vma->vm_start;
	int ret;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (off > exp->size || len > exp->size - off)
		return -EINVAL;

	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);

	mutex_lock(&emu_dev.lock);
	if (!exp->alloc) {
		ret = -ENODEV;
		goto out_unlock;
	}
	ret = emu_dmabuf_remap(vma, exp->alloc, vma->vm_start, exp->offset + off, len);
	if (ret)
		goto out_unlock;
	/* From here the core's munmap (or a failed mmap's unwind) calls ->close. */
	vma->vm_ops = &emu_dmabuf_vm_ops;
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

/* Records an export of @args' range and takes its reference on the allocation. */
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
	if (!a || a->managed) {
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

/* Zaps every PTE of @exp's mappings; a later access faults. */
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

/* The BAR is going away: forget the memory of every export and zap its mappings. */
void emu_dmabuf_orphan_all(void)
{
	struct emu_export *exp;

	lockdep_assert_held(&emu_dev.lock);
	if (emu_dev.nr_dmabufs)
		pr_warn("BAR removed with %llu dma-bufs exported\n", emu_dev.nr_dmabufs);
	list_for_each_entry(exp, &emu_dev.exports, node) {
		exp->alloc = NULL;
		emu_export_zap(exp);
	}
}

MODULE_IMPORT_NS(EMU_DMA_BUF_NS);
