/* A stand-in for libmusa whose first muInit fails (no device), as a driver that is not up yet,
 * and whose later ones succeed; one device that can export dma-bufs. Only what gdr_open's
 * dma-buf backend calls; the codes are CUDA's, which MUSA mirrors. */
#include <stddef.h>

static int inits;

int muInit(unsigned int flags) { (void)flags; return inits++ == 0 ? 100 : 0; }
int muDeviceGetCount(int *count) { *count = 1; return 0; }
int muDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int muDeviceGetAttribute(int *value, int attribute, int device)
{
    (void)device;
    *value = attribute == 124; /* MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
    return 0;
}
int muCtxGetCurrent(void **ctx) { *ctx = NULL; return 0; }
int muCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int muDevicePrimaryCtxRetain(void **ctx, int device) { (void)device; *ctx = NULL; return 0; }
int muDevicePrimaryCtxRelease_v2(int device) { (void)device; return 0; }
int muMemGetHandleForAddressRange(void *handle, unsigned long long va, size_t size, int type,
                                  unsigned long long flags)
{
    (void)handle; (void)va; (void)size; (void)type; (void)flags;
    return 801; /* not supported */
}
