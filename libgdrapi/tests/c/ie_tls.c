// SPDX-License-Identifier: MIT
/*
 * A library with TLS_BYTES bytes of initial-exec TLS, as a plugin or Python extension built with
 * -ftls-model=initial-exec has: glibc must place it in the static TLS block, so dlopen takes it
 * from the surplus reserved for such libraries (or fails with "cannot allocate memory in static
 * TLS block"). Built at several sizes by tests/static_tls.rs.
 */
#ifndef TLS_BYTES
#error "define TLS_BYTES"
#endif

static __thread char block[TLS_BYTES] __attribute__((tls_model("initial-exec")));

/* The initial-exec access that makes the linker flag the library DF_STATIC_TLS. */
char *ie_tls_block(void)
{
	return block;
}
