//! The ebpf collector: bytes written, write operations and failed writes
//! per volume, counted in the kernel by `prjquota-ebpf`'s programs.
//!
//! The programs are loaded once, at start-up, on the blocking pool (parsing
//! the kernel's BTF takes a while); `--ebpf` says what happens then:
//! `auto` (default) runs without them when they cannot load, logging why
//! once; `required` makes start-up fail ([`Exporter::collector_ready`]); `off`
//! loads nothing. Whatever happens, every scrape reports
//! `prjquota_exporter_ebpf_program_attached{program}` per hook point and,
//! while any is not attached, `prjquota_exporter_ebpf_detached_reason{reason}`.
//!
//! Each scrape syncs the programs' map of volume roots with the inventory:
//! the root `<volumes dir>/<volume ID>` is `lstat`ed (on the blocking pool,
//! one call per volumes directory at a time, with `--collector.mount-timeout`; a
//! pass over unchanged volumes is reused for up to a minute, see
//! [`super::roots`]) for its `(st_dev, st_ino)`, and each volume ID keeps
//! one index, assigned at first sight (a freed one only long after its
//! volume left: `kernel_maps::REUSE_AFTER`), for as long as it is in the
//! inventory. A volumes directory whose registry read failed keeps its
//! roots as they were (its inventory is the last good read, or nothing),
//! and a root whose stat timed out keeps its last known identity. The map
//! is rewritten only when the roots changed.
//!
//! [`Exporter::collector_ready`]: crate::Exporter::collector_ready

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::background::{self, Background};
use super::{kernel_maps, BoxFuture, Collector, Scrape};
use crate::exposition::{Extra, Family};
use crate::inventory::Volume;
use anyhow::anyhow;
use prjquota_ebpf::{
    Counters, ErrnoBucket, LoadOptions, Mode, ProgramFailure, WriteTelemetry, HOOK_NAMES,
};

/// How long a scrape waits for a start-up load still in progress before
/// reporting `loading`.
const LOAD_WAIT: Duration = Duration::from_secs(1);

/// The `errno` label sets of `nomad_host_volume_write_errors_total`, in
/// [`ErrnoBucket::ALL`] order.
fn errno_labels(b: ErrnoBucket) -> Extra {
    match b {
        ErrnoBucket::Enospc => &[("errno", "ENOSPC")],
        ErrnoBucket::Edquot => &[("errno", "EDQUOT")],
        ErrnoBucket::Eio => &[("errno", "EIO")],
        ErrnoBucket::Erofs => &[("errno", "EROFS")],
        ErrnoBucket::Other => &[("errno", "other")],
    }
}

/// Where the programs stand: when not loaded (`reason`: `disabled` for
/// `--ebpf=off`, else the crate's `LoadError::reason`), each hook point as
/// not attached.
type Status = background::Status<Attached, Vec<(&'static str, bool)>>;

/// Loaded, with at least one hook attached.
struct Attached {
    telemetry: Arc<Mutex<WriteTelemetry>>,
    programs: Vec<(&'static str, bool)>,
    /// The start-up self-test of each hook a volumes filesystem here
    /// exercises.
    selftest: Vec<super::selftest::Outcome>,
    /// Why the hooks that are not attached failed (`None`: all attached).
    partial: Option<&'static str>,
}

/// Attached is what `--ebpf=auto` and `--ebpf=required` ask for, whatever
/// the hooks that did not attach (reported per hook).
impl background::Loaded for Attached {}

/// Each hook point, as not attached.
fn none_attached() -> Vec<(&'static str, bool)> {
    HOOK_NAMES.iter().map(|p| (*p, false)).collect()
}

/// The write telemetry's slots: `(st_dev, st_ino, index)` per root.
type Roots = kernel_maps::Roots<(u64, u64, u32)>;

fn new_roots() -> Roots {
    Roots::new(|s, (dev, ino)| (dev, ino, s.index))
}

pub struct Ebpf {
    status: Background<Attached, Vec<(&'static str, bool)>>,
    roots: Arc<Mutex<Roots>>,
    since: Mutex<Since>,
}

/// Seconds since the epoch, now.
fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Since when each per-volume counter has counted from zero: OpenMetrics'
/// `_created`, which Prometheus can ingest as a zero sample so that
/// `increase()` sees a series' first count (docs/metrics.md).
///
/// The kernel zeroes a volume's counters when its index enters the roots
/// and keeps them until it leaves; the exporter cannot see that moment,
/// only the reads around it. What it knows for sure: an index absent from
/// one read and present in the next started from zero after the first of
/// them began; an errno series absent from one read of its volume (its
/// count 0) and present in the next was 0 when the first began. So a
/// series' creation time is the start of the last read before it
/// appeared, and the collector's start (before its maps existed) for what
/// the first read finds. Never later than the truth, so Prometheus never
/// takes a count that was already there for a fresh start; and one scrape
/// interval before the first count at most, so `increase()` over a few
/// intervals sees it.
struct Since {
    /// When the collector started: before the programs' maps existed.
    started: f64,
    /// When the last successful read began, and the one before it.
    last_read: Option<f64>,
    previous: Option<f64>,
    /// Per index in the roots at the last read: the volume it was read for
    /// (`None` before it was), and since when it counts. The volume is held,
    /// not hashed: the registry reuses an unchanged record's `Arc`, so most
    /// reads compare a pointer, and a held `Arc`'s address is never reused.
    volumes: foldhash::HashMap<u32, (Option<Arc<Volume>>, f64)>,
    /// Per (index, errno bucket) whose count is not 0: since when.
    errnos: foldhash::HashMap<(u32, usize), f64>,
}

impl Since {
    fn new(started: f64) -> Since {
        Since {
            started,
            last_read: None,
            previous: None,
            volumes: foldhash::HashMap::default(),
            errnos: foldhash::HashMap::default(),
        }
    }

    /// Takes in a read that began at `began`: indexes gone are forgotten,
    /// new ones count since the read before.
    fn read(&mut self, counters: &Counters, began: f64) {
        self.previous = self.last_read;
        self.last_read = Some(began);
        let prev = self.previous_read();
        self.volumes.retain(|i, _| counters.volumes.contains_key(i));
        for i in counters.volumes.keys() {
            self.volumes.entry(*i).or_insert((None, prev));
        }
        let volumes = &self.volumes;
        self.errnos.retain(|(i, _), _| volumes.contains_key(i));
    }

    /// Since when index `index`'s counters count, for `volume`.
    fn volume(&mut self, index: u32, volume: &Arc<Volume>) -> f64 {
        let prev = self.previous_read();
        let e = self.volumes.entry(index).or_insert((None, prev));
        match &e.0 {
            None => e.0 = Some(volume.clone()),
            Some(held) if Arc::ptr_eq(held, volume) => {}
            // The same volume from a rewritten record (a resize).
            Some(held) if held.volume_id == volume.volume_id => e.0 = Some(volume.clone()),
            Some(_) => {
                // Another volume at the same index since the last read: it
                // re-entered, zeroed, after that read.
                *e = (Some(volume.clone()), prev);
                self.errnos.retain(|(i, _), _| *i != index);
            }
        }
        e.1
    }

    /// Since when errno bucket `bucket` of index `index` counts: it was 0
    /// at the read before it was first seen counting.
    fn errno(&mut self, index: u32, bucket: usize) -> f64 {
        let prev = self.previous_read();
        *self.errnos.entry((index, bucket)).or_insert(prev)
    }

    /// When the read before the last one began (after [`Since::read`]).
    fn previous_read(&self) -> f64 {
        self.previous.unwrap_or(self.started)
    }
}

/// Who loads, for the error when it stopped without a result.
const LOADER: &str = "the eBPF loader";

impl Ebpf {
    /// Starts loading the programs on the blocking pool (nothing for
    /// [`Mode::Off`]); scrapes report `loading` until that finishes.
    pub fn start(
        mode: Mode,
        timeout: Duration,
        opts: LoadOptions,
        volumes_dirs: Vec<std::path::PathBuf>,
    ) -> Ebpf {
        let wait = timeout.min(LOAD_WAIT);
        let status = if mode == Mode::Off {
            crate::info!("eBPF write telemetry disabled (--ebpf=off)");
            Background::off(none_attached(), wait, LOADER)
        } else {
            Background::load(
                wait,
                LOADER,
                move || load(mode, &opts, &volumes_dirs),
                |_| {},
            )
        };
        Ebpf::with_status(status)
    }

    fn with_status(status: Background<Attached, Vec<(&'static str, bool)>>) -> Ebpf {
        Ebpf {
            status,
            roots: Arc::new(Mutex::new(new_roots())),
            since: Mutex::new(Since::new(epoch_now())),
        }
    }
}

/// The crate's bounded label for why `failures` failed: their shared
/// reason, else `other` (as `LoadError::reason` does).
fn shared_reason(failures: &[ProgramFailure]) -> &'static str {
    let mut reasons = failures.iter().map(|f| f.reason);
    match reasons.next() {
        Some(first) if reasons.all(|r| r == first) => first.label(),
        _ => "other",
    }
}

fn load(mode: Mode, opts: &LoadOptions, volumes_dirs: &[std::path::PathBuf]) -> Status {
    match WriteTelemetry::start(mode, opts) {
        Ok(Some(mut t)) => {
            let selftest = super::selftest::run(&mut t, volumes_dirs);
            for o in &selftest {
                if o.ok {
                    crate::info!(
                        "eBPF self-test passed",
                        program = o.program,
                        detail = o.detail
                    );
                } else {
                    crate::error!(
                        "eBPF self-test FAILED: the hook is attached but does not count right on this kernel; its writes are miscounted",
                        program = o.program,
                        detail = o.detail
                    );
                }
            }
            let programs = t.programs();
            let partial = (!t.failures().is_empty()).then(|| shared_reason(t.failures()));
            let attached: Vec<&str> = programs.iter().filter(|p| p.1).map(|p| p.0).collect();
            // Which build loaded: helpers (5.17+) or context reads (older
            // kernels), chosen by what this kernel offers.
            crate::info!(
                "eBPF write telemetry attached",
                programs = attached.join(","),
                build = t.variant().as_str()
            );
            for f in t.failures() {
                crate::warn!(
                    "an eBPF write-telemetry program did not attach; its writes are not counted",
                    program = f.program,
                    reason = f.reason.label(),
                    err = f
                );
            }
            Status::Loaded(Attached {
                telemetry: Arc::new(Mutex::new(t)),
                programs,
                selftest,
                partial,
            })
        }
        Ok(None) => Status::Off {
            reason: "disabled",
            error: None,
            detail: none_attached(),
        },
        Err(e) => {
            let reason = e.reason();
            let mut programs: Vec<(&'static str, bool)> =
                e.failures().iter().map(|f| (f.program, false)).collect();
            if programs.is_empty() {
                programs = none_attached();
            }
            if mode != Mode::Required {
                // Logged once, here; scrapes only report it as metrics.
                crate::warn!(
                    "eBPF write telemetry is off: written bytes, write operations and write errors per volume are not reported",
                    reason = reason,
                    err = e
                );
            }
            Status::Off {
                reason,
                error: Some(e.to_string()),
                detail: programs,
            }
        }
    }
}

impl Collector for Ebpf {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let status = self.status.status().await;
            match &*status {
                Status::Loading => {
                    out.extend(status_families(&none_attached(), Some("loading")));
                    Ok(())
                }
                Status::Off {
                    reason,
                    detail: programs,
                    ..
                } => {
                    // Logged once at start-up; a detached collector has
                    // nothing more to report, which is not a failure.
                    out.extend(status_families(programs, Some(reason)));
                    Ok(())
                }
                Status::Loaded(Attached {
                    telemetry,
                    programs,
                    selftest,
                    partial,
                }) => {
                    out.extend(status_families(programs, *partial));
                    out.push(selftest_family(selftest));
                    self.collect_counters(scrape, telemetry, out).await
                }
            }
        })
    }

    fn ready(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(self.status.ready())
    }

    fn register<'a>(&'a self, scrape: &'a Scrape) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let status = self.status.now();
            let Status::Loaded(Attached { telemetry, .. }) = &*status else {
                // Loading: the warm-up registers every volume once loaded.
                return Ok(());
            };
            let (_, errors) = self.sync_roots(scrape, telemetry).await;
            if errors.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(errors.join("; ")))
            }
        })
    }
}

impl Ebpf {
    /// Brings the programs' roots map up to this scrape's inventory; returns
    /// each volume's index (`None`: not registered) and the errors met.
    async fn sync_roots(
        &self,
        scrape: &Scrape,
        telemetry: &Arc<Mutex<WriteTelemetry>>,
    ) -> (Vec<Option<u32>>, Vec<String>) {
        kernel_maps::sync_roots(
            &self.roots,
            scrape,
            telemetry,
            "write telemetry",
            WriteTelemetry::set_roots,
        )
        .await
    }

    async fn collect_counters(
        &self,
        scrape: &Scrape,
        telemetry: &Arc<Mutex<WriteTelemetry>>,
        out: &mut Vec<Family>,
    ) -> anyhow::Result<()> {
        let (index_of, mut errors) = self.sync_roots(scrape, telemetry).await;
        // On this task, not the blocking pool: bpf(2) reads of the maps never
        // wait on a disk (unlike the filesystem calls the pool is for), and
        // at 100 volumes the hand-off to a pool thread and back cost more
        // than the reads (measured under the VM's emulated CPU: the
        // collector took 0.5 ms, from 1.3-1.6 ms with the hand-off and the
        // fdinfo reads `missed_runs` replaced).
        let began = epoch_now();
        let (read, missed) = {
            let mut t = telemetry.lock().unwrap_or_else(|e| e.into_inner());
            let missed = t.missed_runs();
            match t.revalidate_cache(&missed) {
                Ok(false) => {}
                Ok(true) => crate::warn!(
                    "the kernel skipped a run of the eBPF vfs_rename hook: cached write attributions dropped (writes into a directory renamed meanwhile may have counted for its old volume until now)"
                ),
                Err(e) => crate::warn!(
                    "cannot drop the cached write attributions after a skipped vfs_rename run",
                    err = e
                ),
            }
            (t.read(), missed)
        };
        out.push(missed_family(&missed));
        let counters = match read {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("cannot read the eBPF counters: {e}"));
                return Err(anyhow!(errors.join("; ")));
            }
        };
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.read(&counters, began);
        out.extend(counter_families(
            &counters,
            &index_of,
            &scrape.inventory,
            &mut since,
        ));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(errors.join("; ")))
        }
    }
}

/// `…_ebpf_program_missed_runs_total` per attached hook whose count the
/// kernel reports.
fn missed_family(missed: &[(&'static str, Option<u64>)]) -> Family {
    let mut f = Family::counter(
        "prjquota_exporter_ebpf_program_missed_runs_total",
        "Runs of the hook's eBPF programs the kernel skipped since the exporter started (recursion_misses): each is a write that is not counted. A tracing program is not re-entered on a CPU where it already runs; on a preemptible kernel (PREEMPT_LAZY or PREEMPT, as Debian's 7.x) a task preempted inside one makes a write on that CPU go uncounted.",
    );
    for (program, n) in missed {
        if let Some(n) = n {
            f.labelled(vec![("program", program.to_string())], *n as f64);
        }
    }
    f
}

/// `…_ebpf_selftest_success` per hook the start-up self-test exercised.
fn selftest_family(outcomes: &[super::selftest::Outcome]) -> Family {
    let mut f = Family::gauge(
        "prjquota_exporter_ebpf_selftest_success",
        "Whether a known write into the exporter's probe file under <volumes dir>/.prjquota/selftest came back exact through this hook at start-up (1) or not (0: the hook is attached but miscounts on this kernel). Only hooks the node's volume filesystems exercise are tested.",
    );
    for o in outcomes {
        f.labelled(
            vec![("program", o.program.to_string())],
            if o.ok { 1.0 } else { 0.0 },
        );
    }
    f
}

/// `…_ebpf_program_attached` per hook and, when some are not attached,
/// `…_ebpf_detached_reason`.
fn status_families(programs: &[(&'static str, bool)], detached: Option<&str>) -> Vec<Family> {
    let mut attached = Family::gauge(
        "prjquota_exporter_ebpf_program_attached",
        "Whether the eBPF write-telemetry program of a kernel hook point is attached (1) or not (0); nomad_host_volume_written_bytes_total, …_write_operations_total and …_write_errors_total miss the writes of a detached hook point.",
    );
    for (program, ok) in programs {
        attached.labelled(
            vec![("program", program.to_string())],
            if *ok { 1.0 } else { 0.0 },
        );
    }
    let mut fams = vec![attached];
    if let Some(reason) = detached {
        let mut why = Family::gauge(
            "prjquota_exporter_ebpf_detached_reason",
            "1, labelled with why, while some eBPF write-telemetry program is not attached: disabled (--ebpf=off), loading (start-up has not finished), permission, no_btf, bad_btf, bpf_unavailable, function_not_found, verifier, kernel_too_old, attach or other. The exporter logs the details at start-up. No series when every program is attached.",
        );
        why.labelled(vec![("reason", reason.to_string())], 1.0);
        fams.push(why);
    }
    fams
}

/// The per-volume counters of the volumes with a registered root
/// (`index_of[i]`: volume `i`'s index), and the unattributed writes.
fn counter_families(
    counters: &Counters,
    index_of: &[Option<u32>],
    inventory: &crate::inventory::Inventory,
    since: &mut Since,
) -> Vec<Family> {
    let n = index_of.len();
    let mut bytes = Family::counter(
        "nomad_host_volume_written_bytes_total",
        "Bytes written to files below the volume root by successful writes (write, pwrite, writev, O_DIRECT, io_uring, aio), counted by eBPF since the exporter started or the volume appeared.",
    )
    .with_capacity(n);
    let mut ops = Family::counter(
        "nomad_host_volume_write_operations_total",
        "Successful writes (that wrote at least one byte) to files below the volume root, counted by eBPF since the exporter started or the volume appeared.",
    )
    .with_capacity(n);
    let mut errors = Family::counter(
        "nomad_host_volume_write_errors_total",
        "Failed writes to files below the volume root by errno: ENOSPC (on XFS also a full project quota), EDQUOT (on ext4 a full project quota), EIO, EROFS, other; counted by eBPF since the exporter started or the volume appeared. A series appears at its errno's first failed write (none while nomad_host_volume_write_operations_total shows the volume counted and nothing failed).",
    );
    for (i, index) in index_of.iter().enumerate() {
        // A volume whose root is not registered (not stat'able) has no
        // series: its writes are not being counted.
        let Some((x, c)) = index.and_then(|x| Some((x, counters.volumes.get(&x)?))) else {
            continue;
        };
        let created = since.volume(x, &inventory.volumes[i]);
        bytes.volume_since(i, &[], c.written_bytes as f64, created);
        ops.volume_since(i, &[], c.write_ops as f64, created);
        // An errno's series appears at its first failed write: five zero
        // series per volume carried no information and were a fifth of a
        // scrape. The written bytes and operations above say the volume's
        // writes are counted, so a missing errno series means none failed.
        for (n, (b, count)) in c.errors_by_bucket().enumerate() {
            if count > 0 {
                errors.volume_since(i, errno_labels(b), count as f64, since.errno(x, n));
            }
        }
    }
    let mut unattributed = Family::counter(
        "prjquota_exporter_ebpf_unattributed_writes_total",
        "Successful write operations the eBPF programs counted for no volume, by reason: other_filesystems (a filesystem without volumes), outside_roots (a volumes filesystem, not below a volume root), walk_limit (nested deeper than the programs look for a volume root: these are volume writes that went uncounted), map_full (into a volume beyond --ebpf.max-volumes: counted here instead of per volume).",
    );
    let u = &counters.unattributed;
    for (reason, c) in [
        ("other_filesystems", &u.other_filesystems),
        ("outside_roots", &u.outside_roots),
        ("walk_limit", &u.walk_limit),
        ("map_full", &u.map_full),
    ] {
        unattributed.labelled(vec![("reason", reason.to_string())], c.write_ops as f64);
    }
    let mut unfinished = Family::gauge(
        "prjquota_exporter_ebpf_unfinished_direct_writes",
        "O_DIRECT writes into volumes whose completion the eBPF hook saw begin and not end: those completing at the scrape, plus those it will never count. The kernel skips the hook's end for calls inside iomap_dio_complete when another eBPF program attaches to or detaches from that function (another exporter's start or stop, a tracing tool), and records no skipped run. A value that stays above zero after writes stop is O_DIRECT writes missing from the volumes' counters.",
    );
    unfinished.plain(counters.unfinished_direct_writes as f64);
    let mut unfinished_buffered = Family::gauge(
        "prjquota_exporter_ebpf_unfinished_buffered_writes",
        "Buffered writes into volumes whose call the eBPF hooks saw begin and not end: those running at the scrape (a writer throttled by writeback stays inside for as long), plus those they will never count. The kernel skips the hooks' end for calls inside iomap_file_buffered_write or generic_perform_write when another eBPF program attaches to or detaches from that function, and records no skipped run. A value that stays above zero after writes stop is buffered writes missing from the volumes' counters.",
    );
    unfinished_buffered.plain(counters.unfinished_buffered_writes as f64);
    let mut lost_buffered = Family::counter(
        "prjquota_exporter_ebpf_lost_buffered_writes_total",
        "Buffered writes into volumes the eBPF hooks will never count, for certain: the writing thread began another write on a volume filesystem while the hooks still held this one's start, so the kernel skipped its end (another eBPF program attached to or detached from the hooked function). Taken from prjquota_exporter_ebpf_unfinished_buffered_writes as they are found.",
    );
    lost_buffered.plain(counters.lost_buffered_writes as f64);
    vec![
        bytes,
        ops,
        errors,
        unattributed,
        unfinished,
        unfinished_buffered,
        lost_buffered,
    ]
}

/// Every family this collector can export, as an attached exporter would
/// (with no volumes), so that a host without eBPF can still check that what
/// the dashboards read exists (dashboards/tests/dashboard.rs).
pub fn catalogue() -> Vec<Family> {
    let mut fams = status_families(&none_attached(), Some("other"));
    fams.extend(counter_families(
        &Counters::default(),
        &[],
        &crate::inventory::Inventory::default(),
        &mut Since::new(0.0),
    ));
    fams.push(selftest_family(&[]));
    fams.push(missed_family(&[]));
    fams
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::volume;
    use crate::inventory::{Dir, Inventory};
    use prjquota_ebpf::VolumeCounters;

    fn scrape(ids: &[u32], stale: bool) -> Scrape {
        let mut inv = Inventory::for_tests(ids.iter().map(|&i| volume("ns", "pool", i)).collect());
        inv.dirs[0].stale = stale;
        Scrape::new(inv)
    }

    fn text(fams: &[Family], scrape: &Scrape) -> String {
        crate::exposition::encode_all(fams, &scrape.inventory)
    }

    /// Indexes stay with their volume, stay low (the counters are an
    /// array), and a freed one goes to a new volume only once it rested.
    #[test]
    fn indexes_are_stable_and_reused_only_long_after_their_volume_left() {
        use super::super::kernel_maps::REUSE_AFTER;
        let ms = Duration::from_millis;
        let t0 = std::time::Instant::now();
        let mut r = new_roots();
        let s = scrape(&[1, 2], false);
        let roots = r.update_at(&s, &[Some(Ok((8, 100))), Some(Ok((8, 200)))], t0);
        assert_eq!(roots, vec![(8, 100, 0), (8, 200, 1)]);
        // Volume 1 deleted, 3 created: index 0 rests, so 3 gets a new one;
        // 2 keeps its own.
        let left = t0 + ms(1000);
        let s = scrape(&[2, 3], false);
        let roots = r.update_at(&s, &[Some(Ok((8, 200))), Some(Ok((8, 300)))], left);
        assert_eq!(roots, vec![(8, 200, 1), (8, 300, 2)]);
        // A root that cannot be stat'ed is dropped, one that timed out kept.
        let roots = r.update_at(&s, &[Some(Err(())), None], left + ms(1000));
        assert_eq!(roots, vec![(8, 300, 2)]);
        assert_eq!(r.by_id.len(), 2, "the unstat'able volume keeps its index");
        // Just before index 0 has rested: volume 4 gets a new index.
        let up = |i: u64| Some(Ok((8, i * 100)));
        let s = scrape(&[2, 3, 4], false);
        let roots = r.update_at(&s, &[up(2), up(3), up(4)], left + REUSE_AFTER - ms(1));
        assert_eq!(roots, vec![(8, 200, 1), (8, 300, 2), (8, 400, 3)]);
        // Once it has: volume 5 gets index 0, and nobody else holds it.
        let s = scrape(&[2, 3, 4, 5], false);
        let roots = r.update_at(&s, &[up(2), up(3), up(4), up(5)], left + REUSE_AFTER);
        assert_eq!(
            roots,
            vec![(8, 200, 1), (8, 300, 2), (8, 400, 3), (8, 500, 0)]
        );
    }

    #[test]
    fn a_failed_registry_read_keeps_the_roots() {
        let mut r = new_roots();
        let s = scrape(&[1, 2], false);
        r.update(&s, &[Some(Ok((8, 100))), Some(Ok((8, 200)))]);
        // The registry could not be read and nothing was read before: an
        // empty, stale inventory must not empty the map.
        let s = scrape(&[], true);
        assert_eq!(r.update(&s, &[]), vec![(8, 100, 0), (8, 200, 1)]);
        let s = scrape(&[], false);
        assert_eq!(r.update(&s, &[]), vec![]);
    }

    #[test]
    fn every_volume_with_a_root_gets_its_series_and_errnos_once_they_failed() {
        let s = scrape(&[1, 2, 3], false);
        let mut counters = Counters::default();
        let mut a = VolumeCounters {
            written_bytes: 4096,
            write_ops: 2,
            ..VolumeCounters::default()
        };
        a.errors[0] = 3; // ENOSPC
        counters.volumes.insert(7, a);
        counters.volumes.insert(9, VolumeCounters::default());
        counters.unattributed.walk_limit.write_ops = 5;
        let fams = counter_families(
            &counters,
            &[Some(7), Some(9), None],
            &s.inventory,
            &mut Since::new(0.0),
        );
        let t = text(&fams, &s);
        let (v1, v2, v3) = (
            &s.inventory.volumes[0].volume_id,
            &s.inventory.volumes[1].volume_id,
            &s.inventory.volumes[2].volume_id,
        );
        for line in [
            format!("nomad_host_volume_written_bytes_total{{namespace=\"ns\",node_pool=\"pool\",volume_id=\"{v1}\"}} 4096"),
            format!("nomad_host_volume_write_operations_total{{namespace=\"ns\",node_pool=\"pool\",volume_id=\"{v1}\"}} 2"),
            format!("nomad_host_volume_write_errors_total{{namespace=\"ns\",node_pool=\"pool\",volume_id=\"{v1}\",errno=\"ENOSPC\"}} 3"),
            format!("nomad_host_volume_written_bytes_total{{namespace=\"ns\",node_pool=\"pool\",volume_id=\"{v2}\"}} 0"),
            "prjquota_exporter_ebpf_unattributed_writes_total{reason=\"walk_limit\"} 5".to_string(),
            "prjquota_exporter_ebpf_unattributed_writes_total{reason=\"outside_roots\"} 0".to_string(),
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        // Only the errno that failed has a series; the volume without
        // failures has none, though its writes are counted.
        assert_eq!(
            t.matches("nomad_host_volume_write_errors_total{").count(),
            1
        );
        assert!(!t.contains(&format!("volume_id=\"{v2}\",errno=")), "{t}");
        assert!(!t.contains(v3.as_str()), "no root, no series:\n{t}");
        assert!(t.contains("# TYPE nomad_host_volume_write_errors_total counter"));
    }

    /// `_created`: the collector's start for what the first read finds,
    /// the read before for a series that appears later, kept while it
    /// stays, started afresh when its index leaves and comes back.
    #[test]
    fn a_series_counts_since_the_read_before_it_appeared() {
        let s = scrape(&[1, 2], false);
        let ids = [Some(7), Some(9)];
        let mut since = Since::new(100.0);
        let mut counters = Counters::default();
        counters.volumes.insert(7, VolumeCounters::default());
        let created = |since: &mut Since, counters: &Counters, t: f64| {
            since.read(counters, t);
            let fams = counter_families(counters, &ids, &s.inventory, since);
            let of = |name: &str| -> Vec<f64> {
                fams.iter()
                    .find(|f| f.name == name)
                    .map(|f| f.created.clone())
                    .unwrap_or_default()
            };
            (
                of("nomad_host_volume_written_bytes_total"),
                of("nomad_host_volume_write_errors_total"),
            )
        };
        // First read: volume 1 only, no errors.
        assert_eq!(created(&mut since, &counters, 110.0), (vec![100.0], vec![]));
        // Volume 2's root registered, volume 1's first ENOSPC: both since
        // the read at 110, when neither counted.
        counters.volumes.insert(9, VolumeCounters::default());
        counters.volumes.get_mut(&7).unwrap().errors[0] = 1;
        assert_eq!(
            created(&mut since, &counters, 120.0),
            (vec![100.0, 110.0], vec![110.0])
        );
        // Unchanged later; a second errno since the read before it.
        counters.volumes.get_mut(&7).unwrap().errors[2] = 4;
        assert_eq!(
            created(&mut since, &counters, 130.0),
            (vec![100.0, 110.0], vec![110.0, 120.0])
        );
        // Volume 1's root gone for a read, then back (zeroed on entering).
        let gone = counters.volumes.remove(&7).unwrap();
        assert_eq!(created(&mut since, &counters, 140.0), (vec![110.0], vec![]));
        counters.volumes.insert(7, gone);
        assert_eq!(
            created(&mut since, &counters, 150.0),
            (vec![140.0, 110.0], vec![140.0, 140.0])
        );
        // The same volumes from rewritten records (a resize: new `Arc`s,
        // the same IDs) count since when they did.
        let again = scrape(&[1, 2], false);
        since.read(&counters, 155.0);
        let fams = counter_families(&counters, &ids, &again.inventory, &mut since);
        assert_eq!(fams[0].created, vec![140.0, 110.0]);
        // Another volume at index 9 (reused) starts afresh.
        let s2 = scrape(&[1, 3], false);
        since.read(&counters, 160.0);
        let fams = counter_families(&counters, &ids, &s2.inventory, &mut since);
        assert_eq!(fams[0].created, vec![140.0, 155.0]);
    }

    #[tokio::test]
    async fn off_reports_every_program_detached_as_disabled() {
        let e = Ebpf::start(
            Mode::Off,
            Duration::from_secs(1),
            LoadOptions::default(),
            Vec::new(),
        );
        e.ready().await.unwrap();
        let s = scrape(&[1], false);
        let mut out = Vec::new();
        e.collect(&s, &mut out).await.unwrap();
        let t = text(&out, &s);
        for p in HOOK_NAMES {
            let line = format!("prjquota_exporter_ebpf_program_attached{{program=\"{p}\"}} 0");
            assert!(t.lines().any(|l| l == line), "{t}");
        }
        assert!(t.contains("prjquota_exporter_ebpf_detached_reason{reason=\"disabled\"} 1\n"));
        assert!(!t.contains("nomad_host_volume_written_bytes_total{"), "{t}");
    }

    #[tokio::test]
    async fn still_loading_is_reported_as_loading() {
        let (status, _tx) =
            Background::with_status(Status::Loading, Duration::from_millis(10), LOADER);
        let e = Ebpf::with_status(status);
        let s = scrape(&[1], false);
        let mut out = Vec::new();
        e.collect(&s, &mut out).await.unwrap();
        let t = text(&out, &s);
        assert!(
            t.contains("prjquota_exporter_ebpf_detached_reason{reason=\"loading\"} 1\n"),
            "{t}"
        );
        assert_eq!(
            t.matches("prjquota_exporter_ebpf_program_attached{")
                .count(),
            HOOK_NAMES.len()
        );
    }

    #[test]
    fn dir_default_is_not_stale() {
        assert!(!Dir::default().stale);
    }
}
