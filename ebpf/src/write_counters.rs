//! What the write-telemetry programs count, as the exporter reads it: per
//! volume, by errno bucket, the writes no volume took, and each hook's
//! run statistics.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::raw::{self, RawCounters};

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

    pub(crate) fn index(self) -> usize {
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

    pub(crate) fn add(&mut self, c: &RawCounters) {
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
    /// More than [`crate::roots::MAX_DEPTH`] directories below the filesystem root with no
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

/// What the kernel measured of one hook's programs (see
/// [`WriteTelemetry::enable_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// Program runs (fentry and fexit halves both count).
    pub run_count: u64,
    /// Time spent running them.
    pub run_time: Duration,
}
