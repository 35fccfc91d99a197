/*
 * Compiled with -Wall -Wextra -Werror as C11 (and, as header_test.cpp, as C++11) against
 * gdrapi.h and linked with libgdrapi.so: every declaration is used, and the layouts consumers
 * depend on are asserted. Run on a host without the module, it also checks the calls that need
 * no device.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <gdrapi.h>

#ifdef __cplusplus
#define STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

STATIC_ASSERT(sizeof(gdr_mh_t) == 8, "gdr_mh_t is 8 bytes, passed by value");
STATIC_ASSERT(sizeof(gdr_info_v2_t) == 48, "gdr_info_v2_t is 48 bytes");
STATIC_ASSERT(sizeof(gdr_info_t) == 48, "gdr_info_t is the v2 layout");
STATIC_ASSERT(offsetof(gdr_info_v2_t, va) == 0, "va");
STATIC_ASSERT(offsetof(gdr_info_v2_t, mapped_size) == 8, "mapped_size");
STATIC_ASSERT(offsetof(gdr_info_v2_t, page_size) == 16, "page_size");
STATIC_ASSERT(offsetof(gdr_info_v2_t, tm_cycles) == 24, "tm_cycles");
STATIC_ASSERT(offsetof(gdr_info_v2_t, cycles_per_ms) == 32, "cycles_per_ms");
STATIC_ASSERT(offsetof(gdr_info_v2_t, mapping_type) == 40, "mapping_type at 40");
STATIC_ASSERT(sizeof(gdr_mapping_type_t) == 4, "enums are int-sized");
STATIC_ASSERT(GDR_API_MAJOR_VERSION == 1 && GDR_API_MINOR_VERSION == 0, "API 1.0");
STATIC_ASSERT(GDR_API_VERSION == 0x10000, "packed API version");
STATIC_ASSERT(MINIMUM_GDRDRV_VERSION == 0x1, "minimum driver 0.1");
STATIC_ASSERT(GPU_PAGE_SHIFT == 16 && GPU_PAGE_SIZE == 65536, "64 KiB GPU page");
STATIC_ASSERT(GDR_MAPPING_TYPE_WC == 1 && GDR_MAPPING_TYPE_DEVICE == 3, "mapping types");
STATIC_ASSERT(GDR_MAP_FLAG_REQ_DEVICE_MAPPING == 3, "map flags");
STATIC_ASSERT(GDR_ATTR_USING_DMA_BUF_MMAP == 3, "attributes");
STATIC_ASSERT(GDR_PIN_FLAG_FORCE_PCIE == 1, "pin flags");

/* The v1 layout old binaries pass to the exported gdr_get_info symbol. */
typedef struct {
	uint64_t va, mapped_size;
	uint32_t page_size;
	uint64_t tm_cycles;
	uint32_t cycles_per_ms;
	unsigned mapped : 1;
	unsigned wc_mapping : 1;
} info_v1_t;
STATIC_ASSERT(sizeof(info_v1_t) == 40, "legacy gdr_info is 40 bytes");

static int failures;

#define CHECK(cond)                                                         \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "FAILED line %d: %s\n", __LINE__, #cond); \
			failures++;                                         \
		}                                                           \
	} while (0)

/* The bitfields must sit in the word at offset 36, mapped in bit 0, wc_mapping in bit 1, as the
 * library writes them. */
static void check_bitfields(void)
{
	gdr_info_t info;
	unsigned word;

	memset(&info, 0, sizeof(info));
	info.mapped = 1;
	memcpy(&word, (const char *)&info + 36, sizeof(word));
	CHECK(word == 1);
	info.mapped = 0;
	info.wc_mapping = 1;
	memcpy(&word, (const char *)&info + 36, sizeof(word));
	CHECK(word == 2);
}

/* Code written against upstream's gdrapi.h: the handle's struct tag, and the GPU page
 * constants as unsigned long (printed with %lu, masked with unsigned long addresses). */
static void check_upstream_style(void)
{
	struct gdr_mh_s mh;
	char text[64];
	unsigned long addr = 0x12345UL;
	unsigned long aligned = (addr + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
	uint32_t version = (1u << MAJOR_VERSION_SHIFT) | 5u;

	mh.h = 0;
	snprintf(text, sizeof(text), "%lu %lu %lu %lu", GPU_PAGE_SIZE, GPU_PAGE_OFFSET, aligned,
		 mh.h);
	CHECK(strcmp(text, "65536 65535 131072 0") == 0);
	CHECK((version & MINOR_VERSION_MASK) == 5u);
	CHECK((version >> MAJOR_VERSION_SHIFT) == 1u);
}

/* Every entry point, called with arguments that need no device. */
static void check_calls(void)
{
	int major = -1, minor = -1, flag = -1, attr = -1;
	const char *name = NULL;
	gdr_mh_t mh;
	gdr_info_t info;
	void *va = NULL;
	char buf[8] = { 0 };
	gdr_t g;

	gdr_runtime_get_version(&major, &minor);
	CHECK(major == GDR_API_MAJOR_VERSION && minor == GDR_API_MINOR_VERSION);
	CHECK(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_WC, &name) == 0);
	CHECK(name && strcmp(name, "Write Combining") == 0);
	CHECK(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_MAX, &name) == EINVAL);

	errno = 0;
	g = gdr_open();
	if (g) {
		/* A device exists here: the remaining checks are for the VM suite. */
		CHECK(gdr_close(g) == 0);
		return;
	}
	CHECK(errno != 0);

	mh.h = 0;
	CHECK(gdr_close(NULL) == EINVAL);
	CHECK(gdr_pin_buffer(NULL, 0x10000, 4096, 0, 0, &mh) == EINVAL);
	CHECK(gdr_pin_buffer_v2(NULL, 0x10000, 4096, GDR_PIN_FLAG_DEFAULT, &mh) == EINVAL);
	CHECK(gdr_unpin_buffer(NULL, mh) == EINVAL);
	CHECK(gdr_get_callback_flag(NULL, mh, &flag) == EINVAL);
	CHECK(gdr_get_info(NULL, mh, &info) == EINVAL);
	CHECK(gdr_get_info_v2(NULL, mh, &info) == EINVAL);
	CHECK(gdr_map(NULL, mh, &va, 4096) == EINVAL);
	CHECK(gdr_map_v2(NULL, mh, &va, 4096, GDR_MAP_FLAG_REQ_WC_MAPPING) == EINVAL);
	CHECK(gdr_unmap(NULL, mh, va, 4096) == EINVAL);
	CHECK(gdr_copy_to_mapping(mh, buf, buf, sizeof(buf)) == EINVAL);
	CHECK(gdr_copy_from_mapping(mh, buf, buf, sizeof(buf)) == EINVAL);
	CHECK(gdr_copy_to_mapping(mh, buf, buf, 0) == 0);
	CHECK(gdr_driver_get_version(NULL, &major, &minor) == EINVAL);
	CHECK(gdr_get_attribute(NULL, GDR_ATTR_USE_PERSISTENT_MAPPING, &attr) == EINVAL);
}

int main(void)
{
	check_bitfields();
	check_upstream_style();
	check_calls();
	if (failures) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("header test passed\n");
	return 0;
}
