// SPDX-License-Identifier: (GPL-2.0 OR MIT)
/*
 * Probe: struct proc_ops exists (Linux 5.6, "proc: decouple proc from VFS
 * with "struct proc_ops""). Sets MTGDRDRV_HAVE_PROC_OPS.
 */
#include <linux/proc_fs.h>

int mtgdrdrv_conftest(void);

int mtgdrdrv_conftest(void)
{
	struct proc_ops ops = { .proc_open = NULL };

	return ops.proc_open != NULL;
}
