/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * Every kernel-compatibility shim of mtgdrdrv, in one place.
 *
 * Each shim names the kernel change it covers and is selected by an
 * MTGDRDRV_HAVE_* feature macro. The macros come from compile probes against
 * the target kernel (conftest/<name>.c gives MTGDRDRV_HAVE_<NAME>), run by
 * conftest.sh from Kbuild into the generated conftest.h. Code tests the
 * macros, never a kernel version number.
 */
#ifndef MTGDRDRV_COMPAT_H
#define MTGDRDRV_COMPAT_H

#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#include "conftest.h"

/*
 * Linux 6.3, "mm: introduce vma->vm_flags wrapper functions": vm_flags became
 * read-only and is changed through vm_flags_set(). Probe: vm_flags_set.c.
 * (Since 6.15 vm_flags_set() uses the GPL-only __vma_start_write(); fine for
 * a "Dual MIT/GPL" module.)
 */
#ifndef MTGDRDRV_HAVE_VM_FLAGS_SET
static inline void vm_flags_set(struct vm_area_struct *vma, vm_flags_t flags)
{
	vma->vm_flags |= flags;
}
#endif

/*
 * Linux 7.1, "mm: rename zap_vma_ptes() to zap_special_vma_range()": same
 * function (PTEs of a VM_PFNMAP range), new name. Probe: zap_vma_ptes.c.
 */
#ifndef MTGDRDRV_HAVE_ZAP_VMA_PTES
#define zap_vma_ptes zap_special_vma_range
#endif

/*
 * Linux 5.6, "proc: decouple proc from VFS with "struct proc_ops"": procfs
 * entries take a struct proc_ops instead of a struct file_operations.
 * Probe: proc_ops.c. MTGDRDRV_PROC_OPS(name, open) defines a read-only
 * seq_file (single_open) operations table of the right type.
 */
#ifdef MTGDRDRV_HAVE_PROC_OPS
#define MTGDRDRV_PROC_OPS(name, open_fn)				\
	static const struct proc_ops name = {				\
		.proc_open	= open_fn,				\
		.proc_read	= seq_read,				\
		.proc_lseek	= seq_lseek,				\
		.proc_release	= single_release,			\
	}
#else
#define MTGDRDRV_PROC_OPS(name, open_fn)				\
	static const struct file_operations name = {			\
		.owner		= THIS_MODULE,				\
		.open		= open_fn,				\
		.read		= seq_read,				\
		.llseek		= seq_lseek,				\
		.release	= single_release,			\
	}
#endif

/*
 * Linux 5.6, "x86/mm/pat: Rename <asm/pat.h> => <asm/memtype.h>": the header
 * that declares pat_enabled(). Probe: asm_memtype_h.c.
 */
#ifdef CONFIG_X86
#ifdef MTGDRDRV_HAVE_ASM_MEMTYPE_H
#include <asm/memtype.h>
#else
#include <asm/pat.h>
#endif
#endif

/*
 * "mm: remove VM_PAT" (x86, 2025, with the pfnmap tracking rewrite): before
 * it, one remap_pfn_range() over a whole VMA reserved the range's memtype,
 * marked the VMA VM_PAT, and at munmap found the reservation again by reading
 * the VMA's first PTE back. Since then the reservation is kept with the VMA.
 * A macro, so its presence is the probe; mtgdrdrv_mmap.c says why it matters.
 */
#ifdef VM_PAT
#define MTGDRDRV_WHOLE_VMA_REMAP_TRACKS true
#else
#define MTGDRDRV_WHOLE_VMA_REMAP_TRACKS false
#endif

/*
 * Linux 5.5, "PCI: Add PCI_STD_NUM_BARS for the number of standard BARs". A
 * macro, so its absence is the probe.
 */
#include <linux/pci.h>
#ifndef PCI_STD_NUM_BARS
#define PCI_STD_NUM_BARS 6
#endif

#endif /* MTGDRDRV_COMPAT_H */
