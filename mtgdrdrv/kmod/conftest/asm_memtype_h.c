// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * Probe: <asm/memtype.h> declares pat_enabled() (x86, Linux 5.6,
 * "x86/mm/pat: Rename <asm/pat.h> => <asm/memtype.h>"). Sets
 * MTGDRDRV_HAVE_ASM_MEMTYPE_H. Fails on other architectures, where it is
 * not used.
 */
#include <linux/mm.h>
#include <asm/memtype.h>

bool mtgdrdrv_conftest(void);

bool mtgdrdrv_conftest(void)
{
	return pat_enabled();
}
