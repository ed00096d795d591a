//! The quota-escape guard: counts, and with the BPF LSM refuses, attempts to
//! move files out of a volume's project.
//!
//! A project quota only holds while the volume's files stay in its project.
//! `FS_IOC_FSSETXATTR` lets a file's owner (and root in a container without
//! user namespaces, through CAP_FOWNER) give a file another project ID, and
//! it or `FS_IOC_SETFLAGS` (`chattr -P`) can clear PROJINHERIT on a
//! directory; from then on those writes are not charged to the volume. The
//! kernel forbids it only from inside a user namespace.
//!
//! # What counts
//!
//! An *attempt* is a change of file attributes on an inode at or below a
//! volume root (the root included) that would set a project ID other than
//! the volume's, or leave a directory without PROJINHERIT, made by a caller
//! **without CAP_SYS_ADMIN in the initial user namespace** (the effective
//! capabilities `capable()` checks). Who is allowed, then: the plugin (it
//! runs as root for Nomad, with every capability, and needs CAP_SYS_ADMIN
//! for `quotactl` anyway) and host administrators; anyone who could unload
//! the guard. Who is not: file owners, root in a Docker container with the
//! default capabilities (no CAP_SYS_ADMIN), anything in a user namespace.
//! Privileged changes are allowed, not counted per volume, and reported as
//! events ([`GuardEvent::privileged`]) and in [`GuardCounters::privileged`].
//! Other attribute changes (`chattr +a`, extent size hints, …) and changes
//! outside every volume root are never attempts.
//!
//! # Modes
//!
//! - [`GuardMode::Auto`] (default): [`GuardMode::Enforce`] where the BPF LSM
//!   is active, else [`GuardMode::Detect`], decided by [`GuardMode::resolve`]
//!   before the load (the loads take the resolved mode).
//! - [`GuardMode::Detect`] (any kernel with BTF, 5.10 or later):
//!   `fexit/vfs_fileattr_set`, the function every attribute change ends in
//!   (5.13+), counts attempts per volume by outcome: *allowed* (the call
//!   succeeded) or *denied* (it failed, e.g. EPERM for a caller who does not
//!   own the file). Before 5.13, the same attempts are judged at the exit
//!   of `security_file_ioctl` and counted by the native ioctl system call's
//!   result; a 32-bit caller's `compat_ioctl(2)` goes uncounted there.
//! - [`GuardMode::Enforce`]: also a BPF LSM program on `file_ioctl` refuses
//!   attempts with EPERM, counted as denied. Needs the BPF LSM active
//!   (`bpf` in `/sys/kernel/security/lsm`; Debian's kernels have it). When
//!   it is not, or the program cannot attach, the guard runs in detect mode
//!   and [`Guard::not_enforcing`] says why.
//! - [`GuardMode::Off`]: nothing is loaded.
//!
//! # Builds
//!
//! Two builds of `src/bpf/guard.c`, chosen at load time by what the kernel
//! offers, never by its version ([`Guard::variant`]): `helpers`, whose walk
//! up the tree is a `bpf_loop` (5.17+) to [`GUARD_MAX_DEPTH`] dentries, and
//! `context` (built with `-DPRJQUOTA_COMPAT`), whose walk is a bounded loop
//! to [`GUARD_MAX_DEPTH_CONTEXT`] and which has the ioctl detect programs
//! for kernels without `vfs_fileattr_set`.
//!
//! # Limits
//!
//! - The LSM hook runs before the kernel copies the ioctl argument, so it
//!   reads the new attributes from user memory; another thread of the caller
//!   can change them in between. Such a race wins against enforcement, but
//!   not against detection: the fexit sees what the kernel applied and
//!   counts an *allowed* attempt (the alert fires).
//! - Volumes are found by walking up from the dentry the change was made
//!   through. A hard link or a rename to a directory outside every volume
//!   root on the same filesystem takes an inode out of that walk: keep the
//!   volumes filesystem free of directories workloads can write outside
//!   their volumes (Nomad's `host_volumes_dir` on its own filesystem).
//! - Past [`GUARD_MAX_DEPTH`] dentries ([`GUARD_MAX_DEPTH_CONTEXT`] in the
//!   context build) below a filesystem root that holds volumes, the volume
//!   is unknown: every project-ID set and every
//!   PROJINHERIT-less directory request there is an attempt (fail closed),
//!   counted in [`GuardCounters::walk_limit`].
//! - On kernels with `file_setattr(2)` (6.17+) that syscall does not go
//!   through `file_ioctl`: detected, not refused.
//!
//! # Use
//!
//! ```no_run
//! use prjquota_ebpf::guard::{Guard, GuardMode};
//!
//! let mut guard = Guard::load(GuardMode::Enforce).expect("guard");
//! if let Some(why) = guard.not_enforcing() {
//!     eprintln!("guard: detect only: {why}");
//! }
//! let (dev, ino, gen) = prjquota_ebpf::guard::root_identity("/srv/volumes/3f2a…".as_ref()).unwrap();
//! guard.set_roots(&[(dev, ino, gen, 10_000_001)]).unwrap();
//! let c = guard.read().unwrap();
//! println!("{:?}", c.project(dev, 10_000_001));
//! for e in guard.drain_events() {
//!     println!("{} (pid {}) {:?}", e.comm, e.pid, e.result);
//! }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{FExit, Lsm, ProgramError};
use aya::util::KernelVersion;
use aya::{Btf, Ebpf, EbpfLoader};

use crate::error::{chain, errno_of, map_err, named_map, named_map_mut, remove_ok};
use crate::loader::{
    classify, has_function, kernel_btf, object_error, one_load_at_a_time, recursion_misses,
};
pub use crate::raw::{GuardProject, GuardRawRoot as GuardRootValue, GuardRootKey};
use crate::raw::{GuardRawCounters as RawCounters, GuardRawRoot as RawRoot};
use crate::{
    kernel_dev, pins, FailureReason, LoadError, LoadOptions, ProgramFailure, RootsUpdate,
    TelemetryError, Variant,
};

/// Dentries the guard looks at: the changed inode's own, then its
/// ancestors. See the module's *Limits*.
pub const GUARD_MAX_DEPTH: u32 = 4096;

/// [`GUARD_MAX_DEPTH`] of the context build (no `bpf_loop`): every level of
/// its bounded loop costs the verifier instructions, so it is lower.
pub const GUARD_MAX_DEPTH_CONTEXT: u32 = 1024;

/// Where the kernel lists the active LSMs.
pub const LSM_LIST: &str = "/sys/kernel/security/lsm";

// Default map sizes (the same as the write telemetry's: [`LoadOptions`]).
#[cfg(test)]
const MAX_ROOTS: u32 = 16384;
#[cfg(test)]
const MAX_VOLUMES: u32 = 16384;
#[cfg(test)]
const MAX_DEVS: u32 = 64;
#[cfg(test)]
const EVENTS_BYTES: u32 = 262_144;

const GSTAT_EVENTS_LOST: u32 = 0;
const GSTAT_PRIVILEGED: u32 = 1;
const GSTAT_WALK_LIMIT_ALLOWED: u32 = 2;
const GSTAT_WALK_LIMIT_DENIED: u32 = 3;
const GSTAT_UNREADABLE: u32 = 4;
const GSTAT_MAP_FULL: u32 = 5;
const N_GSTATS: u32 = 6;

const GUARD_ALLOWED: u8 = 0;
const GUARD_SRC_LSM: u8 = 1;
const GUARD_WHAT_PROJID: u8 = 1;
const GUARD_WHAT_NOINHERIT: u8 = 2;
const GUARD_WHAT_UNREADABLE: u8 = 4;
const GUARD_WHAT_FOREIGN_PROJID: u8 = 8;
const GUARD_WHAT_GENERATION: u8 = 16;
const GUARD_WHERE_OUTSIDE: u32 = 1;
const GUARD_WHERE_VOLUME: u32 = 2;
#[cfg(test)]
const GUARD_WHERE_WALK_LIMIT: u32 = 3;
/// `sizeof(struct guard_event)`.
const EVENT_SIZE: usize = 80;

const MAP_ROOTS: &str = "guard_roots";
const MAP_ROOT_DEVS: &str = "guard_root_devs";
const MAP_PROJECTS: &str = "guard_projects";
const MAP_COUNTERS: &str = "guard_counters";
const MAP_STATS: &str = "guard_stats";
const MAP_EVENTS: &str = "guard_events";

const COMPONENT: &str = "quota-escape guard";

/// The detecting fexit programs: `hook` judges the request, and with the
/// parts after it (if any) counts its result.
#[derive(Clone, Copy, Debug)]
struct Detect {
    hook: &'static str,
    /// Attached in this order, all or nothing.
    parts: &'static [DetectPart],
}

#[derive(Debug)]
struct DetectPart {
    prog: &'static str,
    /// The functions it can trace, the first the kernel's BTF has.
    funcs: &'static [&'static str],
}

/// Every attribute change ends in vfs_fileattr_set (5.13+).
const DETECT_FILEATTR: Detect = Detect {
    hook: "vfs_fileattr_set",
    parts: &[DetectPart {
        prog: "guard_fileattr_set_exit",
        funcs: &["vfs_fileattr_set"],
    }],
};
/// Before 5.13 (context build only): the ioctl judged at the exit of
/// security_file_ioctl, counted at the exit of the native system call (a
/// 32-bit caller's goes uncounted). The exit first: no judgement is kept
/// without a program to take it.
const DETECT_IOCTL: Detect = Detect {
    hook: "security_file_ioctl",
    parts: &[
        DetectPart {
            prog: "guard_sys_ioctl_exit",
            funcs: &["__x64_sys_ioctl", "__arm64_sys_ioctl"],
        },
        DetectPart {
            prog: "guard_ioctl_judge",
            funcs: &["security_file_ioctl"],
        },
    ],
};

/// An LSM hook the guard enforces through, and its programs in the order
/// tried: sleepable first (bpf_copy_from_user faults the argument in), then
/// the plain one.
struct Enforcer {
    hook: &'static str,
    /// `(program, section)`.
    variants: &'static [(&'static str, &'static str)],
}

/// 6.17+: one hook inside vfs_fileattr_set sees every path (ioctl, compat
/// ioctl, file_setattr(2)) with the request already in kernel memory.
const FILEATTR: Enforcer = Enforcer {
    hook: "inode_file_setattr",
    variants: &[("guard_inode_file_setattr", "lsm/inode_file_setattr")],
};
/// Before 6.17: the ioctl, native ...
const IOCTL: Enforcer = Enforcer {
    hook: "file_ioctl",
    variants: &[
        ("guard_file_ioctl_sleepable", "lsm.s/file_ioctl"),
        ("guard_file_ioctl", "lsm/file_ioctl"),
    ],
};
/// ... and 32-bit (6.8+ and its stable backports; before it, compat
/// ioctls reach file_ioctl with the compat command number, which the
/// program knows).
const IOCTL_COMPAT: Enforcer = Enforcer {
    hook: "file_ioctl_compat",
    variants: &[
        (
            "guard_file_ioctl_compat_sleepable",
            "lsm.s/file_ioctl_compat",
        ),
        ("guard_file_ioctl_compat", "lsm/file_ioctl_compat"),
    ],
};
/// 6.17+, beside [`FILEATTR`]: the inode generation is set by ioctls that
/// never reach `vfs_fileattr_set` (`FS_IOC_SETVERSION`, ext4's own and
/// their 32-bit twins), and the guard keys roots by it. Before 6.17,
/// [`IOCTL`] and [`IOCTL_COMPAT`] judge them with the rest.
const VERSION: Enforcer = Enforcer {
    hook: "file_ioctl",
    variants: &[("guard_file_ioctl_version", "lsm/file_ioctl")],
};
const VERSION_COMPAT: Enforcer = Enforcer {
    hook: "file_ioctl_compat",
    variants: &[("guard_file_ioctl_compat_version", "lsm/file_ioctl_compat")],
};
/// Whether `prog` (a link pin's `link-<prog>` name) is one of the guard's
/// BPF LSM programs: a pinned guard holding one refuses changes.
pub fn is_lsm_program(prog: &str) -> bool {
    [FILEATTR, IOCTL, IOCTL_COMPAT, VERSION, VERSION_COMPAT]
        .iter()
        .any(|e| e.variants.iter().any(|&(p, _)| p == prog))
}

/// The oldest kernel the guard is built and tested for (fexit 5.5, the
/// BPF ring buffer 5.8; Debian 11's 5.10 is the oldest tested). Which build
/// and which hooks load above it is probed, not read from the version.
const MIN_KERNEL: (u8, u8) = (5, 10);

/// Events returned by one [`Guard::drain_events`] at most (the rest stay
/// in the ring buffer for the next call).
pub const MAX_EVENTS_PER_DRAIN: usize = 16_384;

/// The compiled `src/bpf/guard.c` of a build, 8-byte aligned as ELF
/// parsing wants.
fn object(variant: Variant) -> &'static [u8] {
    match variant {
        Variant::Helpers => aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.o")),
        Variant::Context => {
            aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard_compat.o"))
        }
    }
}

/// Which build runs on this kernel, and its detect program: the helpers
/// build where the kernel has `bpf_loop` (a helper probe) and
/// `vfs_fileattr_set` (its BTF), else the context build, on
/// `vfs_fileattr_set` where the BTF has it and on the ioctl before.
fn choose(btf: &Btf) -> (Variant, Detect) {
    let fileattr = has_function(btf, DETECT_FILEATTR.hook);
    let bpf_loop = aya::sys::is_helper_supported(
        aya::programs::ProgramType::KProbe,
        aya::sys::BpfHelper::BPF_FUNC_loop,
    )
    .unwrap_or(false);
    match (fileattr, bpf_loop) {
        (true, true) => (Variant::Helpers, DETECT_FILEATTR),
        (true, false) => (Variant::Context, DETECT_FILEATTR),
        (false, _) => (Variant::Context, DETECT_IOCTL),
    }
}

/// What the guard does (the exporter's `--guard` flag: `auto`, `off`,
/// `detect`, `enforce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GuardMode {
    /// Load nothing.
    Off,
    /// Count attempts by outcome; refuse nothing.
    Detect,
    /// Count, and refuse attempts with EPERM (needs the BPF LSM; falls back
    /// to [`GuardMode::Detect`] without it).
    Enforce,
    /// [`GuardMode::Enforce`] where the BPF LSM is active, else
    /// [`GuardMode::Detect`]: [`GuardMode::resolve`] decides before the
    /// load. A project-ID change by an unprivileged caller inside a volume
    /// is never legitimate, so refusing is the default wherever the kernel
    /// can.
    #[default]
    Auto,
}

impl GuardMode {
    /// The modes a guard can be in (what `auto` resolves to, and off).
    pub const ALL: [GuardMode; 3] = [GuardMode::Off, GuardMode::Detect, GuardMode::Enforce];

    pub fn label(self) -> &'static str {
        match self {
            GuardMode::Off => "off",
            GuardMode::Detect => "detect",
            GuardMode::Enforce => "enforce",
            GuardMode::Auto => "auto",
        }
    }

    /// The mode to load for this requested mode, given whether the BPF LSM
    /// is active ([`bpf_lsm_active`]): `auto` becomes enforce where it is,
    /// and detect, with the reason, where it is not or cannot be told.
    /// Other modes load as asked (enforce without the LSM is refused by the
    /// load's [`Guard::not_enforcing`], not here).
    pub fn resolve(
        self,
        lsm: Result<(bool, String), io::Error>,
    ) -> (GuardMode, Option<NotEnforcing>) {
        match (self, lsm) {
            (GuardMode::Auto, Ok((true, _))) => (GuardMode::Enforce, None),
            (GuardMode::Auto, Ok((false, active))) => (
                GuardMode::Detect,
                Some(NotEnforcing::LsmInactive { active }),
            ),
            (GuardMode::Auto, Err(source)) => {
                (GuardMode::Detect, Some(NotEnforcing::LsmUnknown { source }))
            }
            (m, _) => (m, None),
        }
    }
}

impl FromStr for GuardMode {
    type Err = String;
    fn from_str(s: &str) -> Result<GuardMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(GuardMode::Auto),
            "off" => Ok(GuardMode::Off),
            "detect" => Ok(GuardMode::Detect),
            "enforce" => Ok(GuardMode::Enforce),
            _ => Err(format!(
                "unknown guard mode `{s}` (want auto, off, detect or enforce)"
            )),
        }
    }
}

impl fmt::Display for GuardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why [`GuardMode::Enforce`] runs as detect.
#[derive(Debug)]
pub enum NotEnforcing {
    /// The BPF LSM is built in but not in the kernel's active list (boot
    /// parameter `lsm=`): its programs would load and never run.
    LsmInactive { active: String },
    /// `/sys/kernel/security/lsm` could not be read (securityfs not
    /// mounted?), so whether the BPF LSM runs is unknown.
    LsmUnknown { source: io::Error },
    /// The LSM program did not load or attach (each variant's failure).
    Program { failures: Vec<ProgramFailure> },
}

impl NotEnforcing {
    /// A bounded label: `lsm_inactive`, `lsm_unknown`, or the programs'
    /// shared [`FailureReason::label`] (`permission`, `verifier`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            NotEnforcing::LsmInactive { .. } => "lsm_inactive",
            NotEnforcing::LsmUnknown { .. } => "lsm_unknown",
            NotEnforcing::Program { failures } => {
                let mut reasons = failures.iter().map(|f| f.reason);
                match reasons.next() {
                    Some(first) if reasons.all(|r| r == first) => first.label(),
                    _ => "other",
                }
            }
        }
    }
}

impl fmt::Display for NotEnforcing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotEnforcing::LsmInactive { active } => write!(
                f,
                "the BPF LSM is not active ({LSM_LIST} lists `{active}`): add `bpf` to the \
                 kernel's `lsm=` boot parameter to enforce; detecting only"
            ),
            NotEnforcing::LsmUnknown { source } => write!(
                f,
                "cannot tell whether the BPF LSM is active ({LSM_LIST}: {source}; is securityfs \
                 mounted?); detecting only"
            ),
            NotEnforcing::Program { failures } => {
                f.write_str("the BPF LSM program could not be attached; detecting only: ")?;
                for (i, p) in failures.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

/// Whether the BPF LSM is in the kernel's list of active LSMs.
pub fn bpf_lsm_active() -> Result<(bool, String), io::Error> {
    let list = std::fs::read_to_string(LSM_LIST)?;
    let list = list.trim().to_string();
    Ok((list.split(',').any(|l| l == "bpf"), list))
}

/// Attempts by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// The change went through: the file (or the directory's new files)
    /// left the volume's project.
    pub allowed: u64,
    /// The change failed: refused by the guard (enforce) or by the kernel
    /// (e.g. EPERM for a caller who does not own the file).
    pub denied: u64,
}

impl Outcomes {
    pub fn total(&self) -> u64 {
        self.allowed + self.denied
    }

    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &Outcomes) -> Outcomes {
        Outcomes {
            allowed: self.allowed.saturating_sub(earlier.allowed),
            denied: self.denied.saturating_sub(earlier.denied),
        }
    }
}

/// A snapshot of the guard's counters (cumulative since load).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardCounters {
    /// Per `(device in the kernel's encoding, project ID)`: every volume
    /// project in the guard (zeros until the first attempt), and any other
    /// with counts. Attempts inside a volume count against its project;
    /// outside every volume, against the project asked for.
    pub projects: BTreeMap<(u64, u32), Outcomes>,
    /// Attempts past [`GUARD_MAX_DEPTH`] on a volume filesystem (volume
    /// unknown).
    pub walk_limit: Outcomes,
    /// Project changes below a volume root by privileged callers (allowed,
    /// not attempts).
    pub privileged: u64,
    /// Refused because the LSM could not read the new attributes (also
    /// counted as denied attempts).
    pub unreadable: u64,
    /// Events dropped because the ring buffer was full (drain more often).
    pub events_lost: u64,
    /// Attempts on a volume the counters map had no room for (counted here,
    /// never lost).
    pub map_full: u64,
    /// Runs of the detecting fexit program the kernel skipped since it was
    /// loaded (`recursion_misses`, Linux 5.12+; `None` where the kernel does
    /// not report it): each an attribute change neither counted nor logged.
    /// A tracing program is not re-entered on a CPU where it already runs,
    /// and on a preemptible kernel (Debian's 7.x) a task preempted inside
    /// it makes another task's change on that CPU go unseen. Refusals do
    /// not depend on it: LSM programs are not skipped so.
    pub missed_runs: Option<u64>,
}

impl GuardCounters {
    /// The attempts against project `projid` on device `st_dev` (as `stat`
    /// gives it; zeros if unknown).
    pub fn project(&self, st_dev: u64, projid: u32) -> Outcomes {
        kernel_dev(st_dev)
            .and_then(|d| self.projects.get(&(d, projid)))
            .copied()
            .unwrap_or_default()
    }
}

/// Where the inode of an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// At or below a volume root.
    Volume,
    /// Outside every volume root, on a device that holds volumes.
    Outside,
    /// Deeper than [`GUARD_MAX_DEPTH`] below the filesystem's root without
    /// a volume root found.
    Unknown,
}

/// The outcome of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allowed,
    Denied,
}

impl Outcome {
    /// The `result` label value: `allowed`, `denied`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
        }
    }
}

/// Which program saw an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventSource {
    /// The detecting fexit (`vfs_fileattr_set`, or the ioctl system call
    /// before 5.13): the kernel's own outcome.
    Fileattr,
    /// The LSM program: refused by the guard.
    Lsm,
}

/// One attempt (or one privileged project change), as the kernel saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardEvent {
    /// Process (thread group) ID.
    pub pid: u32,
    pub tid: u32,
    /// Real uid, as the initial user namespace sees it.
    pub uid: u32,
    pub comm: String,
    /// cgroup v2 ID of the caller (the inode number of its cgroup directory
    /// under /sys/fs/cgroup: `find /sys/fs/cgroup -inum <id>`).
    pub cgroup_id: u64,
    /// Where the inode is.
    pub place: Place,
    pub result: Outcome,
    pub source: EventSource,
    /// The caller has CAP_SYS_ADMIN in the initial user namespace: allowed,
    /// not counted as an attempt.
    pub privileged: bool,
    /// Sets a project ID other than the volume's.
    pub changes_project: bool,
    /// Leaves a directory without PROJINHERIT.
    pub clears_inherit: bool,
    /// The LSM could not read the new attributes (refused).
    pub unreadable: bool,
    /// Outside every volume: gives a file a volume's project ID.
    pub joins_project: bool,
    /// Sets the inode generation (`FS_IOC_SETVERSION` and its twins):
    /// on a root, it would take the volume out of the guard's key.
    pub sets_generation: bool,
    /// The requested project ID (`FS_IOC_FSSETXATTR`), else the file's.
    pub projid: u32,
    /// The volume's project ID (outside every volume: the project asked
    /// for).
    pub volume_projid: u32,
    /// Requested `fsx_xflags` (from `FS_IOC_SETFLAGS`: PROJINHERIT only).
    pub xflags: u32,
    /// The errno the caller got (`None`: success).
    pub errno: Option<i32>,
    /// The ioctl command (LSM events, and detect events before 5.13), else 0.
    pub cmd: u32,
    /// `st_dev` (userspace encoding) and inode number of the changed inode.
    pub st_dev: u64,
    pub ino: u64,
}

impl GuardEvent {
    /// Parses one `struct guard_event` record.
    fn parse(b: &[u8]) -> Option<GuardEvent> {
        if b.len() < EVENT_SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let comm = &b[64..80];
        let end = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
        let dev = u64_at(16);
        let place = match u32_at(36) {
            GUARD_WHERE_VOLUME => Place::Volume,
            GUARD_WHERE_OUTSIDE => Place::Outside,
            _ => Place::Unknown,
        };
        let ret = u32_at(52) as i32;
        let what = b[58];
        Some(GuardEvent {
            cgroup_id: u64_at(0),
            ino: u64_at(8),
            st_dev: libc::makedev((dev >> 20) as u32, (dev & 0xf_ffff) as u32),
            pid: u32_at(24),
            tid: u32_at(28),
            uid: u32_at(32),
            place,
            projid: u32_at(40),
            volume_projid: u32_at(44),
            xflags: u32_at(48),
            errno: (ret < 0).then_some(-ret),
            result: if b[56] == GUARD_ALLOWED {
                Outcome::Allowed
            } else {
                Outcome::Denied
            },
            source: if b[57] == GUARD_SRC_LSM {
                EventSource::Lsm
            } else {
                EventSource::Fileattr
            },
            changes_project: what & GUARD_WHAT_PROJID != 0,
            clears_inherit: what & GUARD_WHAT_NOINHERIT != 0,
            unreadable: what & GUARD_WHAT_UNREADABLE != 0,
            joins_project: what & GUARD_WHAT_FOREIGN_PROJID != 0,
            sets_generation: what & GUARD_WHAT_GENERATION != 0,
            privileged: b[59] != 0,
            cmd: u32_at(60),
            comm: String::from_utf8_lossy(&comm[..end]).into_owned(),
        })
    }

    /// What the caller tried, in a few words (for a log line).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.changes_project {
            parts.push(format!(
                "set project ID {} (the volume's is {})",
                self.projid, self.volume_projid
            ));
        }
        if self.clears_inherit {
            parts.push("clear PROJINHERIT on a directory".to_string());
        }
        if self.unreadable {
            parts.push("change attributes (argument unreadable)".to_string());
        }
        if self.sets_generation {
            parts.push(
                "set the inode generation (on a volume root: hides it from the guard)".to_string(),
            );
        }
        if self.joins_project {
            parts.push(format!(
                "give a file outside every volume the volume project ID {}",
                self.projid
            ));
        }
        parts.join(" and ")
    }
}

/// The identity the guard keys a root by: `(st_dev, st_ino, generation)`
/// of the directory at `path` (not following a symlink).
pub fn root_identity(path: &Path) -> io::Result<(u64, u64, u32)> {
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    root_identity_of(dir.as_fd())
}

/// [`root_identity`] of an open directory.
pub fn root_identity_of(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, u32)> {
    let f = std::fs::File::from(fd.try_clone_to_owned()?);
    let m = f.metadata()?;
    Ok((m.dev(), m.ino(), prjquota_core::sys::inode_generation(fd)?))
}

/// The keys in the guard's maps at one moment ([`Guard::snapshot`]): a
/// sync deletes only what was there before it read the registry, never an
/// entry the plugin added since.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    roots: HashSet<GuardRootKey>,
    projects: HashSet<GuardProject>,
}

/// How the guard came to be pinned ([`Guard::load_pinned`]).
#[derive(Debug)]
pub struct Pinned {
    /// The pin directory (`<pin root>/@guard-<unique>`).
    pub dir: PathBuf,
    /// Programs whose links are pinned there.
    pub links: Vec<&'static str>,
    /// The pin directories of earlier starts removed, with their pin count.
    pub removed: pins::Removed,
}

/// The loaded guard. Counters are cumulative from load; a project that
/// leaves the guard loses its counters.
pub struct Guard {
    ebpf: Ebpf,
    variant: Variant,
    detect: Detect,
    events: RingBuf<MapData>,
    requested: GuardMode,
    /// The attached LSM programs' sections, when enforcing.
    lsm: Vec<&'static str>,
    not_enforcing: Option<NotEnforcing>,
    max_roots: u32,
    /// The pinned links' descriptors, kept after pinning: while this
    /// process runs its programs stay attached even when someone removes
    /// their pins, and [`Guard::repin`] can pin them again. Two per
    /// program: pinning consumes one, which a failed pin would close.
    held: Vec<(&'static str, FdLink, Option<FdLink>)>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("variant", &self.variant)
            .field("detect", &self.detect)
            .field("requested", &self.requested)
            .field("lsm", &self.lsm)
            .field("not_enforcing", &self.not_enforcing)
            .finish_non_exhaustive()
    }
}

/// An attached program: `(program name, link)` before its link is pinned.
type Attached = Vec<(&'static str, LinkId)>;

enum LinkId {
    FExit(aya::programs::fexit::FExitLinkId),
    Lsm(aya::programs::lsm::LsmLinkId),
}

impl Guard {
    /// `None` for [`GuardMode::Off`], else [`Guard::load`].
    pub fn start(mode: GuardMode, opts: &LoadOptions) -> Result<Option<Guard>, LoadError> {
        match mode {
            GuardMode::Off => Ok(None),
            m => Guard::load_with(m, opts).map(Some),
        }
    }

    /// Loads and attaches the guard. Fails (never panics) when the detect
    /// program cannot run: no BTF, no bpf(2), fexit refused (as on the
    /// development host), kernel too old. [`GuardMode::Enforce`] without a
    /// usable BPF LSM succeeds in detect mode: see [`Guard::not_enforcing`].
    /// [`GuardMode::Off`] is an error here (use [`Guard::start`]). The
    /// programs stay attached while the `Guard` lives, and no longer.
    pub fn load(mode: GuardMode) -> Result<Guard, LoadError> {
        Guard::load_with(mode, &LoadOptions::default())
    }

    /// [`Guard::load`] with map sizes from `opts` (`require_all` is unused).
    pub fn load_with(mode: GuardMode, opts: &LoadOptions) -> Result<Guard, LoadError> {
        one_load_at_a_time(|| Guard::load_attach(mode, opts, None, &mut |_| {}).map(|(g, _)| g))
    }

    /// Loads the guard pinned under `pin_root` for `volumes_dirs` (see
    /// [`crate::pins`]): fresh maps pinned in a new directory, `fill`
    /// called to put the registry's roots in, the programs attached and
    /// their links pinned there, and only then every volumes directory's
    /// symlink swapped to it; `fill` once more for the roots the plugin
    /// wrote into the maps the symlinks led to until the swap, then the
    /// directories they pointed at before removed. The programs stay
    /// attached after the `Guard` (and the process) is gone. A start that
    /// fails or dies before its swap leaves the guard before it in force.
    ///
    /// The second value says how pinning went: `Err` (the guard runs,
    /// attached to this process at least, and earlier pins are left in
    /// place) with what failed.
    pub fn load_pinned(
        mode: GuardMode,
        opts: &LoadOptions,
        pin_root: &Path,
        volumes_dirs: &[PathBuf],
        fill: &mut dyn FnMut(&mut Guard),
    ) -> Result<(Guard, Result<Pinned, String>), LoadError> {
        one_load_at_a_time(|| {
            Guard::load_attach(mode, opts, Some((pin_root, volumes_dirs)), fill)
                .map(|(g, p)| (g, p.expect("pinned load")))
        })
    }

    fn load_attach(
        mode: GuardMode,
        opts: &LoadOptions,
        pin: Option<(&Path, &[PathBuf])>,
        fill: &mut dyn FnMut(&mut Guard),
    ) -> Result<(Guard, Option<Result<Pinned, String>>), LoadError> {
        if mode == GuardMode::Off {
            return Err(LoadError::BpfUnavailable {
                errno: None,
                detail: "the quota-escape guard is off (--guard=off): nothing to load".into(),
            });
        }
        let (loader, btf) = kernel_btf()?;
        let (variant, detect) = match opts.variant {
            // A build asked for (tests): its detect hook as probed.
            Some(Variant::Context) => (Variant::Context, choose(&btf).1),
            Some(Variant::Helpers) => (Variant::Helpers, DETECT_FILEATTR),
            None => choose(&btf),
        };
        if let Some(f) = too_old(
            detect.hook,
            &format!("fexit/{} ({} build)", detect.hook, variant.as_str()),
        ) {
            return Err(LoadError::NoProgram {
                component: COMPONENT,
                failures: vec![f],
            });
        }
        // Attach first, swap last: until the symlinks point at the new pin
        // directory, the plugin writes new roots into the guard that runs
        // now, so a start that fails or is killed at any step leaves that
        // guard in force. The new one runs beside it from its attach on.
        let mut pinning: Option<Result<PathBuf, String>> = None;
        if let Some((root, _)) = pin {
            pinning = Some(
                pins::ensure_root(root)
                    .and_then(|()| pins::new_dir(root))
                    .map_err(|e| e.to_string()),
            );
        }
        let dir = pinning.as_ref().and_then(|p| p.as_ref().ok()).cloned();
        let mut g = Guard::open(loader, &btf, opts, mode, variant, detect, dir.as_deref())?;
        // A directory left by a start that stops before its swap holds no
        // symlink's target: `pins::remove_unused` takes it as an orphan.
        let abandon = |pinning: &mut Option<Result<PathBuf, String>>, why: String| {
            if let Some(Ok(d)) = pinning.take() {
                let _ = pins::remove_dir(&d);
            }
            *pinning = Some(Err(why));
        };
        if let Some(d) = &dir {
            if let Err(e) = g.pin_maps(d) {
                abandon(&mut pinning, e);
            }
        }
        fault_point("pinned-maps");
        fill(&mut g);
        fault_point("filled");
        let mut attached: Attached = Vec::new();
        match load_detect(&mut g.ebpf, &btf, detect) {
            Ok(links) => attached.extend(links.into_iter().map(|(p, id)| (p, LinkId::FExit(id)))),
            Err((part, e)) => {
                let (reason, detail) = classify(&e);
                if let Some(Ok(d)) = &pinning {
                    let _ = pins::remove_dir(d);
                }
                return Err(LoadError::NoProgram {
                    component: COMPONENT,
                    failures: vec![ProgramFailure {
                        program: detect.hook,
                        part: format!("{part} ({} build)", variant.as_str()),
                        reason,
                        detail,
                    }],
                });
            }
        }
        if mode == GuardMode::Enforce {
            match attach_enforcement(&mut g.ebpf, &btf) {
                Ok(progs) => {
                    g.lsm = progs.iter().map(|(_, section, _)| *section).collect();
                    attached.extend(progs.into_iter().map(|(p, _, id)| (p, LinkId::Lsm(id))));
                }
                Err(why) => {
                    // The exporter refuses to start without enforcement: a
                    // guard pinned before this start (one that enforces)
                    // must go on, not give way to this detect-only one.
                    if matches!(pinning, Some(Ok(_))) {
                        abandon(
                            &mut pinning,
                            format!(
                                "not pinned: enforcement did not attach ({why}), so the guard \
                                 pinned before this start, if any, stays in place"
                            ),
                        );
                    }
                    g.not_enforcing = Some(why);
                }
            }
        }
        fault_point("attached");
        let Some((root, volumes_dirs)) = pin else {
            return Ok((g, None));
        };
        let d = match pinning.expect("set when pinning") {
            Err(e) => return Ok((g, Some(Err(e)))),
            Ok(d) => d,
        };
        let result = g.pin_links(&d, attached).and_then(|links| {
            fault_point("links-pinned");
            // From here the new programs run without this process: only
            // now may the plugin be sent to their maps.
            let swapped = pins::swap_links(root, volumes_dirs, &d).map_err(|e| {
                format!(
                    "the guard is attached and pinned in {}, but the volumes directories' \
                     symlinks could not be pointed at it (the guard before, if any, goes on \
                     beside it): {e}",
                    d.display()
                )
            })?;
            fault_point("swapped");
            // Roots the plugin wrote into the maps the symlinks led to
            // before the swap. The registry again rather than a copy of
            // those maps: the plugin stores a volume's record before it
            // writes the root, so the registry holds all of them, and a
            // round also takes out what a delete removed meanwhile.
            fill(&mut g);
            fault_point("refilled");
            let removed = pins::remove_unused(root, &swapped.previous(), &d).map_err(|e| {
                format!(
                    "the guard is pinned in {}, but the pins of an earlier start could not be \
                     removed: {e}",
                    d.display()
                )
            })?;
            Ok(Pinned {
                dir: d,
                links,
                removed,
            })
        });
        Ok((g, Some(result)))
    }

    /// Parses the object and creates its maps, attaching nothing; with
    /// `pin_events`, the ring buffer is pinned there before it is taken.
    #[allow(clippy::too_many_arguments)]
    fn open<'a>(
        mut loader: EbpfLoader<'a>,
        btf: &'a Btf,
        opts: &LoadOptions,
        requested: GuardMode,
        variant: Variant,
        detect: Detect,
        pin_events: Option<&Path>,
    ) -> Result<Guard, LoadError> {
        let mut ebpf = loader
            .btf(Some(btf))
            .map_max_entries(MAP_COUNTERS, opts.max_volumes)
            .map_max_entries(MAP_PROJECTS, opts.max_volumes)
            .map_max_entries(MAP_ROOTS, opts.max_roots)
            .load(object(variant))
            .map_err(|e| object_error(COMPONENT, e))?;
        if let Some(dir) = pin_events {
            // A failure shows when the other maps are pinned, in the same
            // directory: pin_maps checks this one is there.
            if let Some(m) = ebpf.map(MAP_EVENTS) {
                let _ = m.pin(dir.join(pin_name(MAP_EVENTS)));
            }
        }
        let events = ebpf
            .take_map(MAP_EVENTS)
            .ok_or_else(|| LoadError::BpfUnavailable {
                errno: None,
                detail: format!("the guard object has no `{MAP_EVENTS}` map"),
            })
            .and_then(|m| {
                RingBuf::try_from(m).map_err(|e| LoadError::BpfUnavailable {
                    errno: errno_of(&e),
                    detail: format!("the guard's ring buffer: {}", chain(&e)),
                })
            })?;
        Ok(Guard {
            ebpf,
            variant,
            detect,
            events,
            requested,
            lsm: Vec::new(),
            not_enforcing: None,
            max_roots: opts.max_roots,
            held: Vec::new(),
        })
    }

    fn pin_maps(&self, dir: &Path) -> Result<(), String> {
        for (map, name) in pins::MAP_PINS {
            let path = dir.join(name);
            if map == MAP_EVENTS {
                if !path.exists() {
                    return Err(format!(
                        "cannot pin the guard's map {map} at {}",
                        path.display()
                    ));
                }
                continue;
            }
            let m = self.map(map).map_err(|e| e.to_string())?;
            m.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's map {map} at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
        }
        Ok(())
    }

    fn pin_links(&mut self, dir: &Path, attached: Attached) -> Result<Vec<&'static str>, String> {
        let mut pinned = Vec::new();
        for (prog, id) in attached {
            let path = dir.join(format!("{}{prog}", pins::LINK_PREFIX));
            let p = self
                .ebpf
                .program_mut(prog)
                .ok_or_else(|| format!("no program {prog}"))?;
            let link: FdLink = match id {
                LinkId::FExit(id) => <&mut FExit>::try_from(p)
                    .and_then(|p| p.take_link(id))
                    .map_err(|e| format!("{prog}: {}", chain(&e)))?
                    .into(),
                LinkId::Lsm(id) => <&mut Lsm>::try_from(p)
                    .and_then(|p| p.take_link(id))
                    .map_err(|e| format!("{prog}: {}", chain(&e)))?
                    .into(),
            };
            // Dropping the returned handle closes this process's file
            // descriptor; the pin keeps the program attached.
            let link = link.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's link {prog} at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
            let spare = PinnedLink::from_pin(&path).ok().map(FdLink::from);
            self.held.push((prog, FdLink::from(link), spare));
            pinned.push(prog);
        }
        Ok(pinned)
    }

    /// Pins again, in `dir` (made when missing), whatever of this guard's
    /// maps and links is missing there: someone removed its pins while it
    /// runs. Returns the names pinned.
    pub fn repin(&mut self, dir: &Path) -> Result<Vec<String>, String> {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
        let mut done = Vec::new();
        for (map, name) in pins::MAP_PINS {
            let path = dir.join(name);
            if path.exists() {
                continue;
            }
            let r = if map == MAP_EVENTS {
                self.events
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| e.to_string())
                    .and_then(|fd| MapData::from_fd(fd).map_err(|e| chain(&e)))
                    .and_then(|m| m.pin(&path).map_err(|e| chain(&e)))
            } else {
                self.map(map)
                    .map_err(|e| e.to_string())
                    .and_then(|m| m.pin(&path).map_err(|e| chain(&e)))
            };
            r.map_err(|e| {
                format!(
                    "cannot pin the guard's map {map} again at {}: {e}",
                    path.display()
                )
            })?;
            done.push(name.to_string());
        }
        for (prog, _, spare) in &mut self.held {
            let path = dir.join(format!("{}{prog}", pins::LINK_PREFIX));
            if path.exists() {
                continue;
            }
            let Some(link) = spare.take() else {
                return Err(format!(
                    "cannot pin the guard's link {prog} again at {}: a pin failed before; restart                      the exporter to pin a new guard",
                    path.display()
                ));
            };
            let link = link.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's link {prog} again at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
            *spare = Some(FdLink::from(link));
            done.push(format!("{}{prog}", pins::LINK_PREFIX));
        }
        Ok(done)
    }

    /// Which build of the programs is loaded (`helpers` or `context`).
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The function whose exit judges a change: `vfs_fileattr_set`, or
    /// `security_file_ioctl` on kernels without it (before 5.13).
    pub fn detect_hook(&self) -> &'static str {
        self.detect.hook
    }

    /// The mode asked for.
    pub fn requested_mode(&self) -> GuardMode {
        self.requested
    }

    /// The mode in force: [`GuardMode::Enforce`] only while the LSM program
    /// is attached.
    pub fn mode(&self) -> GuardMode {
        if self.enforcing() {
            GuardMode::Enforce
        } else {
            GuardMode::Detect
        }
    }

    /// Whether attempts are refused.
    pub fn enforcing(&self) -> bool {
        !self.lsm.is_empty()
    }

    /// Why enforcement was asked for and is not in force.
    pub fn not_enforcing(&self) -> Option<&NotEnforcing> {
        self.not_enforcing.as_ref()
    }

    /// The attached LSM programs' sections (e.g. `lsm/inode_file_setattr`,
    /// or `lsm.s/file_ioctl` and `lsm.s/file_ioctl_compat`), when enforcing.
    pub fn lsm_programs(&self) -> &[&'static str] {
        &self.lsm
    }

    /// The keys of the roots and projects maps now.
    pub fn snapshot(&self) -> Result<Snapshot, TelemetryError> {
        let roots: BpfHashMap<&MapData, GuardRootKey, RawRoot> =
            map_err(MAP_ROOTS, BpfHashMap::try_from(self.map(MAP_ROOTS)?))?;
        let projects: BpfHashMap<&MapData, GuardProject, u32> =
            map_err(MAP_PROJECTS, BpfHashMap::try_from(self.map(MAP_PROJECTS)?))?;
        Ok(Snapshot {
            roots: map_err(MAP_ROOTS, roots.keys().collect())?,
            projects: map_err(MAP_PROJECTS, projects.keys().collect())?,
        })
    }

    /// Replaces the volume roots: `(st_dev, st_ino, generation, project
    /// ID)` of each root directory ([`root_identity`]) and the registry.
    /// Adds, updates, deletes; a project no root has any more leaves the
    /// guard with its counters. Nested roots: a file belongs to its
    /// innermost root.
    pub fn set_roots(
        &mut self,
        roots: &[(u64, u64, u32, u32)],
    ) -> Result<RootsUpdate, TelemetryError> {
        let snapshot = self.snapshot()?;
        let update = self.apply(&snapshot, roots)?;
        // Devices without a root: none can be added behind this call's back
        // by the caller itself.
        let wanted: HashSet<u64> = roots.iter().filter_map(|r| kernel_dev(r.0)).collect();
        let mut devs: BpfHashMap<&mut MapData, u64, u32> = map_err(
            MAP_ROOT_DEVS,
            BpfHashMap::try_from(self.map_mut(MAP_ROOT_DEVS)?),
        )?;
        let stale: Vec<u64> = map_err(MAP_ROOT_DEVS, devs.keys().collect())?;
        for dev in stale.iter().filter(|d| !wanted.contains(d)) {
            map_err(MAP_ROOT_DEVS, remove_ok(devs.remove(dev)))?;
        }
        Ok(update)
    }

    /// Brings the maps to `roots` as [`Guard::set_roots`] would, but deletes
    /// only entries in `snapshot` (taken before the registry was read): a
    /// root or project the plugin added since stays. Devices are never
    /// removed here (one map lookup per change on a device without roots).
    ///
    /// Write order: roots, then projects, then devices (a device gates the
    /// walk: it becomes visible once its roots are in place), removals last.
    pub fn apply(
        &mut self,
        snapshot: &Snapshot,
        roots: &[(u64, u64, u32, u32)],
    ) -> Result<RootsUpdate, TelemetryError> {
        let mut update = RootsUpdate::default();
        let mut desired: HashMap<GuardRootKey, u32> = HashMap::new();
        for &(st_dev, ino, gen, projid) in roots {
            match kernel_dev(st_dev) {
                Some(dev) => {
                    desired.insert(
                        GuardRootKey {
                            dev,
                            ino,
                            gen,
                            _pad: 0,
                        },
                        projid,
                    );
                }
                None => update.rejected.push((st_dev, ino, projid)),
            }
        }
        if desired.len() > self.max_roots as usize {
            return Err(TelemetryError::TooManyRoots {
                given: desired.len(),
                max: self.max_roots,
            });
        }
        let projects: HashSet<GuardProject> = desired
            .iter()
            .map(|(k, &projid)| GuardProject {
                dev: k.dev,
                projid,
                _pad: 0,
            })
            .collect();
        let devs: HashSet<u64> = desired.keys().map(|k| k.dev).collect();
        if devs.len() > crate::raw::MAX_DEVS as usize {
            return Err(TelemetryError::TooManyDevices {
                given: devs.len(),
                max: crate::raw::MAX_DEVS,
            });
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
                map_err(MAP_ROOTS, BpfHashMap::try_from(self.map_mut(MAP_ROOTS)?))?;
            for (key, &projid) in &desired {
                let value = RawRoot { projid, _pad: 0 };
                match m.get(key, 0) {
                    Ok(v) if v == value => continue,
                    Ok(_) => update.changed += 1,
                    Err(_) => update.added += 1,
                }
                map_err(MAP_ROOTS, m.insert(key, value, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardProject, u32> = map_err(
                MAP_PROJECTS,
                BpfHashMap::try_from(self.map_mut(MAP_PROJECTS)?),
            )?;
            for p in projects.iter().filter(|p| !snapshot.projects.contains(p)) {
                map_err(MAP_PROJECTS, m.insert(p, 1, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, u64, u32> = map_err(
                MAP_ROOT_DEVS,
                BpfHashMap::try_from(self.map_mut(MAP_ROOT_DEVS)?),
            )?;
            for dev in &devs {
                map_err(MAP_ROOT_DEVS, m.insert(dev, 1, 0))?;
            }
        }
        {
            let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
                map_err(MAP_ROOTS, BpfHashMap::try_from(self.map_mut(MAP_ROOTS)?))?;
            for key in snapshot.roots.iter().filter(|k| !desired.contains_key(k)) {
                map_err(MAP_ROOTS, remove_ok(m.remove(key)))?;
                update.removed += 1;
            }
        }
        let gone: Vec<GuardProject> = snapshot
            .projects
            .iter()
            .filter(|p| !projects.contains(p))
            .copied()
            .collect();
        if !gone.is_empty() {
            {
                let mut m: BpfHashMap<&mut MapData, GuardProject, u32> = map_err(
                    MAP_PROJECTS,
                    BpfHashMap::try_from(self.map_mut(MAP_PROJECTS)?),
                )?;
                for p in &gone {
                    map_err(MAP_PROJECTS, remove_ok(m.remove(p)))?;
                }
            }
            let mut c: PerCpuHashMap<&mut MapData, GuardProject, RawCounters> = map_err(
                MAP_COUNTERS,
                PerCpuHashMap::try_from(self.map_mut(MAP_COUNTERS)?),
            )?;
            for p in &gone {
                if c.remove(p).is_ok() {
                    update.pruned_counters += 1;
                }
            }
        }
        Ok(update)
    }

    /// All counters, summed over CPUs.
    pub fn read(&self) -> Result<GuardCounters, TelemetryError> {
        let mut out = GuardCounters::default();
        let projects: BpfHashMap<&MapData, GuardProject, u32> =
            map_err(MAP_PROJECTS, BpfHashMap::try_from(self.map(MAP_PROJECTS)?))?;
        for p in projects.keys() {
            let p = map_err(MAP_PROJECTS, p)?;
            out.projects.insert((p.dev, p.projid), Outcomes::default());
        }
        let counters: PerCpuHashMap<&MapData, GuardProject, RawCounters> = map_err(
            MAP_COUNTERS,
            PerCpuHashMap::try_from(self.map(MAP_COUNTERS)?),
        )?;
        for item in counters.iter() {
            let (p, per_cpu) = map_err(MAP_COUNTERS, item)?;
            let sum = out.projects.entry((p.dev, p.projid)).or_default();
            for c in per_cpu.iter() {
                sum.allowed = sum.allowed.wrapping_add(c.allowed);
                sum.denied = sum.denied.wrapping_add(c.denied);
            }
        }
        let stats: PerCpuArray<&MapData, u64> =
            map_err(MAP_STATS, PerCpuArray::try_from(self.map(MAP_STATS)?))?;
        let mut sums = [0u64; N_GSTATS as usize];
        for (i, s) in sums.iter_mut().enumerate() {
            let per_cpu = map_err(MAP_STATS, stats.get(&(i as u32), 0))?;
            *s = per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v));
        }
        out.events_lost = sums[GSTAT_EVENTS_LOST as usize];
        out.privileged = sums[GSTAT_PRIVILEGED as usize];
        out.walk_limit = Outcomes {
            allowed: sums[GSTAT_WALK_LIMIT_ALLOWED as usize],
            denied: sums[GSTAT_WALK_LIMIT_DENIED as usize],
        };
        out.unreadable = sums[GSTAT_UNREADABLE as usize];
        out.map_full = sums[GSTAT_MAP_FULL as usize];
        out.missed_runs = self.detect_missed_runs();
        Ok(out)
    }

    /// [`GuardCounters::missed_runs`] of the detecting programs (summed).
    fn detect_missed_runs(&self) -> Option<u64> {
        use std::os::fd::AsFd;
        let mut sum = 0;
        for part in self.detect.parts {
            let Some(prog) = self.ebpf.program(part.prog) else {
                continue;
            };
            let Ok(fd) = prog.fd() else {
                continue;
            };
            let (info, filled) = crate::raw::prog_info(fd.as_fd()).ok()?;
            sum += recursion_misses(&info, filled)?;
        }
        Some(sum)
    }

    /// The events waiting in the ring buffer, oldest first (at most
    /// [`MAX_EVENTS_PER_DRAIN`]; never blocks).
    pub fn drain_events(&mut self) -> Vec<GuardEvent> {
        let mut out = Vec::new();
        while out.len() < MAX_EVENTS_PER_DRAIN {
            let Some(item) = self.events.next() else {
                break;
            };
            if let Some(e) = GuardEvent::parse(&item) {
                out.push(e);
            }
        }
        out
    }

    fn map(&self, name: &'static str) -> Result<&Map, TelemetryError> {
        named_map(&self.ebpf, name)
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, TelemetryError> {
        named_map_mut(&mut self.ebpf, name)
    }
}

/// The pin name of one of the object's maps.
fn pin_name(map: &str) -> &'static str {
    pins::MAP_PINS
        .iter()
        .find(|(m, _)| *m == map)
        .map(|(_, p)| *p)
        .expect("every pinned map is listed")
}

fn too_old(program: &'static str, part: &str) -> Option<ProgramFailure> {
    let k = KernelVersion::current().ok()?;
    let (maj, min) = MIN_KERNEL;
    (k < KernelVersion::new(maj, min, 0)).then(|| ProgramFailure {
        program,
        part: part.to_string(),
        reason: FailureReason::KernelTooOld,
        detail: format!("running {k}, the guard needs {maj}.{min} or later"),
    })
}

/// Attaches every part of `detect` (all or nothing); on failure, which
/// part (`fexit/FUNC as PROG`) and why.
#[allow(clippy::type_complexity)]
fn load_detect(
    ebpf: &mut Ebpf,
    btf: &Btf,
    detect: Detect,
) -> Result<Vec<(&'static str, aya::programs::fexit::FExitLinkId)>, (String, ProgramError)> {
    let mut links = Vec::new();
    let mut result = Ok(());
    for part in detect.parts {
        let Some(func) = part.funcs.iter().find(|f| has_function(btf, f)) else {
            result = Err((
                format!("fexit/{} as {}", part.funcs.join(" or "), part.prog),
                ProgramError::Btf(aya::BtfError::UnknownBtfTypeName {
                    type_name: part.funcs.join(" or "),
                }),
            ));
            break;
        };
        match load_fexit(ebpf, btf, part.prog, func) {
            Ok(id) => links.push((part.prog, id)),
            Err(e) => {
                result = Err((format!("fexit/{func} as {}", part.prog), e));
                break;
            }
        }
    }
    match result {
        Ok(()) => Ok(links),
        Err(e) => {
            for (prog, _) in &links {
                if let Some(p) = ebpf.program_mut(prog) {
                    if let Ok(p) = <&mut FExit>::try_from(p) {
                        let _ = p.unload();
                    }
                }
            }
            Err(e)
        }
    }
}

fn load_fexit(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    func: &str,
) -> Result<aya::programs::fexit::FExitLinkId, ProgramError> {
    let p: &mut FExit = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?
        .try_into()?;
    p.load(func, btf)?;
    p.attach()
}

/// The hooks that together cover every path that can change a project ID
/// on this kernel.
fn enforcement_plan(btf: &Btf) -> Vec<&'static Enforcer> {
    let compat = has_function(btf, "bpf_lsm_file_ioctl_compat");
    if has_function(btf, "bpf_lsm_inode_file_setattr") {
        if compat {
            vec![&FILEATTR, &VERSION, &VERSION_COMPAT]
        } else {
            vec![&FILEATTR, &VERSION]
        }
    } else if compat {
        vec![&IOCTL, &IOCTL_COMPAT]
    } else {
        vec![&IOCTL]
    }
}

/// Attaches every hook of the plan (each by its first variant that loads),
/// or says why enforcement is not in force; then nothing of it stays
/// attached: half a plan would leave a path open while claiming to enforce.
#[allow(clippy::type_complexity)]
fn attach_enforcement(
    ebpf: &mut Ebpf,
    btf: &Btf,
) -> Result<Vec<(&'static str, &'static str, aya::programs::lsm::LsmLinkId)>, NotEnforcing> {
    match bpf_lsm_active() {
        Ok((true, _)) => {}
        Ok((false, active)) => return Err(NotEnforcing::LsmInactive { active }),
        Err(source) => return Err(NotEnforcing::LsmUnknown { source }),
    }
    let mut attached: Vec<(&'static str, &'static str, aya::programs::lsm::LsmLinkId)> = Vec::new();
    let mut failures = Vec::new();
    for enforcer in enforcement_plan(btf) {
        let mut tried = Vec::new();
        for &(prog, section) in enforcer.variants {
            let part = format!("{section} as {prog}");
            if let Some(f) = too_old(enforcer.hook, &part) {
                tried.push(f);
                break;
            }
            match attach_lsm_or_fault(ebpf, btf, prog, enforcer.hook) {
                Ok(id) => {
                    attached.push((prog, section, id));
                    tried.clear();
                    break;
                }
                Err(e) => {
                    let (reason, detail) = classify(&e);
                    tried.push(ProgramFailure {
                        program: enforcer.hook,
                        part,
                        reason,
                        detail,
                    });
                }
            }
        }
        failures.extend(tried);
    }
    if !failures.is_empty() {
        for (prog, _, _) in &attached {
            if let Some(p) = ebpf.program_mut(prog) {
                if let Ok(p) = <&mut Lsm>::try_from(p) {
                    let _ = p.unload();
                }
            }
        }
        return Err(NotEnforcing::Program { failures });
    }
    Ok(attached)
}

/// In the fault-injection build, aborts the process (as a SIGKILL would:
/// nothing unwinds) when `PRJQUOTA_FAULT_GUARD_START` names `step`, so the
/// tests can stop a start at each step of [`Guard::load_pinned`].
fn fault_point(step: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("PRJQUOTA_FAULT_GUARD_START").is_some_and(|s| s == step) {
        eprintln!("PRJQUOTA_FAULT_GUARD_START: aborting at {step}");
        std::process::abort();
    }
    let _ = step;
}

/// [`attach_lsm`]; in the fault-injection build, with
/// `PRJQUOTA_FAULT_GUARD_LSM` set, a refusal as the verifier's: the tests
/// of a start whose enforcement fails while an earlier guard is pinned.
fn attach_lsm_or_fault(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    hook: &str,
) -> Result<aya::programs::lsm::LsmLinkId, ProgramError> {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("PRJQUOTA_FAULT_GUARD_LSM").is_some() {
        return Err(ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load (PRJQUOTA_FAULT_GUARD_LSM)",
            io_error: io::Error::from_raw_os_error(libc::EACCES),
        }));
    }
    attach_lsm(ebpf, btf, prog, hook)
}

fn attach_lsm(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    hook: &str,
) -> Result<aya::programs::lsm::LsmLinkId, ProgramError> {
    let p: &mut Lsm = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?
        .try_into()?;
    p.load(hook, btf)?;
    p.attach()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tests::defines;

    #[test]
    fn header_matches_rust() {
        let h = defines(include_str!("bpf/guard_shared.h"));
        let expect: [(&str, u64); 25] = [
            ("GUARD_MAX_DEPTH", GUARD_MAX_DEPTH as u64),
            ("GUARD_MAX_DEPTH_CONTEXT", GUARD_MAX_DEPTH_CONTEXT as u64),
            ("GUARD_MAX_ROOTS", MAX_ROOTS as u64),
            ("GUARD_MAX_VOLUMES", MAX_VOLUMES as u64),
            ("GUARD_MAX_DEVS", MAX_DEVS as u64),
            ("GUARD_EVENTS_BYTES", EVENTS_BYTES as u64),
            ("GSTAT_EVENTS_LOST", GSTAT_EVENTS_LOST as u64),
            ("GSTAT_PRIVILEGED", GSTAT_PRIVILEGED as u64),
            ("GSTAT_WALK_LIMIT_ALLOWED", GSTAT_WALK_LIMIT_ALLOWED as u64),
            ("GSTAT_WALK_LIMIT_DENIED", GSTAT_WALK_LIMIT_DENIED as u64),
            ("GSTAT_UNREADABLE", GSTAT_UNREADABLE as u64),
            ("GSTAT_MAP_FULL", GSTAT_MAP_FULL as u64),
            ("N_GSTATS", N_GSTATS as u64),
            ("GUARD_ALLOWED", GUARD_ALLOWED as u64),
            ("GUARD_DENIED", 1),
            ("GUARD_SRC_FILEATTR", 0),
            ("GUARD_SRC_LSM", GUARD_SRC_LSM as u64),
            ("GUARD_WHAT_PROJID", GUARD_WHAT_PROJID as u64),
            ("GUARD_WHAT_NOINHERIT", GUARD_WHAT_NOINHERIT as u64),
            ("GUARD_WHAT_UNREADABLE", GUARD_WHAT_UNREADABLE as u64),
            ("GUARD_WHAT_GENERATION", GUARD_WHAT_GENERATION as u64),
            (
                "GUARD_WHAT_FOREIGN_PROJID",
                GUARD_WHAT_FOREIGN_PROJID as u64,
            ),
            ("GUARD_WHERE_OUTSIDE", GUARD_WHERE_OUTSIDE as u64),
            ("GUARD_WHERE_VOLUME", GUARD_WHERE_VOLUME as u64),
            ("GUARD_WHERE_WALK_LIMIT", GUARD_WHERE_WALK_LIMIT as u64),
        ];
        for (name, value) in expect {
            assert_eq!(h.get(name), Some(&value), "{name} in guard_shared.h");
        }
        assert_eq!(std::mem::size_of::<RawRoot>(), 8);
        assert_eq!(std::mem::size_of::<RawCounters>(), 16);
        // The structs the plugin writes too (docs: guard-interface), field
        // by field as the header declares them.
        let h = include_str!("bpf/guard_shared.h");
        for (name, fields) in [
            (
                "guard_root_key",
                "__u64 dev;|__u64 ino;|__u32 gen;|__u32 _pad;",
            ),
            ("guard_root", "__u32 projid;|__u32 _pad;"),
            ("guard_project", "__u64 dev;|__u32 projid;|__u32 _pad;"),
        ] {
            let start = h
                .find(&format!("struct {name} {{"))
                .unwrap_or_else(|| panic!("struct {name} in guard_shared.h"));
            let body = &h[start..start + h[start..].find("};").unwrap()];
            let got: Vec<&str> = body
                .lines()
                .skip(1)
                .filter_map(|l| l.trim().split("/*").next())
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            assert_eq!(got.join("|"), fields, "struct {name}");
        }
        assert_eq!(std::mem::size_of::<GuardRootKey>(), 24);
        assert_eq!(std::mem::offset_of!(GuardRootKey, gen), 16);
        assert_eq!(std::mem::size_of::<GuardProject>(), 16);
        assert_eq!(std::mem::offset_of!(GuardProject, projid), 8);
        assert_eq!(
            pins::MAP_PINS.map(|(m, _)| m),
            [
                MAP_ROOTS,
                MAP_ROOT_DEVS,
                MAP_PROJECTS,
                MAP_COUNTERS,
                MAP_STATS,
                MAP_EVENTS
            ]
        );
        // Shared with the C programs and the rest of the crate.
        assert_eq!(MAX_ROOTS, crate::raw::MAX_ROOTS);
        assert_eq!(MAX_VOLUMES, crate::raw::MAX_VOLUMES);
        assert_eq!(MAX_DEVS, crate::raw::MAX_DEVS);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // c_ulong is u64 on the 64-bit targets only
    fn uapi_values_in_guard_c_match_libc() {
        let c = defines(include_str!("bpf/guard.c"));
        assert_eq!(c["FS_IOC_FSSETXATTR"], 0x401c_5820);
        assert_eq!(c["FS_IOC_SETFLAGS"], libc::FS_IOC_SETFLAGS as u64);
        assert_eq!(c["FS_IOC32_SETFLAGS"], libc::FS_IOC32_SETFLAGS as u64);
        assert_eq!(c["FS_XFLAG_PROJINHERIT"], 0x200);
        assert_eq!(c["FS_PROJINHERIT_FL"], 0x2000_0000);
        assert_eq!(c["CAP_SYS_ADMIN"], 21, "linux/capability.h");
        assert_eq!(c["EPERM"], libc::EPERM as u64);
        assert_eq!(c["EFAULT"], libc::EFAULT as u64);
        assert_eq!(
            (c["S_IFMT"], c["S_IFDIR"]),
            (libc::S_IFMT as u64, libc::S_IFDIR as u64)
        );
    }

    #[test]
    fn event_size_matches_the_c_struct() {
        // Sum of the fields of struct guard_event, in order, no padding.
        let sizes = [8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 4, 16];
        assert_eq!(sizes.iter().sum::<usize>(), EVENT_SIZE);
    }

    #[test]
    fn events_parse() {
        let mut b = vec![0u8; EVENT_SIZE];
        b[0..8].copy_from_slice(&1234u64.to_ne_bytes());
        b[8..16].copy_from_slice(&131u64.to_ne_bytes());
        b[16..24].copy_from_slice(&((7u64 << 20) | 300).to_ne_bytes());
        b[24..28].copy_from_slice(&42u32.to_ne_bytes());
        b[28..32].copy_from_slice(&43u32.to_ne_bytes());
        b[32..36].copy_from_slice(&1000u32.to_ne_bytes());
        b[36..40].copy_from_slice(&GUARD_WHERE_VOLUME.to_ne_bytes());
        b[40..44].copy_from_slice(&0u32.to_ne_bytes());
        b[44..48].copy_from_slice(&10_000_001u32.to_ne_bytes());
        b[48..52].copy_from_slice(&0u32.to_ne_bytes());
        b[52..56].copy_from_slice(&(-1i32).to_ne_bytes());
        b[56] = 1;
        b[57] = GUARD_SRC_LSM;
        b[58] = GUARD_WHAT_PROJID;
        b[59] = 0;
        b[60..64].copy_from_slice(&0x401c_5820u32.to_ne_bytes());
        b[64..70].copy_from_slice(b"xfs_io");
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(e.cgroup_id, 1234);
        assert_eq!(e.ino, 131);
        assert_eq!(e.st_dev, libc::makedev(7, 300));
        assert_eq!((e.pid, e.tid, e.uid), (42, 43, 1000));
        assert_eq!(e.place, Place::Volume);
        assert_eq!((e.projid, e.volume_projid), (0, 10_000_001));
        assert_eq!(e.errno, Some(libc::EPERM));
        assert_eq!(e.result, Outcome::Denied);
        assert_eq!(e.source, EventSource::Lsm);
        assert!(e.changes_project && !e.clears_inherit && !e.unreadable && !e.privileged);
        assert!(!e.joins_project);
        assert_eq!(e.comm, "xfs_io");
        assert_eq!(e.describe(), "set project ID 0 (the volume's is 10000001)");
        b[36..40].copy_from_slice(&GUARD_WHERE_WALK_LIMIT.to_ne_bytes());
        b[56] = GUARD_ALLOWED;
        b[52..56].copy_from_slice(&0i32.to_ne_bytes());
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(
            (e.place, e.result, e.errno),
            (Place::Unknown, Outcome::Allowed, None)
        );
        b[36..40].copy_from_slice(&GUARD_WHERE_OUTSIDE.to_ne_bytes());
        b[58] = GUARD_WHAT_FOREIGN_PROJID;
        b[40..44].copy_from_slice(&77u32.to_ne_bytes());
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(e.place, Place::Outside);
        assert!(e.joins_project && !e.changes_project);
        assert!(
            e.describe().contains("volume project ID 77"),
            "{}",
            e.describe()
        );
        assert!(GuardEvent::parse(&b[..79]).is_none());
    }

    #[test]
    fn auto_enforces_only_where_the_bpf_lsm_is_active() {
        let active = || {
            Ok((
                true,
                "lockdown,capability,landlock,yama,apparmor,bpf".to_string(),
            ))
        };
        let inactive = || Ok((false, "lockdown,capability,yama,apparmor".to_string()));
        let unknown = || Err(io::Error::from_raw_os_error(libc::ENOENT));
        let (m, why) = GuardMode::Auto.resolve(active());
        assert_eq!((m, why.is_none()), (GuardMode::Enforce, true));
        let (m, why) = GuardMode::Auto.resolve(inactive());
        let why = why.expect("a reason");
        assert_eq!((m, why.reason()), (GuardMode::Detect, "lsm_inactive"));
        assert!(
            why.to_string().contains("add `bpf` to the kernel's `lsm=`"),
            "{why}"
        );
        let (m, why) = GuardMode::Auto.resolve(unknown());
        assert_eq!(
            (m, why.unwrap().reason()),
            (GuardMode::Detect, "lsm_unknown")
        );
        // Explicit modes load as asked: enforce's own load reports the LSM.
        for m in GuardMode::ALL {
            for lsm in [active(), inactive(), unknown()] {
                let (r, why) = m.resolve(lsm);
                assert_eq!((r, why.is_none()), (m, true));
            }
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("off".parse::<GuardMode>(), Ok(GuardMode::Off));
        assert_eq!("Detect".parse::<GuardMode>(), Ok(GuardMode::Detect));
        assert_eq!("enforce".parse::<GuardMode>(), Ok(GuardMode::Enforce));
        assert!("on"
            .parse::<GuardMode>()
            .unwrap_err()
            .contains("auto, off, detect or enforce"));
        assert_eq!("AUTO".parse::<GuardMode>(), Ok(GuardMode::Auto));
        for m in GuardMode::ALL.into_iter().chain([GuardMode::Auto]) {
            assert_eq!(m.to_string().parse::<GuardMode>(), Ok(m));
        }
        assert_eq!(GuardMode::default(), GuardMode::Auto);
        assert!(Guard::start(GuardMode::Off, &LoadOptions::default())
            .unwrap()
            .is_none());
        assert!(Guard::load(GuardMode::Off)
            .unwrap_err()
            .to_string()
            .contains("--guard=off"));
    }

    #[test]
    fn guard_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Guard>();
        check::<NotEnforcing>();
    }

    /// On the development host fexit and LSM programs are refused (EPERM by
    /// sandbox policy, although BTF exists): `load` fails, not panics, and
    /// says which program and why. Where they are allowed, it attaches.
    #[test]
    fn load_outcome_names_the_reason() {
        for mode in [GuardMode::Detect, GuardMode::Enforce] {
            match Guard::load(mode) {
                Ok(g) => {
                    eprintln!("{mode}: loaded: {g:?}");
                    if mode == GuardMode::Enforce && !g.enforcing() {
                        let why = g.not_enforcing().expect("a reason");
                        assert!(!why.to_string().is_empty());
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    eprintln!("{mode}: load refused ({}): {text}", e.reason());
                    assert_ne!(e.reason(), "other", "{text}");
                    if !std::path::Path::new(crate::KERNEL_BTF).exists() {
                        assert_eq!(e.reason(), "no_btf");
                        continue;
                    }
                    if let LoadError::NoProgram { failures, .. } = &e {
                        assert_eq!(failures.len(), 1, "{text}");
                        let (_, detect) = choose(&kernel_btf().unwrap().1);
                        assert!(text.contains(detect.hook), "{text}");
                    }
                    if e.reason() == "permission" {
                        assert!(text.contains("EPERM") || text.contains("EACCES"), "{text}");
                        assert!(text.contains("permission denied"), "{text}");
                    }
                }
            }
        }
    }

    /// The maps without programs (the host allows maps): roots keyed with
    /// their generation, projects, devices, counters per project; a sync
    /// from a snapshot leaves alone what was added after it.
    #[test]
    fn roots_projects_and_counters_through_real_maps() {
        // Never a silent pass: a host that cannot run it fails it.
        let (loader, btf) = kernel_btf().unwrap_or_else(|e| {
            panic!("this test reads real BPF maps and needs the kernel's BTF: {e}")
        });
        let mut g = Guard::open(
            loader,
            &btf,
            &LoadOptions::default(),
            GuardMode::Detect,
            Variant::Helpers,
            DETECT_FILEATTR,
            None,
        )
        .unwrap_or_else(|e| {
            panic!("this test needs BPF maps: run it as root (or with CAP_BPF): {e}")
        });
        let loop0 = libc::makedev(7, 0);
        let nvme = libc::makedev(259, 3);
        let (k0, kn) = (7u64 << 20, (259u64 << 20) | 3);
        let u = g
            .set_roots(&[
                (loop0, 128, 11, 1001),
                (loop0, 129, 12, 1002),
                (nvme, 128, 13, 7),
            ])
            .unwrap();
        assert_eq!((u.added, u.changed, u.removed), (3, 0, 0));
        let key = |dev, ino, gen| GuardRootKey {
            dev,
            ino,
            gen,
            _pad: 0,
        };
        let root = |projid| RawRoot { projid, _pad: 0 };
        assert_eq!(
            kernel_roots(&g),
            [
                (key(k0, 128, 11), root(1001)),
                (key(k0, 129, 12), root(1002)),
                (key(kn, 128, 13), root(7)),
            ]
        );
        // The same inode number with another generation is another root.
        let u = g
            .set_roots(&[
                (loop0, 128, 99, 1001),
                (loop0, 129, 12, 1002),
                (nvme, 128, 13, 7),
            ])
            .unwrap();
        assert_eq!((u.added, u.changed, u.removed), (1, 0, 1));

        let ncpu = aya::util::nr_cpus().unwrap();
        {
            let mut m: PerCpuHashMap<&mut MapData, GuardProject, RawCounters> =
                PerCpuHashMap::try_from(g.ebpf.map_mut(MAP_COUNTERS).unwrap()).unwrap();
            let per_cpu: Vec<RawCounters> = (0..ncpu)
                .map(|cpu| RawCounters {
                    allowed: 1,
                    denied: cpu as u64,
                })
                .collect();
            let p = GuardProject {
                dev: k0,
                projid: 1002,
                _pad: 0,
            };
            m.insert(p, aya::maps::PerCpuValues::try_from(per_cpu).unwrap(), 0)
                .unwrap();
        }
        let n = ncpu as u64;
        let c = g.read().unwrap();
        assert_eq!(
            c.projects.keys().copied().collect::<Vec<_>>(),
            [(k0, 1001), (k0, 1002), (kn, 7)]
        );
        assert_eq!(
            c.project(loop0, 1002),
            Outcomes {
                allowed: n,
                denied: n * (n - 1) / 2
            }
        );
        assert_eq!(c.project(loop0, 1001), Outcomes::default());

        // A sync from a snapshot: 1002's root goes (and its project and
        // counters); a root the plugin adds after the snapshot stays.
        let snap = g.snapshot().unwrap();
        {
            let mut m: BpfHashMap<&mut MapData, GuardRootKey, RawRoot> =
                BpfHashMap::try_from(g.ebpf.map_mut(MAP_ROOTS).unwrap()).unwrap();
            m.insert(key(k0, 500, 1), root(1500), 0).unwrap();
        }
        let u = g
            .apply(&snap, &[(loop0, 128, 99, 1001), (nvme, 128, 13, 8)])
            .unwrap();
        assert_eq!(
            (u.added, u.changed, u.removed, u.pruned_counters),
            (0, 1, 1, 1)
        );
        assert_eq!(
            kernel_roots(&g),
            [
                (key(k0, 128, 99), root(1001)),
                (key(k0, 500, 1), root(1500)),
                (key(kn, 128, 13), root(8)),
            ]
        );
        assert_eq!(
            g.read()
                .unwrap()
                .projects
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [(k0, 1001), (kn, 8)]
        );
        assert!(g.drain_events().is_empty());

        let u = g.set_roots(&[]).unwrap();
        assert_eq!(u.removed, 3);
        assert!(kernel_roots(&g).is_empty());
        let devs: BpfHashMap<&MapData, u64, u32> =
            BpfHashMap::try_from(g.ebpf.map(MAP_ROOT_DEVS).unwrap()).unwrap();
        assert_eq!(devs.keys().count(), 0);
    }

    fn kernel_roots(g: &Guard) -> Vec<(GuardRootKey, RawRoot)> {
        let m: BpfHashMap<&MapData, GuardRootKey, RawRoot> =
            BpfHashMap::try_from(g.ebpf.map(MAP_ROOTS).unwrap()).unwrap();
        let mut v: Vec<(GuardRootKey, RawRoot)> = m.iter().map(Result::unwrap).collect();
        v.sort();
        v
    }
}
