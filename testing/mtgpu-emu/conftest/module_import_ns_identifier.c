// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Probe: MODULE_IMPORT_NS() takes a bare identifier, MODULE_IMPORT_NS(DMA_BUF). Linux 6.13
 * ("module: Convert symbol namespace to string literal") made it take a string literal,
 * MODULE_IMPORT_NS("DMA_BUF"), and the identifier form no longer compiles there.
 * Sets MTGDRDRV_HAVE_MODULE_IMPORT_NS_IDENTIFIER.
 */
#include <linux/module.h>

MODULE_IMPORT_NS(DMA_BUF);
