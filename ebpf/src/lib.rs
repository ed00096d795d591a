//! Per-volume write telemetry from eBPF: bytes written, successful writes
//! and failed writes by errno, for every file below a registered volume root
//! directory, whatever the submission path (write/pwrite/writev, O_DIRECT,
//! io_uring, libaio).
//!
//! The programs are CO-RE C (`src/bpf/`), compiled by clang at build time
//! and embedded here; [`WriteTelemetry::load`] relocates them against the
//! running kernel's BTF and attaches them with aya. See
//! `src/bpf/write_telemetry.c` for the hook points and why.
//!
//! # Use from a collector
//!
//! ```no_run
//! use prjquota_ebpf::{Mode, WriteTelemetry};
//!
//! // Once, at start-up. Degrade, never die: keep the error for a self-metric.
//! let mode = Mode::Auto;
//! let mut telemetry = match WriteTelemetry::start(mode, &Default::default()) {
//!     Ok(t) => t, // None when mode is Off
//!     Err(e) if mode == Mode::Required => panic!("{e}"),
//!     Err(e) => {
//!         eprintln!("write telemetry off: {e} (reason {})", e.reason());
//!         None
//!     }
//! };
//!
//! // On every scrape: volume roots from the registry, each with a stable
//! // index the caller chooses (e.g. assigned per volume ID), then counters.
//! if let Some(t) = telemetry.as_mut() {
//!     let (dev, ino) = prjquota_ebpf::root_of("/srv/volumes/3f2a…".as_ref()).unwrap();
//!     t.set_roots(&[(dev, ino, 7)]).unwrap();
//!     let counters = t.read().unwrap();
//!     let v = counters.volume(7);
//!     println!("{} bytes in {} writes", v.written_bytes, v.write_ops);
//! }
//! ```
//!
//! Counters are cumulative from load (Prometheus counters). An index whose
//! roots all disappear from [`WriteTelemetry::set_roots`] loses its counters
//! (so the maps never fill up); if it comes back it starts again at zero.

mod error;
pub mod guard;
pub mod pins;
// The crate's kernel boundary: raw bpf(2) and the C layouts shared with
// the programs. Every block states its SAFETY invariant
// (clippy::undocumented_unsafe_blocks).
#[allow(unsafe_code)]
mod raw;
mod roots;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use aya::maps::{Array, Map, MapData, PerCpuArray};
use aya::programs::{FEntry, FExit, ProgramError};
use aya::{Btf, BtfError, Ebpf, EbpfError, EbpfLoader};

use error::{chain, errno_name, errno_of};
pub use error::{FailureReason, LoadError, ProgramFailure, TelemetryError};
use raw::RawCounters;
use roots::RootMaps;

/// Where aya reads the kernel's BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Volume roots are found by walking at most this many parent directories up
/// from a written file; files deeper below their root count as
/// [`Unattributed::walk_limit`], never for the wrong volume.
pub const MAX_DEPTH: u32 = raw::MAX_DEPTH;

/// How the exporter treats write telemetry (a config value: `off`, `auto`,
/// `required`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Do not load anything.
    Off,
    /// Load what the kernel allows; on failure run without (and say why).
    #[default]
    Auto,
    /// Every program must attach, or start-up fails.
    Required,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(Mode::Off),
            "auto" => Ok(Mode::Auto),
            "required" => Ok(Mode::Required),
            _ => Err(format!(
                "unknown eBPF mode `{s}` (want off, auto or required)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::Required => "required",
        })
    }
}

/// The errno buckets of write errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrnoBucket {
    /// ENOSPC: filesystem full, or an XFS project quota exhausted (XFS
    /// reports project quota as ENOSPC).
    Enospc,
    /// EDQUOT: a quota exhausted (ext4 project quota, user/group quotas).
    Edquot,
    Eio,
    Erofs,
    Other,
}

impl ErrnoBucket {
    pub const ALL: [ErrnoBucket; 5] = [
        ErrnoBucket::Enospc,
        ErrnoBucket::Edquot,
        ErrnoBucket::Eio,
        ErrnoBucket::Erofs,
        ErrnoBucket::Other,
    ];

    /// The bucket of a positive errno (as the BPF program buckets it).
    pub fn from_errno(errno: i32) -> ErrnoBucket {
        match errno {
            libc::ENOSPC => ErrnoBucket::Enospc,
            libc::EDQUOT => ErrnoBucket::Edquot,
            libc::EIO => ErrnoBucket::Eio,
            libc::EROFS => ErrnoBucket::Erofs,
            _ => ErrnoBucket::Other,
        }
    }

    /// The label value for an `errno` label: `ENOSPC`, `EDQUOT`, `EIO`,
    /// `EROFS`, `other`.
    pub fn label(self) -> &'static str {
        match self {
            ErrnoBucket::Enospc => "ENOSPC",
            ErrnoBucket::Edquot => "EDQUOT",
            ErrnoBucket::Eio => "EIO",
            ErrnoBucket::Erofs => "EROFS",
            ErrnoBucket::Other => "other",
        }
    }

    fn index(self) -> usize {
        match self {
            ErrnoBucket::Enospc => raw::BUCKET_ENOSPC,
            ErrnoBucket::Edquot => raw::BUCKET_EDQUOT,
            ErrnoBucket::Eio => raw::BUCKET_EIO,
            ErrnoBucket::Erofs => raw::BUCKET_EROFS,
            ErrnoBucket::Other => raw::BUCKET_OTHER,
        }
    }
}

/// Counters of one volume (or one unattributed bucket), summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeCounters {
    /// Bytes written by successful writes.
    pub written_bytes: u64,
    /// Writes that wrote at least one byte (a short write counts once).
    pub write_ops: u64,
    /// Failed writes, indexed by [`ErrnoBucket`] order; see [`Self::errors`].
    pub errors: [u64; 5],
}

impl VolumeCounters {
    /// Failed writes in one bucket.
    pub fn errors(&self, bucket: ErrnoBucket) -> u64 {
        self.errors[bucket.index()]
    }

    /// `(bucket, count)` for every bucket, zeros included (one series each).
    pub fn errors_by_bucket(&self) -> impl Iterator<Item = (ErrnoBucket, u64)> + '_ {
        ErrnoBucket::ALL.into_iter().map(|b| (b, self.errors(b)))
    }

    pub fn errors_total(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// `self - earlier`, field by field (saturating), for tests and rates.
    pub fn since(&self, earlier: &VolumeCounters) -> VolumeCounters {
        let mut errors = [0; 5];
        for (i, e) in errors.iter_mut().enumerate() {
            *e = self.errors[i].saturating_sub(earlier.errors[i]);
        }
        VolumeCounters {
            written_bytes: self.written_bytes.saturating_sub(earlier.written_bytes),
            write_ops: self.write_ops.saturating_sub(earlier.write_ops),
            errors,
        }
    }

    fn add(&mut self, c: &RawCounters) {
        self.written_bytes = self.written_bytes.wrapping_add(c.bytes);
        self.write_ops = self.write_ops.wrapping_add(c.ops);
        for (i, e) in self.errors.iter_mut().enumerate() {
            *e = e.wrapping_add(c.errors[i]);
        }
    }
}

/// Writes not attributed to any volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unattributed {
    /// On a filesystem that holds no volume root (all other writes of the
    /// host: root disk, tmpfs, …).
    pub other_filesystems: VolumeCounters,
    /// On a volume filesystem, but not below any volume root.
    pub outside_roots: VolumeCounters,
    /// More than [`MAX_DEPTH`] directories below the filesystem root with no
    /// volume root found on the way (deeper than the walk looks).
    pub walk_limit: VolumeCounters,
    /// Below a volume root, but the counters map had no room for one more
    /// volume (`--ebpf.max-volumes`): counted here, never lost.
    pub map_full: VolumeCounters,
}

/// A snapshot of all counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Per volume index: every index currently in the roots (zeros until
    /// the first write).
    pub volumes: BTreeMap<u32, VolumeCounters>,
    pub unattributed: Unattributed,
}

impl Counters {
    /// The counters of one volume index (zeros if unknown).
    pub fn volume(&self, index: u32) -> VolumeCounters {
        self.volumes.get(&index).copied().unwrap_or_default()
    }
}

/// What [`WriteTelemetry::set_roots`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootsUpdate {
    pub added: usize,
    /// Roots whose volume index changed.
    pub changed: usize,
    pub removed: usize,
    /// Volume indexes whose counters were dropped (no root left).
    pub pruned_counters: usize,
    /// Entries whose `st_dev` has no kernel `dev_t` equivalent (never from a
    /// real `stat`); skipped.
    pub rejected: Vec<(u64, u64, u32)>,
}

/// What the kernel measured of one hook's programs (see
/// [`WriteTelemetry::enable_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// Program runs (fentry and fexit halves both count).
    pub run_count: u64,
    /// Time spent running them.
    pub run_time: Duration,
}

/// Load-time knobs; [`LoadOptions::default`] suits a node with up to
/// 16,384 volumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Distinct volume indexes with counters (per-CPU map entries): the
    /// exporter's `--ebpf.max-volumes`. A write into a volume beyond it is
    /// counted as [`Unattributed::map_full`], never lost.
    pub max_volumes: u32,
    /// Root directories (usually one per volume).
    pub max_roots: u32,
    /// Fail unless every program attaches ([`Mode::Required`]).
    pub require_all: bool,
    /// The program build to load; `None` (the default) picks by what the
    /// kernel offers. Set to compare both on one kernel.
    pub variant: Option<Variant>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_volumes: raw::MAX_VOLUMES,
            max_roots: raw::MAX_ROOTS,
            require_all: false,
            variant: None,
        }
    }
}

pub use prjquota_core::guard_pins::kernel_dev;

/// `(st_dev, st_ino)` of a directory, as [`WriteTelemetry::set_roots`]
/// takes them.
pub fn root_of(path: &Path) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[derive(Clone, Copy)]
enum Kind {
    FEntry,
    FExit,
}

/// One BPF program: the kernel function and the symbols in the object that
/// can trace it, tried in order until one loads (one per signature the
/// function has had).
struct Part {
    progs: &'static [&'static str],
    func: &'static str,
    kind: Kind,
}

/// A hook point as reported by [`WriteTelemetry::programs`]: one or two
/// programs that attach together or not at all.
struct Hook {
    name: &'static str,
    parts: &'static [Part],
}

/// Which build of the write-telemetry programs runs: chosen at load time by
/// what the kernel offers, never by its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `bpf_get_func_ret` and task-local storage (Linux 5.17 on): one
    /// program per hook whatever the function's arity.
    Helpers,
    /// Each return value read from the fexit context (Linux 5.5 on), one
    /// program per signature; O_DIRECT hands its start over in a hash map
    /// alone.
    Context,
}

impl Variant {
    /// `helpers` or `context`, as logged and labelled.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Helpers => "helpers",
            Variant::Context => "context",
        }
    }

    fn object(self) -> &'static [u8] {
        match self {
            Variant::Helpers => raw::object(),
            Variant::Context => raw::object_compat(),
        }
    }

    fn hooks(self) -> &'static [Hook] {
        match self {
            Variant::Helpers => HOOKS,
            Variant::Context => HOOKS_COMPAT,
        }
    }
}

const HOOKS: &[Hook] = &[
    // First: the attribution cache is turned on once this is attached (see
    // `attr_cache` in write_telemetry.c). Without it the write hooks count
    // exactly as well, walking every time.
    Hook {
        name: HOOK_RENAME,
        parts: &[Part {
            progs: &["vfs_rename_exit"],
            func: "vfs_rename",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "iomap_file_buffered_write",
        parts: &[Part {
            progs: &["iomap_buffered_write_exit"],
            func: "iomap_file_buffered_write",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "generic_perform_write",
        parts: &[Part {
            progs: &["generic_perform_write_exit"],
            func: "generic_perform_write",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "iomap_dio_complete",
        // fexit first: an fentry without its fexit would only fill the
        // hand-off map.
        parts: &[
            Part {
                progs: &["iomap_dio_complete_exit"],
                func: "iomap_dio_complete",
                kind: Kind::FExit,
            },
            Part {
                progs: &["iomap_dio_complete_entry"],
                func: "iomap_dio_complete",
                kind: Kind::FEntry,
            },
        ],
    },
];

/// [`Variant::Context`]: longest signature first (write_telemetry.c says why).
const HOOKS_COMPAT: &[Hook] = &[
    Hook {
        name: HOOK_RENAME,
        parts: &[Part {
            progs: &["vfs_rename_exit6", "vfs_rename_exit1"],
            func: "vfs_rename",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "iomap_file_buffered_write",
        parts: &[Part {
            progs: &["iomap_buffered_write_exit4", "iomap_buffered_write_exit3"],
            func: "iomap_file_buffered_write",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "generic_perform_write",
        parts: &[Part {
            progs: &[
                "generic_perform_write_exit_file",
                "generic_perform_write_exit_kiocb",
            ],
            func: "generic_perform_write",
            kind: Kind::FExit,
        }],
    },
    Hook {
        name: "iomap_dio_complete",
        parts: &[
            Part {
                progs: &["iomap_dio_complete_exit"],
                func: "iomap_dio_complete",
                kind: Kind::FExit,
            },
            Part {
                progs: &["iomap_dio_complete_entry"],
                func: "iomap_dio_complete",
                kind: Kind::FEntry,
            },
        ],
    },
];

const COMPONENT: &str = "write telemetry";
const HOOK_RENAME: &str = "vfs_rename";
const MAP_GEN: &str = "attr_gen";
const MAP_ROOTS: &str = "roots";
const MAP_ROOT_DEVS: &str = "root_devs";
const MAP_COUNTERS: &str = "volume_counters";
const MAP_UNATTRIBUTED: &str = "unattributed";

/// The loaded, attached programs and their maps. Dropping it detaches
/// everything.
pub struct WriteTelemetry {
    ebpf: Ebpf,
    variant: Variant,
    /// The programs loaded, one per attached part.
    loaded: Vec<&'static str>,
    hooks: Vec<(&'static str, bool)>,
    failures: Vec<ProgramFailure>,
    /// Volume indexes currently in `roots`.
    indexes: BTreeSet<u32>,
    max_roots: u32,
    /// Slots of the counters array: indexes from here have none.
    max_volumes: u32,
    /// What `attr_gen[GEN_ROOTS]` holds: bumped after every roots change.
    roots_generation: u64,
    /// Runs of the vfs_rename hook the kernel skipped, as last seen by
    /// [`Self::revalidate_cache`].
    rename_misses: u64,
    /// Held while kernel BPF run-time statistics are wanted.
    stats: Option<OwnedFd>,
}

impl fmt::Debug for WriteTelemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTelemetry")
            .field("programs", &self.hooks)
            .field("volumes", &self.indexes.len())
            .finish()
    }
}

impl WriteTelemetry {
    /// Loads and attaches every program ([`Mode::Auto`] semantics: `Ok` as
    /// long as one program attached; [`Self::programs`] says which).
    pub fn load() -> Result<WriteTelemetry, LoadError> {
        Self::load_with(&LoadOptions::default())
    }

    /// [`Self::load`] for a [`Mode`]: `Ok(None)` when off; with
    /// [`Mode::Required`], an error unless every program attached.
    pub fn start(mode: Mode, opts: &LoadOptions) -> Result<Option<WriteTelemetry>, LoadError> {
        match mode {
            Mode::Off => Ok(None),
            Mode::Auto => Self::load_with(opts).map(Some),
            Mode::Required => Self::load_with(&LoadOptions {
                require_all: true,
                ..opts.clone()
            })
            .map(Some),
        }
    }

    pub fn load_with(opts: &LoadOptions) -> Result<WriteTelemetry, LoadError> {
        one_load_at_a_time(|| Self::load_attach(opts))
    }

    fn load_attach(opts: &LoadOptions) -> Result<WriteTelemetry, LoadError> {
        let (_, btf) = kernel_btf()?;
        if let Some(v) = opts.variant {
            return Self::load_variant(v, &btf, opts);
        }
        // Task-local storage (5.11) is the helpers build's one map the
        // context build lacks: without it that object cannot even open.
        let storage = aya::sys::is_map_supported(aya::maps::MapType::TaskStorage).unwrap_or(false);
        if !storage {
            return Self::load_variant(Variant::Context, &btf, opts);
        }
        match Self::load_variant(Variant::Helpers, &btf, opts) {
            // Probed by loading: a verifier that does not know
            // bpf_get_func_ret (before 5.17) refuses it by name.
            Ok(t) if !t.failures.iter().any(unknown_helper) => Ok(t),
            Err(LoadError::NoProgram { failures, .. } | LoadError::Incomplete { failures, .. })
                if failures.iter().any(unknown_helper) =>
            {
                Self::load_variant(Variant::Context, &btf, opts)
            }
            Ok(t) => {
                drop(t);
                Self::load_variant(Variant::Context, &btf, opts)
            }
            Err(e) => Err(e),
        }
    }

    fn load_variant(
        variant: Variant,
        btf: &Btf,
        opts: &LoadOptions,
    ) -> Result<WriteTelemetry, LoadError> {
        let mut t = Self::open(variant, btf, opts)?;
        for hook in variant.hooks() {
            let attached = attach_hook(&mut t.ebpf, btf, hook).and_then(|progs| {
                t.loaded.extend(progs);
                if hook.name != HOOK_RENAME {
                    return Ok(());
                }
                t.set_generation(raw::GEN_CACHE_ON, 1)
                    .map_err(|e| ProgramFailure {
                        program: hook.name,
                        part: "attr_gen[GEN_CACHE_ON]".to_string(),
                        reason: FailureReason::Other,
                        detail: format!("cannot turn the attribution cache on: {e}"),
                    })
            });
            match attached {
                Ok(()) => t.hooks.push((hook.name, true)),
                Err(f) => {
                    t.hooks.push((hook.name, false));
                    t.failures.push(f);
                }
            }
        }
        if t.hooks.iter().all(|(_, attached)| !attached) {
            return Err(LoadError::NoProgram {
                component: COMPONENT,
                failures: t.failures,
            });
        }
        if opts.require_all && !t.failures.is_empty() {
            return Err(LoadError::Incomplete {
                component: COMPONENT,
                failures: t.failures,
            });
        }
        Ok(t)
    }

    /// Which build of the programs is loaded.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Parses the object and creates its maps, attaching nothing.
    fn open(variant: Variant, btf: &Btf, opts: &LoadOptions) -> Result<WriteTelemetry, LoadError> {
        let ebpf = EbpfLoader::new()
            .btf(Some(btf))
            // dio_task, task-local storage: aya creates it but has no
            // userspace type for it, and userspace never reads it.
            .allow_unsupported_maps()
            .map_max_entries(MAP_COUNTERS, opts.max_volumes)
            .map_max_entries(MAP_ROOTS, opts.max_roots)
            .load(variant.object())
            .map_err(|e| object_error(COMPONENT, e))?;
        Ok(WriteTelemetry {
            ebpf,
            variant,
            loaded: Vec::new(),
            hooks: Vec::new(),
            failures: Vec::new(),
            indexes: BTreeSet::new(),
            max_roots: opts.max_roots,
            max_volumes: opts.max_volumes,
            roots_generation: 0,
            rename_misses: 0,
            stats: None,
        })
    }

    /// Every hook point and whether it is attached, e.g.
    /// `("iomap_dio_complete", true)`: for an `…_ebpf_program_attached`
    /// self-metric.
    pub fn programs(&self) -> Vec<(&'static str, bool)> {
        self.hooks.clone()
    }

    /// Why the hooks that are not attached failed (empty when all are).
    pub fn failures(&self) -> &[ProgramFailure] {
        &self.failures
    }

    /// Turns on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`,
    /// as `sysctl kernel.bpf_stats_enabled=1` does) for as long as this
    /// telemetry lives, so [`Self::program_stats`] reports the programs'
    /// cost. Off by default: while on, every BPF program on the host pays
    /// two clock reads per run.
    pub fn enable_stats(&mut self) -> Result<(), TelemetryError> {
        if self.stats.is_none() {
            let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| TelemetryError::Stats(e.to_string()))?;
            self.stats = Some(fd);
        }
        Ok(())
    }

    /// Run count and run time of every attached hook (zeros unless
    /// statistics are on: [`Self::enable_stats`] or the sysctl).
    pub fn program_stats(&self) -> Vec<(&'static str, ProgramStats)> {
        let mut out = Vec::new();
        for hook in self.variant.hooks() {
            if !self.hooks.contains(&(hook.name, true)) {
                continue;
            }
            let mut sum = ProgramStats::default();
            for prog in hook.parts.iter().filter_map(|p| self.loaded_prog(p)) {
                if let Some(Ok(info)) = self.ebpf.program(prog).map(|p| p.info()) {
                    sum.run_count += info.run_count();
                    sum.run_time += info.run_time();
                }
            }
            out.push((hook.name, sum));
        }
        out
    }

    /// Runs of each attached hook's programs that the kernel skipped, since
    /// they were loaded: a tracing program is not re-entered on a CPU where
    /// it already runs, and on a preemptible kernel (Debian's 7.x is
    /// `PREEMPT_LAZY`) a task preempted inside it makes another task's
    /// write on that CPU go uncounted. `None` for a hook whose count the
    /// kernel does not report (`recursion_misses` of `bpf_prog_info`,
    /// Linux 5.12+).
    pub fn missed_runs(&self) -> Vec<(&'static str, Option<u64>)> {
        use std::os::fd::AsFd;
        let mut out = Vec::new();
        for hook in self.variant.hooks() {
            if !self.hooks.contains(&(hook.name, true)) {
                continue;
            }
            let mut sum = Some(0u64);
            for part in hook.parts {
                let misses = self
                    .loaded_prog(part)
                    .and_then(|prog| self.ebpf.program(prog))
                    .and_then(|p| p.fd().ok())
                    .and_then(|fd| raw::prog_info(fd.as_fd()).ok())
                    .and_then(|(info, filled)| recursion_misses(&info, filled));
                sum = sum.zip(misses).map(|(a, b)| a + b);
            }
            out.push((hook.name, sum));
        }
        out
    }

    /// Replaces the volume roots: `(st_dev, st_ino, volume index)` of each
    /// root directory, as from `stat` ([`root_of`]). Adds new roots, updates
    /// changed indexes and deletes stale roots; an index new to the roots
    /// has its counters zeroed first, so a reused index starts from zero.
    /// Nested roots are fine: a file counts for its innermost root. Cheap
    /// when nothing changed (one map walk).
    ///
    /// The caller reuses an index only long after its volume left: a write
    /// attributed before the old root went, and counted after the zeroing,
    /// would count for the new volume.
    pub fn set_roots(&mut self, roots: &[(u64, u64, u32)]) -> Result<RootsUpdate, TelemetryError> {
        let entering = roots::entering(&self.indexes, roots.iter().map(|r| r.2), self.max_volumes);
        let zeroed = self.zero_counters(&entering)?;
        let maps = RootMaps {
            roots: MAP_ROOTS,
            devs: MAP_ROOT_DEVS,
        };
        let synced = roots::sync_roots(
            &mut self.ebpf,
            &maps,
            self.max_roots,
            roots.iter().copied(),
            |index| *index,
        );
        // After the roots: a program that reads the new generation walks the
        // new roots; one that read the old one cached under it. Also after a
        // failure, which may have written some of them.
        let unchanged = synced
            .as_ref()
            .is_ok_and(|(u, _)| u.added + u.changed + u.removed == 0);
        if !unchanged {
            self.drop_cached_attributions()?;
        }
        let (mut update, indexes) = synced?;
        update.pruned_counters += zeroed;
        self.indexes = indexes;
        Ok(update)
    }

    /// Zeroes the counters of `indexes` on every CPU.
    fn zero_counters(&mut self, indexes: &BTreeSet<u32>) -> Result<usize, TelemetryError> {
        if indexes.is_empty() {
            return Ok(0);
        }
        let ncpu = aya::util::nr_cpus()
            .map_err(|(path, e)| TelemetryError::Cpus(format!("{path}: {e}")))?;
        let mut counters: PerCpuArray<&mut MapData, RawCounters> = map_err(
            MAP_COUNTERS,
            PerCpuArray::try_from(self.map_mut(MAP_COUNTERS)?),
        )?;
        for &index in indexes {
            let zero = aya::maps::PerCpuValues::try_from(vec![RawCounters::default(); ncpu])
                .map_err(|e| TelemetryError::Cpus(e.to_string()))?;
            map_err(MAP_COUNTERS, counters.set(index, zero, 0))?;
        }
        Ok(indexes.len())
    }

    /// Drops every cached attribution if the kernel skipped a run of the
    /// vfs_rename hook since the last call; returns whether it did. `missed`
    /// is [`Self::missed_runs`], which the caller publishes too.
    ///
    /// A skipped run (a task preempted inside the hook on a preemptible
    /// kernel makes the kernel skip the next rename's run on that CPU) is a
    /// rename the cache did not see: a directory moved to another volume
    /// would keep counting for the old one on CPUs that cached it. The
    /// exporter calls this at every scrape, so that lasts until the next
    /// scrape at most, and the skip is published with the other hooks'
    /// (`prjquota_exporter_ebpf_program_missed_runs_total`).
    pub fn revalidate_cache(
        &mut self,
        missed: &[(&'static str, Option<u64>)],
    ) -> Result<bool, TelemetryError> {
        let misses = missed
            .iter()
            .find(|(hook, _)| *hook == HOOK_RENAME)
            .and_then(|(_, n)| *n)
            .unwrap_or(0);
        if misses <= self.rename_misses {
            return Ok(false);
        }
        self.drop_cached_attributions()?;
        self.rename_misses = misses;
        Ok(true)
    }

    /// A new `attr_gen[GEN_ROOTS]`: no cached attribution matches it.
    fn drop_cached_attributions(&mut self) -> Result<(), TelemetryError> {
        self.roots_generation += 1;
        self.set_generation(raw::GEN_ROOTS, self.roots_generation)
    }

    fn set_generation(&mut self, slot: u32, value: u64) -> Result<(), TelemetryError> {
        let mut gen: Array<&mut MapData, u64> =
            map_err(MAP_GEN, Array::try_from(self.map_mut(MAP_GEN)?))?;
        map_err(MAP_GEN, gen.set(slot, value, 0))
    }

    /// All counters, summed over CPUs: one entry per volume index in the
    /// roots, plus the unattributed buckets.
    pub fn read(&self) -> Result<Counters, TelemetryError> {
        let mut out = Counters::default();
        for index in &self.indexes {
            out.volumes.insert(*index, VolumeCounters::default());
        }
        self.read_volumes(&mut out.volumes)?;
        let unattributed: PerCpuArray<&MapData, RawCounters> = map_err(
            MAP_UNATTRIBUTED,
            PerCpuArray::try_from(self.map(MAP_UNATTRIBUTED)?),
        )?;
        for (i, slot) in [
            (
                raw::UNATTR_OTHER_FS,
                &mut out.unattributed.other_filesystems,
            ),
            (raw::UNATTR_OUTSIDE, &mut out.unattributed.outside_roots),
            (raw::UNATTR_WALK_LIMIT, &mut out.unattributed.walk_limit),
            (raw::UNATTR_MAP_FULL, &mut out.unattributed.map_full),
        ] {
            let per_cpu = map_err(MAP_UNATTRIBUTED, unattributed.get(&i, 0))?;
            for c in per_cpu.iter() {
                slot.add(c);
            }
        }
        debug_assert_eq!(raw::N_UNATTR, 4);
        Ok(out)
    }

    /// Adds every volume's counters, summed over CPUs, to `volumes` (keyed
    /// by the indexes in the roots). The slots are read a batch at a time
    /// from 0 to the highest index in use (the exporter keeps indexes low):
    /// a call per `BATCH` slots, not one per volume. An index past the
    /// array's end has no slot (its writes are `map_full`) and stays zero.
    fn read_volumes(
        &self,
        volumes: &mut BTreeMap<u32, VolumeCounters>,
    ) -> Result<(), TelemetryError> {
        /// Slots per call: the buffer is this times the CPUs times 56 bytes.
        const BATCH: u32 = 256;
        let Some(last) = volumes
            .range(..self.max_volumes)
            .next_back()
            .map(|(i, _)| *i)
        else {
            return Ok(());
        };
        let syscall = |call: &'static str, io_error: std::io::Error| TelemetryError::Map {
            map: MAP_COUNTERS,
            source: aya::maps::MapError::SyscallError(aya::sys::SyscallError { call, io_error }),
        };
        let fd = match self.map(MAP_COUNTERS)? {
            Map::PerCpuArray(data) => std::os::fd::AsFd::as_fd(data.fd()),
            _ => {
                return Err(syscall(
                    "map type",
                    std::io::Error::other("volume_counters is not a per-CPU array"),
                ))
            }
        };
        let ncpu = aya::util::nr_cpus()
            .map_err(|(path, e)| TelemetryError::Cpus(format!("{path}: {e}")))?;
        let mut buf = Vec::new();
        let mut first = 0u32;
        while first <= last {
            let n = BATCH.min(last - first + 1);
            let got = match raw::lookup_counters(fd, first, n, ncpu, &mut buf) {
                Ok(got) => got,
                // ENOTSUPP (524): the kernel has no batch lookup for per-CPU
                // arrays (5.10 has none): one lookup per volume instead.
                Err(e) if e.raw_os_error() == Some(524) => {
                    return self.read_volumes_one_by_one(volumes);
                }
                Err(e) => return Err(syscall("bpf_map_lookup_batch", e)),
            };
            for (index, sum) in volumes.range_mut(first..first + got) {
                let i = (index - first) as usize;
                for c in &buf[i * ncpu..(i + 1) * ncpu] {
                    sum.add(c);
                }
            }
            if got < n {
                break; // the array's end
            }
            first += n;
        }
        Ok(())
    }

    /// [`Self::read_volumes`] a lookup per volume.
    fn read_volumes_one_by_one(
        &self,
        volumes: &mut BTreeMap<u32, VolumeCounters>,
    ) -> Result<(), TelemetryError> {
        let counters: PerCpuArray<&MapData, RawCounters> =
            map_err(MAP_COUNTERS, PerCpuArray::try_from(self.map(MAP_COUNTERS)?))?;
        for (index, sum) in volumes.range_mut(..self.max_volumes) {
            for c in map_err(MAP_COUNTERS, counters.get(index, 0))?.iter() {
                sum.add(c);
            }
        }
        Ok(())
    }

    /// The program that runs for `part`, if one was loaded.
    fn loaded_prog(&self, part: &Part) -> Option<&'static str> {
        part.progs.iter().copied().find(|p| self.loaded.contains(p))
    }

    fn map(&self, name: &'static str) -> Result<&Map, TelemetryError> {
        self.ebpf
            .map(name)
            .ok_or(TelemetryError::MissingMap { map: name })
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, TelemetryError> {
        self.ebpf
            .map_mut(name)
            .ok_or(TelemetryError::MissingMap { map: name })
    }
}

fn map_err<T>(map: &'static str, r: Result<T, aya::maps::MapError>) -> Result<T, TelemetryError> {
    r.map_err(|source| TelemetryError::Map { map, source })
}

/// A key that vanished meanwhile is as good as removed.
fn remove_ok(r: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match r {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(e) if errno_of(&e) == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Runs a load (this crate's or the guard's) while no other runs, then hands
/// the heap it freed back to the kernel.
///
/// Each load parses the kernel's BTF, some 35 MiB of heap at its peak
/// (measured); the exporter starts both loads at once, which doubled its
/// peak to ~70 MiB (its Nomad job reserves 128 MiB, with the eBPF maps
/// charged to the same cgroup).
fn one_load_at_a_time<T>(load: impl FnOnce() -> T) -> T {
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = load();
    // The parsed BTF is dropped by now; its pages go back too.
    raw::trim_heap();
    loaded
}

/// The kernel's BTF, and a loader to give it to.
///
/// aya's `EbpfLoader::new` parses the kernel's BTF for itself, which
/// `.btf(Some(&ours))` then drops. Made while ours was alive, the two parses
/// coexisted and doubled a load's peak heap (measured with heaptrack on 6.1:
/// 18.9 MB, two parses of 9.4 MB). So the loader is made first and emptied
/// before ours is parsed: one parse at a time.
fn kernel_btf() -> Result<(EbpfLoader<'static>, Btf), LoadError> {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    if let Err(source) = std::fs::metadata(KERNEL_BTF) {
        return Err(LoadError::NoBtf {
            path: KERNEL_BTF,
            source,
        });
    }
    let btf = Btf::from_sys_fs().map_err(|e| LoadError::BadBtf {
        path: KERNEL_BTF,
        detail: chain(&e),
    })?;
    Ok((loader, btf))
}

/// Whether the kernel's BTF has a function (a hook point) by that name.
fn has_function(btf: &Btf, name: &str) -> bool {
    btf.id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
        .is_ok()
}

/// Why a program object (of `component`) did not load before any program
/// was tried: `bpf(2)` refused maps or BTF (errno and a hint), or the object
/// does not fit this kernel.
pub(crate) fn object_error(component: &'static str, e: EbpfError) -> LoadError {
    let errno = errno_of(&e);
    let detail = chain(&e);
    match &e {
        EbpfError::MapError(_) | EbpfError::BtfError(BtfError::LoadError { .. }) => {
            let hint = match errno {
                Some(libc::EPERM | libc::EACCES) => {
                    " (not permitted: needs root or CAP_BPF; unprivileged BPF or a sandbox \
                     policy may forbid it)"
                }
                Some(libc::ENOSYS) => " (the kernel has no bpf(2): CONFIG_BPF_SYSCALL is off)",
                _ => "",
            };
            LoadError::BpfUnavailable {
                errno,
                detail: format!("the {component}'s object: {detail}{hint}"),
            }
        }
        _ => LoadError::BpfUnavailable {
            errno,
            detail: format!("the {component} object does not fit this kernel: {detail}"),
        },
    }
}

fn failure(hook: &Hook, part: &Part, reason: FailureReason, detail: String) -> ProgramFailure {
    ProgramFailure {
        program: hook.name,
        part: format!(
            "{}/{} as {}",
            match part.kind {
                Kind::FEntry => "fentry",
                Kind::FExit => "fexit",
            },
            part.func,
            part.progs.join(" or ")
        ),
        reason,
        detail,
    }
}

/// A refusal by a verifier that does not know a helper the program calls.
fn unknown_helper(f: &ProgramFailure) -> bool {
    f.reason == FailureReason::Verifier
        && (f.detail.contains("unknown func") || f.detail.contains("invalid func"))
}

/// Attaches every part of `hook` (all or nothing); returns the programs
/// that loaded.
fn attach_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    hook: &Hook,
) -> Result<Vec<&'static str>, ProgramFailure> {
    let mut done: Vec<(&Part, &'static str)> = Vec::new();
    for part in hook.parts {
        let mut first_err = None;
        let mut loaded = None;
        for prog in part.progs {
            match load_part(ebpf, btf, part, prog) {
                Ok(()) => {
                    loaded = Some(*prog);
                    break;
                }
                Err(e) => {
                    unload_part(ebpf, part, prog);
                    first_err.get_or_insert(e);
                }
            }
        }
        match (loaded, first_err) {
            (Some(prog), _) => done.push((part, prog)),
            (None, e) => {
                // All or nothing: undo the parts already attached.
                for (p, prog) in &done {
                    unload_part(ebpf, p, prog);
                }
                let (reason, detail) = match e {
                    Some(e) => classify(&e),
                    None => (FailureReason::Other, "no program".to_string()),
                };
                return Err(failure(hook, part, reason, detail));
            }
        }
    }
    Ok(done.into_iter().map(|(_, prog)| prog).collect())
}

fn load_part(ebpf: &mut Ebpf, btf: &Btf, part: &Part, prog: &str) -> Result<(), ProgramError> {
    let program = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?;
    match part.kind {
        Kind::FExit => {
            let p: &mut FExit = program.try_into()?;
            p.load(part.func, btf)?;
            p.attach()?;
        }
        Kind::FEntry => {
            let p: &mut FEntry = program.try_into()?;
            p.load(part.func, btf)?;
            p.attach()?;
        }
    }
    Ok(())
}

fn unload_part(ebpf: &mut Ebpf, part: &Part, prog: &str) {
    let Some(program) = ebpf.program_mut(prog) else {
        return;
    };
    // Unloading also drops the program's links (detaches it).
    let _ = match part.kind {
        Kind::FExit => <&mut FExit>::try_from(program).map(|p| p.unload()),
        Kind::FEntry => <&mut FEntry>::try_from(program).map(|p| p.unload()),
    };
}

fn classify(e: &ProgramError) -> (FailureReason, String) {
    let errno = errno_of(e);
    let errno_text = errno.map(errno_name).unwrap_or_default();
    match e {
        ProgramError::Btf(BtfError::UnknownBtfTypeName { type_name }) => (
            FailureReason::FunctionNotFound,
            format!("`{type_name}` is not a function in {KERNEL_BTF} (renamed, inlined, or in a module)"),
        ),
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail[tail.len().saturating_sub(6)..].join(" | ");
            if tail.is_empty() && matches!(errno, Some(libc::EPERM | libc::EACCES)) {
                (
                    FailureReason::PermissionDenied,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error}) with no verifier output"),
                )
            } else if !tail.is_empty() {
                (
                    FailureReason::Verifier,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error}); verifier: {tail}"),
                )
            } else {
                (
                    FailureReason::Other,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error})"),
                )
            }
        }
        ProgramError::SyscallError(s) => {
            let reason = if matches!(errno, Some(libc::EPERM | libc::EACCES)) {
                FailureReason::PermissionDenied
            } else {
                FailureReason::Attach
            };
            (reason, format!("{} returned {errno_text} ({})", s.call, s.io_error))
        }
        other => (FailureReason::Other, chain(other)),
    }
}

/// A program's skipped runs, when the kernel that filled `filled` bytes of
/// `info` knows the field (Linux 5.12+): unknown is not zero.
fn recursion_misses(info: &aya_obj::generated::bpf_prog_info, filled: usize) -> Option<u64> {
    let end = std::mem::offset_of!(aya_obj::generated::bpf_prog_info, recursion_misses)
        + std::mem::size_of::<u64>();
    (filled >= end).then_some(info.recursion_misses)
}

#[cfg(test)]
mod tests;
