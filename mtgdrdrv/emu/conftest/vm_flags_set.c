// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Probe: vm_flags_set() exists (Linux 6.3, "mm: introduce vma->vm_flags wrapper functions").
 * Sets MTGDRDRV_HAVE_VM_FLAGS_SET.
 */
#include <linux/mm.h>

void emu_conftest(struct vm_area_struct *vma);

void emu_conftest(struct vm_area_struct *vma)
{
	vm_flags_set(vma, VM_IO);
}
