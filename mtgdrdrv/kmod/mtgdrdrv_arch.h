/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * Architecture choices of mtgdrdrv, one tiny helper each, so that no other
 * file carries an architecture #ifdef.
 */
#ifndef MTGDRDRV_ARCH_H
#define MTGDRDRV_ARCH_H

#include <linux/io.h>
#include <linux/mm.h>
#include <linux/timex.h>

#include "compat.h"
#include "mtgdrdrv_ioctl.h"

#ifdef CONFIG_X86
#include <asm/tsc.h>
#endif

/*
 * Protection of a GDR_MR_DEVICE mapping: Device-nGnRE on arm64, uncached
 * (UC-) elsewhere. Write-combined mappings use pgprot_writecombine()
 * everywhere.
 */
static inline pgprot_t mtgdrdrv_pgprot_device(pgprot_t prot)
{
#ifdef CONFIG_ARM64
	return pgprot_device(prot);
#else
	return pgprot_noncached(prot);
#endif
}

/*
 * x86 PAT tracks the cache mode of physical ranges; remaps then go page by
 * page after a WC reservation (see mtgdrdrv_mmap.c).
 */
static inline bool mtgdrdrv_pat_enabled(void)
{
#ifdef CONFIG_X86
	return pat_enabled();
#else
	return false;
#endif
}

/*
 * The cache mode of a present PTE as a mapping type, for GET_INFO: x86 PAT
 * (or its absence) may give a page another mode than the one asked for.
 * Uncached is DEVICE, write-combining WC, anything cached CACHING. Without
 * PAT, cachemode2protval() gives WC the bits of UC-, so UC- is tested first.
 * Elsewhere the PTE has what was asked (@asked).
 */
static inline bool mtgdrdrv_cache_type_readable(void)
{
	return IS_ENABLED(CONFIG_X86);
}

static inline gdr_mr_type_t mtgdrdrv_pte_cache_type(pte_t pte,
						    gdr_mr_type_t asked)
{
#ifdef CONFIG_X86
	unsigned long bits = pte_flags(pte) & _PAGE_CACHE_MASK;

	if (bits == cachemode2protval(_PAGE_CACHE_MODE_UC_MINUS) ||
	    bits == cachemode2protval(_PAGE_CACHE_MODE_UC))
		return GDR_MR_DEVICE;
	if (bits == cachemode2protval(_PAGE_CACHE_MODE_WC))
		return GDR_MR_WC;
	return GDR_MR_CACHING;
#else
	return asked;
#endif
}

/* GET_INFO's tm_cycles/tsc_khz: the TSC on x86, 0 elsewhere (as upstream). */
static inline cycles_t mtgdrdrv_cycles(void)
{
#ifdef CONFIG_X86
	return get_cycles();
#else
	return 0;
#endif
}

static inline u32 mtgdrdrv_tsc_khz(void)
{
#ifdef CONFIG_X86
	return tsc_khz;
#else
	return 0;
#endif
}

#endif /* MTGDRDRV_ARCH_H */
