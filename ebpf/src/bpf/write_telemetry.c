// SPDX-License-Identifier: (MPL-2.0 OR GPL-2.0)
/*
 * Per-volume write telemetry: bytes written, successful writes and failed
 * writes by errno, for files below registered volume root directories.
 *
 * Hook points (all in vmlinux: aya cannot attach to or relocate against
 * module BTF, and XFS and ext4 are modules on Debian):
 *
 *   fentry iomap_file_buffered_write   buffered writes on XFS
 *   fexit  iomap_file_buffered_write
 *   fentry generic_perform_write       buffered writes on ext4 (and ext4's
 *   fexit  generic_perform_write       buffered fallback for O_DIRECT)
 *   fentry iomap_dio_complete          O_DIRECT on XFS and ext4: sync,
 *   fexit  iomap_dio_complete          libaio and io_uring all complete here
 *
 * These sit below every submission path. Measured in the VM on Debian's
 * 6.1 with the ftrace function tracer, 16 x 4 KiB writes by fio per engine:
 *  - vfs_write alone misses most paths: pwritev goes through vfs_writev;
 *    io_uring (io_write calls ->write_iter directly) and libaio (aio_write)
 *    never enter vfs_write: vfs_write=3 (fio's own stdout) while
 *    iomap_file_buffered_write=16 (XFS) / generic_perform_write=16 (ext4).
 *  - every O_DIRECT write, sync (psync), libaio and io_uring, on XFS and
 *    ext4, reaches iomap_dio_complete exactly once (not inlined into
 *    iomap_dio_rw or iomap_dio_complete_work), and never the buffered
 *    engines of the volume's filesystem; buffered writes never reach it.
 *    (The loop device under the test filesystems writes its backing file
 *    through generic_perform_write: another filesystem, not attributed.)
 *  - io_uring O_DIRECT on XFS made 17 iomap_dio_complete calls for 16
 *    writes: the extra one is the IOCB_NOWAIT attempt failing with EAGAIN
 *    before io_uring resubmits from a worker.
 *  - one write(2) refused by an XFS project quota calls
 *    iomap_file_buffered_write twice (see below).
 * tests/tests/ebpf.rs then checks the counters themselves: write, pwrite,
 * writev, O_DIRECT, io_uring and libaio (buffered and direct) each move bytes
 * and ops by exactly what was written, at depths 0, 2 and 31, on XFS and
 * ext4; a refused write counts one ENOSPC (XFS) or EDQUOT (ext4).
 *
 * Two kernel retries would count one call twice; both are filtered here:
 *  - IOCB_NOWAIT attempts that fail with EAGAIN: not counted at all.
 *  - xfs_file_buffered_write() retries once after ENOSPC/EDQUOT, after
 *    flushing speculative preallocations. The first failure is remembered per
 *    thread and only the retry's result is counted, so one refused write(2)
 *    is one error.
 *
 * Not seen: stores through shared mmap (they never take a write path).
 *
 * A fifth program, fexit vfs_rename, only bumps the generation that keeps
 * the attribution cache (below) exact.
 */
#include "kernel.h"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "shared.h"

char LICENSE[] SEC("license") = "Dual MPL/GPL";

/* Volume root directories -> volume index. Filled by userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ROOTS);
	__type(key, struct root_key);
	__type(value, __u32);
} roots SEC(".maps");

/* Devices that hold at least one root: writes elsewhere skip the walk. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DEVS);
	__type(key, __u64);
	__type(value, __u32);
} root_devs SEC(".maps");

/*
 * Per volume index, below --ebpf.max-volumes (the loader sets max_entries):
 * an array, so a write's counters are one inlined lookup rather than a hash
 * helper call (4 KiB buffered writes: 491-497 ns of program run time per
 * write with a per-CPU hash, 328-341 ns with this, side by side on 6.1).
 * Userspace hands out low indexes, reuses one only long after its volume
 * left, and zeroes a slot before it gives the index out again.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VOLUMES);
	__type(key, __u32);
	__type(value, struct counters);
} volume_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_UNATTR);
	__type(key, __u32);
	__type(value, struct counters);
} unattributed SEC(".maps");

/*
 * iomap_dio_complete() frees the dio before it returns, so the fentry
 * half reads it and leaves what the fexit half needs here. The key is the
 * dio's address and the thread running the call (the call may sleep, so
 * no per-CPU slot). The address alone is not unique: once this call has
 * freed the dio, another CPU can allocate the same address for its next
 * write and complete it before this call's fexit runs (a vCPU stalled by
 * the host makes that window long). Its fentry then overwrote this entry,
 * this fexit took it, and its own fexit found nothing: one write lost
 * without a trace. A thread runs one call at a time.
 */
struct dio_key {
	__u64 dio;
	__u64 pid_tgid;
};

struct dio_start {
	__u32 kind;
	__u32 volume;
	__u32 nowait;
	__u32 _pad;
	__u64 done_before;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct dio_key);
	__type(value, struct dio_start);
} dio_inflight SEC(".maps");

/*
 * Writes into volumes whose call began and was not seen to end, by path
 * (UNFINISHED_DIRECT, UNFINISHED_BUFFERED): an fentry half adds 1 for a
 * write it attributed to a volume and handed over, the fexit half takes 1
 * away when it finds that start. Summed over CPUs it is the calls running
 * now plus those whose end went unseen, which nothing else reports: when
 * another program attaches to or detaches from a hooked function, the
 * kernel rebuilds the function's trampoline and patches the old one to
 * skip its fexit programs for the calls still inside the function
 * (bpf_tramp_image_put), so those writes are never counted, and no skipped
 * run is recorded. A start that could not be stored stays counted here
 * too (O_DIRECT), or is not counted at all (buffered: its fexit then
 * attributes the write itself, as with no fentry half).
 *
 * A thread runs one buffered write at a time, so a buffered start its
 * thread's next write on a volume filesystem finds still in the slot had
 * its fexit skipped: that write is lost for certain, and moves from
 * UNFINISHED_BUFFERED to LOST_BUFFERED (a count that only grows).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_UNFINISHED);
	__type(key, __u32);
	__type(value, __s64);
} unfinished_writes SEC(".maps");

static __always_inline void unfinished(__u32 path, __s64 delta)
{
	__s64 *n = bpf_map_lookup_elem(&unfinished_writes, &path);

	if (n)
		__sync_fetch_and_add(n, delta);
}

/*
 * The common case of that hand-off without the hash: the thread's own slot
 * (task-local storage), free when dio is 0. A completion that finds the
 * slot taken (one run in interrupt context on a thread inside its own call,
 * or a slot left by a skipped fexit) or the storage busy uses dio_inflight
 * as before. A slot holding this very dio address is stale (a thread never
 * completes one dio twice at once) and is overwritten, so a skipped fexit
 * cannot hand an old call's data to a new dio at a reused address.
 */
struct dio_slot {
	__u64 dio;
	struct dio_start s;
};

#ifndef PRJQUOTA_COMPAT
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct dio_slot);
} dio_task SEC(".maps");
#endif

/*
 * A buffered write's hand-off from its fentry half to its fexit half: the
 * volume the write was attributed to when it began. A thread runs one
 * buffered write at a time (neither hooked function calls the other or
 * itself, and they run in task context only), so one slot per thread
 * holds it, free when id is 0. The call is named by its kiocb's address,
 * or, for generic_perform_write(file, iter, pos) before 5.19, by the file
 * and the position, which the fexit half reads back unchanged.
 *
 * The fexit half takes the slot's volume rather than attributing the file
 * again: a file renamed out of its volume mid-write would otherwise leave
 * its start counted for ever. A start that is not its own (a slot left by
 * a skipped fexit, or none stored: the fentry skipped or not attached yet)
 * makes the fexit attribute the file itself, as with no fentry half. An
 * fentry that attributes the write to no volume frees the slot, so that
 * a stale one cannot meet a later call at the same stack address.
 */
struct buffered_start {
	__u64 id;
	__s64 pos;
	__u32 volume;
	__u32 _pad;
};

#ifndef PRJQUOTA_COMPAT
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct buffered_start);
} buffered_task SEC(".maps");
#else
/* Without task-local storage: keyed by the thread. An LRU, so that the
 * slots of threads that exited make room; a start evicted while its write
 * runs is counted by its fexit all the same, and stays in the gauge. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct buffered_start);
} buffered_inflight SEC(".maps");
#endif

/* A buffered XFS write that failed with ENOSPC/EDQUOT, awaiting its retry. */
struct retry_mark {
	__u64 iocb;
	__s64 pos;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64); /* pid_tgid: one thread */
	__type(value, struct retry_mark);
} xfs_retry SEC(".maps");

#define ATTRIBUTED 0xffffffffU

/*
 * The attribution cache: per CPU and per program, the volume of the last
 * few directories written into, so that a write into a directory seen
 * before costs two array reads instead of the walk below (one hash lookup
 * per level: 4 KiB buffered writes four levels down cost 4 % more with the
 * walk, by the kernel's BPF run-time statistics, on 6.1).
 *
 * A directory's volume is a function of the chain of its ancestors and of
 * the roots map, so an entry is valid while neither changed:
 *  - the chain changes only by a rename (of the directory or an ancestor;
 *    directories have no hard links, bind mounts share dentries). fexit
 *    vfs_rename bumps attr_gen[GEN_RENAMES] after the kernel moved the
 *    dentry (on a device with a root: see vfs_rename_exit), and a program
 *    reads the generations before it walks: a walk that saw the old chain
 *    is stored under the old generation. (Reconnecting a disconnected
 *    dentry also moves one, but a walk through a disconnected dentry ends
 *    there unattributed, and only attributions are cached.)
 *  - the loader bumps attr_gen[GEN_ROOTS] after each change to roots, in the
 *    same order: a root added, removed or re-indexed takes effect at the
 *    next write, as without the cache.
 *  - the key is the directory's identity, (dev, ino, i_generation), the one
 *    NFS file handles use: a directory removed and its inode number reused
 *    comes back with another generation, and a freed dentry reused for
 *    another directory names another inode.
 * Only attributions are cached: a write outside every root, or on a device
 * without one, walks (or stops at root_devs) as before.
 *
 * Each program has its own slots on each CPU: a tracing program never runs
 * twice at once on one CPU (the kernel skips, and counts, a nested run), so
 * an entry is never written by two runs at once nor read half-written.
 *
 * x86-64 only: the argument needs the generation read to be ordered before
 * the walk's reads, which x86 guarantees for loads and BPF offers no barrier
 * for elsewhere; other architectures walk every time.
 */
#if defined(__TARGET_ARCH_x86)
#define ATTR_CACHE 1
#endif

#define CACHE_SLOTS 8 /* per program and CPU; a power of two */
#define CACHE_BUFFERED 0
#define CACHE_GENERIC 1
#define CACHE_DIO 2
#define CACHE_BUFFERED_ENTRY 3 /* the fentry halves: programs of their own */
#define CACHE_GENERIC_ENTRY 4
#define CACHE_GROUPS 5

struct attr_cached {
	__u64 dev;
	__u64 ino;
	__u64 renames;
	__u64 roots;
	__u32 generation;
	__u32 volume;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, N_GEN);
	__type(key, __u32);
	__type(value, __u64);
} attr_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CACHE_GROUPS * CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct attr_cached);
} attr_cache SEC(".maps");

static __always_inline __u64 generation_of(__u32 which)
{
	__u64 *g = bpf_map_lookup_elem(&attr_gen, &which);

	return g ? *(volatile __u64 *)g : 0;
}

/*
 * Which volume a file belongs to: walk d_parent from the file's directory up
 * to MAX_DEPTH ancestors and take the first (innermost) registered root.
 * Bind mounts share dentries with their source, so writes through them are
 * attributed to the same volume. `prog` picks the caller's cache slots.
 */
static __always_inline __u32 attribute(struct file *file, __u32 *volume, __u32 prog)
{
	struct dentry *d = file->f_path.dentry;
	struct root_key key = {};
	__u32 *idx;

	key.dev = d->d_sb->s_dev;
	d = d->d_parent;
#ifdef ATTR_CACHE
	struct inode *dir = d->d_inode;
	__u64 ino = dir->i_ino;
	__u32 generation = dir->i_generation;
	__u64 renames = 0, roots_gen = 0;
	struct attr_cached *c = NULL;

	if (generation_of(GEN_CACHE_ON)) {
		__u32 s = prog * CACHE_SLOTS + ((__u32)(ino ^ (ino >> 12)) & (CACHE_SLOTS - 1));

		renames = generation_of(GEN_RENAMES);
		roots_gen = generation_of(GEN_ROOTS);
		c = bpf_map_lookup_elem(&attr_cache, &s);
		if (c && c->ino == ino && c->dev == key.dev && c->generation == generation &&
		    c->renames == renames && c->roots == roots_gen) {
			*volume = c->volume;
			return ATTRIBUTED;
		}
	}
#endif
	if (!bpf_map_lookup_elem(&root_devs, &key.dev))
		return UNATTR_OTHER_FS;

	for (int i = 0; i < MAX_DEPTH; i++) {
		struct dentry *up;

		key.ino = d->d_inode->i_ino;
		idx = bpf_map_lookup_elem(&roots, &key);
		if (idx) {
			*volume = *idx;
#ifdef ATTR_CACHE
			if (c) {
				c->dev = key.dev;
				c->ino = ino;
				c->generation = generation;
				c->renames = renames;
				c->roots = roots_gen;
				c->volume = *volume;
			}
#endif
			return ATTRIBUTED;
		}
		up = d->d_parent;
		if (!up || up == d)
			return UNATTR_OUTSIDE;
		d = up;
	}
	return UNATTR_WALK_LIMIT;
}

static __always_inline __u32 bucket(__s64 err)
{
	switch (err) {
	case ENOSPC:
		return BUCKET_ENOSPC;
	case EDQUOT:
		return BUCKET_EDQUOT;
	case EIO:
		return BUCKET_EIO;
	case EROFS:
		return BUCKET_EROFS;
	default:
		return BUCKET_OTHER;
	}
}

static __always_inline struct counters *slot(__u32 kind, __u32 volume)
{
	struct counters *c;

	if (kind != ATTRIBUTED)
		return bpf_map_lookup_elem(&unattributed, &kind);
	c = bpf_map_lookup_elem(&volume_counters, &volume);
	if (c)
		return c;
	/* An index beyond --ebpf.max-volumes: counted, never lost. */
	kind = UNATTR_MAP_FULL;
	return bpf_map_lookup_elem(&unattributed, &kind);
}

/* ret: the write's result; bytes: what this call itself wrote when ret > 0. */
static __always_inline void account(__u32 kind, __u32 volume, __s64 ret, __u64 bytes)
{
	struct counters *c;

	if (ret > 0 && bytes == 0)
		return;
	c = slot(kind, volume);
	if (!c)
		return;
	/* Atomic even though per-CPU: a completion in interrupt context may
	 * interleave with a program running in task context on the same CPU. */
	if (ret > 0) {
		__sync_fetch_and_add(&c->bytes, bytes);
		__sync_fetch_and_add(&c->ops, 1);
	} else {
		__u32 b = bucket(-ret);
		if (b < N_BUCKETS)
			__sync_fetch_and_add(&c->errors[b], 1);
	}
}

/* A start found in its thread's slot when the thread began another write. */
static __always_inline void buffered_lost(void)
{
	unfinished(UNFINISHED_BUFFERED, -1);
	unfinished(LOST_BUFFERED, 1);
}

/*
 * The fentry half of a buffered write: id and pos name the call. Most of a
 * node's writes are on filesystems without a volume: those neither halves
 * hand anything over for (no slot is read or written), so that they cost
 * what they cost with the fexit alone. A device that loses its last root
 * while a write into that root runs leaves that write's start counted.
 */
static __always_inline void buffered_begin(__u64 id, __s64 pos, struct file *file, __u32 prog)
{
	struct buffered_start s = { .id = id, .pos = pos };
	__u32 kind = attribute(file, &s.volume, prog);
#ifndef PRJQUOTA_COMPAT
	struct buffered_start *slot;

	if (kind == UNATTR_OTHER_FS)
		return;
	if (kind != ATTRIBUTED) {
		slot = bpf_task_storage_get(&buffered_task, bpf_get_current_task_btf(), 0, 0);
		if (slot && slot->id) {
			slot->id = 0;
			buffered_lost();
		}
		return;
	}
	slot = bpf_task_storage_get(&buffered_task, bpf_get_current_task_btf(), 0,
				    BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!slot)
		return;
	if (slot->id)
		buffered_lost();
	*slot = s;
#else
	__u64 tid = bpf_get_current_pid_tgid();
	int stale;

	if (kind == UNATTR_OTHER_FS)
		return;
	stale = bpf_map_lookup_elem(&buffered_inflight, &tid) != 0;
	if (stale)
		buffered_lost();
	if (kind != ATTRIBUTED) {
		if (stale)
			bpf_map_delete_elem(&buffered_inflight, &tid);
		return;
	}
	if (bpf_map_update_elem(&buffered_inflight, &tid, &s, BPF_ANY)) {
		/* Counted lost already: it must not be counted again. */
		if (stale)
			bpf_map_delete_elem(&buffered_inflight, &tid);
		return;
	}
#endif
	unfinished(UNFINISHED_BUFFERED, 1);
}

/*
 * The fexit half's start: 1 and the volume when this thread's slot holds
 * this call's start, which it takes back (with its unfinished count);
 * else 0, and the caller attributes the file itself.
 */
static __always_inline int buffered_started(__u64 id, __s64 pos, __u32 *volume)
{
#ifndef PRJQUOTA_COMPAT
	struct buffered_start *slot =
		bpf_task_storage_get(&buffered_task, bpf_get_current_task_btf(), 0, 0);

	if (!slot || slot->id != id || slot->pos != pos)
		return 0;
	*volume = slot->volume;
	slot->id = 0;
#else
	__u64 tid = bpf_get_current_pid_tgid();
	struct buffered_start *p = bpf_map_lookup_elem(&buffered_inflight, &tid);

	if (!p || p->id != id || p->pos != pos)
		return 0;
	*volume = p->volume;
	bpf_map_delete_elem(&buffered_inflight, &tid);
#endif
	unfinished(UNFINISHED_BUFFERED, -1);
	return 1;
}

/* The volume of a buffered write ending now: from its start, else walked. */
static __always_inline __u32 buffered_end(__u64 id, __s64 pos, struct file *file, __u32 *volume,
					  __u32 prog)
{
	__u64 dev = file->f_path.dentry->d_sb->s_dev;

	if (!bpf_map_lookup_elem(&root_devs, &dev))
		return UNATTR_OTHER_FS;
	if (buffered_started(id, pos, volume))
		return ATTRIBUTED;
	return attribute(file, volume, prog);
}

/* A buffered write's result, for the volume (or bucket) it began in. */
static __always_inline void account_buffered_in(__u32 kind, __u32 volume, __s64 ret, int nowait)
{
	if (ret == 0)
		return;
	if (ret == -EAGAIN && nowait)
		return;
#ifdef PRJQUOTA_FAULT_WRONG_RET
	/* Fault injection (cargo feature `fault-injection`): a hook that reads
	 * the wrong return value, as after a kernel changes a signature. The
	 * exporter's start-up self-test must catch it. */
	ret = ret > 1 ? (__s64)((__u64)ret >> 1) : ret;
#endif
	account(kind, volume, ret, ret > 0 ? ret : 0);
}

static __always_inline void account_buffered(struct kiocb *iocb, __s64 ret, __u32 prog)
{
	__u32 volume = 0;
	__u32 kind = buffered_end((__u64)iocb, 0, iocb->ki_filp, &volume, prog);

	account_buffered_in(kind, volume, ret, iocb->ki_flags & IOCB_NOWAIT);
}

static __always_inline void buffered_write_exit(struct kiocb *iocb, __s64 ret)
{
	__u32 volume = 0;
	/* Taken back before the retry's filter: each attempt has its start. */
	__u32 kind = buffered_end((__u64)iocb, 0, iocb->ki_filp, &volume, CACHE_BUFFERED);

	if ((ret == -ENOSPC || ret == -EDQUOT) &&
	    iocb->ki_filp->f_path.dentry->d_sb->s_magic == XFS_SUPER_MAGIC) {
		__u64 tid = bpf_get_current_pid_tgid();
		struct retry_mark mark = { .iocb = (__u64)iocb, .pos = iocb->ki_pos };
		struct retry_mark *seen = bpf_map_lookup_elem(&xfs_retry, &tid);

		if (!seen || seen->iocb != mark.iocb || seen->pos != mark.pos) {
			/* First attempt: XFS frees space and retries once. */
			bpf_map_update_elem(&xfs_retry, &tid, &mark, BPF_ANY);
			return;
		}
		bpf_map_delete_elem(&xfs_retry, &tid);
	}
	account_buffered_in(kind, volume, ret, iocb->ki_flags & IOCB_NOWAIT);
}

/* The fentry halves. Only the first parameter is read, whatever the
 * arity, in both builds. */
SEC("fentry/iomap_file_buffered_write")
int BPF_PROG(iomap_buffered_write_entry, struct kiocb *iocb)
{
	buffered_begin((__u64)iocb, 0, iocb->ki_filp, CACHE_BUFFERED_ENTRY);
	return 0;
}

#ifndef PRJQUOTA_COMPAT
SEC("fexit/iomap_file_buffered_write")
int BPF_PROG(iomap_buffered_write_exit, struct kiocb *iocb)
{
	__s64 ret = 0;

	/* The return value, whatever the arity (6.1 has 3 parameters, later
	 * kernels 4): only the kiocb, parameter 0, is read. */
	bpf_get_func_ret(ctx, (__u64 *)&ret);
	buffered_write_exit(iocb, ret);
	return 0;
}

SEC("fentry/generic_perform_write")
int BPF_PROG(generic_perform_write_entry, struct kiocb *iocb)
{
	buffered_begin((__u64)iocb, 0, iocb->ki_filp, CACHE_GENERIC_ENTRY);
	return 0;
}

SEC("fexit/generic_perform_write")
int BPF_PROG(generic_perform_write_exit, struct kiocb *iocb)
{
	__s64 ret = 0;

	bpf_get_func_ret(ctx, (__u64 *)&ret);
	account_buffered(iocb, ret, CACHE_GENERIC);
	return 0;
}
#else
/*
 * Without bpf_get_func_ret (before 5.17) an fexit program finds the return
 * value in its context right after the parameters, so each arity is its own
 * program. The loader tries the longest first: the verifier refuses a read
 * past the function's return value, so a program never loads against a
 * signature shorter than its own (a shorter one would read a parameter as
 * the return value).
 */
SEC("fexit/iomap_file_buffered_write")
int BPF_PROG(iomap_buffered_write_exit4, struct kiocb *iocb, void *from, void *ops, void *private,
	     long ret)
{
	buffered_write_exit(iocb, ret);
	return 0;
}

SEC("fexit/iomap_file_buffered_write")
int BPF_PROG(iomap_buffered_write_exit3, struct kiocb *iocb, void *from, void *ops, long ret)
{
	buffered_write_exit(iocb, ret);
	return 0;
}

/*
 * Before 5.19: generic_perform_write(file, iter, pos). The kiocb is not
 * passed, but ext4 (its only caller among the volume filesystems) never
 * gets here with IOCB_NOWAIT: ext4_buffered_write_iter() refuses those
 * writes before, so there is no EAGAIN attempt to leave out.
 */
SEC("fexit/generic_perform_write")
int BPF_PROG(generic_perform_write_exit_file, struct file *file, void *i, long long pos, long ret)
{
	__u32 volume = 0;
	__u32 kind = buffered_end((__u64)file, pos, file, &volume, CACHE_GENERIC);

	account_buffered_in(kind, volume, ret, 0);
	return 0;
}

/* 5.19 and later: generic_perform_write(iocb, iter). */
SEC("fexit/generic_perform_write")
int BPF_PROG(generic_perform_write_exit_kiocb, struct kiocb *iocb, void *i, long ret)
{
	account_buffered(iocb, ret, CACHE_GENERIC);
	return 0;
}

/* The fentry halves, longest signature first as above: the first reads
 * pos, which the verifier refuses past a two-parameter function. */
SEC("fentry/generic_perform_write")
int BPF_PROG(generic_perform_write_entry_file, struct file *file, void *i, long long pos)
{
	buffered_begin((__u64)file, pos, file, CACHE_GENERIC_ENTRY);
	return 0;
}

SEC("fentry/generic_perform_write")
int BPF_PROG(generic_perform_write_entry_kiocb, struct kiocb *iocb)
{
	buffered_begin((__u64)iocb, 0, iocb->ki_filp, CACHE_GENERIC_ENTRY);
	return 0;
}
#endif

SEC("fentry/iomap_dio_complete")
int BPF_PROG(iomap_dio_complete_entry, struct iomap_dio *dio)
{
	struct dio_start s = {};
	struct kiocb *iocb;
	struct dio_key key = {};
	struct dio_slot *slot;

	if (!(dio->flags & IOMAP_DIO_WRITE))
		return 0;
	iocb = dio->iocb;
	s.kind = attribute(iocb->ki_filp, &s.volume, CACHE_DIO);
	s.nowait = (iocb->ki_flags & IOCB_NOWAIT) ? 1 : 0;
	if (bpf_core_field_exists(dio->done_before))
		s.done_before = dio->done_before;
	if (s.kind == ATTRIBUTED)
		unfinished(UNFINISHED_DIRECT, 1);
#ifndef PRJQUOTA_COMPAT
	slot = bpf_task_storage_get(&dio_task, bpf_get_current_task_btf(), 0,
				    BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (slot && (slot->dio == 0 || slot->dio == (__u64)dio)) {
		/* Claimed before it is filled: a completion in an interrupt on
		 * this thread meanwhile finds it taken. */
		slot->dio = (__u64)dio;
		asm volatile("" ::: "memory");
		slot->s = s;
		return 0;
	}
#else
	(void)slot;
#endif
	key.dio = (__u64)dio;
	key.pid_tgid = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&dio_inflight, &key, &s, BPF_ANY);
	return 0;
}

#ifndef PRJQUOTA_COMPAT
SEC("fexit/iomap_dio_complete")
int BPF_PROG(iomap_dio_complete_exit, struct iomap_dio *dio)
#else
/* iomap_dio_complete(dio) has had one parameter since it came (4.10). */
SEC("fexit/iomap_dio_complete")
int BPF_PROG(iomap_dio_complete_exit, struct iomap_dio *dio, long func_ret)
#endif
{
	/* dio is freed by now: only its address is used. */
	struct dio_key key = { .dio = (__u64)dio, .pid_tgid = bpf_get_current_pid_tgid() };
	struct dio_start *p;
	struct dio_start s;
	__s64 ret = 0;
	__u64 bytes = 0;
#ifndef PRJQUOTA_COMPAT
	struct dio_slot *slot = bpf_task_storage_get(&dio_task, bpf_get_current_task_btf(), 0, 0);

	if (slot && slot->dio == (__u64)dio) {
		s = slot->s;
		/* Released only once read. */
		asm volatile("" ::: "memory");
		slot->dio = 0;
	} else {
		p = bpf_map_lookup_elem(&dio_inflight, &key);
		if (!p)
			return 0;
		s = *p;
		bpf_map_delete_elem(&dio_inflight, &key);
	}
	bpf_get_func_ret(ctx, (__u64 *)&ret);
#else
	p = bpf_map_lookup_elem(&dio_inflight, &key);
	if (!p)
		return 0;
	s = *p;
	bpf_map_delete_elem(&dio_inflight, &key);
	ret = func_ret;
#endif
	if (s.kind == ATTRIBUTED)
		unfinished(UNFINISHED_DIRECT, -1);
	if (ret == 0 || (ret == -EAGAIN && s.nowait))
		return 0;
	/* On success the result includes what earlier partial submissions of
	 * the same request already wrote (and counted). */
	if (ret > 0 && (__u64)ret > s.done_before)
		bytes = ret - s.done_before;
	account(s.kind, s.volume, ret, bytes);
	return 0;
}

/*
 * Invalidates every cached attribution: the kernel has moved the dentry by
 * now, so a program that reads the new generation walks the new chain.
 * Renames on a filesystem without a root are skipped (a busy node renames
 * all the time, mostly elsewhere): no attribution there can be cached, and
 * a device that gains its first root bumps GEN_ROOTS after root_devs.
 */
static __always_inline void renamed(struct dentry *old_dentry)
{
	__u32 which = GEN_RENAMES;
	__u64 dev = old_dentry->d_sb->s_dev;
	__u64 *g;

	if (!bpf_map_lookup_elem(&root_devs, &dev))
		return;
	g = bpf_map_lookup_elem(&attr_gen, &which);
	if (g)
		__sync_fetch_and_add(g, 1);
}

#ifndef PRJQUOTA_COMPAT
SEC("fexit/vfs_rename")
int BPF_PROG(vfs_rename_exit, struct renamedata *rd)
{
	renamed(rd->old_dentry);
	return 0;
}
#else
/* Before 5.12 vfs_rename() took its six arguments one by one. */
SEC("fexit/vfs_rename")
int BPF_PROG(vfs_rename_exit6, void *old_dir, struct dentry *old_dentry, void *new_dir,
	     void *new_dentry, void *delegated, unsigned int flags, int ret)
{
	/* Read, so that the verifier checks this arity (see above). */
	asm volatile("" ::"r"(ret));
	renamed(old_dentry);
	return 0;
}

SEC("fexit/vfs_rename")
int BPF_PROG(vfs_rename_exit1, struct renamedata *rd, int ret)
{
	asm volatile("" ::"r"(ret));
	renamed(rd->old_dentry);
	return 0;
}
#endif
