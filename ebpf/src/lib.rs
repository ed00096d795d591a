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
mod loader;
// The crate's kernel boundary: raw bpf(2) and the C layouts shared with
// the programs. Every block states its SAFETY invariant
// (clippy::undocumented_unsafe_blocks).
#[allow(unsafe_code)]
mod raw;
mod roots;
mod write_telemetry;

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use raw::RawCounters;

pub use error::{FailureReason, LoadError, ProgramFailure, TelemetryError};
pub use write_telemetry::{
    Variant, WriteTelemetry, HOOK_BUFFERED_GENERIC, HOOK_BUFFERED_IOMAP, HOOK_DIRECT, HOOK_NAMES,
    HOOK_RENAME,
};

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
    /// O_DIRECT writes into volumes whose completion the hooks saw begin
    /// and not end: running now, or never counted because the kernel
    /// skipped the end (a trampoline rebuilt by another program's attach
    /// or detach on the same function, or a skipped run).
    pub unfinished_direct_writes: u64,
    /// Buffered writes into volumes whose call the hooks saw begin and not
    /// end, for the same reasons.
    pub unfinished_buffered_writes: u64,
    /// Buffered writes into volumes never counted for certain: their
    /// thread began another write on a volume filesystem before their
    /// end was seen (taken from `unfinished_buffered_writes`). Only grows.
    pub lost_buffered_writes: u64,
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

#[cfg(test)]
mod tests;
