// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mtgpu_emu: /dev/mtgpu_emu, the test runtime's handle on the emulated device memory.
 *
 * Every ioctl answers -ENODEV while no ivshmem BAR is bound and -ENOTTY for unknown commands.
 * User memory is only touched here, never with emu_dev.lock held: READ/WRITE go through a
 * bounce buffer one EMU_IO_CHUNK at a time, taking the lock per chunk.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/build_bug.h>
#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "emu.h"

/* The generated header must agree with the kernel's own _IOC encoding of its structs. */
static_assert(MTGPU_EMU_IOC_ALLOC == _IOWR(MTGPU_EMU_IOCTL, 1, struct mtgpu_emu_alloc));
static_assert(MTGPU_EMU_IOC_FREE == _IOW(MTGPU_EMU_IOCTL, 2, struct mtgpu_emu_free));
static_assert(MTGPU_EMU_IOC_READ == _IOW(MTGPU_EMU_IOCTL, 3, struct mtgpu_emu_rw));
static_assert(MTGPU_EMU_IOC_WRITE == _IOW(MTGPU_EMU_IOCTL, 4, struct mtgpu_emu_rw));
static_assert(MTGPU_EMU_IOC_MEMSET == _IOW(MTGPU_EMU_IOCTL, 5, struct mtgpu_emu_rw));
static_assert(MTGPU_EMU_IOC_INJECT_FAULT == _IOW(MTGPU_EMU_IOCTL, 6, struct mtgpu_emu_fault));
static_assert(MTGPU_EMU_IOC_GET_STATS == _IOR(MTGPU_EMU_IOCTL, 7, struct mtgpu_emu_stats));
static_assert(MTGPU_EMU_IOC_EXPORT_DMABUF ==
	      _IOWR(MTGPU_EMU_IOCTL, 8, struct mtgpu_emu_export_dmabuf));
static_assert(MTGPU_EMU_IOC_VMM == _IOWR(MTGPU_EMU_IOCTL, 9, struct mtgpu_emu_vmm));

/* READ (BAR -> user) or WRITE (user -> BAR) of args->size bytes at args->gpu_va. */
static int emu_copy(const struct mtgpu_emu_rw *args, enum emu_io_op op)
{
	u8 __user *ubuf = u64_to_user_ptr(args->user_ptr);
	size_t bounce_len = min_t(u64, args->size, EMU_IO_CHUNK);
	struct emu_io io = { .op = op };
	size_t chunk;
	u64 done;
	u8 *bounce;
	int ret = 0;

	bounce = kvmalloc(bounce_len, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;

	for (done = 0; done < args->size; done += chunk) {
		chunk = min_t(u64, args->size - done, bounce_len);
		io.buf = bounce;
		if (op == EMU_IO_WRITE && copy_from_user(bounce, ubuf + done, chunk)) {
			ret = -EFAULT;
			break;
		}
		ret = emu_alloc_access(args->gpu_va, args->size, done, chunk, &io);
		if (ret)
			break;
		if (op == EMU_IO_READ && copy_to_user(ubuf + done, bounce, chunk)) {
			ret = -EFAULT;
			break;
		}
		cond_resched();
	}

	kvfree(bounce);
	return ret;
}

/* MEMSET: the low byte of args->value over args->size bytes at args->gpu_va. */
static int emu_fill(const struct mtgpu_emu_rw *args)
{
	struct emu_io io = { .op = EMU_IO_FILL, .fill = args->value & 0xff };
	size_t chunk;
	u64 done;
	int ret;

	for (done = 0; done < args->size; done += chunk) {
		chunk = min_t(u64, args->size - done, EMU_IO_CHUNK);
		ret = emu_alloc_access(args->gpu_va, args->size, done, chunk, &io);
		if (ret)
			return ret;
		cond_resched();
	}
	return 0;
}

static int emu_ioctl_alloc(struct file *file, struct mtgpu_emu_alloc __user *uarg)
{
	struct mtgpu_emu_alloc args;
	int ret;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;

	ret = emu_alloc_create(file, &args);
	if (ret)
		return ret;

	if (copy_to_user(uarg, &args, sizeof(args))) {
		emu_alloc_free(args.gpu_va);
		return -EFAULT;
	}
	return 0;
}

static int emu_ioctl_free(struct mtgpu_emu_free __user *uarg)
{
	struct mtgpu_emu_free args;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	return emu_alloc_free(args.gpu_va);
}

static int emu_ioctl_rw(struct mtgpu_emu_rw __user *uarg, enum emu_io_op op)
{
	struct mtgpu_emu_rw args;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.reserved || !args.size)
		return -EINVAL;
	return op == EMU_IO_FILL ? emu_fill(&args) : emu_copy(&args, op);
}

static int emu_ioctl_inject_fault(struct mtgpu_emu_fault __user *uarg)
{
	struct mtgpu_emu_fault args;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	return emu_fault_set(args.kind, args.count);
}

static int emu_ioctl_get_stats(struct mtgpu_emu_stats __user *uarg)
{
	struct mtgpu_emu_stats st;
	int ret;

	ret = emu_stats_get(&st);
	if (ret)
		return ret;
	return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
}

static long emu_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *argp = (void __user *)arg;

	switch (cmd) {
	case MTGPU_EMU_IOC_ALLOC:
		return emu_ioctl_alloc(file, argp);
	case MTGPU_EMU_IOC_FREE:
		return emu_ioctl_free(argp);
	case MTGPU_EMU_IOC_READ:
		return emu_ioctl_rw(argp, EMU_IO_READ);
	case MTGPU_EMU_IOC_WRITE:
		return emu_ioctl_rw(argp, EMU_IO_WRITE);
	case MTGPU_EMU_IOC_MEMSET:
		return emu_ioctl_rw(argp, EMU_IO_FILL);
	case MTGPU_EMU_IOC_INJECT_FAULT:
		return emu_ioctl_inject_fault(argp);
	case MTGPU_EMU_IOC_GET_STATS:
		return emu_ioctl_get_stats(argp);
	case MTGPU_EMU_IOC_EXPORT_DMABUF:
		return emu_dmabuf_export(argp);
	case MTGPU_EMU_IOC_VMM:
		return emu_vmm_ioctl(file, argp);
	default:
		return -ENOTTY;
	}
}

/* Allocations belong to the file that made them: closing it frees them (see emu_alloc.c). */
static int emu_release(struct inode *inode, struct file *file)
{
	emu_alloc_release_file(file);
	return 0;
}

static const struct file_operations emu_fops = {
	.owner = THIS_MODULE,
	.open = nonseekable_open,
	.release = emu_release,
	.unlocked_ioctl = emu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice emu_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = MTGPU_EMU_DEVICE_NAME,
	.fops = &emu_fops,
	.mode = 0666,			/* test-only device */
};

int emu_chardev_register(void)
{
	return misc_register(&emu_misc);
}

void emu_chardev_unregister(void)
{
	misc_deregister(&emu_misc);
}
