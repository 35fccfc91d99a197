// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Probe: get_file_active() exists (Linux 6.7, "file: convert to SLAB_TYPESAFE_BY_RCU", which
 * also made get_file_rcu() take the address of an RCU-protected pointer instead of a file).
 * Sets MTGDRDRV_HAVE_GET_FILE_ACTIVE.
 */
#include <linux/fs.h>

struct file *emu_conftest(struct file **f);

struct file *emu_conftest(struct file **f)
{
	return get_file_active(f);
}
