//! The BPF object and the map layouts shared with it: every `unsafe` of the
//! crate is here.
//!
//! Mirrors `src/bpf/shared.h`; `tests::header_matches_rust` parses that header
//! and checks both sides agree, and aya checks key and value sizes against
//! the maps' definitions whenever a map is opened.

/// The compiled `src/bpf/write_telemetry.c`, 8-byte aligned as ELF parsing
/// wants.
pub(crate) fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/write_telemetry.o"))
}

/// The same source built with `-DPRJQUOTA_COMPAT`: no `bpf_get_func_ret`,
/// no task-local storage.
pub(crate) fn object_compat() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/write_telemetry_compat.o"))
}

pub(crate) const BUCKET_ENOSPC: usize = 0;
pub(crate) const BUCKET_EDQUOT: usize = 1;
pub(crate) const BUCKET_EIO: usize = 2;
pub(crate) const BUCKET_EROFS: usize = 3;
pub(crate) const BUCKET_OTHER: usize = 4;
pub(crate) const N_BUCKETS: usize = 5;

pub(crate) const UNATTR_OTHER_FS: u32 = 0;
pub(crate) const UNATTR_OUTSIDE: u32 = 1;
pub(crate) const UNATTR_WALK_LIMIT: u32 = 2;
pub(crate) const UNATTR_MAP_FULL: u32 = 3;
pub(crate) const N_UNATTR: u32 = 4;

/// Bumped by the C side only; here for the header test.
#[cfg(test)]
pub(crate) const GEN_RENAMES: u32 = 0;
pub(crate) const GEN_ROOTS: u32 = 1;
pub(crate) const GEN_CACHE_ON: u32 = 2;
#[cfg(test)]
pub(crate) const N_GEN: u32 = 3;

pub(crate) const UNFINISHED_DIRECT: u32 = 0;
pub(crate) const UNFINISHED_BUFFERED: u32 = 1;
pub(crate) const LOST_BUFFERED: u32 = 2;
#[cfg(test)]
pub(crate) const N_UNFINISHED: u32 = 3;

pub(crate) const MAX_DEPTH: u32 = 32;
pub(crate) const MAX_ROOTS: u32 = 16384;
pub(crate) const MAX_VOLUMES: u32 = 16384;
pub(crate) const MAX_DEVS: u32 = 64;

/// `struct root_key`: a directory as the kernel names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RootKey {
    /// `super_block->s_dev`, kernel encoding (see `crate::kernel_dev`).
    pub dev: u64,
    pub ino: u64,
}

/// `struct counters`: one CPU's share of a volume's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawCounters {
    pub bytes: u64,
    pub ops: u64,
    pub errors: [u64; N_BUCKETS],
}

// SAFETY: `aya::Pod` requires a plain-old-data type: `Copy`, `#[repr(C)]`,
// every bit pattern valid, no padding (aya copies raw bytes to and from the
// kernel). `RootKey` is two `u64`s: 16 bytes, no padding, any bits valid.
unsafe impl aya::Pod for RootKey {}

// SAFETY: as above: seven `u64`s (56 bytes), `#[repr(C)]`, no padding, any
// bit pattern is a valid value.
unsafe impl aya::Pod for RawCounters {}

/// `struct guard_root_key`: a directory as the guard names it, for the life
/// of its filesystem.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuardRootKey {
    /// `super_block->s_dev`, kernel encoding (see `crate::kernel_dev`).
    pub dev: u64,
    pub ino: u64,
    /// `inode->i_generation`.
    pub gen: u32,
    pub _pad: u32,
}

/// `struct guard_root`: a volume root's project ID.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuardRawRoot {
    pub projid: u32,
    pub _pad: u32,
}

/// `struct guard_project`: a project on one device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuardProject {
    /// Kernel encoding.
    pub dev: u64,
    pub projid: u32,
    pub _pad: u32,
}

/// `struct guard_range`: project IDs `min..=max`; `max` 0 is no range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardRange {
    pub min: u32,
    pub max: u32,
}

/// `struct guard_counters`: one CPU's share of a volume's attempts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GuardRawCounters {
    pub allowed: u64,
    pub denied: u64,
}

// SAFETY: `aya::Pod` needs a plain-old-data type: `Copy`, `#[repr(C)]`, every
// bit pattern valid, no padding. `GuardRawRoot` is two `u32`s (8 bytes).
unsafe impl aya::Pod for GuardRawRoot {}

// SAFETY: as above: two `u64`s and two `u32`s (24 bytes, the explicit
// `_pad` fills what would be tail padding), any bit pattern valid.
unsafe impl aya::Pod for GuardRootKey {}

// SAFETY: as above: a `u64` and two `u32`s (16 bytes, no implicit
// padding), any bit pattern valid.
unsafe impl aya::Pod for GuardProject {}

// SAFETY: as above: two `u64`s (16 bytes), `#[repr(C)]`, no padding, any bit
// pattern valid.
unsafe impl aya::Pod for GuardRawCounters {}

// SAFETY: as above: two `u32`s (8 bytes), `#[repr(C)]`, no padding, any bit
// pattern valid.
unsafe impl aya::Pod for GuardRange {}

/// A `bpf_prog_info` of zeros: what the kernel wants in the fields it does
/// not fill (a zero length asks for no array).
pub(crate) fn zeroed_prog_info() -> aya_obj::generated::bpf_prog_info {
    // SAFETY: `bpf_prog_info` holds only integers and integer arrays, so all
    // zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `bpf_prog_info` of the program behind `fd`, and how many of its bytes the
/// running kernel filled (an older kernel knows fewer fields: the rest stay
/// zero). One `bpf(2)` call: the exporter asks at every scrape.
pub(crate) fn prog_info(
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<(aya_obj::generated::bpf_prog_info, usize)> {
    let mut info = zeroed_prog_info();
    // SAFETY: `bpf_prog_info` is the kernel's `#[repr(C)]` struct for a
    // program's descriptor, holding only integers and integer arrays; its
    // pointer fields are zero, with zero lengths, so the kernel fills no
    // array through them.
    let filled = unsafe { prjquota_core::sys::obj_get_info(fd, &mut info) }?;
    Ok((info, filled))
}

/// `union bpf_attr` as the `BPF_MAP_*_BATCH` commands read it.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every CPU's share of the counters in slots `first..first + n` of the
/// per-CPU array behind `fd`, `ncpu` (the possible CPUs) per slot: slot
/// `first + i` on CPU `c` is `out[i * ncpu + c]`. One `bpf(2)` call
/// (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6) where a lookup per slot would be
/// `n`; fewer slots come back only at the array's end.
pub(crate) fn lookup_counters(
    fd: std::os::fd::BorrowedFd<'_>,
    first: u32,
    n: u32,
    ncpu: usize,
    out: &mut Vec<RawCounters>,
) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut keys = vec![0u32; n as usize];
    out.clear();
    out.resize(n as usize * ncpu, RawCounters::default());
    // The batch names the slot before the first wanted (none: from 0).
    let before: u32 = first.wrapping_sub(1);
    let mut next: u32 = 0;
    let mut attr = BatchAttr {
        in_batch: if first == 0 {
            0
        } else {
            &before as *const u32 as u64
        },
        out_batch: &mut next as *mut u32 as u64,
        keys: keys.as_mut_ptr() as u64,
        values: out.as_mut_ptr() as u64,
        count: n,
        map_fd: fd.as_raw_fd() as u32,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` is a valid `bpf_attr` for this command and the size
    // passed is its own. `in_batch` is null or points to `before` (the
    // map's 4-byte key); `out_batch` to `next`, writable for one key; `keys`
    // to `n` writable keys; `values` to `n * ncpu` writable `RawCounters`,
    // which is `n` per-CPU values of a map whose value is `RawCounters`
    // (56 bytes, already a multiple of the 8 the kernel rounds each CPU's
    // share to) on `ncpu` possible CPUs. All outlive the call, which writes
    // at most that much and the filled count back into `attr`.
    let r = unsafe {
        prjquota_core::sys::bpf(
            aya_obj::generated::bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long,
            &mut attr,
        )
    };
    match r {
        Ok(_) => {}
        // ENOENT: the array ended; `count` says how many came back.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    out.truncate(attr.count as usize * ncpu);
    Ok(attr.count)
}

/// Every key of the hash map behind `fd`, whose values are `value_size`
/// bytes (a plain hash map's, not per-CPU), in a few `bpf(2)` calls
/// (`BPF_MAP_LOOKUP_BATCH`, hash maps since Linux 5.6) where listing them
/// key by key costs one call per key. A key added or removed during the
/// listing may be in it or not, as with a listing key by key.
pub(crate) fn hash_keys<K: aya::Pod + Default>(
    fd: std::os::fd::BorrowedFd<'_>,
    value_size: usize,
) -> std::io::Result<Vec<K>> {
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    // Keys per call; doubled when one hash bucket holds more.
    let mut count: u32 = 1024;
    // The bucket to go on from (the kernel's batch token for hash maps).
    let mut from: Option<u32> = None;
    loop {
        let mut keys = vec![K::default(); count as usize];
        let mut values = vec![0u8; count as usize * value_size];
        let before = from.unwrap_or(0);
        let mut next: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: match from {
                Some(_) => &before as *const u32 as u64,
                None => 0,
            },
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is a valid `bpf_attr` for this command and the size
        // passed is its own. `in_batch` is null or points to `before`, and
        // `out_batch` to `next`: a hash map's batch token is a 4-byte bucket
        // index. `keys` points to `count` writable `K` (the map's key type:
        // aya checked its size when the map was opened; `Pod`, so any bytes
        // the kernel writes are a valid `K`), `values` to `count *
        // value_size` writable bytes, one plain value each. All outlive the
        // call, which writes at most that much and the filled count back
        // into `attr`.
        let r = unsafe {
            prjquota_core::sys::bpf(
                aya_obj::generated::bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long,
                &mut attr,
            )
        };
        let done = match r {
            Ok(_) => false,
            // ENOENT: no bucket left; `count` says how many came back.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            // The next bucket holds more keys than `count`: nothing came
            // back, ask again with room for it.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && count < 1 << 20 => {
                count *= 2;
                continue;
            }
            Err(e) => return Err(e),
        };
        keys.truncate(attr.count as usize);
        out.extend(keys);
        if done {
            return Ok(out);
        }
        from = Some(next);
    }
}

/// Mounts a bpf filesystem on `dir` for root only: mode 0700, nosuid,
/// nodev, noexec (as systemd mounts /sys/fs/bpf at boot).
pub(crate) fn mount_bpffs(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let bpf = c"bpf";
    // The kernel's default is 1777: anyone could make the pin root first.
    let data = c"mode=0700";
    // SAFETY: every pointer is a NUL-terminated string alive for the call;
    // bpffs reads `data` as a comma-separated option string.
    let r = unsafe {
        libc::mount(
            bpf.as_ptr(),
            target.as_ptr(),
            bpf.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
