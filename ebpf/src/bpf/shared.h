/* SPDX-License-Identifier: (MPL-2.0 OR GPL-2.0) */
/*
 * Layouts and constants shared by the BPF programs and the Rust loader
 * (src/raw.rs mirrors them; a host unit test parses this file and checks
 * that both sides agree).
 */
#ifndef PRJQUOTA_SHARED_H
#define PRJQUOTA_SHARED_H

/* Error buckets: index into counters.errors. */
#define BUCKET_ENOSPC 0
#define BUCKET_EDQUOT 1
#define BUCKET_EIO 2
#define BUCKET_EROFS 3
#define BUCKET_OTHER 4
#define N_BUCKETS 5

/* Index into the `unattributed` per-CPU array. */
#define UNATTR_OTHER_FS 0    /* the file's filesystem holds no volume root */
#define UNATTR_OUTSIDE 1     /* walked up to the filesystem root, no volume root on the way */
#define UNATTR_WALK_LIMIT 2  /* MAX_DEPTH ancestors checked without finding a volume root */
#define UNATTR_MAP_FULL 3    /* attributed, but the counters map had no room for the volume */
#define N_UNATTR 4

/* Ancestors checked above the written file (the file itself is not a root). */
#define MAX_DEPTH 32

/* Default map sizes; the loader can override max_entries. */
#define MAX_ROOTS 16384
#define MAX_VOLUMES 16384
#define MAX_DEVS 64

/* Slots of the `attr_gen` array: what a cached attribution was made under. */
#define GEN_RENAMES 0  /* bumped by the vfs_rename hook after a rename on a root's device */
#define GEN_ROOTS 1    /* bumped by the loader after every change to `roots` */
#define GEN_CACHE_ON 2 /* 1 once the vfs_rename hook is attached */
#define N_GEN 3

/* Index into the per-CPU `unfinished` array: write calls into volumes
 * whose start a hook saw and whose end it has not (yet) seen, and those
 * whose end it will never see. */
#define UNFINISHED_DIRECT 0   /* O_DIRECT completions (iomap_dio_complete) */
#define UNFINISHED_BUFFERED 1 /* buffered writes (iomap_file_buffered_write, generic_perform_write) */
#define LOST_BUFFERED 2       /* buffered writes whose thread began another before their fexit ran */
#define N_UNFINISHED 3

/* Key of the `roots` map: a directory as the kernel names it. */
struct root_key {
	__u64 dev; /* super_block->s_dev, kernel dev_t encoding: major << 20 | minor */
	__u64 ino; /* inode->i_ino */
};

/* Value of the per-CPU `volume_counters` map and `unattributed` array. */
struct counters {
	__u64 bytes;  /* bytes written by successful writes */
	__u64 ops;    /* writes that wrote at least one byte */
	__u64 errors[N_BUCKETS]; /* failed writes, by errno bucket */
};

#endif
