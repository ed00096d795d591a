// SPDX-License-Identifier: (MPL-2.0 OR GPL-2.0)
/*
 * The quota-escape guard: project-ID changes of files below registered
 * volume roots.
 *
 * A project quota only holds while the volume's files stay in its project.
 * vfs_fileattr_set() lets a file's owner (or anyone with CAP_FOWNER, which
 * root in a Docker container without user namespaces has) set another
 * project ID with FS_IOC_FSSETXATTR, or clear PROJINHERIT on a directory
 * with FS_IOC_FSSETXATTR or FS_IOC_SETFLAGS (chattr -P); the kernel only
 * forbids it from inside a user namespace. From then on the file's blocks,
 * or the new files of the directory, are not charged to the volume.
 *
 * An ATTEMPT is such a call on an inode at or below a volume root (the root
 * itself included) that would
 *   - set fsx_projid to anything but the volume's project ID
 *     (FS_IOC_FSSETXATTR; SETFLAGS cannot change the project ID), or
 *   - leave a directory without PROJINHERIT (both ioctls),
 * or that would set the inode's generation (FS_IOC_SETVERSION, ext4's
 * EXT4_IOC_SETVERSION, and their 32-bit twins: ext4 without metadata_csum
 * applies them, to any inode its caller owns): roots are keyed by their
 * generation, so a root's owner could otherwise take the whole volume out
 * of the guard (GUARD_WHAT_GENERATION),
 * made by a caller WITHOUT CAP_SYS_ADMIN in the initial user namespace
 * (the effective set, as capable() checks, of both its subjective and its
 * objective credentials: see privileged()). The plugin runs as root with it; root in a default Docker container, a file
 * owner, and anything in a user namespace lack it. Privileged changes are
 * allowed, counted apart (GSTAT_PRIVILEGED) and reported as events: they
 * are the plugin or an administrator. Other attribute changes (append-only,
 * nodump, extent size hints ...) are not attempts.
 *
 * Outside every volume root, on a device that holds roots, an unprivileged
 * FS_IOC_FSSETXATTR (or file_setattr(2)) whose project ID is a volume's
 * project on that device (`guard_projects`), or lies in a range prjquota
 * gives out (`guard_ranges`: the volumes' and the allocations', from
 * prjquota.toml), is an attempt too (GUARD_WHAT_FOREIGN_PROJID): it would
 * charge the file to that volume's quota and fill it, or squat an ID a
 * create then has to step over. It is counted apart
 * (GSTAT_OUTSIDE_ALLOWED/DENIED), never against the volume it names: its
 * owner did not make it.
 *
 * Roots are keyed by (device, inode number, inode generation): a deleted
 * root's inode number, given to a new file, does not match its entry.
 * Counters are keyed by (device, project ID), the volume's identity that
 * the plugin and the exporter both know without sharing an index.
 *
 * Hook points (vmlinux only: aya cannot relocate against module BTF, and
 * XFS and ext4 are modules on Debian):
 *
 *   fexit  vfs_fileattr_set   DETECT: every path that changes file
 *                             attributes ends here (ioctl FS_IOC_SETFLAGS
 *                             and FS_IOC_FSSETXATTR, native and compat,
 *                             overlayfs passing a change down,
 *                             file_setattr(2) on 6.17+). At exit `fa` holds
 *                             the request merged with the old attributes,
 *                             and the return value says whether it went
 *                             through: result allowed (0) or denied.
 *   fexit  security_file_ioctl DETECT before 5.13 (no vfs_fileattr_set;
 *   fexit  __x64_sys_ioctl     context build only): judged at the first,
 *                             counted by the native system call's result
 *                             at the second; 32-bit callers go uncounted.
 *   ENFORCE (--guard=enforce, BPF LSM active), refusing an attempt with
 *   EPERM, by the first plan the kernel has (src/guard.rs picks it):
 *   lsm    inode_file_setattr  6.17+: inside vfs_fileattr_set, on the
 *                             kernel's own copy of the request: covers
 *                             every path above; with it, file_ioctl and
 *                             file_ioctl_compat judge the SETVERSION
 *                             ioctls only (they never reach it).
 *   lsm.s  file_ioctl (+ file_ioctl_compat where the kernel has it, 6.8
 *   lsm    and stable backports): before 6.17, the ioctl is judged on its
 *                             argument read from user memory (SETVERSION
 *                             included). file_setattr(2) does not exist
 *                             there.
 *   fexit  security_file_ioctl DETECT from 5.13, where nothing enforces:
 *   fexit  __x64_sys_ioctl     the generation ioctls alone, which never
 *                             reach vfs_fileattr_set (guard_version_judge);
 *                             the exporter's sync also re-reads each root's
 *                             generation and puts the new key in within one
 *                             interval.

 * The volume of an inode: walk d_parent from the inode's own dentry (the
 * root's own attributes matter most) up to GUARD_MAX_DEPTH dentries, with
 * bpf_loop (the context build, -DPRJQUOTA_COMPAT, for kernels without it:
 * a bounded loop to GUARD_MAX_DEPTH_CONTEXT), to the first registered
 * (dev, ino); a device without roots is
 * skipped after one lookup. Past the limit on a volume device, or from a
 * disconnected dentry (one a file handle opened, whose path is not known)
 * the guard cannot tell the volume: it treats every FS_IOC_FSSETXATTR and
 * every PROJINHERIT-less directory request there as an attempt (fail
 * closed).
 *
 * Known gaps, documented in src/guard.rs: the LSM reads user memory that
 * another thread may change before the kernel copies it (then the fexit
 * still counts the escape as allowed), and it sees the file the ioctl was
 * made on: a hard link or a rename to a writable directory outside every
 * volume root on the same filesystem takes the inode out of the walk.
 */
#include "kernel.h"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "shared.h"
#include "guard_shared.h"

char LICENSE[] SEC("license") = "Dual MPL/GPL";

/* ---- kernel types beyond kernel.h (CO-RE: only the fields read) ---- */

/* `struct inode` with the field kernel.h does not declare (a flavour: the
 * part after ___ is ignored when relocating). */
struct inode___guard {
	unsigned short i_mode; /* umode_t */
} __core;

/* include/linux/fileattr.h: `struct fileattr` from 5.13, renamed
 * `struct file_kattr` in 6.17 (with the file_setattr(2) system call). The
 * fields read kept their names; which type the kernel has is asked at load
 * time (bpf_core_type_exists), and the branch for the other one is dead
 * code the verifier never walks. */
struct fileattr {
	__u32 flags;
	__u32 fsx_xflags;
	__u32 fsx_projid;
	_Bool flags_valid : 1;
	_Bool fsx_valid : 1;
} __core;

struct file_kattr {
	__u32 flags;
	__u32 fsx_xflags;
	__u32 fsx_projid;
	_Bool flags_valid : 1;
	_Bool fsx_valid : 1;
} __core;

struct user_namespace {
	int level; /* 0: the initial user namespace */
} __core;

/* kernel_cap_t: `struct { __u32 cap[2]; }` up to 6.2, `struct { u64 val; }`
 * since 6.3: the same 8 bytes on little-endian targets. Read whole. */
struct guard_caps {
	__u32 lo;
	__u32 hi;
};

struct cred {
	struct guard_caps cap_effective;
	struct user_namespace *user_ns;
} __core;

struct task_struct {
	const struct cred *real_cred;
	const struct cred *cred;
} __core;

/* ---- uapi (include/uapi/linux/fs.h, asm-generic/ioctl.h, capability.h) ---- */

#define FS_IOC_SETFLAGS 0x40086602   /* _IOW('f', 2, long) */
#define FS_IOC32_SETFLAGS 0x40046602 /* _IOW('f', 2, int): compat tasks */
#define FS_IOC_FSSETXATTR 0x401c5820 /* _IOW('X', 32, struct fsxattr): same in compat */
/* The inode generation (ext2/ext4; ext4 only without metadata_csum): roots
 * are keyed by it, so a root whose owner changes it leaves the guard. */
#define FS_IOC_SETVERSION 0x40087602     /* _IOW('v', 2, long), EXT4_IOC_SETVERSION_OLD */
#define FS_IOC32_SETVERSION 0x40047602   /* _IOW('v', 2, int): compat tasks */
#define EXT4_IOC_SETVERSION 0x40086604   /* _IOW('f', 4, long) */
#define EXT4_IOC32_SETVERSION 0x40046604 /* _IOW('f', 4, int): compat tasks */
#define FS_XFLAG_PROJINHERIT 0x00000200
#define FS_PROJINHERIT_FL 0x20000000
#define S_IFMT 0xf000 /* 0170000 */
#define S_IFDIR 0x4000 /* 0040000 */
#define CAP_SYS_ADMIN 21
#define EPERM 1
#define EFAULT 14
#define XFS_SUPER_MAGIC 0x58465342

/* The head of struct fsxattr (28 bytes in all ABIs). */
struct fsxattr_head {
	__u32 fsx_xflags;
	__u32 fsx_extsize;
	__u32 fsx_nextents;
	__u32 fsx_projid;
};

/* ---- maps ---- */

/* Volume root directories -> project ID. Filled by userspace (the plugin at
 * create and delete, the exporter at start and on its sync timer). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_MAX_ROOTS);
	__type(key, struct guard_root_key);
	__type(value, struct guard_root);
} guard_roots SEC(".maps");

/* The volumes' projects, per device: a file outside every root may not
 * join one (unprivileged). Filled by userspace with the roots. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_MAX_VOLUMES);
	__type(key, struct guard_project);
	__type(value, __u32);
} guard_projects SEC(".maps");

/* The project-ID ranges prjquota gives out; filled by the exporter. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GUARD_MAX_RANGES);
	__type(key, __u32);
	__type(value, struct guard_range);
} guard_ranges SEC(".maps");

/* Devices that hold at least one root. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GUARD_MAX_DEVS);
	__type(key, __u64);
	__type(value, __u32);
} guard_root_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, GUARD_MAX_VOLUMES);
	__type(key, struct guard_project);
	__type(value, struct guard_counters);
} guard_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_GSTATS);
	__type(key, __u32);
	__type(value, __u64);
} guard_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, GUARD_EVENTS_BYTES);
} guard_events SEC(".maps");

/*
 * Refusals by the inode_file_setattr program, per thread, so that the fexit
 * of the same vfs_fileattr_set() call, which then sees -EPERM, does not
 * count and report the attempt a second time. (The ioctl programs refuse
 * before vfs_fileattr_set runs: no fexit follows them.)
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   /* pid_tgid */
	__type(value, __u64); /* the dentry refused */
} guard_refused SEC(".maps");

/* ---- helpers ---- */

#define WHERE_OTHER_FS 0
#define WHERE_OUTSIDE GUARD_WHERE_OUTSIDE
#define WHERE_VOLUME GUARD_WHERE_VOLUME
#define WHERE_WALK_LIMIT GUARD_WHERE_WALK_LIMIT

struct walk {
	struct guard_root_key key;
	__u64 dentry; /* the dentry to look at next */
	struct guard_root root;
	__u32 where;
	__u32 _pad;
};

static long walk_step(__u32 i, void *data)
{
	struct walk *w = data;
	struct dentry *d = (struct dentry *)w->dentry;
	struct guard_root *r;
	struct dentry *up;

	w->key.ino = BPF_CORE_READ(d, d_inode, i_ino);
	w->key.gen = BPF_CORE_READ(d, d_inode, i_generation);
	r = bpf_map_lookup_elem(&guard_roots, &w->key);
	if (r) {
		w->root = *r;
		w->where = WHERE_VOLUME;
		return 1;
	}
	up = BPF_CORE_READ(d, d_parent);
	if (!up || (__u64)up == w->dentry) {
		/* Only the filesystem's root is outside every volume. A
		 * disconnected dentry (open_by_handle_at, NFS export) is its own
		 * parent too, but its volume is unknown: WHERE_WALK_LIMIT
		 * stays, and the attempt is judged fail-closed. */
		if (up && (__u64)BPF_CORE_READ(d, d_sb, s_root) == w->dentry)
			w->where = WHERE_OUTSIDE;
		return 1;
	}
	w->dentry = (__u64)up;
	return 0;
}

/* Where the inode of `dentry` is: on which volume, if any. */
static __always_inline __u32 locate(struct dentry *dentry, struct guard_root *root, __u64 *dev)
{
	struct walk w = {};

	w.key.dev = BPF_CORE_READ(dentry, d_sb, s_dev);
	*dev = w.key.dev;
	if (!bpf_map_lookup_elem(&guard_root_devs, &w.key.dev))
		return WHERE_OTHER_FS;
	w.dentry = (__u64)dentry;
	w.where = WHERE_WALK_LIMIT;
#ifdef PRJQUOTA_COMPAT
	/* No bpf_loop before 5.17: a bounded loop the verifier walks through
	 * (5.3+). Past the bound `where` stays WHERE_WALK_LIMIT, as with
	 * bpf_loop past GUARD_MAX_DEPTH. */
	for (__u32 i = 0; i < GUARD_MAX_DEPTH_CONTEXT; i++) {
		if (walk_step(i, &w))
			break;
	}
#else
	bpf_loop(GUARD_MAX_DEPTH, walk_step, &w, 0);
#endif
	*root = w.root;
	return w.where;
}

static __always_inline int is_dir(struct dentry *dentry)
{
	struct inode___guard *inode = (void *)BPF_CORE_READ(dentry, d_inode);

	return (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFDIR;
}

/* The attributes a vfs_fileattr_set() call asks for, from its `fa`. */
struct requested {
	__u32 xflags;
	__u32 projid;
	int sets_projid; /* FS_IOC_FSSETXATTR / file_setattr(2): fsx_valid */
};

static __always_inline void read_requested(void *fa, struct requested *r)
{
	if (bpf_core_type_exists(struct file_kattr)) {
		struct file_kattr *k = fa;

		r->sets_projid = BPF_CORE_READ_BITFIELD_PROBED(k, fsx_valid);
		r->projid = BPF_CORE_READ(k, fsx_projid);
		r->xflags = BPF_CORE_READ(k, fsx_xflags);
	} else {
		struct fileattr *o = fa;

		r->sets_projid = BPF_CORE_READ_BITFIELD_PROBED(o, fsx_valid);
		r->projid = BPF_CORE_READ(o, fsx_projid);
		r->xflags = BPF_CORE_READ(o, fsx_xflags);
	}
}

/* CAP_SYS_ADMIN in the initial user namespace in `cred`, as capable()
 * would see it (without asking the other LSMs, and without auditing). */
static __always_inline int cred_privileged(const struct cred *cred)
{
	struct guard_caps caps = {};

	if (!cred)
		return 0;
	if (bpf_probe_read_kernel(&caps, sizeof(caps), &cred->cap_effective))
		return 0;
	if (BPF_CORE_READ(cred, user_ns, level) != 0)
		return 0;
	return (caps.lo >> CAP_SYS_ADMIN) & 1;
}

/*
 * Whether the caller may change what the guard protects: privileged in
 * both its credentials. A kernel path that acts for a caller with other
 * credentials (override_creds) changes only the subjective ones: overlayfs
 * passes a change of one of its files down to the real inode with the
 * credentials of whoever mounted it (dockerd, root), so a container's
 * process on an overlay whose upper layer shares a volume's filesystem
 * would look privileged. The objective ones (real_cred) are still the
 * caller's own.
 */
static __always_inline int privileged(void)
{
	struct task_struct *task = (void *)bpf_get_current_task();

	return cred_privileged(BPF_CORE_READ(task, real_cred)) &&
	       cred_privileged(BPF_CORE_READ(task, cred));
}

static __always_inline void stat_add(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&guard_stats, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* Counts an attempt against the volume's project `projid` on `dev`
 * (WHERE_VOLUME), outside every root apart, or as unattributed. */
static __always_inline void count(__u32 where, __u64 dev, __u32 projid, __u8 result)
{
	struct guard_project key = {.dev = dev, .projid = projid};
	struct guard_counters *c;

	if (where == WHERE_OUTSIDE) {
		stat_add(result == GUARD_ALLOWED ? GSTAT_OUTSIDE_ALLOWED : GSTAT_OUTSIDE_DENIED);
		return;
	}
	if (where != WHERE_VOLUME) {
		stat_add(result == GUARD_ALLOWED ? GSTAT_WALK_LIMIT_ALLOWED : GSTAT_WALK_LIMIT_DENIED);
		return;
	}
	c = bpf_map_lookup_elem(&guard_counters, &key);
	if (!c) {
		struct guard_counters zero = {};

		bpf_map_update_elem(&guard_counters, &key, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&guard_counters, &key);
		if (!c) {
			/* No room for one more volume: counted apart, never lost. */
			stat_add(GSTAT_MAP_FULL);
			return;
		}
	}
	if (result == GUARD_ALLOWED)
		__sync_fetch_and_add(&c->allowed, 1);
	else
		__sync_fetch_and_add(&c->denied, 1);
}

/* Whether `projid` is a volume's project on `dev`. */
static __always_inline int volume_project(__u64 dev, __u32 projid)
{
	struct guard_project key = {.dev = dev, .projid = projid};

	return bpf_map_lookup_elem(&guard_projects, &key) != 0;
}

/* Whether `projid` lies in a range prjquota gives out. */
static __always_inline int in_ranges(__u32 projid)
{
	for (__u32 i = 0; i < GUARD_MAX_RANGES; i++) {
		__u32 k = i;
		struct guard_range *r = bpf_map_lookup_elem(&guard_ranges, &k);

		if (r && r->max && projid >= r->min && projid <= r->max)
			return 1;
	}
	return 0;
}

/* What an attempt is: the request against the volume's state, or, outside
 * every root, whether it would join a volume's project. */
static __always_inline __u8 judge(__u32 where, const struct guard_root *root, __u64 dev, int dir,
				  int sets_projid, __u32 projid, __u32 xflags)
{
	__u8 what = 0;

	if (where == WHERE_OUTSIDE)
		return sets_projid && (volume_project(dev, projid) || in_ranges(projid))
			       ? GUARD_WHAT_FOREIGN_PROJID
			       : 0;
	if (sets_projid && (where != WHERE_VOLUME || projid != root->projid))
		what |= GUARD_WHAT_PROJID;
	if (dir && !(xflags & FS_XFLAG_PROJINHERIT))
		what |= GUARD_WHAT_NOINHERIT;
	return what;
}

static __always_inline void emit(struct guard_event *proto)
{
	struct guard_event *e = bpf_ringbuf_reserve(&guard_events, sizeof(*e), 0);
	__u64 id;

	if (!e) {
		stat_add(GSTAT_EVENTS_LOST);
		return;
	}
	*e = *proto;
	id = bpf_get_current_pid_tgid();
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->cgroup_id = bpf_get_current_cgroup_id();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

/* Fills where the inode is; the caller has judged the request. */
static __always_inline void place(struct guard_event *ev, struct dentry *dentry, __u32 where,
				  const struct guard_root *root, __u64 dev)
{
	ev->ino = BPF_CORE_READ(dentry, d_inode, i_ino);
	ev->dev = dev;
	ev->where = where;
	ev->volume_projid = where == WHERE_OUTSIDE ? ev->projid : root->projid;
}

/* ---- detect ---- */

/* vfs_fileattr_set(idmap or mnt_userns, dentry, fa): 3 parameters from 5.13
 * on, so the return value is ctx[3]. */
SEC("fexit/vfs_fileattr_set")
int BPF_PROG(guard_fileattr_set_exit, void *idmap, struct dentry *dentry, void *fa, int ret)
{
	struct guard_event ev = {};
	struct requested req = {};
	struct guard_root root = {};
	__u64 dev = 0;
	__u32 where;

	if (ret == -EPERM) {
		__u64 tid = bpf_get_current_pid_tgid();
		__u64 *refused = bpf_map_lookup_elem(&guard_refused, &tid);

		if (refused && *refused == (__u64)dentry) {
			/* Counted and reported by the LSM program that refused it. */
			bpf_map_delete_elem(&guard_refused, &tid);
			return 0;
		}
	}
	where = locate(dentry, &root, &dev);
	if (where == WHERE_OTHER_FS)
		return 0;

	/* FS_IOC_SETFLAGS fills `flags` (and the xflags it implies); only
	 * FS_IOC_FSSETXATTR and file_setattr(2) set fsx_valid and a project ID. */
	read_requested(fa, &req);
	ev.projid = req.projid;
	ev.xflags = req.xflags;
	ev.what = judge(where, &root, dev, is_dir(dentry), req.sets_projid, req.projid, req.xflags);
	if (!ev.what)
		return 0;

	place(&ev, dentry, where, &root, dev);
	ev.ret = ret;
	ev.result = ret == 0 ? GUARD_ALLOWED : GUARD_DENIED;
	ev.source = GUARD_SRC_FILEATTR;
	ev.privileged = privileged();
	if (ev.privileged)
		stat_add(GSTAT_PRIVILEGED);
	else
		count(where, dev, ev.volume_projid, ev.result);
	emit(&ev);
	return 0;
}

/* Whether an ioctl of `cmd` sets the inode generation, in any encoding. */
static __always_inline int sets_version(unsigned int cmd)
{
	return cmd == FS_IOC_SETVERSION || cmd == FS_IOC32_SETVERSION ||
	       cmd == EXT4_IOC_SETVERSION || cmd == EXT4_IOC32_SETVERSION;
}

static __always_inline int sets_flags(unsigned int cmd)
{
	return cmd == FS_IOC_SETFLAGS || cmd == FS_IOC32_SETFLAGS;
}

/*
 * The file an ioctl of `cmd` concerns, located as locate() does, its
 * dentry in *dentry; WHERE_OTHER_FS when the ioctl cannot be an escape: a
 * command that sets no flag, project ID or generation, a file of another
 * filesystem, flags or a generation outside every root (only a project ID
 * can be an attempt there), or XFS's SETFLAGS before 5.13 (no struct
 * fileattr: xfs_merge_ioc_xflags keeps the directory's PROJINHERIT whatever
 * the flags say, and `chattr` there never sends it).
 */
static __always_inline __u32 ioctl_subject(struct file *file, unsigned int cmd,
					   struct dentry **dentry, struct guard_root *root,
					   __u64 *dev)
{
	__u32 where;

	if (cmd != FS_IOC_FSSETXATTR && !sets_flags(cmd) && !sets_version(cmd))
		return WHERE_OTHER_FS;
	*dentry = BPF_CORE_READ(file, f_path.dentry);
	where = locate(*dentry, root, dev);
	if (where == WHERE_OUTSIDE && cmd != FS_IOC_FSSETXATTR)
		return WHERE_OTHER_FS;
	if (sets_flags(cmd) && !bpf_core_type_exists(struct fileattr) &&
	    BPF_CORE_READ(*dentry, d_sb, s_magic) == XFS_SUPER_MAGIC)
		return WHERE_OTHER_FS;
	return where;
}

/*
 * An ioctl judged at the exit of security_file_ioctl (the file still held,
 * the argument read from the caller's memory before the kernel copies it:
 * another thread may change it in between, a gap the LSM hook shares), and
 * kept per thread until the native ioctl system call returns, whose result
 * says allowed (0) or denied. A 32-bit caller's compat_ioctl(2) goes
 * uncounted: an fexit on its system call wrapper attached on 5.10 and never
 * took a judgement in the VM tests, so that path is not claimed.
 *
 * Before 5.13 there is no vfs_fileattr_set: FS_IOC_FSSETXATTR and
 * FS_IOC_SETFLAGS go from the ioctl system call to the filesystem's own
 * handler (xfs_file_ioctl, ext4_ioctl, modules), which checks and applies
 * them; vfs_ioctl, between the two, is inlined into the system call. So
 * there (the context build) every attempt is judged so (guard_ioctl_judge).
 * From 5.13 on, the generation ioctls alone never reach vfs_fileattr_set:
 * guard_version_judge judges them so, beside the fexit of vfs_fileattr_set,
 * where nothing refuses them (detect mode).
 *
 * Judged and counted as guard_fileattr_set_exit does: the same attempts,
 * allowed or denied by the kernel's result; privileged changes counted
 * apart.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct guard_event);
} guard_pending SEC(".maps");

/* Judges one ioctl for its system call's exit to count; `version_only`:
 * the generation ioctls alone. */
static __always_inline int judge_ioctl(struct file *file, unsigned int cmd, unsigned long arg,
				       int ret, int version_only)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct guard_event ev = {};
	struct guard_root root = {};
	struct dentry *dentry;
	__u64 dev = 0;
	__u32 where;
	long err;

	/* A judgement a 32-bit call left (its exit is not traced) never
	 * outlives the thread's next ioctl, whatever its command: the native
	 * exit that follows must not count it. */
	bpf_map_delete_elem(&guard_pending, &tid);
	if (ret)
		return 0; /* refused before the filesystem saw it */
	if (version_only && !sets_version(cmd))
		return 0;
	where = ioctl_subject(file, cmd, &dentry, &root, &dev);
	if (where == WHERE_OTHER_FS)
		return 0;

	if (sets_version(cmd)) {
		/* The new generation does not matter: any is an attempt. */
		err = 0;
		ev.projid = root.projid;
		ev.what = GUARD_WHAT_GENERATION;
	} else if (cmd == FS_IOC_FSSETXATTR) {
		struct fsxattr_head x = {};

		err = bpf_probe_read_user(&x, sizeof(x), (void *)arg);
		if (!err) {
			ev.projid = x.fsx_projid;
			ev.xflags = x.fsx_xflags;
			ev.what = judge(where, &root, dev, is_dir(dentry), 1, ev.projid, ev.xflags);
		}
	} else {
		/* Both SETFLAGS variants read an int. */
		__u32 flags = 0;

		err = bpf_probe_read_user(&flags, sizeof(flags), (void *)arg);
		if (!err) {
			ev.xflags = (flags & FS_PROJINHERIT_FL) ? FS_XFLAG_PROJINHERIT : 0;
			ev.projid = root.projid;
			ev.what = judge(where, &root, dev, is_dir(dentry), 0, 0, ev.xflags);
		}
	}
	if (err) {
		/* Outside every root an unreadable request is no known attempt
		 * (the kernel's own copy fails the same way). Inside, what the
		 * kernel will read is unknown: an attempt (fail closed), unless
		 * the kernel fails to read it too (-EFAULT, below). */
		if (where == WHERE_OUTSIDE)
			return 0;
		ev.what = GUARD_WHAT_UNREADABLE;
	}
	if (!ev.what)
		return 0;
	place(&ev, dentry, where, &root, dev);
	ev.cmd = cmd;
	ev.source = GUARD_SRC_FILEATTR;
	ev.privileged = privileged();
	bpf_map_update_elem(&guard_pending, &tid, &ev, BPF_ANY);
	return 0;
}

#ifdef PRJQUOTA_COMPAT
SEC("fexit/security_file_ioctl")
int BPF_PROG(guard_ioctl_judge, struct file *file, unsigned int cmd, unsigned long arg, int ret)
{
	return judge_ioctl(file, cmd, arg, ret, 0);
}
#endif

SEC("fexit/security_file_ioctl")
int BPF_PROG(guard_version_judge, struct file *file, unsigned int cmd, unsigned long arg,
	     int ret)
{
	return judge_ioctl(file, cmd, arg, ret, 1);
}

/* Counts and reports the judgement of this thread's ioctl by its result. */
static __always_inline int ioctl_done(long ret)
{
	__u64 tid = bpf_get_current_pid_tgid();
	struct guard_event *p = bpf_map_lookup_elem(&guard_pending, &tid);
	struct guard_event ev;

	if (!p)
		return 0;
	ev = *p;
	bpf_map_delete_elem(&guard_pending, &tid);
	/* Unreadable for the kernel too: nothing changed, as on 5.13+ where
	 * vfs_fileattr_set is then never called. */
	if ((ev.what & GUARD_WHAT_UNREADABLE) && ret == -EFAULT)
		return 0;
	ev.ret = ret;
	ev.result = ret == 0 ? GUARD_ALLOWED : GUARD_DENIED;
	if (ev.privileged)
		stat_add(GSTAT_PRIVILEGED);
	else
		count(ev.where, ev.dev, ev.volume_projid, ev.result);
	emit(&ev);
	return 0;
}

/* The system call wrapper (__x64_sys_ioctl, or arm64's): one pt_regs
 * argument, so the return value is ctx[1]. src/guard.rs attaches it by the
 * name the kernel's BTF has. */
SEC("fexit/sys_ioctl")
int BPF_PROG(guard_sys_ioctl_exit, void *regs, long ret)
{
	return ioctl_done(ret);
}

/* ---- enforce ---- */

/* Refuses a judged attempt: counts it, reports it, returns -EPERM. */
static __always_inline int refuse(struct guard_event *ev, struct dentry *dentry, __u32 where,
				  const struct guard_root *root, __u64 dev)
{
	if (ev->what & GUARD_WHAT_UNREADABLE)
		stat_add(GSTAT_UNREADABLE);
	place(ev, dentry, where, root, dev);
	ev->ret = -EPERM;
	ev->result = GUARD_DENIED;
	ev->source = GUARD_SRC_LSM;
	/* Outside every root an unreadable request names no volume: it is
	 * counted in GSTAT_UNREADABLE alone. */
	if (!(where == WHERE_OUTSIDE && (ev->what & GUARD_WHAT_UNREADABLE)))
		count(where, dev, ev->volume_projid, GUARD_DENIED);
	emit(ev);
	return -EPERM;
}

/*
 * 6.17+: every path that changes file attributes (FS_IOC_SETFLAGS,
 * FS_IOC_FSSETXATTR native and compat, file_setattr(2), overlayfs) calls
 * security_inode_file_setattr() with the request already merged and copied
 * into the kernel: no user memory to read, no race with another thread.
 */
SEC("lsm/inode_file_setattr")
int BPF_PROG(guard_inode_file_setattr, struct dentry *dentry, void *fa, int ret)
{
	struct guard_event ev = {};
	__u64 tid, mark;
	struct requested req = {};
	struct guard_root root = {};
	__u64 dev = 0;
	__u32 where;

	if (ret)
		return ret; /* an earlier BPF LSM program refused already */
	where = locate(dentry, &root, &dev);
	if (where == WHERE_OTHER_FS)
		return 0;
	if (privileged())
		return 0;
	read_requested(fa, &req);
	ev.projid = req.projid;
	ev.xflags = req.xflags;
	ev.what = judge(where, &root, dev, is_dir(dentry), req.sets_projid, req.projid, req.xflags);
	if (!ev.what)
		return 0;
	tid = bpf_get_current_pid_tgid();
	mark = (__u64)dentry;
	bpf_map_update_elem(&guard_refused, &tid, &mark, BPF_ANY);
	return refuse(&ev, dentry, where, &root, dev);
}

/*
 * Before 6.17 there is no LSM hook inside vfs_fileattr_set (security_
 * inode_setattr is not called there), so the ioctl itself is judged: the
 * new struct fsxattr / flags word is read from user memory,
 * bpf_copy_from_user in the sleepable variant (faults pages in),
 * bpf_probe_read_user in the fallback. Unreadable: refused. A 32-bit caller
 * (an i386 binary, or int $0x80) comes through file_ioctl_compat since
 * "lsm: new security_file_ioctl_compat() hook" (6.8, backported to stable);
 * before that, through file_ioctl with the compat command number.
 * overlayfs (5.13 to 6.16) passes a change of one of its files down by
 * calling security_file_ioctl on the real file with no argument (0): the
 * request is unreadable, so an unprivileged caller's change through an
 * overlay is refused at or below a root and, for FS_IOC_FSSETXATTR (whose
 * project ID is not known), anywhere on a device that holds roots.
 */
static __always_inline int check_ioctl(struct file *file, unsigned int cmd, unsigned long arg,
				       int ret, int sleepable, int version_only)
{
	struct guard_event ev = {};
	struct guard_root root = {};
	struct dentry *dentry;
	__u64 dev = 0;
	__u32 where;
	long err;

	if (ret)
		return ret; /* an earlier BPF LSM program refused already */
	if (version_only && !sets_version(cmd))
		return 0;
	where = ioctl_subject(file, cmd, &dentry, &root, &dev);
	if (where == WHERE_OTHER_FS)
		return 0;
	if (privileged())
		return 0;

	if (sets_version(cmd)) {
		/* The new generation does not matter: any is an attempt. */
		ev.projid = root.projid;
		ev.what = GUARD_WHAT_GENERATION;
	} else if (cmd == FS_IOC_FSSETXATTR) {
		struct fsxattr_head x = {};

		if (sleepable)
			err = bpf_copy_from_user(&x, sizeof(x), (void *)arg);
		else
			err = bpf_probe_read_user(&x, sizeof(x), (void *)arg);
		if (err) {
			/* Unreadable here is not unreadable for the kernel: the
			 * non-sleepable program cannot fault a page in, the
			 * kernel's own copy does. Outside every root too, what
			 * the kernel will read may be a volume's project ID: an
			 * attempt (fail closed). */
			ev.what = GUARD_WHAT_UNREADABLE;
		} else {
			ev.projid = x.fsx_projid;
			ev.xflags = x.fsx_xflags;
			ev.what = judge(where, &root, dev, is_dir(dentry), 1, ev.projid, ev.xflags);
		}
	} else {
		/* Both SETFLAGS variants read an int. */
		__u32 flags = 0;

		if (sleepable)
			err = bpf_copy_from_user(&flags, sizeof(flags), (void *)arg);
		else
			err = bpf_probe_read_user(&flags, sizeof(flags), (void *)arg);
		if (err) {
			ev.what = GUARD_WHAT_UNREADABLE;
		} else {
			ev.xflags = (flags & FS_PROJINHERIT_FL) ? FS_XFLAG_PROJINHERIT : 0;
			ev.projid = root.projid;
			ev.what = judge(where, &root, dev, is_dir(dentry), 0, 0, ev.xflags);
		}
	}
	if (!ev.what)
		return 0;
	ev.cmd = cmd;
	return refuse(&ev, dentry, where, &root, dev);
}

SEC("lsm.s/file_ioctl")
int BPF_PROG(guard_file_ioctl_sleepable, struct file *file, unsigned int cmd, unsigned long arg,
	     int ret)
{
	return check_ioctl(file, cmd, arg, ret, 1, 0);
}

SEC("lsm/file_ioctl")
int BPF_PROG(guard_file_ioctl, struct file *file, unsigned int cmd, unsigned long arg, int ret)
{
	return check_ioctl(file, cmd, arg, ret, 0, 0);
}

/* compat_ptr() is a zero extension on x86_64 and arm64: `arg` is the user
 * address as it is. */
SEC("lsm.s/file_ioctl_compat")
int BPF_PROG(guard_file_ioctl_compat_sleepable, struct file *file, unsigned int cmd,
	     unsigned long arg, int ret)
{
	return check_ioctl(file, cmd, arg, ret, 1, 0);
}

SEC("lsm/file_ioctl_compat")
int BPF_PROG(guard_file_ioctl_compat, struct file *file, unsigned int cmd, unsigned long arg,
	     int ret)
{
	return check_ioctl(file, cmd, arg, ret, 0, 0);
}

/*
 * 6.17+, beside inode_file_setattr: the generation is set by ioctls that do
 * not go through vfs_fileattr_set, so they are judged here, native and
 * compat. The argument is not read: any new generation is an attempt.
 */
SEC("lsm/file_ioctl")
int BPF_PROG(guard_file_ioctl_version, struct file *file, unsigned int cmd, unsigned long arg,
	     int ret)
{
	return check_ioctl(file, cmd, arg, ret, 0, 1);
}

SEC("lsm/file_ioctl_compat")
int BPF_PROG(guard_file_ioctl_compat_version, struct file *file, unsigned int cmd,
	     unsigned long arg, int ret)
{
	return check_ioctl(file, cmd, arg, ret, 0, 1);
}
