/* SPDX-License-Identifier: (MPL-2.0 OR GPL-2.0) */
/*
 * The few kernel types the programs read, declared CO-RE style instead of a
 * generated multi-megabyte vmlinux.h: only the fields used, in any order.
 * `preserve_access_index` makes clang record every field access as a BTF
 * relocation, which aya resolves against the running kernel's
 * /sys/kernel/btf/vmlinux at load time, so offsets follow the kernel.
 *
 * Every type here lives in vmlinux (fs/, mm/, fs/iomap/), never in a module:
 * aya 0.14 cannot relocate against module BTF, and XFS and ext4 are modules
 * on Debian's kernel.
 */
#ifndef PRJQUOTA_KERNEL_H
#define PRJQUOTA_KERNEL_H

#include <linux/types.h>

#define __core __attribute__((preserve_access_index))

/* Only ever a pointer here (bpf_get_current_task_btf). */
struct task_struct;

struct dentry;

struct super_block {
	__u32 s_dev; /* dev_t: MKDEV(major, minor) = major << 20 | minor */
	unsigned long s_magic;
	struct dentry *s_root;
} __core;

struct inode {
	unsigned long i_ino;
	__u32 i_generation;
} __core;

struct dentry {
	struct dentry *d_parent;
	struct inode *d_inode;
	struct super_block *d_sb;
} __core;

struct path {
	struct dentry *dentry;
} __core;

struct file {
	struct path f_path;
} __core;

/* include/linux/fs.h, vfs_rename()'s argument since 5.12. */
struct renamedata {
	struct dentry *old_dentry;
} __core;

struct kiocb {
	struct file *ki_filp;
	long long ki_pos;
	int ki_flags;
} __core;

/* fs/iomap/direct-io.c: private to vmlinux, but present in its BTF. */
struct iomap_dio {
	struct kiocb *iocb;
	unsigned int flags;
	__u64 done_before; /* size_t; since 5.16 */
} __core;

/* include/linux/fs.h: IOCB_NOWAIT == RWF_NOWAIT (uapi, stable). */
#define IOCB_NOWAIT 0x00000008

/* fs/iomap/direct-io.c: unchanged from 4.19 to 6.18. */
#define IOMAP_DIO_WRITE (1U << 30)

/* include/uapi/linux/magic.h */
#define XFS_SUPER_MAGIC 0x58465342

/* include/uapi/asm-generic/errno*.h */
#define EIO 5
#define EAGAIN 11
#define ENOSPC 28
#define EROFS 30
#define EDQUOT 122

#endif
