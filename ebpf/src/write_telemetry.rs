//! The write-telemetry programs (`src/bpf/write_telemetry.c`): which build
//! and hooks load on this kernel, the roots the programs attribute writes
//! to, and the counters they keep.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::os::fd::OwnedFd;

use aya::maps::{Array, Map, MapData, PerCpuArray};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::error::{map_err, named_map, named_map_mut};
use crate::error::{FailureReason, LoadError, ProgramFailure, TelemetryError};
use crate::loader::{
    attach_hook, kernel_btf, object_error, one_load_at_a_time, recursion_misses, unknown_helper,
    Hook, Kind, Part,
};
use crate::loader::{LoadOptions, Variant};
use crate::raw::{self, RawCounters};
use crate::roots::RootsUpdate;
use crate::roots::{self, RootMaps};
use crate::telemetry_mode::Mode;
use crate::write_counters::{Counters, ProgramStats, VolumeCounters};

impl Variant {
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

/// The rename hook: it keeps the attribution cache right.
pub const HOOK_RENAME: &str = "vfs_rename";
/// Buffered writes on XFS (and ext4 from 6.x on, where it moved to iomap).
pub const HOOK_BUFFERED_IOMAP: &str = "iomap_file_buffered_write";
/// Buffered writes on ext4 before iomap.
pub const HOOK_BUFFERED_GENERIC: &str = "generic_perform_write";
/// O_DIRECT writes, io_uring's and aio's included.
pub const HOOK_DIRECT: &str = "iomap_dio_complete";

/// Every hook point of write telemetry, in the order both builds attach and
/// [`WriteTelemetry::programs`] reports them: the names of
/// `prjquota_exporter_ebpf_program_attached{program}`.
pub const HOOK_NAMES: [&str; 4] = [
    HOOK_RENAME,
    HOOK_BUFFERED_IOMAP,
    HOOK_BUFFERED_GENERIC,
    HOOK_DIRECT,
];

/// O_DIRECT's hook, the same in both builds (`iomap_dio_complete` has kept
/// its one argument). Every hook with two halves attaches its fexit first:
/// an fentry without its fexit would only fill the hand-off slots, and a
/// call the fentry's attach finds in flight (its trampoline rebuilt, see
/// `unfinished_writes` in write_telemetry.c) then has no start: not
/// counted, and not left unfinished either, as it began before the
/// exporter counted.
const DIRECT: Hook = Hook {
    name: HOOK_DIRECT,
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
};

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
        name: HOOK_BUFFERED_IOMAP,
        parts: &[
            Part {
                progs: &["iomap_buffered_write_exit"],
                func: "iomap_file_buffered_write",
                kind: Kind::FExit,
            },
            BUFFERED_IOMAP_ENTRY,
        ],
    },
    Hook {
        name: HOOK_BUFFERED_GENERIC,
        parts: &[
            Part {
                progs: &["generic_perform_write_exit"],
                func: "generic_perform_write",
                kind: Kind::FExit,
            },
            Part {
                progs: &["generic_perform_write_entry"],
                func: "generic_perform_write",
                kind: Kind::FEntry,
            },
        ],
    },
    DIRECT,
];

/// The same program in both builds: it reads the kiocb alone.
const BUFFERED_IOMAP_ENTRY: Part = Part {
    progs: &["iomap_buffered_write_entry"],
    func: "iomap_file_buffered_write",
    kind: Kind::FEntry,
};

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
        name: HOOK_BUFFERED_IOMAP,
        parts: &[
            Part {
                progs: &["iomap_buffered_write_exit4", "iomap_buffered_write_exit3"],
                func: "iomap_file_buffered_write",
                kind: Kind::FExit,
            },
            BUFFERED_IOMAP_ENTRY,
        ],
    },
    Hook {
        name: HOOK_BUFFERED_GENERIC,
        parts: &[
            Part {
                progs: &[
                    "generic_perform_write_exit_file",
                    "generic_perform_write_exit_kiocb",
                ],
                func: "generic_perform_write",
                kind: Kind::FExit,
            },
            Part {
                progs: &[
                    "generic_perform_write_entry_file",
                    "generic_perform_write_entry_kiocb",
                ],
                func: "generic_perform_write",
                kind: Kind::FEntry,
            },
        ],
    },
    DIRECT,
];

const COMPONENT: &str = "write telemetry";
const MAP_GEN: &str = "attr_gen";
const MAP_ROOTS: &str = "roots";
const MAP_ROOT_DEVS: &str = "root_devs";
const MAP_COUNTERS: &str = "volume_counters";
const MAP_UNATTRIBUTED: &str = "unattributed";
const MAP_UNFINISHED: &str = "unfinished_writes";

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
            // dio_task and buffered_task, task-local storage: aya creates
            // them but has no userspace type for them, and userspace never
            // reads them.
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
        let unfinished: PerCpuArray<&MapData, i64> = map_err(
            MAP_UNFINISHED,
            PerCpuArray::try_from(self.map(MAP_UNFINISHED)?),
        )?;
        // Each CPU holds the starts minus the ends it ran, so one may be
        // negative; the sum is not.
        for (path, slot) in [
            (raw::UNFINISHED_DIRECT, &mut out.unfinished_direct_writes),
            (
                raw::UNFINISHED_BUFFERED,
                &mut out.unfinished_buffered_writes,
            ),
        ] {
            let per_cpu = map_err(MAP_UNFINISHED, unfinished.get(&path, 0))?;
            let sum = per_cpu.iter().fold(0i64, |a, n| a.wrapping_add(*n));
            *slot = sum.max(0) as u64;
        }
        let per_cpu = map_err(MAP_UNFINISHED, unfinished.get(&raw::LOST_BUFFERED, 0))?;
        out.lost_buffered_writes = per_cpu.iter().fold(0u64, |a, n| a.wrapping_add(*n as u64));
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
        named_map(&self.ebpf, name)
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, TelemetryError> {
        named_map_mut(&mut self.ebpf, name)
    }
}

#[cfg(test)]
mod tests;
