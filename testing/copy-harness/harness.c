// SPDX-License-Identifier: MIT
/*
 * Calls a gdrapi library's public copy entry points the way an application does: dlopen, then
 * gdr_open, gdr_pin_buffer, gdr_map, gdr_copy_{to,from}_mapping through a real mapping handle.
 * The device node is devnode_double.so's (LD_PRELOAD), so any host can run it.
 *
 *   harness count LIB [device]   read cases from stdin, call each once under a tracer
 *                                (device: through a DEVICE mapping, gdr_map_v2's request)
 *   harness time LIB [LIB...]    read cases from stdin, time each in every library, interleaved
 *
 * A case is a line `to|from SIZE DEVICE_MISALIGNMENT HOST_MISALIGNMENT`.
 *
 * In count mode the harness talks to its tracer (cargo xtask copy-counts) with int3 markers,
 * the code in rax:
 *   1  the library is about to be opened (a tracer emulating CPU features steps from here on,
 *      so that the library's feature detection sees them);
 *   2  set-up done, the copy routine is chosen;
 *   3  the next call of the function at rbx is a measured copy of rdx bytes at device address
 *      rcx (rsi: 1 to the device, 0 from it).
 * Without a tracer an int3 kills the process: count mode is only for the tracer.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The ABI of gdrapi.h, declared here so that one harness serves libraries of both headers. */
typedef struct gdr *gdr_t;
typedef struct { unsigned long h; } mh_t;
typedef int (*copy_to_fn)(mh_t, void *, const void *, size_t);
typedef int (*copy_from_fn)(mh_t, void *, const void *, size_t);

#define GPU_VA 0x7f0000000000UL
/* Copies of up to 1 MiB at any misalignment below 4 KiB fit in one pin. */
#define MAX_SIZE (1UL << 20)
#define PIN_SIZE (2 * MAX_SIZE)
#define MAX_CASES 65536

struct lib {
	const char *path;
	copy_to_fn to;
	copy_from_fn from;
	mh_t mh;
	char *map;
	/* map with GDR_MAP_FLAG_REQ_DEVICE_MAPPING (3) instead of gdr_map's default */
	int device;
};

struct copy_case {
	int to_device;
	size_t size, dev_mis, host_mis;
};

static _Alignas(4096) unsigned char host_buf[MAX_SIZE + 4096];

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "harness: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
	exit(2);
}

static void marker(unsigned long code, const void *fn, const void *dev, unsigned long size,
		   int to_device)
{
	__asm__ volatile("int3"
			 :
			 : "a"(code), "b"(fn), "c"(dev), "d"(size), "S"((long)to_device)
			 : "memory");
}

static void *sym(void *so, const char *name)
{
	void *p = dlsym(so, name);

	if (!p)
		die("missing symbol", name);
	return p;
}

static void open_lib(struct lib *l)
{
	gdr_t (*gdr_open)(void);
	int (*pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, mh_t *);
	int (*map)(gdr_t, mh_t, void **, size_t);
	int (*map_v2)(gdr_t, mh_t, void **, size_t, int);
	void *so = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
	void *va;
	gdr_t g;

	if (!so)
		die("dlopen", dlerror());
	gdr_open = (gdr_t(*)(void))sym(so, "gdr_open");
	pin = sym(so, "gdr_pin_buffer");
	map = sym(so, "gdr_map");
	/* Only device mode needs gdr_map_v2, which older libraries lack. */
	map_v2 = l->device ? sym(so, "gdr_map_v2") : NULL;
	l->to = (copy_to_fn)sym(so, "gdr_copy_to_mapping");
	l->from = (copy_from_fn)sym(so, "gdr_copy_from_mapping");
	g = gdr_open();
	if (!g)
		die("gdr_open failed", l->path);
	if (pin(g, GPU_VA, PIN_SIZE, 0, 0, &l->mh))
		die("gdr_pin_buffer failed", l->path);
	if (l->device ? map_v2(g, l->mh, &va, PIN_SIZE, 3) : map(g, l->mh, &va, PIN_SIZE))
		die("gdr_map failed", l->path);
	l->map = va;
}

static int copy(const struct lib *l, const struct copy_case *c)
{
	char *dev = l->map + c->dev_mis;
	unsigned char *host = host_buf + c->host_mis;

	return c->to_device ? l->to(l->mh, dev, host, c->size) : l->from(l->mh, host, dev, c->size);
}

static size_t read_cases(struct copy_case *cases)
{
	char dir[8];
	size_t n = 0;
	struct copy_case c;

	while (scanf("%7s %zu %zu %zu", dir, &c.size, &c.dev_mis, &c.host_mis) == 4) {
		if (n == MAX_CASES)
			die("too many cases", NULL);
		c.to_device = strcmp(dir, "to") == 0;
		if (!c.to_device && strcmp(dir, "from") != 0)
			die("direction must be to or from", dir);
		if (c.size > MAX_SIZE || c.dev_mis >= 4096 || c.host_mis >= 4096)
			die("case out of range", NULL);
		cases[n++] = c;
	}
	return n;
}

static int count(struct lib *l, const struct copy_case *cases, size_t n)
{
	/*
	 * The first copies in each direction that reach a copy routine (copies below 16 bytes are
	 * made inline) choose it: inside the stepped set-up.
	 */
	static const struct copy_case first[] = { { 1, 64, 0, 0 }, { 0, 64, 0, 0 } };

	marker(1, NULL, NULL, 0, 0);
	open_lib(l);
	for (size_t i = 0; i < 2; i++)
		if (copy(l, &first[i]))
			die("copy failed", NULL);
	marker(2, NULL, NULL, 0, 0);
	for (size_t i = 0; i < n; i++) {
		const struct copy_case *c = &cases[i];
		const void *fn = c->to_device ? (const void *)l->to : (const void *)l->from;

		/* Warm: the measured call finds caches and predictors as a loop of copies would. */
		if (copy(l, c))
			die("copy failed", NULL);
		marker(3, fn, l->map + c->dev_mis, c->size, c->to_device);
		if (copy(l, c))
			die("copy failed", NULL);
	}
	return 0;
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* ns per call: median of 31 rounds, the libraries interleaved round by round. */
static int timing(struct lib *libs, size_t nlibs, const struct copy_case *cases, size_t n)
{
	enum { ROUNDS = 31 };
	static double samples[8][ROUNDS];

	for (size_t i = 0; i < nlibs; i++)
		open_lib(&libs[i]);
	for (size_t i = 0; i < n; i++) {
		const struct copy_case *c = &cases[i];
		/* About 200 µs of copying per sample. */
		size_t calls = 200000 / (20 + c->size / 8) + 1;

		for (int r = 0; r < ROUNDS; r++) {
			for (size_t k = 0; k < nlibs; k++) {
				double t0 = now_ns();

				for (size_t j = 0; j < calls; j++)
					if (copy(&libs[k], c))
						die("copy failed", libs[k].path);
				samples[k][r] = (now_ns() - t0) / calls;
			}
		}
		for (size_t k = 0; k < nlibs; k++) {
			qsort(samples[k], ROUNDS, sizeof(double), compare_double);
			printf("%zu %s %zu %zu %zu %.2f %.2f\n", k, c->to_device ? "to" : "from",
			       c->size, c->dev_mis, c->host_mis, samples[k][ROUNDS / 2],
			       samples[k][0]);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct copy_case cases[MAX_CASES];
	struct lib libs[8] = { 0 };
	size_t nlibs = (size_t)argc - 2, n;

	if (argc < 3 || (strcmp(argv[1], "count") && strcmp(argv[1], "time")) ||
	    (!strcmp(argv[1], "count") &&
	     (argc > 4 || (argc == 4 && strcmp(argv[3], "device")))) ||
	    nlibs > 8)
		die("usage: harness count LIB [device] | harness time LIB [LIB...] < cases", NULL);
	for (size_t i = 0; i < nlibs; i++)
		libs[i].path = argv[i + 2];
	if (!strcmp(argv[1], "count")) {
		nlibs = 1;
		libs[0].device = argc == 4;
	}
	memset(host_buf, 0x5a, sizeof(host_buf));
	n = read_cases(cases);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "count"))
		return count(&libs[0], cases, n);
	return timing(libs, nlibs, cases, n);
}
