// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * mtgdrdrv: GDRCopy's kernel module for Moore Threads GPUs.
 *
 * A process pins a range of its GPU memory through /dev/mtgdrdrv (the
 * module asks mtgpu for the CPU physical addresses of the BAR pages behind
 * it), then mmaps the pin and reads and writes GPU memory with plain CPU
 * loads and stores. The ioctl ABI is upstream gdrdrv's (mtgdrdrv_ioctl.h).
 *
 * This file: module init/exit, the misc device, file operations, the ioctl
 * dispatcher, GET_ATTR/GET_VERSION and /proc/driver/mtgdrdrv.
 *
 * Lock order:
 *
 *   mmap_lock			(mm core: ->mmap, vm_ops->open/close)
 *     mtgdrdrv_file.lock	(mutex per open file: pins, handles)
 *       memtype/page-table locks inside io_remap_pfn_range() and
 *       arch_io_{reserve,free}_memtype_wc()
 *
 * Never with mtgdrdrv_file.lock held: copy_{from,to}_user() (a fault takes
 * mmap_lock), mtgpu_p2p_get_pages()/put_pages() (they sleep and take
 * mtgpu's locks), unmap_mapping_range() (i_mmap_rwsem). Never under any
 * spinlock: mtgpu_p2p_get_pages()/put_pages(). Never under mmap_lock:
 * put_pages (mtgpu's locks must not nest inside it), so a pin whose last
 * VMA closes is put from a work item. get_pages runs only from the pin
 * ioctl, in the owner's context (and only while mtgpu's PCI driver is
 * registered); put_pages also runs from release (any process) and from the
 * put work item.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/compat.h>
#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pid.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "mtgdrdrv.h"
#include "compat.h"

int mtgdrdrv_dbg_enabled;
module_param_named(dbg_enabled, mtgdrdrv_dbg_enabled, int, 0644);
MODULE_PARM_DESC(dbg_enabled, "Log debug messages (default: 0)");

int mtgdrdrv_info_enabled;
module_param_named(info_enabled, mtgdrdrv_info_enabled, int, 0644);
MODULE_PARM_DESC(info_enabled, "Log informational messages (default: 0)");

#ifdef MTGDRDRV_TEST_HOOKS
/*
 * Test builds only (Kbuild MTGDRDRV_TEST_HOOKS=y; DKMS never sets it): a
 * nonzero value is what GET_VERSION reports as the driver version, so tests
 * can check how the library handles a driver it does not support.
 */
static unsigned int mtgdrdrv_test_report_version;
module_param_named(test_report_version, mtgdrdrv_test_report_version, uint,
		   0644);
MODULE_PARM_DESC(test_report_version,
		 "Test builds only: driver version GET_VERSION reports, major << 16 | minor (default: 0 = the real one)");

static u32 mtgdrdrv_reported_version(void)
{
	return READ_ONCE(mtgdrdrv_test_report_version) ?: MTGDRDRV_VERSION;
}
#else
static u32 mtgdrdrv_reported_version(void)
{
	return MTGDRDRV_VERSION;
}
#endif

struct mtgdrdrv_counters mtgdrdrv_counters;

static struct proc_dir_entry *mtgdrdrv_proc_dir;

/*
 * The opener's thread group in the opener's address space: a forked child,
 * a process the fd was passed to, and the new image after an exec (which
 * keeps the fd without O_CLOEXEC) are all refused.
 */
bool mtgdrdrv_is_owner(const struct mtgdrdrv_file *priv)
{
	return task_tgid(current) == priv->tgid && current->mm == priv->mm;
}

static int mtgdrdrv_ioctl_get_attr(struct mtgdrdrv_file *priv,
				   void __user *argp)
{
	struct GDRDRV_IOC_GET_ATTR_PARAMS p;

	if (copy_from_user(&p, argp, sizeof(p)))
		return -EFAULT;
	switch (p.attr) {
	case GDRDRV_ATTR_USE_PERSISTENT_MAPPING:
		p.val = 1;	/* a pin holds its memory until unpinned */
		break;
	case GDRDRV_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE:
		p.val = 0;
		break;
	default:
		return -EINVAL;
	}
	return copy_to_user(argp, &p, sizeof(p)) ? -EFAULT : 0;
}

static int mtgdrdrv_ioctl_get_version(struct mtgdrdrv_file *priv,
				      void __user *argp)
{
	struct GDRDRV_IOC_GET_VERSION_PARAMS p = {
		.gdrdrv_version = mtgdrdrv_reported_version(),
		.minimum_gdr_api_version = MINIMUM_GDR_API_VERSION,
	};

	return copy_to_user(argp, &p, sizeof(p)) ? -EFAULT : 0;
}

/*
 * The size encoded in cmd is ignored: seven commands encode a pointer size
 * (upstream's quirk). Each handler copies exactly its struct.
 */
static long mtgdrdrv_ioctl(struct file *filp, unsigned int cmd,
			   unsigned long arg)
{
	struct mtgdrdrv_file *priv = filp->private_data;
	void __user *argp = (void __user *)arg;

	if (_IOC_TYPE(cmd) != GDRDRV_IOCTL)
		return -EINVAL;
	if (!mtgdrdrv_is_owner(priv))
		return -EACCES;

	switch (cmd) {
	case GDRDRV_IOC_PIN_BUFFER:
		return mtgdrdrv_ioctl_pin_buffer(priv, argp);
	case GDRDRV_IOC_PIN_BUFFER_V2:
		return mtgdrdrv_ioctl_pin_buffer_v2(priv, argp);
	case GDRDRV_IOC_UNPIN_BUFFER:
		return mtgdrdrv_ioctl_unpin_buffer(priv, argp);
	case GDRDRV_IOC_GET_CB_FLAG:
		return mtgdrdrv_ioctl_get_cb_flag(priv, argp);
	case GDRDRV_IOC_GET_INFO:
		return mtgdrdrv_ioctl_get_info(priv, argp);
	case GDRDRV_IOC_GET_INFO_V2:
		return mtgdrdrv_ioctl_get_info_v2(priv, argp);
	case GDRDRV_IOC_GET_ATTR:
		return mtgdrdrv_ioctl_get_attr(priv, argp);
	case GDRDRV_IOC_REQ_MAPPING_TYPE:
		return mtgdrdrv_ioctl_req_mapping_type(priv, argp);
	case GDRDRV_IOC_GET_VERSION:
		return mtgdrdrv_ioctl_get_version(priv, argp);
	default:
		return -ENOTTY;
	}
}

#ifdef CONFIG_COMPAT
/* The argument structs are fixed-width, so only the pointer needs care. */
static long mtgdrdrv_compat_ioctl(struct file *filp, unsigned int cmd,
				  unsigned long arg)
{
	return mtgdrdrv_ioctl(filp, cmd, (unsigned long)compat_ptr(arg));
}
#endif

static int mtgdrdrv_open(struct inode *inode, struct file *filp)
{
	struct mtgdrdrv_file *priv;

	priv = kzalloc(sizeof(*priv), GFP_KERNEL_ACCOUNT);
	if (!priv)
		return -ENOMEM;

	mutex_init(&priv->lock);
	INIT_LIST_HEAD(&priv->pins);
	priv->tgid = get_pid(task_tgid(current));
	priv->mm = current->mm;
	if (priv->mm)
		mmgrab(priv->mm);
	address_space_init_once(&priv->mapping);
	priv->mapping.host = inode;
	priv->mapping.a_ops = inode->i_mapping->a_ops;
	filp->f_mapping = &priv->mapping;
	filp->private_data = priv;
	return 0;
}

/* From any process: the last closer may not be the opener (issue 313). */
static int mtgdrdrv_release(struct inode *inode, struct file *filp)
{
	struct mtgdrdrv_file *priv = filp->private_data;

	mtgdrdrv_pins_release(priv);
	filp->f_mapping = inode->i_mapping;
	put_pid(priv->tgid);
	if (priv->mm)
		mmdrop(priv->mm);
	mutex_destroy(&priv->lock);
	kfree(priv);
	return 0;
}

static const struct file_operations mtgdrdrv_fops = {
	.owner		= THIS_MODULE,
	.open		= mtgdrdrv_open,
	.release	= mtgdrdrv_release,
	.unlocked_ioctl	= mtgdrdrv_ioctl,
#ifdef CONFIG_COMPAT
	.compat_ioctl	= mtgdrdrv_compat_ioctl,
#endif
	.mmap		= mtgdrdrv_mmap,
};

/* /dev/mtgdrdrv; udev creates the node, its mode is packaging policy. */
static struct miscdevice mtgdrdrv_misc = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= "mtgdrdrv",
	.fops	= &mtgdrdrv_fops,
};

static int mtgdrdrv_params_show(struct seq_file *m, void *v)
{
	seq_printf(m, "Version: %s\n", MTGDRDRV_VERSION_STRING);
	seq_printf(m, "dbg_enabled: %d\n", READ_ONCE(mtgdrdrv_dbg_enabled));
	seq_printf(m, "info_enabled: %d\n", READ_ONCE(mtgdrdrv_info_enabled));
	seq_printf(m, "max_pins_per_file: %u\n",
		   READ_ONCE(mtgdrdrv_max_pins_per_file));
	seq_printf(m, "max_bytes_per_file: %llu\n",
		   READ_ONCE(mtgdrdrv_max_bytes_per_file));
	seq_printf(m, "max_runs_per_pin: %u\n",
		   READ_ONCE(mtgdrdrv_max_runs_per_pin));
#ifdef MTGDRDRV_TEST_HOOKS
	seq_printf(m, "test_report_version: 0x%x\n",
		   READ_ONCE(mtgdrdrv_test_report_version));
#endif
	return 0;
}

static int mtgdrdrv_params_open(struct inode *inode, struct file *file)
{
	return single_open(file, mtgdrdrv_params_show, NULL);
}

MTGDRDRV_PROC_OPS(mtgdrdrv_params_ops, mtgdrdrv_params_open);

/* One "name value" line of /proc/driver/mtgdrdrv/counters. */
#define mtgdrdrv_show_counter(m, c, name)				\
	seq_printf(m, #name " %lld\n", (long long)atomic64_read(&(c)->name))

static int mtgdrdrv_counters_show(struct seq_file *m, void *v)
{
	const struct mtgdrdrv_counters *c = &mtgdrdrv_counters;

	mtgdrdrv_show_counter(m, c, pins_outstanding);
	mtgdrdrv_show_counter(m, c, bytes_pinned);
	mtgdrdrv_show_counter(m, c, mappings);
	mtgdrdrv_show_counter(m, c, get_pages_calls);
	mtgdrdrv_show_counter(m, c, put_pages_calls);
	mtgdrdrv_show_counter(m, c, get_pages_refused);
	mtgdrdrv_show_counter(m, c, bad_tables);
	mtgdrdrv_show_counter(m, c, provider_unavailable);
	mtgdrdrv_show_counter(m, c, deferred_puts);
	mtgdrdrv_show_counter(m, c, pins_over_limit);
	mtgdrdrv_show_counter(m, c, stale_maps);
	mtgdrdrv_show_counter(m, c, wc_came_out_uc);
	mtgdrdrv_show_counter(m, c, device_came_out_wc);
	return 0;
}

static int mtgdrdrv_counters_open(struct inode *inode, struct file *file)
{
	return single_open(file, mtgdrdrv_counters_show, NULL);
}

MTGDRDRV_PROC_OPS(mtgdrdrv_counters_ops, mtgdrdrv_counters_open);

/* /proc/driver/mtgdrdrv/{params,counters}; the device works without them. */
static void mtgdrdrv_proc_init(void)
{
	mtgdrdrv_proc_dir = proc_mkdir("driver/mtgdrdrv", NULL);
	if (!mtgdrdrv_proc_dir ||
	    !proc_create("params", 0444, mtgdrdrv_proc_dir,
			 &mtgdrdrv_params_ops) ||
	    !proc_create("counters", 0444, mtgdrdrv_proc_dir,
			 &mtgdrdrv_counters_ops))
		pr_warn("cannot create /proc/driver/mtgdrdrv\n");
}

static void mtgdrdrv_proc_exit(void)
{
	proc_remove(mtgdrdrv_proc_dir);
}

/* Every pin holds a module reference through its file: all must be zero. */
static void mtgdrdrv_check_counters(void)
{
	const struct mtgdrdrv_counters *c = &mtgdrdrv_counters;
	s64 gets = atomic64_read(&c->get_pages_calls);
	s64 puts = atomic64_read(&c->put_pages_calls);

	WARN(atomic64_read(&c->pins_outstanding) ||
	     atomic64_read(&c->bytes_pinned) ||
	     atomic64_read(&c->mappings) || gets != puts,
	     "mtgdrdrv: leak at unload: pins %lld, bytes %lld, mappings %lld, get_pages %lld, put_pages %lld\n",
	     (long long)atomic64_read(&c->pins_outstanding),
	     (long long)atomic64_read(&c->bytes_pinned),
	     (long long)atomic64_read(&c->mappings),
	     (long long)gets, (long long)puts);
}

static int __init mtgdrdrv_init(void)
{
	int ret;

	ret = mtgdrdrv_pin_init();
	if (ret)
		return ret;
	mtgdrdrv_proc_init();
	ret = misc_register(&mtgdrdrv_misc);
	if (ret) {
		pr_err("cannot register /dev/%s: %d\n", mtgdrdrv_misc.name,
		       ret);
		mtgdrdrv_proc_exit();
		mtgdrdrv_pin_exit();
		return ret;
	}
	pr_info("version %s loaded\n", MTGDRDRV_VERSION_STRING);
	if (!mtgdrdrv_provider_registered())
		pr_warn("mtgpu is loaded but not initialised (its PCI driver is not registered; disable_driver=1?): pins fail until mtgpu is reloaded without disable_driver=1, or after a reboot\n");
#ifdef MTGDRDRV_TEST_HOOKS
	pr_notice("built with test hooks (MTGDRDRV_TEST_HOOKS): not for production\n");
#endif
	return 0;
}

static void __exit mtgdrdrv_exit(void)
{
	misc_deregister(&mtgdrdrv_misc);
	mtgdrdrv_proc_exit();
	mtgdrdrv_pin_exit();
	mtgdrdrv_check_counters();
	mtgdrdrv_info("unloaded\n");
}

module_init(mtgdrdrv_init);
module_exit(mtgdrdrv_exit);

MODULE_LICENSE("Dual MIT/GPL");
MODULE_DESCRIPTION("GDRCopy driver for Moore Threads GPUs (CPU mappings of GPU memory)");
MODULE_VERSION(MTGDRDRV_VERSION_STRING);
