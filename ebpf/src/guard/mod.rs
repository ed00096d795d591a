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
//! # Files
//!
//! One concern a file: [`mode`](GuardMode) (what is asked, and the BPF LSM's
//! state), `load` (the plan of builds and hooks, and attaching it), `maps`
//! (the roots, devices and projects maps), `counters` (attempts and the
//! guard-wide statistics), `events` (the ring buffer), `pinning` (this
//! guard's maps and links in its pin directory) and [`pins`] (the pin
//! directories in bpffs). The names the exporter and the plugin both rely
//! on (pins, link pins, the LSM programs) are `prjquota_core::guard_contract`'s.
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

mod counters;
mod events;
mod load;
mod maps;
mod mode;
mod pinning;
pub mod pins;
#[cfg(test)]
mod tests;

use std::fmt;

use aya::maps::{MapData, RingBuf};
use aya::programs::links::FdLink;
use aya::Ebpf;

pub use crate::raw::{GuardProject, GuardRawRoot as GuardRootValue, GuardRootKey};
pub use counters::{GuardCounters, Outcomes};
pub use events::{EventSource, GuardEvent, Outcome, Place, MAX_EVENTS_PER_DRAIN};
pub use maps::{root_identity, root_identity_of, Snapshot};
pub use mode::{bpf_lsm_active, GuardMode, NotEnforcing, LSM_LIST};
pub use pinning::Pinned;
pub use prjquota_core::guard_contract::is_lsm_program;

use crate::error::LoadError;
use crate::loader::one_load_at_a_time;
use crate::loader::LoadOptions;
use crate::loader::Variant;
use load::Detect;

/// Dentries the guard looks at: the changed inode's own, then its
/// ancestors. See the module's *Limits*.
pub const GUARD_MAX_DEPTH: u32 = 4096;

/// [`GUARD_MAX_DEPTH`] of the context build (no `bpf_loop`): every level of
/// its bounded loop costs the verifier instructions, so it is lower.
pub const GUARD_MAX_DEPTH_CONTEXT: u32 = 1024;

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
    /// Detecting only (5.13+): the generation ioctls are judged too.
    version_detected: bool,
    /// Why they are not, when their programs did not attach.
    version_detect_error: Option<String>,
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

    /// Whether a generation change (`FS_IOC_SETVERSION`) is counted while
    /// the guard detects only; and why not when its programs did not
    /// attach (`None` when it enforces, where it is refused instead, or
    /// before 5.13, where the context build judges every ioctl).
    pub fn version_detect(&self) -> (bool, Option<&str>) {
        (self.version_detected, self.version_detect_error.as_deref())
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
}
