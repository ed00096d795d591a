//! The kernel boundary: project-quota and file-attribute syscalls.
//!
//! This is the only module of the workspace that contains `unsafe`. Every item
//! that `libc` lacks is defined here once, with the uapi header it comes from,
//! and every struct carries a compile-time size check against the C layout
//! (x86-64 and arm64 agree on all of them).
//!
//! Callers get small safe functions that take a file descriptor and return
//! `io::Result`; the meaning of errno values is interpreted one level up, in
//! [`crate::quota`], where the filesystem and path are known.

use std::ffi::CStr;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

// ---------------------------------------------------------------------------
// include/uapi/linux/fs.h
// ---------------------------------------------------------------------------

/// `struct fsxattr`: the attributes behind `FS_IOC_FSGETXATTR`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsXattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}
const _: () = assert!(size_of::<FsXattr>() == 28);

/// `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = ioc(2, b'X', 31, size_of::<FsXattr>());
/// `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: libc::c_ulong = ioc(1, b'X', 32, size_of::<FsXattr>());
/// New files and directories inherit the directory's project ID.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// Neither the inode nor its directory entry can change (`chattr +i`).
pub const FS_XFLAG_IMMUTABLE: u32 = 0x0000_0008;
/// Writes only append, and the entry cannot be unlinked (`chattr +a`).
pub const FS_XFLAG_APPEND: u32 = 0x0000_0010;

/// The generic `_IOC` encoding (asm-generic/ioctl.h), used by x86 and arm.
const fn ioc(dir: u64, ty: u8, nr: u8, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u64) << 16) | ((ty as u64) << 8) | nr as u64) as libc::c_ulong
}
const _: () = assert!(FS_IOC_FSGETXATTR == 0x801c_581f);
const _: () = assert!(FS_IOC_FSSETXATTR == 0x401c_5820);
/// `_IOR('f', 1, long)`: the inode flags (`chattr`'s). The kernel moves an
/// `int` through the pointer; the number says `long`, so a `long` is passed.
const FS_IOC_GETFLAGS: libc::c_ulong = ioc(2, b'f', 1, size_of::<libc::c_long>());
/// `_IOW('f', 2, long)`.
const FS_IOC_SETFLAGS: libc::c_ulong = ioc(1, b'f', 2, size_of::<libc::c_long>());
const _: () = assert!(FS_IOC_GETFLAGS == 0x8008_6601);
const _: () = assert!(FS_IOC_SETFLAGS == 0x4008_6602);
/// Inode flags of `FS_IOC_GETFLAGS`: project inheritance (`chattr +P`),
/// append only (`+a`), no dump (`+d`), immutable (`+i`).
pub const FS_PROJINHERIT_FL: u32 = 0x2000_0000;
pub const FS_APPEND_FL: u32 = 0x0000_0020;
pub const FS_NODUMP_FL: u32 = 0x0000_0040;
pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;

// ---------------------------------------------------------------------------
// include/uapi/linux/quota.h
// ---------------------------------------------------------------------------

/// Quota type of project quotas (`USRQUOTA` 0, `GRPQUOTA` 1).
pub const PRJQUOTA: i32 = 2;
const Q_GETQUOTA: i32 = 0x80_0007;
const Q_GETNEXTQUOTA: i32 = 0x80_0009;

/// `struct if_nextdqblk`: `if_dqblk` plus the ID it describes. Space is in
/// bytes, block limits in 1 KiB units.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IfNextDqblk {
    pub bhardlimit: u64,
    pub bsoftlimit: u64,
    pub curspace: u64,
    pub ihardlimit: u64,
    pub isoftlimit: u64,
    pub curinodes: u64,
    pub btime: u64,
    pub itime: u64,
    pub valid: u32,
    pub id: u32,
}
const _: () = assert!(size_of::<IfNextDqblk>() == 72);

/// `struct if_dqblk` is the same layout without the trailing `dqb_id`; the
/// kernel writes 72 bytes for it too (the tail is padding), so one struct
/// serves both calls.
type IfDqblk = IfNextDqblk;

// ---------------------------------------------------------------------------
// include/uapi/linux/dqblk_xfs.h
// ---------------------------------------------------------------------------

const fn xqm_cmd(x: i32) -> i32 {
    ((b'X' as i32) << 8) + x
}
const Q_XGETQUOTA: i32 = xqm_cmd(3);
const Q_XSETQLIM: i32 = xqm_cmd(4);
const Q_XGETQSTAT: i32 = xqm_cmd(5);
const Q_XGETNEXTQUOTA: i32 = xqm_cmd(9);

pub const FS_DQUOT_VERSION: i8 = 1;
pub const FS_PROJ_QUOTA: i8 = 2;
pub const FS_DQ_ISOFT: u16 = 1 << 0;
pub const FS_DQ_IHARD: u16 = 1 << 1;
pub const FS_DQ_BSOFT: u16 = 1 << 2;
pub const FS_DQ_BHARD: u16 = 1 << 3;
/// Project quota accounting is on.
pub const FS_QUOTA_PDQ_ACCT: u16 = 1 << 4;
/// Project quota limits are enforced.
pub const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;

/// `struct fs_disk_quota`. Block counts are in 512-byte basic blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FsDiskQuota {
    pub version: i8,
    pub flags: i8,
    pub fieldmask: u16,
    pub id: u32,
    pub blk_hardlimit: u64,
    pub blk_softlimit: u64,
    pub ino_hardlimit: u64,
    pub ino_softlimit: u64,
    pub bcount: u64,
    pub icount: u64,
    pub itimer: i32,
    pub btimer: i32,
    pub iwarns: u16,
    pub bwarns: u16,
    pub itimer_hi: i8,
    pub btimer_hi: i8,
    pub rtbtimer_hi: i8,
    pub padding2: i8,
    pub rtb_hardlimit: u64,
    pub rtb_softlimit: u64,
    pub rtbcount: u64,
    pub rtbtimer: i32,
    pub rtbwarns: u16,
    pub padding3: i16,
    pub padding4: [u8; 8],
}
const _: () = assert!(size_of::<FsDiskQuota>() == 112);

/// `struct fs_qfilestat`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FsQfilestat {
    ino: u64,
    nblks: u64,
    nextents: u32,
}

/// `struct fs_quota_stat` (the v1 ABI, same on every arch that matters here).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FsQuotaStat {
    version: i8,
    flags: u16,
    pad: i8,
    uquota: FsQfilestat,
    gquota: FsQfilestat,
    incoredqs: u32,
    btimelimit: i32,
    itimelimit: i32,
    rtbtimelimit: i32,
    bwarnlimit: u16,
    iwarnlimit: u16,
}
const _: () = assert!(size_of::<FsQuotaStat>() == 80);

const fn qcmd(cmd: i32, ty: i32) -> i32 {
    (cmd << 8) | (ty & 0xff)
}

// ---------------------------------------------------------------------------
// Safe wrappers
// ---------------------------------------------------------------------------

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The descriptors `first .. first + count` that the parent handed this
/// process (systemd's socket activation, `sd_listen_fds(3)`), owned from
/// here on and marked close-on-exec. Refused with EBADF for one that is not
/// open: nothing is taken then.
pub fn take_inherited_fds(first: i32, count: usize) -> io::Result<Vec<OwnedFd>> {
    let fds: Vec<i32> = (0..count)
        .map(|i| i32::try_from(i).ok().and_then(|i| first.checked_add(i)))
        .collect::<Option<_>>()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
    for &fd in &fds {
        // SAFETY: F_GETFD reads the descriptor's flags and changes nothing;
        // an fd that is not open answers EBADF.
        cvt(i64::from(unsafe { libc::fcntl(fd, libc::F_GETFD) }))?;
    }
    fds.into_iter()
        .map(|fd| {
            // SAFETY: `fd` is open (checked above) and, by the activation
            // protocol, handed to this process alone: nothing else in it
            // owns or closes it, so the OwnedFd is its only owner. The
            // caller takes each range once (the environment names it once).
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: F_SETFD on a descriptor this process owns.
            cvt(i64::from(unsafe {
                libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC)
            }))?;
            Ok(owned)
        })
        .collect()
}

/// Whether this kernel has `quotactl_fd(2)` (Linux 5.14+), asked once per
/// process: with fd -1 the syscall answers EBADF when it exists and ENOSYS
/// when it does not. Asking on a real descriptor could not tell the two apart:
/// a filesystem without quota support answers ENOSYS too.
fn have_quotactl_fd() -> bool {
    static HAVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAVE.get_or_init(|| {
        // SAFETY: a null `addr` with an invalid fd: the kernel rejects the fd
        // before it reads or writes anything.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_quotactl_fd,
                -1 as libc::c_long,
                qcmd(Q_XGETQSTAT, PRJQUOTA) as libc::c_long,
                0 as libc::c_long,
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        !(ret < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
    })
}

/// The block device of the filesystem holding `fd`, for `quotactl(2)`.
/// Remembered per device number: the exporter's `Q_GETNEXTQUOTA` walk makes
/// one call per project, and must not read mountinfo for each. A remembered
/// node is checked (still that block device) before it is used.
fn block_device_of(fd: BorrowedFd<'_>) -> io::Result<std::ffi::CString> {
    use std::collections::HashMap;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::sync::Mutex;
    static KNOWN: Mutex<Option<HashMap<u64, std::ffi::CString>>> = Mutex::new(None);
    let st = fstat(fd)?;
    let dev = st.st_dev;
    let still_valid = |p: &std::ffi::CStr| {
        let p = std::path::Path::new(std::ffi::OsStr::from_bytes(p.to_bytes()));
        std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == dev)
    };
    if let Some(known) = KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&dev))
        .filter(|p| still_valid(p))
    {
        return Ok(known.clone());
    }
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let found = crate::mountinfo::block_device(&path, dev)?;
    KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(dev, found.clone());
    Ok(found)
}

/// One quota command on the filesystem holding `fd`: `quotactl_fd(2)`
/// (Linux 5.14+; `fd` may be any descriptor on the filesystem, an `O_PATH`
/// one included), or on older kernels `quotactl(2)` on the filesystem's
/// block device (found through /proc/self/mountinfo).
///
/// # Safety
/// `addr` must be null or point to a value of the type that `cmd` reads or
/// writes, valid for the duration of the call.
unsafe fn quotactl_fd(
    fd: BorrowedFd<'_>,
    cmd: i32,
    id: u32,
    addr: *mut libc::c_void,
) -> io::Result<()> {
    if !have_quotactl_fd() {
        let dev = block_device_of(fd)?;
        // SAFETY: `dev` is a NUL-terminated path alive for the call; the
        // caller guarantees `addr` matches `cmd`. The id is passed bit for bit
        // (the kernel reads it as qid_t, an unsigned 32-bit value).
        return cvt(
            unsafe { libc::quotactl(cmd, dev.as_ptr(), id as i32, addr.cast()) } as libc::c_long,
        )
        .map(drop);
    }
    // SAFETY: raw syscall with a live fd (borrowed for the call); the caller
    // guarantees `addr` matches `cmd`.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd() as libc::c_long,
            cmd as libc::c_long,
            id as libc::c_long,
            addr,
        )
    })
    .map(drop)
}

/// Project-quota state flags of the filesystem holding `fd`
/// (`FS_QUOTA_PDQ_ACCT`, `FS_QUOTA_PDQ_ENFD`, …). ENOSYS means no quota
/// support is active on this mount at all (a kernel without `quotactl_fd`
/// is handled below this function and never shows as ENOSYS here).
pub fn quota_stat_flags(fd: BorrowedFd<'_>) -> io::Result<u16> {
    let mut st = FsQuotaStat::default();
    // SAFETY: Q_XGETQSTAT writes one `fs_quota_stat` (80 bytes, checked above).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_XGETQSTAT, PRJQUOTA),
            0,
            (&mut st as *mut FsQuotaStat).cast(),
        )?
    };
    Ok(st.flags)
}

/// Sets the project's limits named by `q.fieldmask`. Usage fields are never
/// sent: the fieldmask only carries limit bits, so counters are left alone
/// (on ext4 a usage field would overwrite the kernel's counters).
pub fn set_project_limits(fd: BorrowedFd<'_>, q: &FsDiskQuota) -> io::Result<()> {
    debug_assert_eq!(
        q.fieldmask & !(FS_DQ_ISOFT | FS_DQ_IHARD | FS_DQ_BSOFT | FS_DQ_BHARD),
        0
    );
    let mut q = *q;
    // SAFETY: Q_XSETQLIM reads one `fs_disk_quota` (112 bytes, checked above).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_XSETQLIM, PRJQUOTA),
            q.id,
            (&mut q as *mut FsDiskQuota).cast(),
        )
    }
}

/// Usage and limits of one project, XFS-style units. XFS answers ENOENT for a
/// project that has no dquot; ext4 answers with zeros.
pub fn get_project_quota(fd: BorrowedFd<'_>, id: u32) -> io::Result<FsDiskQuota> {
    let mut q = FsDiskQuota::default();
    // SAFETY: Q_XGETQUOTA writes one `fs_disk_quota` (112 bytes, checked above).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_XGETQUOTA, PRJQUOTA),
            id,
            (&mut q as *mut FsDiskQuota).cast(),
        )?
    };
    Ok(q)
}

/// The first project with an ID `>= id` that the filesystem holds a dquot
/// for, XFS-style units; ENOENT past the last one. Unlike
/// `Q_GETNEXTQUOTA`, the kernel does not count it as a write, so it answers
/// on a read-only mount.
pub fn get_next_project_quota(fd: BorrowedFd<'_>, id: u32) -> io::Result<FsDiskQuota> {
    let mut q = FsDiskQuota::default();
    // SAFETY: Q_XGETNEXTQUOTA writes one `fs_disk_quota` (112 bytes,
    // checked above).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_XGETNEXTQUOTA, PRJQUOTA),
            id,
            (&mut q as *mut FsDiskQuota).cast(),
        )?
    };
    Ok(q)
}

/// Usage and limits of one project through the generic interface: space in
/// bytes (not rounded to 512-byte blocks), limits in KiB.
pub fn get_project_dqblk(fd: BorrowedFd<'_>, id: u32) -> io::Result<IfNextDqblk> {
    let mut q = IfDqblk::default();
    // SAFETY: Q_GETQUOTA writes one `if_dqblk` (72 bytes; our struct is 72).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_GETQUOTA, PRJQUOTA),
            id,
            (&mut q as *mut IfDqblk).cast(),
        )?
    };
    q.id = id;
    Ok(q)
}

/// The first project with an ID `>= id` that the filesystem holds a dquot
/// for; ENOENT past the last one.
pub fn get_next_project_dqblk(fd: BorrowedFd<'_>, id: u32) -> io::Result<IfNextDqblk> {
    let mut q = IfNextDqblk::default();
    // SAFETY: Q_GETNEXTQUOTA writes one `if_nextdqblk` (72 bytes, checked above).
    unsafe {
        quotactl_fd(
            fd,
            qcmd(Q_GETNEXTQUOTA, PRJQUOTA),
            id,
            (&mut q as *mut IfNextDqblk).cast(),
        )?
    };
    Ok(q)
}

/// `FS_IOC_FSGETXATTR` on an open file or directory.
pub fn get_fsxattr(fd: BorrowedFd<'_>) -> io::Result<FsXattr> {
    let mut attr = FsXattr::default();
    // SAFETY: the ioctl writes one `fsxattr` (28 bytes, checked above) to a
    // valid, exclusively borrowed buffer; `fd` is live for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &mut attr as *mut FsXattr) };
    cvt(r as libc::c_long)?;
    Ok(attr)
}

/// `FS_IOC_FSSETXATTR` on an open file or directory.
pub fn set_fsxattr(fd: BorrowedFd<'_>, attr: &FsXattr) -> io::Result<()> {
    // SAFETY: the ioctl reads one `fsxattr` from a valid buffer; `fd` is live.
    cvt(
        unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR, attr as *const FsXattr) }
            as libc::c_long,
    )
    .map(drop)
}

/// `FS_IOC_GETFLAGS` (what `lsattr` reads) on an open file or directory.
pub fn get_inode_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut flags: libc::c_long = 0;
    // SAFETY: the ioctl writes at most one `long` (the kernel: an `int`)
    // to a live, exclusively borrowed local; `fd` is live for the call.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            FS_IOC_GETFLAGS,
            &mut flags as *mut libc::c_long,
        )
    };
    cvt(r as libc::c_long)?;
    // The kernel wrote an `int`: its 32 bits are the flags.
    Ok(flags as u32)
}

/// `FS_IOC_SETFLAGS` (what `chattr` does) on an open file or directory.
pub fn set_inode_flags(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    let value = flags as libc::c_long;
    // SAFETY: the ioctl reads at most one `long` from a live local; `fd` is
    // live for the call.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            FS_IOC_SETFLAGS,
            &value as *const libc::c_long,
        )
    };
    cvt(r as libc::c_long).map(drop)
}

/// `statfs(2)` of the filesystem holding `path` (following symlinks).
pub fn statfs(path: &CStr) -> io::Result<libc::statfs> {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is NUL-terminated and alive for the call; statfs fills
    // the whole struct on success; read only after Ok.
    cvt(unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) } as libc::c_long)?;
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { st.assume_init() })
}

/// `fstatfs(2)`.
pub fn fstatfs(fd: BorrowedFd<'_>) -> io::Result<libc::statfs> {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs fills the whole struct on success; read only after Ok.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) } as libc::c_long)?;
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(2)` relative to `dir`, never following a final symlink.
pub fn fstatat_nofollow(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated; fstatat fills the struct on success.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } as libc::c_long)?;
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { st.assume_init() })
}

/// The mount ID of the mount holding `fd` (`statx` with `STATX_MNT_ID`,
/// Linux 5.8+). Two directories on one device can still be different mounts
/// (bind mounts); only the mount ID tells them apart.
pub fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    statx_mount_id(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// The mount ID of `name` in `dir`, itself if a symlink (not followed): a
/// mount point's differs from its parent's, with one `statx` and no open.
pub fn mount_id_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<u64> {
    statx_mount_id(dir.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW)
}

/// `fstat(2)` and [`mount_id`] of `fd` in one `statx`: what an entry
/// opened with `O_PATH` is, and on which mount. The `stat` holds the type
/// and mode, inode, device, link count, owner and size.
pub fn stat_and_mount(fd: BorrowedFd<'_>) -> io::Result<(libc::stat, u64)> {
    const STATX_MNT_ID: u32 = 0x0000_1000;
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: "" with AT_EMPTY_PATH describes `fd`, a descriptor the caller
    // borrows; the kernel writes at most one `struct statx`.
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    cvt(ret as libc::c_long)?;
    // SAFETY: zero-initialised and filled by the successful call above.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & STATX_MNT_ID == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx did not report a mount ID (kernel older than 5.8)",
        ));
    }
    // SAFETY: `struct stat` is plain old data, for which all zeroes is a
    // valid value; the fields below are then set from the statx.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_mode = u32::from(stx.stx_mode);
    st.st_ino = stx.stx_ino;
    st.st_dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    st.st_nlink = u64::from(stx.stx_nlink);
    st.st_uid = stx.stx_uid;
    st.st_gid = stx.stx_gid;
    st.st_size = stx.stx_size as i64;
    Ok((st, stx.stx_mnt_id))
}

fn statx_mount_id(dirfd: libc::c_int, name: &CStr, flags: libc::c_int) -> io::Result<u64> {
    const STATX_MNT_ID: u32 = 0x0000_1000;
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `name` is NUL-terminated and `dirfd` a descriptor the caller
    // borrows (with AT_EMPTY_PATH and "" the call describes it); the kernel
    // writes at most one `struct statx`.
    let ret = unsafe { libc::statx(dirfd, name.as_ptr(), flags, STATX_MNT_ID, stx.as_mut_ptr()) };
    cvt(ret as libc::c_long)?;
    // SAFETY: zero-initialised and filled by the successful call above.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & STATX_MNT_ID == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx did not report a mount ID (kernel older than 5.8)",
        ));
    }
    Ok(stx.stx_mnt_id)
}

/// `fstat(2)`.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the struct on success.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } as libc::c_long)?;
    // SAFETY: initialised by the successful call above.
    Ok(unsafe { st.assume_init() })
}

/// `openat(2)` relative to `dir`; `O_CLOEXEC` is always added.
pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; on success the kernel returns a new
    // descriptor that nothing else owns, so OwnedFd may take it.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    } as libc::c_long)?;
    // SAFETY: see above; fd is a fresh, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat(2)` of an absolute `path` (`AT_FDCWD`, which the kernel ignores
/// for one); `O_CLOEXEC` is always added.
pub fn open(path: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; on success the kernel returns a new
    // descriptor that nothing else owns, so OwnedFd may take it.
    let fd = cvt(unsafe {
        libc::openat(
            libc::AT_FDCWD,
            path.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    } as libc::c_long)?;
    // SAFETY: see above; fd is a fresh, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `struct open_how` (include/uapi/linux/openat2.h); libc's cannot be
/// built outside libc (non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const _: () = assert!(size_of::<OpenHow>() == 24);

/// Opens `name`, one entry of `dir`, without leaving `dir`'s mount:
/// `openat2(2)` (Linux 5.6+) with `RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS |
/// RESOLVE_BENEATH`. A mount point (a bind mount, a tmpfs) fails with
/// `EXDEV`, a symlink with `ELOOP`, whatever the device numbers say;
/// `O_CLOEXEC` is always added.
pub fn openat_no_xdev(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_NO_XDEV | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
    };
    // SAFETY: `name` is NUL-terminated and `how` a live `struct open_how`
    // whose size is passed with it; on success the kernel returns a new
    // descriptor that nothing else owns.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd() as libc::c_long,
            name.as_ptr(),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: see above; fd is a fresh, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `fgetxattr(2)`: the value of extended attribute `name` of `fd`, `None`
/// when it has none (`ENODATA`).
pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; 256];
    // SAFETY: `name` is NUL-terminated; the kernel writes at most
    // `buf.len()` bytes into `buf`, a live mutable buffer of that length.
    let n = match cvt(unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    } as libc::c_long)
    {
        Ok(n) => n as usize,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => return Ok(None),
        Err(e) => return Err(e),
    };
    buf.truncate(n);
    Ok(Some(buf))
}

/// `fsetxattr(2)`: sets extended attribute `name` of `fd` to `value`.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `value` a live slice whose
    // length is passed with it.
    cvt(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    } as libc::c_long)
    .map(drop)
}

/// `mkdirat(2)`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(
        unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }
            as libc::c_long,
    )
    .map(drop)
}

/// `unlinkat(2)`; `remove_dir` selects `AT_REMOVEDIR`. Never follows links:
/// unlinking a symlink removes the link, not its target.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, remove_dir: bool) -> io::Result<()> {
    let flags = if remove_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } as libc::c_long).map(drop)
}

/// `fchmod(2)`.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a live descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } as libc::c_long).map(drop)
}

/// `fchown(2)`.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a live descriptor.
    cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } as libc::c_long).map(drop)
}

/// `fsync(2)`.
pub fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on a live descriptor.
    cvt(unsafe { libc::fsync(fd.as_raw_fd()) } as libc::c_long).map(drop)
}

/// Writes a file's dirty pages and waits until the device has them
/// (`sync_file_range(2)` with `WAIT_BEFORE | WRITE | WAIT_AFTER` over the
/// whole file). Unlike `fsync`, it commits no metadata: the file's size and
/// blocks are durable only once the journal commits, which the caller
/// must arrange.
pub fn write_data_and_wait(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    loop {
        // SAFETY: plain syscall on a live descriptor; offset 0 and length 0
        // name the whole file.
        match cvt(unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, flags) } as libc::c_long) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.map(drop),
        }
    }
}

/// `flock(2)`; `exclusive` selects `LOCK_EX`, else `LOCK_SH`. Blocks.
pub fn flock(fd: BorrowedFd<'_>, exclusive: bool) -> io::Result<()> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: plain syscall on a live descriptor.
        match cvt(unsafe { libc::flock(fd.as_raw_fd(), op) } as libc::c_long) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// `flock(2)` without waiting: `Ok(false)` when another holds a
/// conflicting lock.
pub fn try_flock(fd: BorrowedFd<'_>, exclusive: bool) -> io::Result<bool> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    loop {
        // SAFETY: plain syscall on a live descriptor.
        match cvt(unsafe { libc::flock(fd.as_raw_fd(), op) } as libc::c_long) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// `renameat(2)` within one directory.
pub fn renameat(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated.
    cvt(
        unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) }
            as libc::c_long,
    )
    .map(drop)
}

/// One directory entry: its name, inode and `d_type` (`DT_UNKNOWN` on
/// filesystems that do not fill it), and `d_off`, the position of the
/// entry after it (for [`seek_dir`]: XFS and ext4 keep it stable while the
/// directory changes, as NFS needs).
pub struct DirEntry {
    pub name: std::ffi::CString,
    pub ino: u64,
    pub d_type: u8,
    pub d_off: i64,
}

/// Lists a directory through its descriptor (`.` and `..` left out). The
/// directory is opened afresh (`.` relative to `dir`), so the listing has
/// its own position and `dir` stays untouched: four system calls for a small
/// directory, where `fdopendir` on a duplicate took nine (a create lists
/// three registry directories).
pub fn read_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<DirEntry>> {
    let fd = openat(
        dir,
        c".",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?;
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = Vec::new();
    loop {
        let batch = read_dir_batch(fd.as_fd(), &mut buf)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}

/// Reads the next entries of a directory from its descriptor's position:
/// one `getdents64` call into `buf` (`.` and `..` left out). An empty batch
/// is the end of the directory. Unlike [`read_dir`], memory stays bounded by
/// `buf` however many entries the directory holds, and the position lives
/// in the descriptor, so a caller can act on each batch (unlink what it
/// lists) before reading the next.
pub fn read_dir_batch(dir: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, a
        // live mutable slice of that length, and returns how many it wrote.
        let n = cvt(unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd() as libc::c_long,
                buf.as_mut_ptr(),
                buf.len(),
            )
        })? as usize;
        if n == 0 {
            return Ok(Vec::new());
        }
        let out = parse_dirents(&buf[..n])?;
        // A batch of only `.` and `..` is not the end: read on.
        if !out.is_empty() {
            return Ok(out);
        }
    }
}

/// The entries of a `getdents64` result: `struct linux_dirent64`
/// (include/linux/dirent.h) records of `d_ino` u64, `d_off` s64, `d_reclen`
/// u16, `d_type` u8, then the NUL-terminated name, each `d_reclen` long.
fn parse_dirents(mut bytes: &[u8]) -> io::Result<Vec<DirEntry>> {
    const NAME_AT: usize = 19;
    let bad = || io::Error::other("getdents64 returned a malformed record");
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let reclen = u16::from_ne_bytes(
            bytes
                .get(16..18)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        ) as usize;
        let rec = bytes
            .get(..reclen)
            .filter(|r| r.len() > NAME_AT)
            .ok_or_else(bad)?;
        let d_type = rec[18];
        let name = CStr::from_bytes_until_nul(&rec[NAME_AT..]).map_err(|_| bad())?;
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            out.push(DirEntry {
                name: name.to_owned(),
                ino: u64::from_ne_bytes(rec[..8].try_into().map_err(|_| bad())?),
                d_type,
                d_off: i64::from_ne_bytes(rec[8..16].try_into().map_err(|_| bad())?),
            });
        }
        bytes = &bytes[reclen..];
    }
    Ok(out)
}

/// Moves a directory descriptor back to its first entry, for another pass
/// of [`read_dir_batch`].
pub fn rewind_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    seek_dir(dir, 0)
}

/// Moves a directory descriptor to `pos`, a [`DirEntry::d_off`] it gave
/// (0: the first entry), so that [`read_dir_batch`] reads on from there.
pub fn seek_dir(dir: BorrowedFd<'_>, pos: i64) -> io::Result<()> {
    // SAFETY: lseek on a descriptor we borrow; no memory is passed.
    cvt(unsafe { libc::lseek(dir.as_raw_fd(), pos, libc::SEEK_SET) } as libc::c_long).map(drop)
}

// ---------------------------------------------------------------------------
// include/uapi/linux/fcntl.h, fs/fhandle.c: file handles
// ---------------------------------------------------------------------------

/// `MAX_HANDLE_SZ` (include/linux/exportfs.h).
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}
const _: () = assert!(size_of::<RawHandle>() == 8 + MAX_HANDLE_SZ);

/// A file handle (`name_to_handle_at(2)`): names an inode on its
/// filesystem however it is renamed, and goes stale once it is freed; an
/// inode's number and generation, for XFS and ext4 (8 to 12 bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle {
    kind: i32,
    bytes: Box<[u8]>,
}

/// The handle of the inode `fd` holds (an `O_PATH` descriptor will do).
pub fn handle_of(fd: BorrowedFd<'_>) -> io::Result<FileHandle> {
    let mut h = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a live `struct file_handle` whose handle_bytes says
    // how much room f_handle has; the empty path with AT_EMPTY_PATH names
    // `fd` itself; the kernel writes the handle and the mount ID only.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd() as libc::c_long,
            c"".as_ptr(),
            &mut h as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        )
    })?;
    let n = (h.handle_bytes as usize).min(MAX_HANDLE_SZ);
    Ok(FileHandle {
        kind: h.handle_type,
        bytes: h.f_handle[..n].into(),
    })
}

/// Opens the inode `handle` names on the filesystem of `mount` with
/// `flags` (`O_CLOEXEC` added); needs `CAP_DAC_READ_SEARCH`. `ESTALE`:
/// the inode is gone.
pub fn open_by_handle(
    mount: BorrowedFd<'_>,
    handle: &FileHandle,
    flags: i32,
) -> io::Result<OwnedFd> {
    let mut h = RawHandle {
        handle_bytes: handle.bytes.len() as u32,
        handle_type: handle.kind,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    h.f_handle[..handle.bytes.len()].copy_from_slice(&handle.bytes);
    // SAFETY: `h` is a live `struct file_handle` holding handle_bytes
    // valid bytes; on success the kernel returns a new descriptor that
    // nothing else owns.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd() as libc::c_long,
            &h as *const RawHandle,
            (flags | libc::O_CLOEXEC) as libc::c_long,
        )
    })?;
    // SAFETY: see above; fd is a fresh, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

// ---------------------------------------------------------------------------
// glibc's allocator
// ---------------------------------------------------------------------------

/// Makes glibc give freed heap back once `keep_free` bytes of it sit free
/// at the top of the heap, serve blocks of `own_mapping_from` bytes and
/// more with their own mappings, and serve every thread from one heap. Call
/// it before any thread starts.
///
/// glibc's default thresholds grow whenever a large block is freed, up to
/// 32 MiB (64-bit), after which a long-running process keeps whatever its
/// busiest moment freed. The exporter frees a scrape's worth of families
/// and exposition text every scrape; fixing either threshold turns the
/// growth off, so its RSS follows what it uses.
///
/// glibc also gives a thread that meets a locked heap a heap of its own (up
/// to eight per core), and what one heap freed is never reused by another.
/// A scrape's work moves between the runtime's workers and its blocking
/// pool, so each heap would grow to a scrape's size; one heap holds one
/// scrape's worth. A small `keep_free` makes the next scrape fault in again
/// the pages the last one gave back, which slows small scrapes; 2 MiB keeps
/// them as fast as with many heaps, for a little more memory. The effect on
/// RSS is in docs/performance.md. A no-op outside glibc.
pub fn cap_retained_heap(keep_free: i32, own_mapping_from: i32) {
    #[cfg(target_env = "gnu")]
    // SAFETY: `mallopt` takes two integers and no pointers; glibc validates
    // the values and applies them under the allocator's own locks.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, keep_free);
        libc::mallopt(libc::M_MMAP_THRESHOLD, own_mapping_from);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = (keep_free, own_mapping_from);
}

/// Hands the heap that loading freed back to the kernel.
///
/// Loading an eBPF object parses the kernel's BTF (several MB of types) and
/// frees it again, but glibc keeps freed heap mapped: measured, an exporter
/// that loaded both objects kept ~30 MiB of RSS it no longer used (7 MiB
/// without eBPF). A no-op outside glibc.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: `malloc_trim` takes no pointers and has no preconditions; it
    // only returns free pages of glibc's heaps to the kernel, under the
    // allocator's own locks, so it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted_as_the_kernel_writes_them() {
        assert_eq!(count_cpu_list("0\n"), Some(1));
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        for bad in ["", "\n", "a", "3-1", "0-", "0,,1"] {
            assert_eq!(count_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quota_commands_match_the_headers() {
        // Values from include/uapi/linux/{quota,dqblk_xfs}.h.
        assert_eq!(qcmd(Q_XGETQSTAT, PRJQUOTA), 0x5805 << 8 | 2);
        assert_eq!(Q_XSETQLIM, 0x5804);
        assert_eq!(Q_XGETQUOTA, 0x5803);
        assert_eq!(qcmd(Q_GETNEXTQUOTA, PRJQUOTA), 0x8000_0902u32 as i32);
    }

    #[test]
    fn read_dir_lists_entries_and_can_repeat() {
        use std::os::fd::AsFd;
        let dir = std::env::temp_dir().join(format!("prjquota-sys-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("file"), b"x").unwrap();
        let fd: OwnedFd = std::fs::File::open(&dir).unwrap().into();
        for _ in 0..2 {
            let mut names: Vec<_> = read_dir(fd.as_fd())
                .unwrap()
                .into_iter()
                .map(|e| e.name.into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, ["file", "sub"]);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_dir_batch_streams_a_directory_in_bounded_batches() {
        use std::os::fd::AsFd;
        let dir = std::env::temp_dir().join(format!("prjquota-sys-batch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..500 {
            std::fs::write(dir.join(format!("entry-{i:04}")), b"").unwrap();
        }
        let fd: OwnedFd = std::fs::File::open(&dir).unwrap().into();
        let mut buf = vec![0u8; 1024];
        for _ in 0..2 {
            let (mut names, mut batches) = (Vec::new(), 0);
            loop {
                let batch = read_dir_batch(fd.as_fd(), &mut buf).unwrap();
                if batch.is_empty() {
                    break;
                }
                batches += 1;
                assert!(
                    batch.len() <= 1024 / 24,
                    "{} entries from 1 KiB",
                    batch.len()
                );
                names.extend(batch.into_iter().map(|e| e.name.into_string().unwrap()));
            }
            names.sort();
            let want: Vec<String> = (0..500).map(|i| format!("entry-{i:04}")).collect();
            assert_eq!(names, want);
            assert!(batches > 10, "{batches} batches");
            rewind_dir(fd.as_fd()).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

// ---------------------------------------------------------------------------
// The other ways to change file attributes: the 32-bit ioctl, which only
// the real-kernel tests call, and file_setattr(2), which delete also uses
// to clear a lock flag of a file it must not open.
// ---------------------------------------------------------------------------

/// `struct file_attr` (include/uapi/linux/fs.h, Linux 6.17+), what
/// `file_getattr(2)`/`file_setattr(2)` exchange (`FILE_ATTR_SIZE_VER0`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileAttr {
    pub xflags: u64,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
}
const _: () = assert!(size_of::<FileAttr>() == 24);

/// System call numbers (the same on every architecture since 6.17).
const SYS_FILE_GETATTR: libc::c_long = 468;
const SYS_FILE_SETATTR: libc::c_long = 469;

/// `file_getattr(AT_FDCWD, path, &attr, sizeof attr, 0)`; ENOSYS before 6.17.
/// For the tests only (the `test-syscalls` feature).
#[cfg(feature = "test-syscalls")]
pub fn file_getattr(path: &CStr) -> io::Result<FileAttr> {
    let mut a = FileAttr::default();
    // SAFETY: the kernel writes at most `usize` bytes into `a`, a live
    // local of that size; `path` is NUL-terminated and outlives the call.
    cvt(unsafe {
        libc::syscall(
            SYS_FILE_GETATTR,
            libc::AT_FDCWD as libc::c_long,
            path.as_ptr(),
            &mut a as *mut FileAttr,
            size_of::<FileAttr>(),
            0 as libc::c_long,
        )
    })?;
    Ok(a)
}

/// `file_getattr(dir, name, &attr, sizeof attr, AT_SYMLINK_NOFOLLOW)`;
/// ENOSYS before 6.17.
pub fn file_getattr_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<FileAttr> {
    let mut a = FileAttr::default();
    // SAFETY: the kernel writes at most `usize` bytes into `a`, a live
    // local of that size; `name` is NUL-terminated and outlives the call.
    cvt(unsafe {
        libc::syscall(
            SYS_FILE_GETATTR,
            dir.as_raw_fd() as libc::c_long,
            name.as_ptr(),
            &mut a as *mut FileAttr,
            size_of::<FileAttr>(),
            libc::AT_SYMLINK_NOFOLLOW as libc::c_long,
        )
    })?;
    Ok(a)
}

/// `file_setattr(dir, name, &attr, sizeof attr, AT_SYMLINK_NOFOLLOW)`;
/// ENOSYS before 6.17.
pub fn file_setattr_at(dir: BorrowedFd<'_>, name: &CStr, a: &FileAttr) -> io::Result<()> {
    // SAFETY: the kernel reads `usize` bytes from `a`; `name` is
    // NUL-terminated; both outlive the call.
    cvt(unsafe {
        libc::syscall(
            SYS_FILE_SETATTR,
            dir.as_raw_fd() as libc::c_long,
            name.as_ptr(),
            a as *const FileAttr,
            size_of::<FileAttr>(),
            libc::AT_SYMLINK_NOFOLLOW as libc::c_long,
        )
    })
    .map(drop)
}

/// `file_setattr(AT_FDCWD, path, &attr, sizeof attr, 0)`; ENOSYS before 6.17.
/// For the tests only (the `test-syscalls` feature).
#[cfg(feature = "test-syscalls")]
pub fn file_setattr(path: &CStr, a: &FileAttr) -> io::Result<()> {
    // SAFETY: the kernel reads `usize` bytes from `a`; `path` is
    // NUL-terminated; both outlive the call.
    cvt(unsafe {
        libc::syscall(
            SYS_FILE_SETATTR,
            libc::AT_FDCWD as libc::c_long,
            path.as_ptr(),
            a as *const FileAttr,
            size_of::<FileAttr>(),
            0 as libc::c_long,
        )
    })
    .map(drop)
}

/// `FS_IOC_FSSETXATTR` through the 32-bit system call entry (`int $0x80`,
/// i386 `ioctl` = 54), as an i386 binary makes it: the kernel takes its
/// compat path (`compat_sys_ioctl`, the `file_ioctl_compat` LSM hook).
/// ENOSYS where the kernel runs no 32-bit code. For the tests only (the
/// `test-syscalls` feature): no product code makes a 32-bit system call.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
pub fn set_fsxattr_compat(fd: BorrowedFd<'_>, attr: &FsXattr) -> io::Result<()> {
    ioctl_compat(fd, FS_IOC_FSSETXATTR as u32, fsxattr_bytes(attr))
}

/// [`set_fsxattr_compat`] with the argument in a page the process never
/// touched ([`ioctl_compat_cold`]). For the tests only.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
pub fn set_fsxattr_compat_cold(fd: BorrowedFd<'_>, attr: &FsXattr) -> io::Result<()> {
    ioctl_compat_cold(fd, FS_IOC_FSSETXATTR as u32, fsxattr_bytes(attr))
}

/// The bytes of `attr`, as the kernel reads a `struct fsxattr`.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
fn fsxattr_bytes(attr: &FsXattr) -> &[u8] {
    // SAFETY: FsXattr is a plain repr(C) struct of u32s: every byte of it
    // is initialised, and the slice lives as long as the borrow of `attr`.
    unsafe {
        std::slice::from_raw_parts((attr as *const FsXattr).cast::<u8>(), size_of::<FsXattr>())
    }
}

/// An ioctl whose argument points at `arg`, through the 32-bit system
/// call entry (`int $0x80`): the argument is copied to a page below 4 GiB
/// (`MAP_32BIT`), where a 32-bit pointer reaches it. For the tests only.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
pub fn ioctl_compat(fd: BorrowedFd<'_>, cmd: u32, arg: &[u8]) -> io::Result<()> {
    const PAGE: usize = 4096;
    if arg.len() > PAGE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: an anonymous private mapping; checked for failure below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `page` is a fresh writable mapping of PAGE bytes, and `arg`
    // is at most PAGE bytes long (checked above); they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(arg.as_ptr(), page.cast::<u8>(), arg.len()) };
    let ret = int80_ioctl(fd, cmd, page as usize as u32);
    // SAFETY: unmaps the page mapped above, no longer used.
    unsafe { libc::munmap(page, PAGE) };
    ret
}

/// [`ioctl_compat`] with the argument in a page this process has never
/// touched: a shared mapping of a memfd holding `arg`, so the kernel's own
/// copy faults it in while a reader that must not fault (a non-sleepable
/// eBPF program's `bpf_probe_read_user`) finds it absent. For the tests
/// only.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
pub fn ioctl_compat_cold(fd: BorrowedFd<'_>, cmd: u32, arg: &[u8]) -> io::Result<()> {
    const PAGE: usize = 4096;
    if arg.len() > PAGE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a static NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"prjquota-cold".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor memfd_create just returned, owned here
    // alone.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(memfd);
    std::io::Write::write_all(&mut file, arg)?;
    file.set_len(PAGE as u64)?;
    // SAFETY: a read-only shared mapping of the memfd's first page (its
    // length was set above); checked for failure below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_32BIT,
            file.as_raw_fd(),
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ret = int80_ioctl(fd, cmd, page as usize as u32);
    // SAFETY: unmaps the page mapped above, no longer used.
    unsafe { libc::munmap(page, PAGE) };
    ret
}

/// `ioctl(fd, cmd, addr)` through `int $0x80` (i386 `ioctl` = 54). ENOSYS
/// where the kernel runs no 32-bit code.
#[cfg(all(target_arch = "x86_64", feature = "test-syscalls"))]
fn int80_ioctl(fd: BorrowedFd<'_>, cmd: u32, addr: u32) -> io::Result<()> {
    const NR_IOCTL_I386: i32 = 54;
    let ret: i32;
    // SAFETY: int $0x80 with eax = the i386 ioctl number, ebx = fd, ecx =
    // cmd, edx = a 32-bit user address the caller mapped; rbx, which LLVM
    // reserves, is swapped in and restored around the call; the kernel
    // may clobber r8-r11 on this entry, declared as such.
    unsafe {
        std::arch::asm!(
            "xchg rbx, {fd}",
            "int 0x80",
            "xchg rbx, {fd}",
            fd = inout(reg) fd.as_raw_fd() as u64 => _,
            inlateout("eax") NR_IOCTL_I386 => ret,
            in("ecx") cmd,
            in("edx") addr,
            out("r8") _,
            out("r9") _,
            out("r10") _,
            out("r11") _,
        );
    }
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret))
    } else {
        Ok(())
    }
}

/// The process at the other end of a Unix socket, as the kernel recorded
/// it at connect/listen time (`SO_PEERCRED`): (pid, uid).
pub fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<(i32, u32)> {
    let mut cred = MaybeUninit::<libc::ucred>::zeroed();
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes (one ucred) into
    // `cred`, a live local of that size.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            cred.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getsockopt succeeded and filled the ucred.
    let cred = unsafe { cred.assume_init() };
    Ok((cred.pid, cred.uid))
}

/// A non-blocking Unix stream socket connected to the abstract address
/// `name` (without its leading NUL). A listener whose backlog is full
/// answers `WouldBlock` at once, where a blocking `connect` would wait
/// until the listener accepts, which a squatter never does.
pub fn connect_abstract_nonblocking(name: &[u8]) -> io::Result<OwnedFd> {
    let mut addr: libc::sockaddr_un = {
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        unsafe { std::mem::zeroed() }
    };
    if name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the socket name is too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    let len =
        (std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len()) as libc::socklen_t;
    // SAFETY: plain syscall, no pointers.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    } as libc::c_long)?;
    // SAFETY: socket(2) returned a new descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: `addr` is a live sockaddr_un and `len` covers only its
    // family, the leading NUL and the name.
    cvt(unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        )
    } as libc::c_long)?;
    Ok(sock)
}

// ---------------------------------------------------------------------------
// include/uapi/linux/fs.h: the inode generation
// ---------------------------------------------------------------------------

/// `_IOR('v', 1, long)`: `inode->i_generation`. XFS and ext4 both answer it;
/// the kernel moves an `int` through the pointer.
const FS_IOC_GETVERSION: libc::c_ulong = ioc(2, b'v', 1, size_of::<libc::c_long>());
const _: () = assert!(FS_IOC_GETVERSION == 0x8008_7601);

/// The four numbers that set an inode's generation (ext2/ext4 only, and
/// on ext4 only without `metadata_csum`), each as a 64-bit process sends
/// it; a 32-bit process sends the `_IOW(.., int)` twins. The kernel reads
/// an `int` through the pointer for all of them.
/// `_IOW('v', 2, long)`, also `EXT4_IOC_SETVERSION_OLD`.
pub const FS_IOC_SETVERSION: libc::c_ulong = ioc(1, b'v', 2, size_of::<libc::c_long>());
const _: () = assert!(FS_IOC_SETVERSION == 0x4008_7602);
/// `_IOW('f', 4, long)`: ext4's own.
pub const EXT4_IOC_SETVERSION: libc::c_ulong = ioc(1, b'f', 4, size_of::<libc::c_long>());
const _: () = assert!(EXT4_IOC_SETVERSION == 0x4008_6604);
/// `_IOW('v', 2, int)`: a 32-bit process's FS_IOC_SETVERSION.
pub const FS_IOC32_SETVERSION: libc::c_ulong = ioc(1, b'v', 2, size_of::<libc::c_int>());
const _: () = assert!(FS_IOC32_SETVERSION == 0x4004_7602);
/// `_IOW('f', 4, int)`: a 32-bit process's EXT4_IOC_SETVERSION.
pub const EXT4_IOC32_SETVERSION: libc::c_ulong = ioc(1, b'f', 4, size_of::<libc::c_int>());
const _: () = assert!(EXT4_IOC32_SETVERSION == 0x4004_6604);

/// Sets an open inode's generation through `cmd` (one of the SETVERSION
/// numbers above): what an attacker would do to a volume root to make the
/// guard's `{dev, ino, generation}` key miss it. For the tests only.
#[cfg(feature = "test-syscalls")]
pub fn set_inode_generation(fd: BorrowedFd<'_>, cmd: libc::c_ulong, gen: u32) -> io::Result<()> {
    let value: libc::c_int = gen as libc::c_int;
    // SAFETY: the kernel reads one int from the live local `value`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd, &value as *const libc::c_int) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The generation of an open inode: with the inode number it names one
/// inode for the life of the filesystem, where the number alone is reused.
pub fn inode_generation(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut gen: libc::c_long = 0;
    // SAFETY: FS_IOC_GETVERSION writes one int into the live local `gen`,
    // which is larger.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            FS_IOC_GETVERSION,
            &mut gen as *mut libc::c_long,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(gen as u32)
}

// ---------------------------------------------------------------------------
// include/uapi/linux/bpf.h: pinned objects and map elements
// ---------------------------------------------------------------------------

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_OBJ_GET: libc::c_long = 7;
/// Map update flags.
pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;

/// The `BPF_OBJ_*` member of `union bpf_attr`, up to `file_flags`.
#[repr(C)]
struct BpfObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}
const _: () = assert!(size_of::<BpfObjAttr>() == 16);

/// The `BPF_MAP_*_ELEM` member of `union bpf_attr`.
#[repr(C)]
struct BpfElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}
const _: () = assert!(size_of::<BpfElemAttr>() == 32);

/// `bpf(cmd, attr, size)`; the kernel reads only `size` bytes of `attr`.
/// The workspace's one entry to bpf(2) outside aya (`prjquota-ebpf`'s raw
/// module makes its batch lookups through it too).
///
/// # Safety
/// `attr` must be a `union bpf_attr` member as `cmd` reads it (`#[repr(C)]`,
/// its size the kernel's for that member or a prefix of it) whose pointers
/// are valid for what `cmd` reads and writes through them.
pub unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract; the size passed is T's own.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            size_of::<T>() as libc::c_uint,
        )
    })
}

/// A BPF map opened from its pin, with the sizes the kernel gave it: every
/// key and value passed to the kernel is checked against them first, so no
/// call reads or writes past a caller's buffer.
#[derive(Debug)]
pub struct BpfMap {
    fd: OwnedFd,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
}

/// `struct bpf_map_info`, up to `max_entries`.
#[repr(C)]
#[derive(Default)]
struct BpfMapInfoHead {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD`'s member of `union bpf_attr`.
#[repr(C)]
struct BpfInfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}
const _: () = assert!(size_of::<BpfInfoAttr>() == 16);
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `BPF_OBJ_GET_INFO_BY_FD`: the kernel's `bpf_*_info` of the map, program
/// or link behind `fd`, written into `info` (at most its size); returns how
/// many bytes the running kernel filled (an older kernel knows fewer
/// fields: the rest keep what `info` held). One `bpf(2)` call, where
/// `/proc/self/fdinfo` costs an open, a read, a close and a parse.
///
/// # Safety
/// `T` must be a `#[repr(C)]` prefix of the `bpf_*_info` struct of `fd`'s
/// object holding only integers (every bit pattern valid), and any pointer
/// fields set in `info` must be valid for the lengths set beside them.
pub unsafe fn obj_get_info<T>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<usize> {
    let mut attr = BpfInfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<T>() as u32,
        info: info as *mut T as u64,
    };
    // SAFETY: the kernel writes at most `info_len` bytes at `info`, a live
    // `T` of that size whose every bit pattern is valid (the caller's
    // contract), and the filled length back into `attr`.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(attr.info_len as usize)
}

/// How many CPUs the kernel sizes per-CPU map values for
/// (`num_possible_cpus()`), read once: it is fixed at boot.
fn possible_cpus() -> io::Result<usize> {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if let Some(n) = CPUS.get() {
        return Ok(*n);
    }
    let path = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(path)?;
    let n = count_cpu_list(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} is not a CPU list: {:?}", text.trim()),
        )
    })?;
    Ok(*CPUS.get_or_init(|| n))
}

/// The number of CPUs in a kernel CPU list (`0-3,8,10-11`).
pub fn count_cpu_list(text: &str) -> Option<usize> {
    let mut n = 0;
    for part in text.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// `BPF_MAP_TYPE_PERCPU_HASH`, `_PERCPU_ARRAY`, `_LRU_PERCPU_HASH`,
/// `_PERCPU_CGROUP_STORAGE`.
const PERCPU_MAP_TYPES: [u32; 4] = [5, 6, 10, 21];

fn size_mismatch(what: &str, got: usize, want: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("a {what} of {got} bytes for a map whose {what}s are {want} bytes"),
    )
}

impl BpfMap {
    /// Opens the map pinned at `path` (following a symlink on the way).
    pub fn open_pinned(path: &CStr) -> io::Result<BpfMap> {
        let mut attr = BpfObjAttr {
            pathname: path.as_ptr() as u64,
            bpf_fd: 0,
            file_flags: 0,
        };
        // SAFETY: `pathname` points at a NUL-terminated string alive for the call.
        let fd = unsafe { bpf(BPF_OBJ_GET, &mut attr) }?;
        // SAFETY: BPF_OBJ_GET returned a new file descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut info = BpfMapInfoHead::default();
        // SAFETY: `BpfMapInfoHead` is the `#[repr(C)]` head of `struct
        // bpf_map_info`, five `u32`s. A pinned program or link answers
        // EINVAL or another layout: only a map's type and sizes are used
        // below.
        unsafe { obj_get_info(fd.as_fd(), &mut info) }?;
        Ok(BpfMap {
            fd,
            map_type: info.map_type,
            key_size: info.key_size,
            value_size: info.value_size,
        })
    }

    fn check(&self, key: &[u8], value: Option<&[u8]>) -> io::Result<()> {
        if key.len() != self.key_size as usize {
            return Err(size_mismatch("key", key.len(), self.key_size));
        }
        match value {
            // A per-CPU map moves one value per possible CPU.
            Some(_) if PERCPU_MAP_TYPES.contains(&self.map_type) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a per-CPU map's values are one per CPU: not read or written here",
            )),
            Some(v) if v.len() != self.value_size as usize => {
                Err(size_mismatch("value", v.len(), self.value_size))
            }
            _ => Ok(()),
        }
    }

    /// Sets `key` to `value` (`flags`: [`BPF_ANY`], [`BPF_NOEXIST`]). Not
    /// for per-CPU maps, whose values are one per CPU.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
        self.check(key, Some(value))?;
        let mut attr = BpfElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags,
        };
        // SAFETY: the kernel reads key_size bytes at `key` and value_size
        // bytes at `value` (for the map types this is used on), and both
        // slices were checked to be exactly that long.
        unsafe { bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
    }

    /// Removes `key`; `Ok(false)` when it was not there.
    pub fn delete(&self, key: &[u8]) -> io::Result<bool> {
        self.check(key, None)?;
        let mut attr = BpfElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: 0,
            flags: 0,
        };
        // SAFETY: the kernel reads key_size bytes at `key`, checked above.
        match unsafe { bpf(BPF_MAP_DELETE_ELEM, &mut attr) } {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads `key`'s values of a per-CPU map, one per possible CPU, each
    /// `value_size` bytes (the kernel pads each to 8); `Ok(None)` when
    /// absent.
    pub fn lookup_per_cpu(&self, key: &[u8]) -> io::Result<Option<Vec<Vec<u8>>>> {
        self.check(key, None)?;
        if !PERCPU_MAP_TYPES.contains(&self.map_type) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a per-CPU map: read it with lookup",
            ));
        }
        let stride = (self.value_size as usize).div_ceil(8) * 8;
        let mut buf = vec![0u8; stride * possible_cpus()?];
        // SAFETY: for a per-CPU map the kernel writes round_up(value_size,
        // 8) bytes for each possible CPU: `buf` holds that many for the
        // count the kernel publishes in /sys/devices/system/cpu/possible.
        let found = unsafe { self.lookup_raw(key, &mut buf) }?;
        Ok(found.then(|| {
            buf.chunks(stride)
                .map(|c| c[..self.value_size as usize].to_vec())
                .collect()
        }))
    }

    /// `BPF_MAP_LOOKUP_ELEM` of `key` (whose size the caller checked) into
    /// `value`; `Ok(false)` when absent.
    ///
    /// # Safety
    /// `value` must hold at least what the kernel writes for this map's
    /// type: `value_size` bytes, or one padded value per possible CPU.
    unsafe fn lookup_raw(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        let mut attr = BpfElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the kernel reads key_size bytes at `key` (the caller
        // checked its length) and writes into `value` no more than the
        // caller's contract says it holds.
        match unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads `key`'s value into `value`; `Ok(false)` when absent. Not for
    /// per-CPU maps.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        self.check(key, Some(value))?;
        // SAFETY: `value` is exactly value_size bytes (checked above), and
        // the map is not per-CPU (`check` refuses those).
        unsafe { self.lookup_raw(key, value) }
    }
}
