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

/// Hands the heap that loading freed back to the kernel.
///
/// Loading parses the kernel's BTF (several MB of types) and frees it again,
/// but glibc keeps freed heap mapped: measured, an exporter that loaded both
/// objects kept ~30 MiB of RSS it no longer used (7 MiB without eBPF).
pub(crate) fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: `malloc_trim` takes no pointers and has no preconditions; it
    // only returns free pages of glibc's heaps to the kernel, under the
    // allocator's own locks, so it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A `bpf_prog_info` of zeros: what the kernel wants in the fields it does
/// not fill (a zero length asks for no array).
pub(crate) fn zeroed_prog_info() -> aya_obj::generated::bpf_prog_info {
    // SAFETY: `bpf_prog_info` holds only integers and integer arrays, so all
    // zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `union bpf_attr` as `BPF_OBJ_GET_INFO_BY_FD` reads it.
#[repr(C)]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `bpf_prog_info` of the program behind `fd`, and how many of its bytes the
/// running kernel filled (an older kernel knows fewer fields: the rest stay
/// zero). One `bpf(2)` call, where `/proc/self/fdinfo` costs an open, a read,
/// a close and a parse: the exporter asks at every scrape.
pub(crate) fn prog_info(
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<(aya_obj::generated::bpf_prog_info, usize)> {
    use std::os::fd::AsRawFd;
    let mut info = zeroed_prog_info();
    let mut attr = InfoByFdAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: &mut info as *mut _ as u64,
    };
    // SAFETY: `attr` is a valid `bpf_attr` prefix for this command, and the
    // size passed is its own; `attr.info` points to `info`, writable for the
    // `info_len` bytes announced, and both outlive the call. The kernel writes
    // at most `info_len` bytes there and the filled length back into `attr`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &mut attr as *mut InfoByFdAttr,
            std::mem::size_of::<InfoByFdAttr>() as libc::c_long,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((info, attr.info_len as usize))
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
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as libc::c_long,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // ENOENT: the array ended; `count` says how many came back.
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    out.truncate(attr.count as usize * ncpu);
    Ok(attr.count)
}

/// `f_type` of the filesystem holding `path`.
pub(crate) fn statfs_type(path: &std::path::Path) -> std::io::Result<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path alive for the call; statfs writes
    // one `struct statfs` into `st`, which is that large.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statfs succeeded and filled the struct.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // __fsword_t is i64 on x86_64, i32 elsewhere
    Ok(st.f_type as i64)
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
