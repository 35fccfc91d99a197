// SPDX-License-Identifier: MIT
/*
 * dlopen order of tests/static_tls.rs, in a process of its own:
 *
 *   static_tls_dlopen probe LIB                 exit 0 if LIB loads, 1 if not
 *   static_tls_dlopen run FILLER CONTROL GDRAPI
 *
 * "run" loads FILLER (initial-exec TLS taking most of glibc's static TLS surplus) first, checks
 * that CONTROL (128 bytes of initial-exec TLS, as much as libgdrapi's whole TLS segment) no
 * longer loads, then loads libgdrapi and calls it: gdr_copy_to_mapping and
 * gdr_copy_from_mapping with a zeroed handle (EINVAL, after reading the thread's hazard
 * through TLS), on this thread and on a new one, then gdr_open. Preloaded with the copy
 * harness's device-node stand-in (testing/copy-harness/devnode_double.c) gdr_open opens, and
 * each thread pins, maps, copies a pattern to the mapping and back and compares, twice: with
 * the hazard pointer in dynamic TLS every copy takes the library's cold path.
 * Exit status: 0 passed; 2 FILLER did not load; 3 CONTROL loaded (the surplus was not used up,
 * so the run proves nothing); 4 libgdrapi did not load; 5 a call answered wrongly; 6 (run-open)
 * gdr_open did not open.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct gdr *gdr_t;
typedef struct {
	unsigned long h;
} mh_t;

static int (*copy_to)(mh_t, void *, const void *, size_t);
static int (*copy_from)(mh_t, void *, const void *, size_t);
static int (*pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, mh_t *);
static int (*map)(gdr_t, mh_t, void **, size_t);
static int (*unmap)(gdr_t, mh_t, void *, size_t);
static int (*unpin)(gdr_t, mh_t);

/* The stand-in's one buffer: any address, 64 KiB. */
#define GPU_VA 0x7f0000000000UL
#define PIN_SIZE 65536

static void *load(const char *path)
{
	void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!so)
		printf("dlopen %s: %s\n", path, dlerror());
	return so;
}

/* Both copy entry points with a zeroed handle, twice (a thread's first copy takes its hazard,
 * the second reads it on the fast path): EINVAL every time. */
static void *copies(void *failed)
{
	uint64_t device = 0, host = 0;

	for (int i = 0; i < 2; i++) {
		int to = copy_to((mh_t){ 0 }, &device, &host, sizeof(host));
		int from = copy_from((mh_t){ 0 }, &host, &device, sizeof(host));

		if (to != EINVAL || from != EINVAL) {
			printf("copy with a zeroed handle: %d and %d, not EINVAL\n", to, from);
			*(int *)failed = 1;
		}
	}
	return NULL;
}

/* Pin, map, copy a pattern there and back (twice), unmap, unpin on `g`: 0 if every byte came
 * back. Serialised by the caller (the stand-in holds one pin per open file). */
static int copy_through_mapping(gdr_t g, unsigned seed)
{
	unsigned char out[256], back[256];
	mh_t mh;
	void *va;
	int bad = 0;

	if (pin(g, GPU_VA, PIN_SIZE, 0, 0, &mh) || map(g, mh, &va, PIN_SIZE)) {
		printf("pin or map through the stand-in failed\n");
		return 1;
	}
	for (int round = 0; round < 2; round++) {
		for (size_t i = 0; i < sizeof(out); i++)
			out[i] = (unsigned char)(i * 7 + seed + round);
		memset(back, 0, sizeof(back));
		if (copy_to(mh, (char *)va + 64 * round, out, sizeof(out)) ||
		    copy_from(mh, back, (char *)va + 64 * round, sizeof(back)) ||
		    memcmp(out, back, sizeof(out))) {
			printf("copy through the mapping did not come back (round %d)\n", round);
			bad = 1;
		}
	}
	if (unmap(g, mh, va, PIN_SIZE) || unpin(g, mh)) {
		printf("unmap or unpin failed\n");
		bad = 1;
	}
	return bad;
}

static gdr_t opened;

static void *copies_through_mapping(void *failed)
{
	if (copy_through_mapping(opened, 99))
		*(int *)failed = 1;
	return NULL;
}

static int run(const char *filler, const char *control, const char *gdrapi)
{
	gdr_t (*gdr_open)(void);
	int (*gdr_close)(gdr_t);
	int failed = 0;
	pthread_t thread;
	void *so;
	gdr_t g;

	if (!load(filler))
		return 2;
	if (load(control)) {
		printf("%s still loads: the surplus is not used up\n", control);
		return 3;
	}
	so = load(gdrapi);
	if (!so)
		return 4;
	copy_to = dlsym(so, "gdr_copy_to_mapping");
	copy_from = dlsym(so, "gdr_copy_from_mapping");
	gdr_open = (gdr_t(*)(void))dlsym(so, "gdr_open");
	gdr_close = (int (*)(gdr_t))dlsym(so, "gdr_close");
	pin = (int (*)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, mh_t *))dlsym(
		so, "gdr_pin_buffer");
	map = (int (*)(gdr_t, mh_t, void **, size_t))dlsym(so, "gdr_map");
	unmap = (int (*)(gdr_t, mh_t, void *, size_t))dlsym(so, "gdr_unmap");
	unpin = (int (*)(gdr_t, mh_t))dlsym(so, "gdr_unpin_buffer");
	if (!copy_to || !copy_from || !gdr_open || !gdr_close || !pin || !map || !unmap ||
	    !unpin) {
		printf("missing symbols\n");
		return 5;
	}
	copies(&failed);
	if (pthread_create(&thread, NULL, copies, &failed) || pthread_join(thread, NULL)) {
		printf("pthread_create failed\n");
		return 5;
	}
	g = gdr_open();
	printf("gdr_open: %s\n", g ? "opened" : strerror(errno));
	if (g) {
		opened = g;
		if (copy_through_mapping(g, 1))
			failed = 1;
		if (pthread_create(&thread, NULL, copies_through_mapping, &failed) ||
		    pthread_join(thread, NULL)) {
			printf("pthread_create failed\n");
			return 5;
		}
	}
	if (g && gdr_close(g)) {
		printf("gdr_close failed\n");
		failed = 1;
	}
	return failed ? 5 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "probe"))
		return load(argv[2]) ? 0 : 1;
	if (argc == 5 && !strcmp(argv[1], "run"))
		return run(argv[2], argv[3], argv[4]);
	/* "run" whose gdr_open must open (the stand-in is preloaded): exit 6 if it does not */
	if (argc == 5 && !strcmp(argv[1], "run-open")) {
		int status = run(argv[2], argv[3], argv[4]);

		return status ? status : (opened ? 0 : 6);
	}
	fprintf(stderr, "usage: static_tls_dlopen probe LIB | run FILLER CONTROL GDRAPI\n");
	return 64;
}
