// SPDX-License-Identifier: MIT
/*
 * A stand-in for the gdrdrv-style device node, preloaded (LD_PRELOAD) into the copy harness so
 * that a gdrapi library runs its real gdr_open / gdr_pin_buffer / gdr_map / gdr_copy_* code on a
 * host without a GPU or a kernel module.
 *
 * open() of /dev/mtgdrdrv (or upstream's /dev/gdrdrv) returns a memfd; the ioctls a library
 * issues on it are answered as the driver would for one pinned buffer, write-combined or (when
 * REQ_MAPPING_TYPE asks for it) DEVICE; mmap() of
 * it returns fresh anonymous memory standing in for the BAR pages. Every other call goes to libc.
 * The answers follow the ioctl ABI (mtgdrdrv/kmod/mtgdrdrv_ioctl.h, upstream's numbers).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "mtgdrdrv_ioctl.h"

#define GPU_PAGE (64UL * 1024)

/* One open file of a node; a process may hold both libraries' (the harness compares them). */
struct node {
	int fd;
	/* upstream's /dev/gdrdrv: answers with upstream's versions */
	int upstream;
	__u64 pinned_addr, pinned_size;
	/* what REQ_MAPPING_TYPE asked for: WC (the default) or DEVICE */
	__u32 mapping_type;
};

static struct node nodes[8];
static int node_count;

/* 0: not a node; 1: ours; 2: upstream's. */
static int node_kind(const char *path)
{
	if (strcmp(path, "/dev/mtgdrdrv") == 0)
		return 1;
	if (strcmp(path, "/dev/gdrdrv") == 0)
		return 2;
	return 0;
}

static int open_node(int kind)
{
	struct node *n;

	if (node_count == (int)(sizeof(nodes) / sizeof(nodes[0]))) {
		errno = EMFILE;
		return -1;
	}
	n = &nodes[node_count];
	n->fd = memfd_create("devnode-double", MFD_CLOEXEC);
	if (n->fd < 0)
		return -1;
	n->upstream = kind == 2;
	n->mapping_type = GDR_MR_WC;
	node_count++;
	return n->fd;
}

static struct node *find_node(int fd)
{
	for (int i = 0; i < node_count; i++)
		if (fd >= 0 && nodes[i].fd == fd)
			return &nodes[i];
	return NULL;
}

/* The mode argument, present when the flags create a file. */
#define TAKE_MODE(flags, mode)                                                   \
	do {                                                                     \
		if (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE) { \
			va_list ap;                                              \
			va_start(ap, flags);                                     \
			mode = va_arg(ap, mode_t);                               \
			va_end(ap);                                              \
		}                                                                \
	} while (0)

#define OPEN_WRAPPER(name)                                                       \
	int name(const char *path, int flags, ...)                               \
	{                                                                        \
		static int (*real)(const char *, int, ...);                      \
		mode_t mode = 0;                                                 \
		TAKE_MODE(flags, mode);                                          \
		if (node_kind(path))                                             \
			return open_node(node_kind(path));                       \
		if (!real)                                                       \
			real = dlsym(RTLD_NEXT, #name);                          \
		return real(path, flags, mode);                                  \
	}

OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                                     \
	int name(int dirfd, const char *path, int flags, ...)                    \
	{                                                                        \
		static int (*real)(int, const char *, int, ...);                 \
		mode_t mode = 0;                                                 \
		TAKE_MODE(flags, mode);                                          \
		if (node_kind(path))                                             \
			return open_node(node_kind(path));                       \
		if (!real)                                                       \
			real = dlsym(RTLD_NEXT, #name);                          \
		return real(dirfd, path, flags, mode);                           \
	}

OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

static void fill_info(const struct node *n, __u64 *va, __u64 *mapped_size, __u32 *page_size)
{
	*va = n->pinned_addr & ~(GPU_PAGE - 1);
	*mapped_size = (n->pinned_addr + n->pinned_size + GPU_PAGE - 1) / GPU_PAGE * GPU_PAGE - *va;
	*page_size = GPU_PAGE;
}

/* One buffer per node: a pin replaces the previous one and is handle 1. */
static gdr_hnd_t pin(struct node *n, __u64 addr, __u64 size)
{
	n->pinned_addr = addr;
	n->pinned_size = size;
	return 1;
}

static int node_ioctl(struct node *n, unsigned long request, void *arg)
{
	switch (request) {
	case GDRDRV_IOC_GET_VERSION: {
		struct GDRDRV_IOC_GET_VERSION_PARAMS *p = arg;
		p->gdrdrv_version = n->upstream ? 0x00020006 : MTGDRDRV_VERSION;
		p->minimum_gdr_api_version = n->upstream ? 0x00020000 : MINIMUM_GDR_API_VERSION;
		return 0;
	}
	case GDRDRV_IOC_PIN_BUFFER: {
		struct GDRDRV_IOC_PIN_BUFFER_PARAMS *p = arg;

		p->handle = pin(n, p->addr, p->size);
		return 0;
	}
	case GDRDRV_IOC_PIN_BUFFER_V2: {
		struct GDRDRV_IOC_PIN_BUFFER_V2_PARAMS *p = arg;

		p->handle = pin(n, p->addr, p->size);
		return 0;
	}
	case GDRDRV_IOC_UNPIN_BUFFER:
		return 0;
	case GDRDRV_IOC_GET_CB_FLAG:
		((struct GDRDRV_IOC_GET_CB_FLAG_PARAMS *)arg)->flag = 0;
		return 0;
	case GDRDRV_IOC_GET_INFO: {
		struct GDRDRV_IOC_GET_INFO_PARAMS *p = arg;
		fill_info(n, &p->va, &p->mapped_size, &p->page_size);
		p->mapped = 1;
		p->wc_mapping = n->mapping_type == GDR_MR_WC;
		return 0;
	}
	case GDRDRV_IOC_GET_INFO_V2: {
		struct GDRDRV_IOC_GET_INFO_V2_PARAMS *p = arg;
		fill_info(n, &p->va, &p->mapped_size, &p->page_size);
		p->mapping_type = n->mapping_type;
		return 0;
	}
	case GDRDRV_IOC_GET_ATTR: {
		struct GDRDRV_IOC_GET_ATTR_PARAMS *p = arg;
		p->val = p->attr == GDRDRV_ATTR_USE_PERSISTENT_MAPPING;
		return 0;
	}
	case GDRDRV_IOC_REQ_MAPPING_TYPE: {
		struct GDRDRV_IOC_REQ_MAPPING_TYPE_PARAMS *p = arg;
		if (p->mapping_type != GDR_MR_NONE && p->mapping_type != GDR_MR_WC &&
		    p->mapping_type != GDR_MR_DEVICE) {
			errno = EINVAL;
			return -1;
		}
		n->mapping_type = p->mapping_type == GDR_MR_NONE ? GDR_MR_WC : p->mapping_type;
		return 0;
	}
	default:
		errno = ENOTTY;
		return -1;
	}
}

int ioctl(int fd, unsigned long request, ...)
{
	static int (*real)(int, unsigned long, ...);
	va_list ap;
	void *arg;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (find_node(fd))
		return node_ioctl(find_node(fd), request, arg);
	if (!real)
		real = dlsym(RTLD_NEXT, "ioctl");
	return real(fd, request, arg);
}

#define MMAP_WRAPPER(name)                                                       \
	void *name(void *addr, size_t len, int prot, int flags, int fd, off_t off) \
	{                                                                        \
		static void *(*real)(void *, size_t, int, int, int, off_t);      \
		if (!real)                                                       \
			real = dlsym(RTLD_NEXT, #name);                          \
		if (find_node(fd))                                               \
			return real(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); \
		return real(addr, len, prot, flags, fd, off);                    \
	}

MMAP_WRAPPER(mmap)
MMAP_WRAPPER(mmap64)
