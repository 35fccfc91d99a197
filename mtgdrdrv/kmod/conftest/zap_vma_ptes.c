// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * Probe: zap_vma_ptes() exists (until Linux 7.1, "mm: rename zap_vma_ptes()
 * to zap_special_vma_range()"). Sets MTGDRDRV_HAVE_ZAP_VMA_PTES.
 */
#include <linux/mm.h>

void mtgdrdrv_conftest(struct vm_area_struct *vma);

void mtgdrdrv_conftest(struct vm_area_struct *vma)
{
	zap_vma_ptes(vma, vma->vm_start, PAGE_SIZE);
}
