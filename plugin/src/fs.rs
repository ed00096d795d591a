//! The volumes filesystem: opening `DHV_VOLUMES_DIR` safely, telling which
//! filesystem and mount it is on, and whether project quotas work there, with
//! errors that name the device, the mount and the exact fix.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use prjquota_core::fs_type::FsType;
use prjquota_core::quota::{self, Support};
use prjquota_core::sys;

/// One line of /proc/self/mountinfo, the parts error messages need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    pub options: String,
}

impl Mount {
    pub fn has_option(&self, opt: &str) -> bool {
        self.options.split(',').any(|o| o == opt)
    }
}

/// Finds the mount that holds `path` on device `dev`: the longest mount
/// point that prefixes `path` among the entries with that device number.
pub fn find_mount(mountinfo: &str, path: &Path, dev: u64) -> Option<Mount> {
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(_id), Some(_parent), Some(majmin), Some(_root), Some(mp), Some(mopts)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        if majmin != want {
            continue;
        }
        // Optional fields end with a lone "-"; then fstype, source, super options.
        let mut rest = fields.skip_while(|f| *f != "-").skip(1);
        let (Some(fstype), Some(source), sopts) = (rest.next(), rest.next(), rest.next()) else {
            continue;
        };
        let mount_point = PathBuf::from(unescape_mountinfo(mp));
        if !path.starts_with(&mount_point) {
            continue;
        }
        if best
            .as_ref()
            .is_some_and(|b| b.mount_point.as_os_str().len() >= mount_point.as_os_str().len())
        {
            continue;
        }
        best = Some(Mount {
            mount_point,
            fstype: fstype.to_string(),
            source: unescape_mountinfo(source),
            options: format!("{mopts},{}", sopts.unwrap_or("")),
        });
    }
    best
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An open volumes directory and what is known about its filesystem.
#[derive(Debug)]
pub struct VolumesFs {
    pub path: PathBuf,
    pub dir: OwnedFd,
    pub fstype: FsType,
    /// Filesystem block size: limits are rounded up to it.
    pub block_size: u64,
    pub dev: u64,
    /// Size of the whole filesystem in bytes.
    pub fs_bytes: u64,
    /// The mount holding the directory, read from /proc/self/mountinfo the
    /// first time a message or a check asks ([`VolumesFs::mount`]). A create
    /// or restore that succeeds never needs it, and reading it costs a pass
    /// over every mount of the host: hundreds on a Nomad client whose
    /// allocations each bind-mount their directories.
    mount: std::sync::OnceLock<Option<Mount>>,
}

pub fn cstr(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| anyhow!("path {path:?} contains a NUL byte"))
}

impl VolumesFs {
    /// Opens the volumes directory, creating it (and its parents, mode 0711)
    /// when `create` is set. The last component must not be a symlink: a
    /// symlinked volumes dir could be repointed under a running plugin, so
    /// the operator is asked to configure the real path instead.
    pub fn open(path: &Path, create: bool) -> Result<VolumesFs> {
        let c = cstr(path)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let dir = match sys::open(&c, flags, 0) {
            Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                Self::make_volumes_dir(path)?;
                sys::open(&c, flags, 0)
            }
            r => r,
        }
        .map_err(|e| match e.raw_os_error() {
            // O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR or ELOOP.
            Some(libc::ELOOP | libc::ENOTDIR)
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
            anyhow!(
                "the volumes directory {} is a symlink: set host_volumes_dir in the Nomad client config to the real directory it points to",
                path.display()
            ),
            Some(libc::ENOTDIR) => anyhow!(
                "the volumes directory {} is not a directory: set host_volumes_dir to a directory on an XFS or ext4 filesystem with project quota",
                path.display()
            ),
            Some(libc::ENOENT) => anyhow!(
                "the volumes directory {} does not exist: create it on an XFS filesystem mounted with -o prjquota",
                path.display()
            ),
            _ => anyhow::Error::new(e)
                .context(format!("cannot open the volumes directory {}", path.display())),
        })?;
        let st = sys::fstat(dir.as_fd()).context("fstat of the volumes directory")?;
        let sfs = sys::fstatfs(dir.as_fd()).context("statfs of the volumes directory")?;
        let block_size = (sfs.f_bsize as u64).max(512);
        Ok(VolumesFs {
            path: path.to_path_buf(),
            dir,
            fstype: FsType::from_magic(sfs.f_type as i64),
            block_size,
            dev: st.st_dev,
            fs_bytes: (sfs.f_blocks as u64).saturating_mul(sfs.f_frsize as u64),
            mount: std::sync::OnceLock::new(),
        })
    }

    /// Makes a missing volumes directory (and its parents, mode 0711), once
    /// the filesystem it would be on enforces project quotas.
    fn make_volumes_dir(path: &Path) -> Result<()> {
        // Refuse before creating anything: the nearest existing ancestor is
        // on the filesystem the directory would be.
        let mut anc = path.parent();
        while let Some(a) = anc {
            if a.exists() {
                break;
            }
            anc = a.parent();
        }
        let anc = Self::open(anc.unwrap_or(Path::new("/")), false)?;
        anc.require_enforced_quota().map_err(|e| {
            anyhow!("{e:#}").context(format!(
                "not creating the volumes directory {}",
                path.display()
            ))
        })?;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(path)
            .with_context(|| format!("cannot create the volumes directory {}", path.display()))
    }

    /// The mount holding the directory, if /proc/self/mountinfo names it.
    pub fn mount(&self) -> Option<&Mount> {
        self.mount
            .get_or_init(|| {
                prjquota_core::mountinfo::read_own()
                    .ok()
                    .and_then(|mi| find_mount(&mi, &self.path, self.dev))
            })
            .as_ref()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// "XFS on /dev/sdb1 mounted at /srv" for error messages.
    pub fn describe(&self) -> String {
        match self.mount() {
            Some(m) => format!(
                "{} on {} mounted at {}",
                self.fstype,
                m.source,
                m.mount_point.display()
            ),
            None => format!("{}", self.fstype),
        }
    }

    /// Whether this filesystem's journal commits metadata changes in the
    /// order they were made, so that one fsync makes every earlier change
    /// durable too: XFS always (one log, forced up to the fsynced inode's
    /// sequence), ext4 when it has a journal and no fast commits (jbd2
    /// commits whole transactions in order; a fast commit holds only the
    /// fsynced inode's own changes). The registry then fsyncs only where a
    /// promise leaves the process. Anything unknown answers `false`, which
    /// costs fsyncs, never safety.
    pub fn journal_orders_metadata(&self) -> bool {
        match self.fstype {
            FsType::Xfs => true,
            FsType::Ext4 => read_ext4_superblock(self.dev)
                .is_some_and(|sb| ext4_superblock_orders_metadata(&sb)),
            FsType::Other(_) => false,
        }
    }

    fn source(&self) -> &str {
        self.mount().map_or("<device>", |m| m.source.as_str())
    }

    fn mount_point(&self) -> String {
        self.mount().map_or_else(
            || "<mount point>".into(),
            |m| m.mount_point.display().to_string(),
        )
    }

    /// ext4 suspends its quotas while mounted read-only (`Q_XGETQSTAT` then
    /// says off, and limits cannot be read) and resumes them, with the
    /// stored limits, when mounted read-write again. Nothing can be written
    /// meanwhile, so no volume can outgrow its limit: a read-only ext4
    /// mounted with `prjquota` counts as enforcing, and only a restore that
    /// writes nothing can succeed there (every write fails with EROFS).
    pub fn quota_suspended_read_only(&self) -> bool {
        self.fstype == FsType::Ext4
            && self
                .mount()
                .is_some_and(|m| m.has_option("ro") && m.has_option("prjquota"))
    }

    /// Whether project quota is enforced, only accounted, or off here: the
    /// one place the plugin asks.
    pub fn quota_support(&self) -> io::Result<Support> {
        quota::support(self.fd())
    }

    /// Fails unless project quotas are accounted and enforced here; the error
    /// says exactly what to change.
    pub fn require_enforced_quota(&self) -> Result<()> {
        let p = self.path.display();
        if self.quota_suspended_read_only() {
            return Ok(());
        }
        if let FsType::Other(_) = self.fstype {
            bail!(
                "{p} is on {}: prjquota needs XFS (mounted with -o prjquota) or ext4 (with the project and quota features, mounted with -o prjquota); point host_volumes_dir at such a filesystem",
                self.describe()
            );
        }
        let support = self
            .quota_support()
            .with_context(|| format!("cannot read the quota state of {p} ({})", self.describe()))?;
        if support == Support::Enforced {
            return Ok(());
        }
        // Only a failure describes the filesystem: that reads mountinfo.
        let d = self.describe();
        let root_hint = if self.mount_point() == "/" {
            " (this is the root filesystem: add rootflags=prjquota to the kernel command line and reboot; quota accounting cannot be switched on by remount)"
        } else {
            ""
        };
        match (self.fstype, support) {
            (_, Support::Enforced) => unreachable!("returned above"),
            (FsType::Xfs, Support::Off) if !Path::new("/proc/fs/xfs/xqm").exists() => bail!(
                "{p} is on {d}, but this kernel has no XFS quota support (CONFIG_XFS_QUOTA is off): boot a kernel built with it, such as Debian's linux-image-amd64"
            ),
            (FsType::Xfs, Support::Off) => bail!(
                "{p} is on {d} without project quota: mount it with -o prjquota, e.g. in /etc/fstab `{} {} xfs defaults,prjquota 0 0`, then unmount and mount it again{root_hint}",
                self.source(),
                self.mount_point()
            ),
            (FsType::Xfs, Support::AccountingOnly) => bail!(
                "{p} is on {d} with project quota accounting but not enforcement (pqnoenforce): mount it with -o prjquota instead{root_hint}"
            ),
            (FsType::Ext4, _) if !Path::new("/proc/sys/fs/quota").exists() => bail!(
                "{p} is on {d}, but this kernel has no quota support (CONFIG_QUOTA and CONFIG_QFMT_V2 are off): boot a kernel built with them, such as Debian's linux-image-amd64"
            ),
            (FsType::Ext4, Support::AccountingOnly) => bail!(
                "{p} is on {d} with project quota accounting but not enforcement: mount it with -o prjquota, e.g. in /etc/fstab `{} {} ext4 defaults,prjquota 0 0`{root_hint}",
                self.source(),
                self.mount_point()
            ),
            (FsType::Ext4, _) => bail!(
                "{p} is on {d} without project quota: unmount it, run `tune2fs -O project,quota {}` (the filesystem needs 256-byte inodes: one made with `mkfs.ext4 -I 128` cannot hold project IDs and must be recreated with `-I 256`), then mount it with -o prjquota{root_hint}",
                self.source()
            ),
            (FsType::Other(_), _) => unreachable!("refused above"),
        }
    }
}

/// The primary superblock of the ext4 filesystem on block device `dev`
/// (1024 bytes at offset 1024).
fn read_ext4_superblock(dev: u64) -> Option<[u8; 1024]> {
    use std::os::unix::fs::FileExt;
    let node = prjquota_core::mountinfo::dev_node(libc::major(dev), libc::minor(dev))?;
    let dev_file = std::fs::File::open(node).ok()?;
    let mut sb = [0u8; 1024];
    dev_file.read_exact_at(&mut sb, 1024).ok()?;
    Some(sb)
}

/// See [`VolumesFs::journal_orders_metadata`]; `sb` is ext4's superblock.
fn ext4_superblock_orders_metadata(sb: &[u8; 1024]) -> bool {
    const MAGIC: u16 = 0xEF53;
    const COMPAT_HAS_JOURNAL: u32 = 0x0004;
    const COMPAT_FAST_COMMIT: u32 = 0x0400;
    let magic = u16::from_le_bytes([sb[0x38], sb[0x39]]);
    let compat = u32::from_le_bytes([sb[0x5C], sb[0x5D], sb[0x5E], sb[0x5F]]);
    magic == MAGIC && compat & COMPAT_HAS_JOURNAL != 0 && compat & COMPAT_FAST_COMMIT == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:0 / /srv/xfs rw,relatime shared:9 - xfs /dev/loop0 rw,attr2,inode64,prjquota
31 30 7:0 /sub /srv/xfs/deeper rw,relatime - xfs /dev/loop0 rw,attr2,inode64,prjquota
40 22 7:1 / /mnt/with\\040space rw - ext4 /dev/loop1 rw,prjquota
";

    #[test]
    fn finds_the_longest_matching_mount_on_the_device() {
        let dev = libc::makedev(7, 0);
        let m = find_mount(MOUNTINFO, Path::new("/srv/xfs/deeper/vols"), dev).unwrap();
        assert_eq!(m.mount_point, Path::new("/srv/xfs/deeper"));
        let m = find_mount(MOUNTINFO, Path::new("/srv/xfs/vols"), dev).unwrap();
        assert_eq!(m.mount_point, Path::new("/srv/xfs"));
        assert_eq!(m.source, "/dev/loop0");
        assert_eq!(m.fstype, "xfs");
        assert!(m.has_option("prjquota"));
        assert!(!m.has_option("quota"));
    }

    #[test]
    fn device_must_match_not_just_the_prefix() {
        let m = find_mount(MOUNTINFO, Path::new("/srv/xfs/vols"), libc::makedev(254, 0)).unwrap();
        assert_eq!(m.mount_point, Path::new("/"));
        assert!(find_mount(MOUNTINFO, Path::new("/x"), libc::makedev(9, 9)).is_none());
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        let m = find_mount(
            MOUNTINFO,
            Path::new("/mnt/with space/v"),
            libc::makedev(7, 1),
        )
        .unwrap();
        assert_eq!(m.mount_point, Path::new("/mnt/with space"));
    }

    #[test]
    fn a_symlinked_volumes_dir_is_refused() {
        let base = std::env::temp_dir().join(format!("prjquota-fs-{}", std::process::id()));
        std::fs::create_dir_all(base.join("real")).unwrap();
        let link = base.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(base.join("real"), &link).unwrap();
        let err = VolumesFs::open(&link, true).unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_tmpfs_or_other_filesystem_is_refused_by_name() {
        // /dev/shm is tmpfs on Linux hosts and CI machines.
        let vfs = VolumesFs::open(Path::new("/dev/shm"), false).unwrap();
        let err = vfs.require_enforced_quota().unwrap_err().to_string();
        assert!(err.contains("prjquota needs XFS"), "{err}");
    }

    fn superblock(magic: u16, compat: u32) -> [u8; 1024] {
        let mut sb = [0u8; 1024];
        sb[0x38..0x3A].copy_from_slice(&magic.to_le_bytes());
        sb[0x5C..0x60].copy_from_slice(&compat.to_le_bytes());
        sb
    }

    #[test]
    fn only_a_journaled_ext4_without_fast_commits_orders_metadata() {
        // mke2fs's defaults: has_journal, ext_attr, resize_inode, dir_index.
        assert!(ext4_superblock_orders_metadata(&superblock(0xEF53, 0x3C)));
        assert!(!ext4_superblock_orders_metadata(&superblock(0xEF53, 0x38)));
        assert!(!ext4_superblock_orders_metadata(&superblock(0xEF53, 0x43C)));
        assert!(!ext4_superblock_orders_metadata(&superblock(0x5846, 0x3C)));
    }
}
