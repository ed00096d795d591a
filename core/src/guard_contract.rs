//! The quota-escape guard's pins: the contract between the exporter, which
//! loads the guard and pins its maps and links in bpffs
//! (`prjquota_ebpf::guard::pins`), so the kernel keeps enforcing while no
//! exporter runs (restart, crash, upgrade), and the plugin, which opens
//! the maps from their pins ([`PinnedGuard`]). Every name both sides must
//! agree on is written here once: the pin root, the layout below, the map
//! pins' names and layouts, the owner lock's name, the link pins and which
//! of their programs enforce.
//!
//! ```text
//! <pin root>/                      root:root 0700 (default PIN_ROOT)
//!   @guard-<unique>/               one per exporter start (DIR_PREFIX)
//!     roots devs projects counters stats events      the maps (MAP_*)
//!     link-<program>               one per attached program (link_pin)
//!   <escape_path(D)> -> <pin root>/@guard-<unique>   one per volumes directory D (link_of)
//!   @owner-<escape_path(D)>/       flock'ed by the exporter that owns D's guard (owner_lock_of)
//! ```
//!
//! No name holds a `.`: bpffs refuses them (reserved for the kernel's own
//! files), so [`escape_path`] escapes every dot and the exporter's own
//! names start with `@` (which [`escape_path`] never leaves in a name).
//!
//! The plugin puts a new volume's root into the maps itself, before the
//! root is tagged and handed to its owner: a create never waits on, or
//! trusts, anything an unprivileged process can reach. The layouts are
//! `ebpf/src/bpf/guard_shared.h`'s (a host test of the ebpf crate holds
//! them to this file).
//!
//! No pin (no exporter with a guard has run since boot, or it runs with
//! `--guard=off`) is not an error: nothing guards any volume then, and the
//! exporter guards them all from its start. Pins that exist but cannot be
//! used are an error: the caller refuses to hand out an unguarded volume.

use std::ffi::CString;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, BpfMap, BPF_ANY};

/// Where the exporter pins the guard (bpffs).
pub const PIN_ROOT: &str = "/sys/fs/bpf/prjquota";

/// `BPF_FS_MAGIC` (include/uapi/linux/magic.h).
pub const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The pinned maps' names in a pin directory.
pub const MAP_ROOTS: &str = "roots";
pub const MAP_DEVS: &str = "devs";
pub const MAP_PROJECTS: &str = "projects";
pub const MAP_COUNTERS: &str = "counters";
/// The exporter's own: the plugin neither opens nor needs them.
pub const MAP_STATS: &str = "stats";
pub const MAP_EVENTS: &str = "events";

/// A pin directory's name starts with this.
pub const DIR_PREFIX: &str = "@guard-";
/// A temporary symlink's name starts with this (a swap renames it over
/// the volumes directory's).
pub const TMP_PREFIX: &str = "@tmp-";
/// A volumes directory's owner lock's name starts with this.
pub const OWNER_PREFIX: &str = "@owner-";
/// A link pin's name starts with this; the program's name follows.
pub const LINK_PREFIX: &str = "link-";

/// The symlink of volumes directory `volumes_dir` under `pin_root`, which
/// leads to the pin directory of its guard.
pub fn link_of(pin_root: &Path, volumes_dir: &Path) -> PathBuf {
    pin_root.join(escape_path(&crate::announce::canonical(volumes_dir)))
}

/// The owner lock of volumes directory `volumes_dir` under `pin_root`.
pub fn owner_lock_of(pin_root: &Path, volumes_dir: &Path) -> PathBuf {
    pin_root.join(format!(
        "{OWNER_PREFIX}{}",
        escape_path(&crate::announce::canonical(volumes_dir))
    ))
}

/// The link pin's name of program `prog`.
pub fn link_pin(prog: &str) -> String {
    format!("{LINK_PREFIX}{prog}")
}

/// The program whose link pin is named `name`; `None` for a map's pin.
pub fn linked_program(name: &str) -> Option<&str> {
    name.strip_prefix(LINK_PREFIX)
}

/// A BPF LSM hook the guard enforces through, and its programs in the
/// order tried: sleepable first (bpf_copy_from_user faults the argument
/// in), then the plain one. The programs' names are their link pins'
/// ([`link_pin`]).
#[derive(Debug)]
pub struct LsmHook {
    pub hook: &'static str,
    /// `(program, section)`.
    pub variants: &'static [(&'static str, &'static str)],
}

/// 6.17+: one hook inside vfs_fileattr_set sees every path (ioctl, compat
/// ioctl, file_setattr(2)) with the request already in kernel memory.
pub const LSM_FILEATTR: LsmHook = LsmHook {
    hook: "inode_file_setattr",
    variants: &[("guard_inode_file_setattr", "lsm/inode_file_setattr")],
};
/// Before 6.17: the ioctl, native ...
pub const LSM_IOCTL: LsmHook = LsmHook {
    hook: "file_ioctl",
    variants: &[
        ("guard_file_ioctl_sleepable", "lsm.s/file_ioctl"),
        ("guard_file_ioctl", "lsm/file_ioctl"),
    ],
};
/// ... and 32-bit (6.8+ and its stable backports; before it, compat
/// ioctls reach file_ioctl with the compat command number, which the
/// program knows).
pub const LSM_IOCTL_COMPAT: LsmHook = LsmHook {
    hook: "file_ioctl_compat",
    variants: &[
        (
            "guard_file_ioctl_compat_sleepable",
            "lsm.s/file_ioctl_compat",
        ),
        ("guard_file_ioctl_compat", "lsm/file_ioctl_compat"),
    ],
};
/// 6.17+, beside [`LSM_FILEATTR`]: the inode generation is set by ioctls
/// that never reach `vfs_fileattr_set` (`FS_IOC_SETVERSION`, ext4's own
/// and their 32-bit twins), and the guard keys roots by it. Before 6.17,
/// [`LSM_IOCTL`] and [`LSM_IOCTL_COMPAT`] judge them with the rest.
pub const LSM_VERSION: LsmHook = LsmHook {
    hook: "file_ioctl",
    variants: &[("guard_file_ioctl_version", "lsm/file_ioctl")],
};
pub const LSM_VERSION_COMPAT: LsmHook = LsmHook {
    hook: "file_ioctl_compat",
    variants: &[("guard_file_ioctl_compat_version", "lsm/file_ioctl_compat")],
};
/// Every hook the guard enforces through (which of them load on a kernel
/// is the exporter's plan).
pub const LSM_HOOKS: [&LsmHook; 5] = [
    &LSM_FILEATTR,
    &LSM_IOCTL,
    &LSM_IOCTL_COMPAT,
    &LSM_VERSION,
    &LSM_VERSION_COMPAT,
];

/// Whether `prog` (a link pin's `link-<prog>` name) is one of the guard's
/// BPF LSM programs: a pinned guard holding one refuses changes.
pub fn is_lsm_program(prog: &str) -> bool {
    LSM_HOOKS
        .iter()
        .any(|h| h.variants.iter().any(|&(p, _)| p == prog))
}

/// Where the kernel lists the active LSMs.
pub const LSM_LIST: &str = "/sys/kernel/security/lsm";

/// Whether the BPF LSM is in the kernel's list of active LSMs, and the
/// list.
pub fn bpf_lsm_active() -> io::Result<(bool, String)> {
    let list = std::fs::read_to_string(LSM_LIST)?;
    let list = list.trim().to_string();
    Ok((list.split(',').any(|l| l == "bpf"), list))
}

/// The name of a volumes directory's pin: `systemd-escape --path`, but for
/// `.`, which bpffs refuses in a name (it keeps dotted names for itself):
/// `/` becomes `-`; bytes outside `[A-Za-z0-9:_]` become `\xNN`.
pub fn escape_path(path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    let trimmed: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    if trimmed.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for b in trimmed.join(&b'/') {
        match b {
            b'/' => out.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The kernel's `dev_t` (`super_block->s_dev`, `MKDEV(major, minor)` =
/// major << 20 | minor), which the BPF programs see, for a `stat` `st_dev`
/// (glibc's `new_encode_dev` encoding: the two agree on nothing but 0:0).
/// `None` when major or minor do not fit the kernel's 12/20 bits (no real
/// `stat` gives that).
pub fn kernel_dev(st_dev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(st_dev) as u64, libc::minor(st_dev) as u64);
    if major >= 1 << 12 || minor >= 1 << 20 {
        return None;
    }
    Some((major << 20) | minor)
}

/// A volume root as the guard names it: device, inode number and the
/// inode's generation, so that a deleted root's number, once reused by
/// another file, never inherits the root's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RootKey {
    /// Kernel encoding ([`kernel_dev`]).
    pub dev: u64,
    pub ino: u64,
    pub gen: u32,
}

impl RootKey {
    /// The key of an open directory.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<RootKey> {
        let st = sys::fstat(fd)?;
        Ok(RootKey {
            dev: kernel_dev(st.st_dev).ok_or_else(|| {
                io::Error::other(format!("device {:#x} has no kernel encoding", st.st_dev))
            })?,
            ino: st.st_ino,
            gen: sys::inode_generation(fd)?,
        })
    }

    /// `struct guard_root_key`.
    pub fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.dev.to_ne_bytes());
        b[8..16].copy_from_slice(&self.ino.to_ne_bytes());
        b[16..20].copy_from_slice(&self.gen.to_ne_bytes());
        b
    }
}

/// `struct guard_project`: a project on one device.
pub fn project_key(dev: u64, projid: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&dev.to_ne_bytes());
    b[8..12].copy_from_slice(&projid.to_ne_bytes());
    b
}

/// `struct guard_root`: the value of a root's entry.
fn root_value(projid: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&projid.to_ne_bytes());
    b
}

/// The guard's maps for one volumes directory, opened from their pins.
#[derive(Debug)]
pub struct PinnedGuard {
    /// The pin (a symlink to the directory holding the maps).
    pub pin: PathBuf,
    roots: BpfMap,
    devs: BpfMap,
    projects: BpfMap,
    counters: BpfMap,
}

/// Why the pins cannot be used, with the path and what to do.
fn unusable(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!(
        "the quota-escape guard pinned at {} cannot be used: {what}; restart prjquota-exporter to pin it again, or remove {} to run without a guard",
        path.display(),
        PIN_ROOT
    ))
}

impl PinnedGuard {
    /// The pins of `volumes_dir` (its canonical form) under [`PIN_ROOT`];
    /// `None` when no exporter has pinned a guard for it.
    pub fn open(volumes_dir: &Path) -> io::Result<Option<PinnedGuard>> {
        PinnedGuard::open_in(Path::new(PIN_ROOT), volumes_dir)
    }

    /// [`PinnedGuard::open`] under another pin root.
    pub fn open_in(pin_root: &Path, volumes_dir: &Path) -> io::Result<Option<PinnedGuard>> {
        let meta = match std::fs::symlink_metadata(pin_root) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unusable(pin_root, e)),
        };
        // Only root may have made or changed what a create trusts: the
        // pins, and the symlinks that lead to them.
        if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            return Err(unusable(
                pin_root,
                format_args!(
                    "it must be a directory owned by root and writable by root only (uid {}, mode {:o})",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
        let fs = fs_type(pin_root).map_err(|e| unusable(pin_root, e))?;
        if fs != BPF_FS_MAGIC {
            return Err(unusable(pin_root, "it is not on a bpf filesystem"));
        }
        if let Some(why) = untrusted_dirs(pin_root).map_err(|e| unusable(pin_root, e))? {
            return Err(unusable(pin_root, why));
        }
        let pin = link_of(pin_root, volumes_dir);
        match std::fs::symlink_metadata(&pin) {
            Ok(m) if m.file_type().is_symlink() || m.is_dir() => {
                if m.uid() != 0 {
                    return Err(unusable(
                        &pin,
                        format_args!("it is owned by uid {}", m.uid()),
                    ));
                }
            }
            Ok(_) => return Err(unusable(&pin, "it is not a symlink or a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unusable(&pin, e)),
        }
        let open = |name: &str, key: u32, value: u32| -> io::Result<BpfMap> {
            let path = pin.join(name);
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| unusable(&path, "the path holds a NUL byte"))?;
            let map = BpfMap::open_pinned(&c).map_err(|e| unusable(&path, e))?;
            if map.key_size != key || map.value_size != value {
                return Err(unusable(
                    &path,
                    format_args!(
                        "its keys and values are {} and {} bytes, this plugin writes {key} and {value}: install the plugin and the exporter of one release",
                        map.key_size, map.value_size
                    ),
                ));
            }
            Ok(map)
        };
        Ok(Some(PinnedGuard {
            roots: open(MAP_ROOTS, 24, 8)?,
            devs: open(MAP_DEVS, 8, 4)?,
            projects: open(MAP_PROJECTS, 16, 4)?,
            counters: open(MAP_COUNTERS, 16, 16)?,
            pin,
        }))
    }

    /// Guards `root` as a volume of project `projid`: its device and project
    /// are known ([`PinnedGuard::register_project`]), and the root's own
    /// entry is set. `fresh`: a new volume, whose project ID may have had
    /// counts under an earlier volume, which are dropped.
    pub fn register(&self, root: &RootKey, projid: u32, fresh: bool) -> io::Result<()> {
        self.register_project(root.dev, projid, fresh)?;
        self.roots
            .update(&root.to_bytes(), &root_value(projid), BPF_ANY)
            .map_err(|e| self.error("add the volume root", e))
    }

    /// Makes `projid` on `dev` a volume's project before the volume has a
    /// root: from then on no file outside the volumes can be given it by an
    /// unprivileged process (which would charge the new volume for it).
    /// `fresh` drops counts an earlier volume of that ID left.
    pub fn register_project(&self, dev: u64, projid: u32, fresh: bool) -> io::Result<()> {
        self.devs
            .update(&dev.to_ne_bytes(), &1u32.to_ne_bytes(), BPF_ANY)
            .map_err(|e| self.error("add the device", e))?;
        let project = project_key(dev, projid);
        self.projects
            .update(&project, &1u32.to_ne_bytes(), BPF_ANY)
            .map_err(|e| self.error(&format!("add project {projid}"), e))?;
        if fresh {
            self.counters
                .delete(&project)
                .map_err(|e| self.error(&format!("reset the counts of project {projid}"), e))?;
        }
        Ok(())
    }

    fn error(&self, what: &str, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!(
                "cannot {what} in the quota-escape guard's maps at {}: {e}",
                self.pin.display()
            ),
        )
    }

    /// Takes `root` out of the guard; `Ok(false)` when it was not in.
    pub fn unregister_root(&self, root: &RootKey) -> io::Result<bool> {
        self.roots.delete(&root.to_bytes()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot remove a volume root from the quota-escape guard's maps at {}: {e}",
                    self.pin.display()
                ),
            )
        })
    }

    /// Forgets that `projid` on `dev` is a volume's project (its volume is
    /// gone); `Ok(false)` when it was not known.
    pub fn forget_project(&self, dev: u64, projid: u32) -> io::Result<bool> {
        self.projects
            .delete(&project_key(dev, projid))
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot remove project {projid} from the quota-escape guard's maps at {}: {e}",
                        self.pin.display()
                    ),
                )
            })
    }

    /// The project ID the guard holds for `root`, if it holds the root.
    pub fn root_projid(&self, root: &RootKey) -> io::Result<Option<u32>> {
        let mut v = [0u8; 8];
        Ok(self
            .roots
            .lookup(&root.to_bytes(), &mut v)?
            .then(|| u32::from_ne_bytes([v[0], v[1], v[2], v[3]])))
    }

    /// The attempts the guard let through in project `projid` on `dev`
    /// since its counts last started over (0 when none was counted).
    pub fn allowed(&self, dev: u64, projid: u32) -> io::Result<u64> {
        let per_cpu = self
            .counters
            .lookup_per_cpu(&project_key(dev, projid))
            .map_err(|e| self.error(&format!("read the counts of project {projid}"), e))?;
        // `struct guard_counters`: allowed, then denied.
        Ok(per_cpu
            .unwrap_or_default()
            .iter()
            .map(|v| u64::from_ne_bytes(v[..8].try_into().expect("16-byte values")))
            .fold(0, u64::wrapping_add))
    }

    /// Whether `projid` on `dev` is known as a volume's project.
    pub fn knows_project(&self, dev: u64, projid: u32) -> io::Result<bool> {
        let mut v = [0u8; 4];
        self.projects.lookup(&project_key(dev, projid), &mut v)
    }
}

/// Why `dir` or a directory above it on the same filesystem (up to the
/// bpffs mount) cannot be trusted to hold the guard's pins, with the fix;
/// `None` when each is a directory root owns and only root may write.
/// Another user who may write one of them could have made what lies below
/// it before root did, or (without the sticky bit) swapped it for their
/// own: a pin root squatted so is a guard that never starts, or one whose
/// maps someone else chose.
pub fn untrusted_dirs(dir: &Path) -> io::Result<Option<String>> {
    let dir = std::fs::canonicalize(dir)?;
    let dev = std::fs::metadata(&dir)?.dev();
    for a in dir.ancestors() {
        let m = std::fs::metadata(a)?;
        if m.dev() != dev {
            break;
        }
        let mode = m.mode() & 0o7777;
        if !m.is_dir() {
            return Ok(Some(format!(
                "{} is not a directory: remove it and restart prjquota-exporter",
                a.display()
            )));
        }
        if m.uid() != 0 {
            return Ok(Some(format!(
                "{} is owned by uid {}, not root, so that user chose what is in it: remove it \
                 (rm -r {}) and restart prjquota-exporter",
                a.display(),
                m.uid(),
                a.display()
            )));
        }
        if mode & 0o022 != 0 {
            return Ok(Some(format!(
                "{} is writable by users other than root (mode {mode:o}), so one of them could \
                 have made or replaced the guard's pin root in it: make it writable by root \
                 only (chmod go-w {}; for a bpf filesystem mounted by another tool, mount it \
                 for root only: mount -t bpf -o mode=0700,nosuid,nodev,noexec bpf {}), or give \
                 --guard.pin-root in a directory only root may write, then restart \
                 prjquota-exporter",
                a.display(),
                a.display(),
                a.display()
            )));
        }
    }
    Ok(None)
}

/// The filesystem type (`f_type`) of `path`: [`BPF_FS_MAGIC`] for a pin
/// root both sides may use.
pub fn fs_type(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    #[allow(clippy::unnecessary_cast)] // __fsword_t is i64 on x86_64, i32 elsewhere
    Ok(sys::statfs(&c)?.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_escape_as_systemd_escape_does() {
        // As `systemd-escape --path` but for dots.
        assert_eq!(
            escape_path(Path::new("/opt/nomad/data/host_volumes")),
            "opt-nomad-data-host_volumes"
        );
        assert_eq!(escape_path(Path::new("/")), "-");
        assert_eq!(escape_path(Path::new("/a//b/")), "a-b");
        assert_eq!(
            escape_path(Path::new("/.hidden/x-y z")),
            "\\x2ehidden-x\\x2dy\\x20z"
        );
        assert_eq!(escape_path(Path::new("/v/a.b:c")), "v-a\\x2eb:c");
        assert_ne!(
            escape_path(Path::new("/a-b")),
            escape_path(Path::new("/a/b"))
        );
    }

    #[test]
    fn names_under_the_pin_root() {
        let root = Path::new("/sys/fs/bpf/prjquota");
        assert_eq!(
            link_of(root, Path::new("/v/a.b")),
            Path::new("/sys/fs/bpf/prjquota/v-a\\x2eb")
        );
        assert_eq!(
            owner_lock_of(root, Path::new("/v/a")),
            Path::new("/sys/fs/bpf/prjquota/@owner-v-a")
        );
        assert_eq!(link_pin("guard_file_ioctl"), "link-guard_file_ioctl");
        assert_eq!(linked_program("link-x"), Some("x"));
        assert_eq!(linked_program("roots"), None);
        assert!(is_lsm_program("guard_file_ioctl_compat_version"));
        assert!(is_lsm_program("guard_inode_file_setattr"));
        assert!(!is_lsm_program("guard_fileattr_set_exit"));
    }

    #[test]
    fn keys_have_the_c_layout() {
        let k = RootKey {
            dev: 0x0070_0001,
            ino: 0x1122_3344_5566_7788,
            gen: 0xdead_beef,
        };
        let b = k.to_bytes();
        assert_eq!(&b[..8], &0x0070_0001u64.to_ne_bytes());
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&b[16..20], &0xdead_beefu32.to_ne_bytes());
        assert_eq!(&b[20..], &[0; 4]);
        let p = project_key(7, 42);
        assert_eq!(&p[..8], &7u64.to_ne_bytes());
        assert_eq!(&p[8..12], &42u32.to_ne_bytes());
        assert_eq!(&p[12..], &[0; 4]);
    }

    #[test]
    fn devices_take_the_kernel_encoding() {
        // 7:1 (loop1) and 259:3 (an NVMe partition) as `stat` gives them.
        assert_eq!(kernel_dev(libc::makedev(7, 1)), Some((7 << 20) | 1));
        assert_eq!(kernel_dev(libc::makedev(259, 3)), Some((259 << 20) | 3));
        assert_eq!(kernel_dev(libc::makedev(1 << 12, 0)), None);
    }

    #[test]
    fn no_pin_root_is_no_guard_and_a_foreign_one_is_refused() {
        let missing = Path::new("/nonexistent/prjquota-pins");
        assert!(PinnedGuard::open_in(missing, Path::new("/v"))
            .unwrap()
            .is_none());
        // /tmp is world-writable: anyone could have planted what a create
        // would trust.
        let err = PinnedGuard::open_in(Path::new("/tmp"), Path::new("/v")).unwrap_err();
        assert!(err.to_string().contains("writable by root only"), "{err}");
    }

    #[test]
    fn a_directory_under_one_others_may_write_is_untrusted() {
        // Root's and 0755 all the way up (as the build image has it).
        assert_eq!(untrusted_dirs(Path::new("/usr/share")).unwrap(), None);
        let dir = Path::new("/tmp").join(format!("pins-chain-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let why = untrusted_dirs(&dir).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let why = why.expect("a directory in /tmp (1777) trusted");
        assert!(
            why.contains("/tmp is writable by users other than root (mode 1777)")
                && why.contains("chmod go-w /tmp"),
            "{why}"
        );
    }
}
