//! The block device under a file, for `quotactl(2)`.
//!
//! `quotactl_fd(2)` (Linux 5.14) takes any descriptor on the filesystem; the
//! older `quotactl(2)` wants the path of the filesystem's block device. On
//! kernels without `quotactl_fd` ([`crate::sys`] falls back to `quotactl`),
//! this module finds that device: the mount in `/proc/self/mountinfo` whose
//! `major:minor` is the file's `st_dev` and whose mount point is the longest
//! prefix of the file's path, then its source (`/dev/loop0`). A source that
//! is not a device node (`/dev/root`, a stale path) is resolved through
//! `/dev/block/MAJ:MIN` or `/sys/dev/block/MAJ:MIN/uevent` instead.
//!
//! The parsing is pure and unit-tested on any host.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`, the fields this module needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Mount {
    pub major: u32,
    pub minor: u32,
    pub mount_point: PathBuf,
    pub source: String,
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`,
/// `\134`) in a mountinfo field.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line:
/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
/// (mount ID, parent ID, major:minor, root, mount point, options, optional
/// fields up to `-`, fs type, source, super options).
pub fn parse_line(line: &str) -> Option<Mount> {
    let mut fields = line.split(' ');
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let _root = fields.next()?;
    let mount_point = unescape(fields.next()?);
    // Optional fields end with a lone `-`.
    fields.by_ref().find(|f| *f == "-")?;
    let _fstype = fields.next()?;
    let source = unescape(fields.next()?);
    Some(Mount {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point: PathBuf::from(mount_point),
        source,
    })
}

/// The mount of device `major:minor` whose mount point is the longest prefix
/// of `path` (by whole components), from mountinfo text.
pub fn find_mount(mountinfo: &str, major: u32, minor: u32, path: &Path) -> Option<Mount> {
    mountinfo
        .lines()
        .filter_map(parse_line)
        .filter(|m| m.major == major && m.minor == minor && path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
}

/// Whether a mount made at `path` would propagate to the mount's peers:
/// the mount that holds `path` (the longest mount point that is a prefix
/// of it, by whole components; the last one mounted there) is `shared:`
/// in its optional fields. Mounted under a private or a slave mount (a
/// systemd sandbox, `unshare --propagation private`), a new mount is seen
/// by this mount namespace alone.
pub fn propagates(mountinfo: &str, path: &Path) -> bool {
    mountinfo
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = PathBuf::from(unescape(fields.get(4)?));
            path.starts_with(&point).then_some((point, fields))
        })
        // The last of the longest: a mount over a mount hides it.
        .fold(None::<(PathBuf, Vec<&str>)>, |best, (p, f)| match &best {
            Some((b, _)) if b.components().count() > p.components().count() => best,
            _ => Some((p, f)),
        })
        .is_some_and(|(_, f)| {
            f.iter()
                .skip(6)
                .take_while(|o| **o != "-")
                .any(|o| o.starts_with("shared:"))
        })
}

/// This process's `/proc/self/mountinfo`. Read into a buffer sized for a
/// typical table: procfs reports no size, and from an empty String
/// `read_to_string` probes with 32 bytes and doubles (nine system calls).
pub fn read_own() -> io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(16 * 1024);
    std::fs::File::open("/proc/self/mountinfo")?.read_to_string(&mut text)?;
    Ok(text)
}

/// The `/dev/<name>` of block device `major:minor`, from sysfs (`DEVNAME=`
/// of `/sys/dev/block/MAJ:MIN/uevent`).
pub fn dev_node(major: u32, minor: u32) -> Option<String> {
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent")).ok()?;
    uevent_devname(&uevent).map(|n| format!("/dev/{n}"))
}

/// `DEVNAME=` of a `/sys/dev/block/MAJ:MIN/uevent` text.
pub fn uevent_devname(uevent: &str) -> Option<&str> {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .filter(|n| !n.is_empty())
}

/// Whether `path` is the block device `rdev`.
fn is_block_device(path: &Path, rdev: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
}

/// The path of the block device that holds the file at `path` whose
/// `st_dev` is `dev`, for `quotactl(2)`. The error names the device numbers
/// and the places searched.
pub fn block_device(path: &Path, dev: u64) -> io::Result<CString> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let mountinfo = read_own()?;
    let from_mount = find_mount(&mountinfo, major, minor, path).map(|m| m.source);
    let from_sys = dev_node(major, minor);
    let candidates = from_mount
        .iter()
        .filter(|s| s.starts_with('/'))
        .cloned()
        .chain([format!("/dev/block/{major}:{minor}")])
        .chain(from_sys);
    for c in candidates {
        if is_block_device(Path::new(&c), dev) {
            return CString::new(c).map_err(io::Error::other);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no block device node for the filesystem holding {} (device {major}:{minor}; \
             mount source {}; none of /dev/block/{major}:{minor} or the DEVNAME of \
             /sys/dev/block/{major}:{minor}/uevent exists): this kernel lacks quotactl_fd(2) \
             (Linux < 5.14) and its quotactl(2) needs the device node: create it \
             (`mknod`, or run udev) or use Linux 5.14+",
            path.display(),
            find_mount(&mountinfo, major, minor, path)
                .map(|m| m.source)
                .unwrap_or_else(|| "not found in /proc/self/mountinfo".into()),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / ro,relatime - 9p /dev/root ro,trans=virtio
25 22 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw,size=1000k
40 22 0:34 / /tmp rw - tmpfs tmpfs rw
41 40 7:0 / /tmp/prjquota-vm/xfs rw,relatime - xfs /dev/loop0 rw,prjquota
42 40 7:1 / /tmp/prjquota-vm/ext4 rw,relatime shared:5 master:1 - ext4 /dev/loop1 rw,prjquota
43 41 7:0 /vol1 /tmp/prjquota-vm/xfs/bind rw - xfs /dev/loop0 rw,prjquota
44 40 7:2 / /tmp/with\\040space rw - xfs /dev/loop2 rw
45 40 8:1 / /srv - ext4 /dev/root rw
";

    #[test]
    fn parses_optional_fields_and_escapes() {
        let m = parse_line(INFO.lines().nth(4).unwrap()).unwrap();
        assert_eq!((m.major, m.minor), (7, 1));
        assert_eq!(m.mount_point, Path::new("/tmp/prjquota-vm/ext4"));
        assert_eq!(m.source, "/dev/loop1");
        let m = parse_line(INFO.lines().nth(6).unwrap()).unwrap();
        assert_eq!(m.mount_point, Path::new("/tmp/with space"));
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line("1 2 x / / rw - xfs /dev/sda rw"), None);
    }

    #[test]
    fn picks_the_device_and_the_longest_mount_point() {
        let m = find_mount(INFO, 7, 0, Path::new("/tmp/prjquota-vm/xfs/bind/a")).unwrap();
        assert_eq!(m.mount_point, Path::new("/tmp/prjquota-vm/xfs/bind"));
        let m = find_mount(INFO, 7, 0, Path::new("/tmp/prjquota-vm/xfs/v1")).unwrap();
        assert_eq!(m.mount_point, Path::new("/tmp/prjquota-vm/xfs"));
        assert_eq!(m.source, "/dev/loop0");
        // The device must match: /tmp holds the path, but is not 7:1.
        assert_eq!(
            find_mount(INFO, 7, 1, Path::new("/tmp/prjquota-vm/xfs/v1")),
            None
        );
        // Whole components: /tmp/prjquota-vm/xfs2 is not under .../xfs.
        assert_eq!(
            find_mount(INFO, 7, 0, Path::new("/tmp/prjquota-vm/xfs2")),
            None
        );
        let m = find_mount(INFO, 7, 2, Path::new("/tmp/with space/v")).unwrap();
        assert_eq!(m.source, "/dev/loop2");
        // A source that is not a device path is returned as it is; the caller
        // resolves it through /dev/block or /sys.
        assert_eq!(
            find_mount(INFO, 8, 1, Path::new("/srv/v")).unwrap().source,
            "/dev/root"
        );
    }

    #[test]
    fn uevent_names_the_device() {
        assert_eq!(
            uevent_devname("MAJOR=7\nMINOR=0\nDEVNAME=loop0\nDEVTYPE=disk\n"),
            Some("loop0")
        );
        assert_eq!(uevent_devname("MAJOR=7\nDEVNAME=\n"), None);
        assert_eq!(uevent_devname(""), None);
    }

    #[test]
    fn a_missing_device_says_so() {
        // No filesystem on this host is on device 4095:1048575.
        let dev = libc::makedev(4095, 1_048_575);
        let err = block_device(Path::new("/nonexistent/v"), dev).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(msg.contains("4095:1048575"), "{msg}");
        assert!(msg.contains("quotactl_fd"), "{msg}");
    }
    #[test]
    fn a_mount_propagates_only_under_a_shared_one() {
        let host = "22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                    23 22 0:22 / /sys/fs/bpf rw shared:8 - bpf bpf rw,mode=700\n";
        assert!(propagates(host, Path::new("/sys/fs/bpf")));
        let sandbox = "22 1 0:21 / /sys rw,nosuid master:7 - sysfs sysfs rw\n";
        assert!(!propagates(sandbox, Path::new("/sys/fs/bpf")));
        let private = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n";
        assert!(!propagates(private, Path::new("/sys/fs/bpf")));
        // A private mount over a shared one hides it.
        let over = "22 1 0:21 / /sys rw shared:7 - sysfs sysfs rw\n\
                    30 22 0:21 / /sys rw - sysfs sysfs rw\n";
        assert!(!propagates(over, Path::new("/sys/fs/bpf")));
        assert!(!propagates("", Path::new("/sys/fs/bpf")));
    }
}
