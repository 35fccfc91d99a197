// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * The per-file pin table and the pin ioctls: PIN_BUFFER(_V2), UNPIN_BUFFER,
 * GET_CB_FLAG, GET_INFO(_V2) and REQ_MAPPING_TYPE.
 *
 * Handles: a pin's handle is the first mmap page offset of its range; the
 * next handle advances by max(1, mapped_size >> PAGE_SHIFT), so the offset
 * ranges [handle, handle + pages) of one file never overlap, and handles are
 * never reused. Once a pin would cross MTGDRDRV_HANDLE_LIMIT, this pin and
 * every later one on the file fail with -ENOMEM.
 *
 * Limits, checked before any provider call, so that a user who may open
 * the device cannot make the kernel hold unbounded memory on its behalf
 * (mtgpu keeps 8 bytes per provider page and a record per pin, and each
 * mapping adds memtype entries, none of it charged to the caller's memory
 * cgroup): a file holds at most max_pins_per_file pins and
 * max_bytes_per_file pinned bytes (unpinned ones still mapped count, and
 * pins being made count at once), and a pin has at most max_runs_per_pin
 * runs (mtgdrdrv_p2p.c). Beyond, -ENOSPC, one rate-limited line naming the
 * parameter, and pins_over_limit counts it.
 *
 * Pages are put (mtgpu_p2p_put_pages()) from the ioctl or release that ends
 * a pin, with no lock held, except when the last VMA of an unpinned pin
 * closes: that runs under mmap_lock, so the pin goes to a work item instead,
 * which release and module exit wait for.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/errno.h>
#include <linux/llist.h>
#include <linux/lockdep.h>
#include <linux/moduleparam.h>
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "mtgdrdrv.h"
#include "mtgdrdrv_arch.h"

unsigned int mtgdrdrv_max_pins_per_file = 65536;
module_param_named(max_pins_per_file, mtgdrdrv_max_pins_per_file, uint, 0644);
MODULE_PARM_DESC(max_pins_per_file,
		 "Pins one open file of /dev/mtgdrdrv may hold (default: 65536)");

/*
 * 0: the sum of the memory BARs of mtgpu's devices, i.e. all device memory
 * the CPU can reach: pinning more means pinning memory twice, which no real
 * workload needs.
 */
unsigned long long mtgdrdrv_max_bytes_per_file;
module_param_named(max_bytes_per_file, mtgdrdrv_max_bytes_per_file, ullong,
		   0644);
MODULE_PARM_DESC(max_bytes_per_file,
		 "Bytes one open file of /dev/mtgdrdrv may hold pinned (default: 0 = the sum of the memory BARs of mtgpu's devices)");

static struct workqueue_struct *mtgdrdrv_put_wq;
static LLIST_HEAD(mtgdrdrv_put_list);

static void mtgdrdrv_put_work_fn(struct work_struct *work)
{
	struct llist_node *list = llist_del_all(&mtgdrdrv_put_list);
	struct mtgdrdrv_pin *pin, *tmp;

	llist_for_each_entry_safe(pin, tmp, list, put_node) {
		mtgdrdrv_pin_destroy(pin);
		atomic64_inc(&mtgdrdrv_counters.deferred_puts);
	}
}

static DECLARE_WORK(mtgdrdrv_put_work, mtgdrdrv_put_work_fn);

/* What GET_INFO reports, copied out of a pin under the lock. */
struct mtgdrdrv_pin_info {
	u64 va;
	u64 mapped_size;
	u32 page_size;
	u64 tm_cycles;
	gdr_mr_type_t map_type;
};

/* Host pages of the pin's mmap offset range. */
static u64 mtgdrdrv_pin_npages(const struct mtgdrdrv_pin *pin)
{
	return max_t(u64, 1, pin->pages.size >> PAGE_SHIFT);
}

/* The live (not unpinned) pin with @handle, or NULL. */
struct mtgdrdrv_pin *mtgdrdrv_pin_lookup(struct mtgdrdrv_file *priv,
					 u64 handle)
{
	struct mtgdrdrv_pin *pin;

	lockdep_assert_held(&priv->lock);
	list_for_each_entry(pin, &priv->pins, node) {
		if (pin->handle == handle && !pin->unpinned)
			return pin;
	}
	return NULL;
}

/*
 * The pin, live or unpinned, with @handle, or NULL. Used by the VMA
 * callbacks with the handle the VMA carries in vm_private_data, which every
 * split and mremap copies: its vm_pgoff is not reliable (on 6.1 and 6.2 a
 * split that fails calls ->close on the new VMA with vm_pgoff set to 0).
 */
struct mtgdrdrv_pin *mtgdrdrv_pin_lookup_any(struct mtgdrdrv_file *priv,
					     u64 handle)
{
	struct mtgdrdrv_pin *pin;

	lockdep_assert_held(&priv->lock);
	list_for_each_entry(pin, &priv->pins, node) {
		if (pin->handle == handle)
			return pin;
	}
	return NULL;
}

/* Takes @pin off the file's list and out of the file's limits. */
void mtgdrdrv_pin_unlink(struct mtgdrdrv_file *priv, struct mtgdrdrv_pin *pin)
{
	lockdep_assert_held(&priv->lock);
	list_del(&pin->node);
	priv->nr_pins--;
	priv->bytes_pinned -= pin->pages.size;
}

/* Frees a pin that is off the list and unmapped: puts its pages. */
void mtgdrdrv_pin_destroy(struct mtgdrdrv_pin *pin)
{
	mtgdrdrv_memtype_free(pin);
	mtgdrdrv_p2p_put(&pin->pages);
	kfree(pin);
}

/*
 * The same, from under mmap_lock (a VMA's close): mtgpu_p2p_put_pages()
 * takes mtgpu's locks, which must not nest inside mmap_lock, so the put runs
 * from the work item.
 */
void mtgdrdrv_pin_destroy_deferred(struct mtgdrdrv_pin *pin)
{
	mtgdrdrv_memtype_free(pin);
	if (llist_add(&pin->put_node, &mtgdrdrv_put_list))
		queue_work(mtgdrdrv_put_wq, &mtgdrdrv_put_work);
}

/* Waits until every deferred put queued so far is done. */
static void mtgdrdrv_put_flush(void)
{
	flush_work(&mtgdrdrv_put_work);
}

int mtgdrdrv_pin_init(void)
{
	mtgdrdrv_put_wq = alloc_workqueue("mtgdrdrv_put", WQ_UNBOUND, 0);
	return mtgdrdrv_put_wq ? 0 : -ENOMEM;
}

/* No file is open any more; a put may still be queued by the last close. */
void mtgdrdrv_pin_exit(void)
{
	mtgdrdrv_put_flush();
	destroy_workqueue(mtgdrdrv_put_wq);
}

/*
 * Gives @pin (reserved by mtgdrdrv_pin_reserve()) the next handle and
 * publishes it; -ENOMEM once out of handles.
 */
static int mtgdrdrv_pin_insert(struct mtgdrdrv_file *priv,
			       struct mtgdrdrv_pin *pin, u64 *handle)
{
	u64 npages = mtgdrdrv_pin_npages(pin);
	int ret = 0;

	mutex_lock(&priv->lock);
	if (priv->handle_overflow ||
	    priv->next_handle + npages >= MTGDRDRV_HANDLE_LIMIT) {
		priv->handle_overflow = true;
		ret = -ENOMEM;
		goto out;
	}
	pin->handle = priv->next_handle;
	priv->next_handle += npages;
	list_add_tail(&pin->node, &priv->pins);
	*handle = pin->handle;
out:
	mutex_unlock(&priv->lock);
	return ret;
}

/* The pinned length of [addr, addr + size) (rounding rule), or 0 if invalid. */
static u64 mtgdrdrv_pin_span(u64 addr, u64 size)
{
	u64 end;

	if (!addr || !size || size > MTGDRDRV_MAX_PIN_SIZE ||
	    check_add_overflow(addr, size, &end) ||
	    end > (U64_MAX & PAGE_MASK)) {
		mtgdrdrv_dbg("pin of 0x%llx@0x%llx refused\n", size, addr);
		return 0;
	}
	return PAGE_ALIGN(end) - (addr & PAGE_MASK);
}

/* The file's byte limit: the parameter, or the sum of the BARs. */
static u64 mtgdrdrv_bytes_limit(const struct mtgdrdrv_bars *bars)
{
	return READ_ONCE(mtgdrdrv_max_bytes_per_file) ?:
	       mtgdrdrv_bars_total(bars);
}

/*
 * Counts a pin of @bytes against the file's limits before any provider
 * call, so that concurrent pins cannot all pass; undone by
 * mtgdrdrv_pin_unreserve() if the pin fails. -ENOSPC over a limit.
 */
static int mtgdrdrv_pin_reserve(struct mtgdrdrv_file *priv, u64 bytes,
				const struct mtgdrdrv_bars *bars)
{
	unsigned int max_pins = READ_ONCE(mtgdrdrv_max_pins_per_file);
	u64 max_bytes = mtgdrdrv_bytes_limit(bars);
	u64 held;
	bool pins_full, bytes_full;

	mutex_lock(&priv->lock);
	held = priv->bytes_pinned;
	pins_full = priv->nr_pins >= max_pins;
	bytes_full = held > max_bytes || bytes > max_bytes - held;
	if (!pins_full && !bytes_full) {
		priv->nr_pins++;
		priv->bytes_pinned += bytes;
	}
	mutex_unlock(&priv->lock);

	if (!pins_full && !bytes_full)
		return 0;
	atomic64_inc(&mtgdrdrv_counters.pins_over_limit);
	if (pins_full)
		pr_warn_ratelimited("pin refused: the file holds %u pins, the limit (module parameter max_pins_per_file)\n",
				    max_pins);
	else
		pr_warn_ratelimited("pin refused: the file holds 0x%llx bytes pinned, 0x%llx more would pass the limit of 0x%llx (module parameter max_bytes_per_file; 0 = the sum of mtgpu's memory BARs)\n",
				    held, bytes, max_bytes);
	return -ENOSPC;
}

static void mtgdrdrv_pin_unreserve(struct mtgdrdrv_file *priv, u64 bytes)
{
	mutex_lock(&priv->lock);
	priv->nr_pins--;
	priv->bytes_pinned -= bytes;
	mutex_unlock(&priv->lock);
}

/* Pins [addr, addr + size) through the provider, within the file's limits. */
static int mtgdrdrv_pin_get(struct mtgdrdrv_file *priv, u64 addr, u64 size,
			    struct mtgdrdrv_pages *pages)
{
	u64 bytes = mtgdrdrv_pin_span(addr, size);
	struct mtgdrdrv_bars *bars;
	int ret;

	if (!bytes)
		return -EINVAL;
	bars = mtgdrdrv_p2p_bars();
	if (IS_ERR(bars))
		return PTR_ERR(bars);
	ret = mtgdrdrv_pin_reserve(priv, bytes, bars);
	if (!ret) {
		ret = mtgdrdrv_p2p_get(addr, size, bars, pages);
		if (ret)
			mtgdrdrv_pin_unreserve(priv, bytes);
	}
	mtgdrdrv_bars_free(bars);
	return ret;
}

/* Pins [addr, addr + size) and returns its new handle. */
static int mtgdrdrv_pin(struct mtgdrdrv_file *priv, u64 addr, u64 size,
			u64 *handle)
{
	struct mtgdrdrv_pin *pin;
	int ret;

	pin = kzalloc(sizeof(*pin), GFP_KERNEL_ACCOUNT);
	if (!pin)
		return -ENOMEM;

	ret = mtgdrdrv_pin_get(priv, addr, size, &pin->pages);
	if (ret) {
		/* mtgpu logged its own refusal; ours were logged (rate
		 * limited) where they were decided. */
		mtgdrdrv_dbg("cannot pin 0x%llx@0x%llx: %d\n", size, addr, ret);
		goto err_free;
	}
	pin->offset = addr - pin->pages.va;
	pin->req_type = GDR_MR_NONE;
	pin->map_type = GDR_MR_NONE;

	mtgdrdrv_info("pin 0x%llx@0x%llx: pinned 0x%llx@0x%llx\n", size, addr,
		      pin->pages.size, pin->pages.va);
	/* Once inserted, the pin may be unpinned by another thread at once. */
	ret = mtgdrdrv_pin_insert(priv, pin, handle);
	if (ret)
		goto err_put;
	return 0;

err_put:
	mtgdrdrv_pin_unreserve(priv, pin->pages.size);
	mtgdrdrv_p2p_put(&pin->pages);
err_free:
	kfree(pin);
	return ret;
}

static void mtgdrdrv_zap(struct mtgdrdrv_file *priv, u64 handle, u64 npages)
{
	unmap_mapping_range(&priv->mapping, (loff_t)(handle << PAGE_SHIFT),
			    (loff_t)(npages << PAGE_SHIFT), 1);
}

/*
 * Unpins @handle: the handle becomes unknown, user mappings of the pin are
 * zapped (later accesses get SIGBUS) and the pages are put, at once if no VMA
 * maps the pin, else when its last VMA closes. The deferral covers a VMA
 * that ->mmap filled but the mm core has not linked into the address space
 * yet, which unmap_mapping_range() cannot reach.
 */
static int mtgdrdrv_unpin(struct mtgdrdrv_file *priv, u64 handle)
{
	struct mtgdrdrv_pin *pin, *dead = NULL;
	u64 npages;

	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup(priv, handle);
	if (!pin) {
		mutex_unlock(&priv->lock);
		return -EINVAL;
	}
	pin->unpinned = true;
	npages = mtgdrdrv_pin_npages(pin);
	if (!pin->map_count) {
		mtgdrdrv_pin_unlink(priv, pin);
		dead = pin;
	}
	mutex_unlock(&priv->lock);

	mtgdrdrv_zap(priv, handle, npages);
	if (dead)
		mtgdrdrv_pin_destroy(dead);
	mtgdrdrv_info("unpin 0x%llx%s\n", handle, dead ? "" : " (mapped)");
	return 0;
}

/* Copies the handle out; a failed copy undoes the pin. */
static int mtgdrdrv_pin_copy_out(struct mtgdrdrv_file *priv, u64 handle,
				 void __user *argp, const void *params,
				 size_t size)
{
	if (!copy_to_user(argp, params, size))
		return 0;
	mtgdrdrv_unpin(priv, handle);
	return -EFAULT;
}

int mtgdrdrv_ioctl_pin_buffer(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_PIN_BUFFER_PARAMS p;
	int ret;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	/* mtgpu has no P2P tokens or VA spaces (upstream's persistent mode). */
	if (p.p2p_token || p.va_space)
		return -EINVAL;
	ret = mtgdrdrv_pin(priv, p.addr, p.size, &p.handle);
	if (ret)
		return ret;
	return mtgdrdrv_pin_copy_out(priv, p.handle, argp, &p, sizeof(p));
}

int mtgdrdrv_ioctl_pin_buffer_v2(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS p;
	int ret;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	/* FORCE_PCIE asks for a mode mtgpu does not have; other bits are unknown. */
	if (p.flags != GDRDRV_PIN_BUFFER_FLAG_DEFAULT)
		return -EINVAL;
	ret = mtgdrdrv_pin(priv, p.addr, p.size, &p.handle);
	if (ret)
		return ret;
	return mtgdrdrv_pin_copy_out(priv, p.handle, argp, &p, sizeof(p));
}

int mtgdrdrv_ioctl_unpin_buffer(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_UNPIN_BUFFER_PARAMS p;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	return mtgdrdrv_unpin(priv, p.handle);
}

int mtgdrdrv_ioctl_get_cb_flag(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_GET_CB_FLAG_PARAMS p;
	bool found;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	mutex_lock(&priv->lock);
	found = mtgdrdrv_pin_lookup(priv, p.handle);
	mutex_unlock(&priv->lock);
	if (!found)
		return -EINVAL;
	/* mtgpu never invalidates a pin, so no callback ever fires. */
	p.flag = 0;
	return copy_to_user(argp, &p, sizeof(p)) ? -EFAULT : 0;
}

static int mtgdrdrv_pin_get_info(struct mtgdrdrv_file *priv, u64 handle,
				 struct mtgdrdrv_pin_info *info)
{
	struct mtgdrdrv_pin *pin;
	int ret = 0;

	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup(priv, handle);
	if (pin) {
		info->va = pin->pages.va;
		info->mapped_size = pin->pages.size;
		info->page_size = PAGE_SIZE;
		info->tm_cycles = pin->pages.tm_cycles;
		info->map_type = pin->map_type;
	} else {
		ret = -EINVAL;
	}
	mutex_unlock(&priv->lock);
	return ret;
}

int mtgdrdrv_ioctl_get_info(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_GET_INFO_PARAMS p;
	struct mtgdrdrv_pin_info info;
	int ret;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	ret = mtgdrdrv_pin_get_info(priv, p.handle, &info);
	if (ret)
		return ret;
	p.va = info.va;
	p.mapped_size = info.mapped_size;
	p.page_size = info.page_size;
	p.tsc_khz = mtgdrdrv_tsc_khz();
	p.tm_cycles = info.tm_cycles;
	p.mapped = info.map_type != GDR_MR_NONE;
	p.wc_mapping = info.map_type == GDR_MR_WC;
	return copy_to_user(argp, &p, sizeof(p)) ? -EFAULT : 0;
}

int mtgdrdrv_ioctl_get_info_v2(struct mtgdrdrv_file *priv, void __user *argp)
{
	struct GDRDRV_IOC_GET_INFO_V2_PARAMS p;
	struct mtgdrdrv_pin_info info;
	int ret;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	ret = mtgdrdrv_pin_get_info(priv, p.handle, &info);
	if (ret)
		return ret;
	p.va = info.va;
	p.mapped_size = info.mapped_size;
	p.page_size = info.page_size;
	p.tsc_khz = mtgdrdrv_tsc_khz();
	p.tm_cycles = info.tm_cycles;
	p.mapping_type = info.map_type;
	return copy_to_user(argp, &p, sizeof(p)) ? -EFAULT : 0;
}

/* Records the type the next mmap of @handle uses. */
static int mtgdrdrv_pin_req_type(struct mtgdrdrv_file *priv, u64 handle,
				 gdr_mr_type_t type)
{
	struct mtgdrdrv_pin *pin;
	int ret = 0;

	mutex_lock(&priv->lock);
	pin = mtgdrdrv_pin_lookup(priv, handle);
	if (!pin)
		ret = -EINVAL;
	else if (pin->map_count)
		ret = -EBUSY;
	else if (type == GDR_MR_CACHING)
		ret = -EOPNOTSUPP;	/* the BAR is not CPU-coherent */
	else
		pin->req_type = type;
	mutex_unlock(&priv->lock);
	return ret;
}

int mtgdrdrv_ioctl_req_mapping_type(struct mtgdrdrv_file *priv,
				    void __user *argp)
{
	struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS p;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	if (p.mapping_type > GDR_MR_DEVICE)
		return -EINVAL;
	return mtgdrdrv_pin_req_type(priv, p.handle, p.mapping_type);
}

/*
 * Frees every pin of a file being released, from whatever process closes it
 * last (no owner check: upstream issue 313). No VMA can exist any more:
 * each holds a reference to the file.
 */
void mtgdrdrv_pins_release(struct mtgdrdrv_file *priv)
{
	struct mtgdrdrv_pin *pin, *tmp;
	LIST_HEAD(pins);

	mutex_lock(&priv->lock);
	list_splice_init(&priv->pins, &pins);
	mutex_unlock(&priv->lock);

	list_for_each_entry_safe(pin, tmp, &pins, node) {
		if (pin->map_count) {
			pr_err("pin 0x%llx still has %u mappings at release\n",
			       pin->handle, pin->map_count);
			atomic64_sub(pin->map_count, &mtgdrdrv_counters.mappings);
		}
		list_del(&pin->node);
		mtgdrdrv_pin_destroy(pin);
	}
	/* The last munmap may have queued this file's last puts. */
	mtgdrdrv_put_flush();
}
