/* SPDX-License-Identifier: (MPL-2.0 OR GPL-2.0) */
/*
 * Layouts and constants shared by the quota-escape guard (guard.c) and its
 * Rust loader (src/guard.rs mirrors them; a host unit test parses this file
 * and checks that both sides agree).
 */
#ifndef PRJQUOTA_GUARD_SHARED_H
#define PRJQUOTA_GUARD_SHARED_H

/* Dentries looked at: the changed inode itself, then its ancestors. Deeper
 * than this with no volume root found on a volume device: fail closed. */
#define GUARD_MAX_DEPTH 4096
/* The same bound in the context build (kernels without bpf_loop, before
 * 5.17), whose walk is a loop the verifier follows to its end: each level
 * costs the verifier instructions against its limit of a million per
 * program (the non-sleepable LSM program three times the fexit's), so the
 * bound is lower. Deeper is judged as above: fail closed. */
#define GUARD_MAX_DEPTH_CONTEXT 1024

/* Default map sizes; the loader can override max_entries. */
#define GUARD_MAX_ROOTS 16384
#define GUARD_MAX_VOLUMES 16384
#define GUARD_MAX_DEVS 64
/* Ring buffer of events, bytes (a power of two, a multiple of the page). */
#define GUARD_EVENTS_BYTES 262144

/* Index into the per-CPU `guard_stats` array. */
#define GSTAT_EVENTS_LOST 0       /* events not sent: ring buffer full */
#define GSTAT_PRIVILEGED 1        /* project changes under a root by a privileged caller */
#define GSTAT_WALK_LIMIT_ALLOWED 2 /* attempts past GUARD_MAX_DEPTH that went through */
#define GSTAT_WALK_LIMIT_DENIED 3  /* ... that were refused */
#define GSTAT_UNREADABLE 4        /* ioctl argument unreadable in the LSM hook: refused */
#define GSTAT_MAP_FULL 5          /* attempts on a volume the counters map had no room for */
#define GSTAT_OUTSIDE_ALLOWED 6   /* outside every root, taking a volume's or an allocation's ID (or one of their ranges): went through */
#define GSTAT_OUTSIDE_DENIED 7    /* ... refused */
#define N_GSTATS 8

/* Entries of `guard_ranges`: the project-ID ranges prjquota gives out
 * (the volumes', the allocations'), from prjquota.toml. */
#define GUARD_MAX_RANGES 4

/* guard_event.result */
#define GUARD_ALLOWED 0
#define GUARD_DENIED 1

/* guard_event.source */
#define GUARD_SRC_FILEATTR 0 /* fexit/vfs_fileattr_set: the kernel's own outcome */
#define GUARD_SRC_LSM 1      /* a BPF LSM hook: refused by the guard */

/* guard_event.what: bits */
#define GUARD_WHAT_PROJID 1     /* sets a project ID other than the volume's */
#define GUARD_WHAT_NOINHERIT 2  /* leaves a directory without PROJINHERIT */
#define GUARD_WHAT_UNREADABLE 4 /* the new attributes could not be read */
#define GUARD_WHAT_FOREIGN_PROJID 8 /* outside every root: sets a volume's or an allocation's project ID, or one in their ranges */
#define GUARD_WHAT_GENERATION 16 /* sets the inode generation (SETVERSION): a root would leave the guard's key */

/* guard_event.where */
#define GUARD_WHERE_OUTSIDE 1    /* outside every volume root, on a volume device */
#define GUARD_WHERE_VOLUME 2     /* at or below a volume root */
#define GUARD_WHERE_WALK_LIMIT 3 /* volume unknown: no root within GUARD_MAX_DEPTH, or a disconnected dentry */

/* Key of the `guard_roots` map: a directory as the kernel names it, for
 * the life of the filesystem (an inode number alone is reused). 24 bytes. */
struct guard_root_key {
	__u64 dev; /* super_block->s_dev, kernel encoding: major << 20 | minor */
	__u64 ino; /* inode->i_ino */
	__u32 gen; /* inode->i_generation (FS_IOC_GETVERSION from userspace) */
	__u32 _pad; /* 0 */
};

/* Value of the `guard_roots` map. */
struct guard_root {
	__u32 projid; /* the volume's project ID */
	__u32 _pad;   /* 0 */
};

/* Key of `guard_projects` (-> __u32 1: a volume's project on that device)
 * and of the per-CPU `guard_counters`. 16 bytes. */
struct guard_project {
	__u64 dev;    /* kernel encoding */
	__u32 projid;
	__u32 _pad;   /* 0 */
};

/* Value of `guard_ranges`: an inclusive range of project IDs; max 0 is
 * no range. */
struct guard_range {
	__u32 min;
	__u32 max;
};

/* Value of the per-CPU `guard_counters` map, per (device, project ID). */
struct guard_counters {
	__u64 allowed; /* attempts that changed the file */
	__u64 denied;  /* attempts that failed (refused by the guard or the kernel) */
};

/* One record of the `guard_events` ring buffer: 80 bytes, no padding. */
struct guard_event {
	__u64 cgroup_id; /* cgroup v2 id of the caller */
	__u64 ino;       /* the inode whose attributes were to change */
	__u64 dev;       /* its super_block->s_dev, kernel encoding */
	__u32 pid;       /* tgid */
	__u32 tid;
	__u32 uid;       /* real uid, as the initial user namespace sees it */
	__u32 where;     /* GUARD_WHERE_* */
	__u32 projid;    /* requested project ID (FS_IOC_FSSETXATTR), else the current */
	__u32 volume_projid; /* the volume's (outside: the project asked for) */
	__u32 xflags;    /* requested fsx_xflags (SETFLAGS: translated) */
	__s32 ret;       /* 0, or the negative errno the caller got */
	__u8 result;     /* GUARD_ALLOWED / GUARD_DENIED */
	__u8 source;     /* GUARD_SRC_* */
	__u8 what;       /* GUARD_WHAT_* bits */
	__u8 privileged; /* CAP_SYS_ADMIN in the initial user namespace */
	__u32 cmd;       /* ioctl command (LSM), 0 from the fexit */
	char comm[16];
};

#endif
