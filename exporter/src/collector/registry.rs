//! The registry collector: reads `<volumes dir>/.prjquota/volumes/*.json`
//! into the scrape's [`Inventory`] and reports what the plugin recorded.
//!
//! Reading 10,000 records at every scrape would parse megabytes of JSON for
//! nothing, so parsed records are cached per file, keyed by the file's inode,
//! size, mtime and ctime. The plugin replaces records by rename, so a changed
//! record is a new inode; a stat per file finds it. When the registry
//! directory itself is unchanged (same inode, mtime and ctime) and the last
//! full scan began at least a second after its mtime (so no later change could
//! share that timestamp), nothing was added, removed or renamed, and even the
//! stats are skipped.
//!
//! A missing volumes directory or registry is an empty inventory, not an
//! error. A corrupt record is skipped, counted and logged once (when the file
//! first appears in that form). An unreadable or stuck directory fails the
//! collector and serves the volumes of the last good read, so their series do
//! not flap.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use prjquota_core::record::{self, records_dir, Record, State};

use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::Family;
use crate::inventory::{Dir, Inventory, Volume};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileKey {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    fn of(m: &fs::Metadata) -> FileKey {
        FileKey {
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

#[derive(Clone, Debug)]
enum Parsed {
    Ready(Arc<Volume>),
    InFlight(State),
    Corrupt,
}

#[derive(Debug, Default)]
struct DirCache {
    /// The volumes directory was missing at the last read (logged once).
    missing: bool,
    /// The registry directory as of the last full scan.
    dir_key: Option<(u64, FileKey)>,
    last_full_scan: Option<SystemTime>,
    files: BTreeMap<OsString, (FileKey, Parsed)>,
}

impl DirCache {
    fn clear(&mut self) {
        let missing = self.missing;
        *self = DirCache {
            missing,
            ..DirCache::default()
        };
    }

    /// True when the directory is provably unchanged since the last full scan.
    fn unchanged(&self, key: (u64, FileKey)) -> bool {
        let (Some(old), Some(scanned)) = (self.dir_key, self.last_full_scan) else {
            return false;
        };
        let mtime = UNIX_EPOCH + Duration::new(key.1.mtime.0.max(0) as u64, key.1.mtime.1 as u32);
        old == key && scanned >= mtime + Duration::from_secs(1)
    }
}

/// One read of one volumes directory.
#[derive(Debug, Default)]
struct Snapshot {
    dir: Dir,
    volumes: Vec<Arc<Volume>>,
}

#[derive(Debug)]
struct DirSource {
    index: usize,
    path: PathBuf,
    cache: Arc<Mutex<DirCache>>,
    last_good: Mutex<Option<Arc<Snapshot>>>,
}

/// The registry collector and inventory source.
#[derive(Debug)]
pub struct Registry {
    dirs: Vec<DirSource>,
    timeout: Duration,
    inflight: InFlight,
    /// Volume IDs already reported as duplicates.
    warned: Mutex<HashSet<String>>,
    /// The last inventory handed out: handed out again while nothing in it
    /// changed, with what collectors derived from it.
    last: Mutex<Option<Arc<Inventory>>>,
}

impl Registry {
    pub fn new(volumes_dirs: &[PathBuf], timeout: Duration) -> Registry {
        let mut seen = HashSet::new();
        let dirs = volumes_dirs
            .iter()
            .filter(|p| seen.insert((*p).clone()))
            .enumerate()
            .map(|(index, path)| DirSource {
                index,
                path: path.clone(),
                cache: Arc::default(),
                last_good: Mutex::default(),
            })
            .collect();
        Registry {
            dirs,
            timeout,
            inflight: InFlight::new("registry read"),
            warned: Mutex::default(),
            last: Mutex::default(),
        }
    }

    /// Reads every volumes directory. Always returns an inventory (with the
    /// last good read of a directory that failed), plus whether all reads
    /// succeeded.
    pub async fn load(&self) -> (Arc<Inventory>, anyhow::Result<()>) {
        let mut dirs = Vec::with_capacity(self.dirs.len());
        let mut per_dir = Vec::with_capacity(self.dirs.len());
        let mut errors = Vec::new();
        for src in &self.dirs {
            let cache = src.cache.clone();
            let (index, path) = (src.index, src.path.clone());
            let key = src.path.display().to_string();
            let read = self
                .inflight
                .run(&key, self.timeout, move || {
                    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
                    scan(&mut cache, index, &path)
                })
                .await;
            let (snap, stale) = match read {
                Ok(Ok(s)) => {
                    let s = Arc::new(s);
                    *src.last_good.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
                    (s, false)
                }
                Ok(Err(e)) => {
                    errors.push(format!("cannot read the registry in {key}: {e}"));
                    (self.last_good(src), true)
                }
                Err(blocked) => {
                    errors.push(format!("reading the registry in {key}: {blocked}"));
                    (self.last_good(src), true)
                }
            };
            dirs.push(Dir {
                stale,
                ..snap.dir.clone()
            });
            per_dir.push(snap.volumes.clone());
        }
        let result = if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(errors.join("; ")))
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        // Most loads find what the last one did: that inventory is kept as
        // it is, without assembling (a hash of every volume ID) a copy to
        // compare with it.
        if let Some(l) = last.as_ref().filter(|l| l.lists(&dirs, &per_dir)) {
            return (l.clone(), result);
        }
        let (inventory, dropped) = Inventory::assemble(dirs, per_dir);
        if !dropped.is_empty() {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            for id in dropped {
                if warned.insert(id.clone()) {
                    crate::warn!(
                        "volume listed in more than one volumes directory; reporting the first",
                        volume_id = id
                    );
                }
            }
        }
        let inventory = match last.as_ref() {
            Some(l) if l.same_as(&inventory) => l.clone(),
            _ => Arc::new(inventory),
        };
        *last = Some(inventory.clone());
        (inventory, result)
    }

    fn last_good(&self, src: &DirSource) -> Arc<Snapshot> {
        src.last_good
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| {
                Arc::new(Snapshot {
                    dir: Dir {
                        path: src.path.clone(),
                        ..Dir::default()
                    },
                    volumes: Vec::new(),
                })
            })
    }
}

/// Reads one volumes directory, reusing what `cache` already parsed.
fn scan(cache: &mut DirCache, index: usize, volumes_dir: &Path) -> io::Result<Snapshot> {
    let mut snap = Snapshot {
        dir: Dir {
            path: volumes_dir.to_path_buf(),
            ..Dir::default()
        },
        volumes: Vec::new(),
    };
    match fs::metadata(volumes_dir) {
        Ok(m) => {
            snap.dir.dev = Some(m.dev());
            cache.missing = false;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !cache.missing {
                crate::info!(
                    "the volumes directory does not exist (yet); it holds no volumes",
                    volumes_dir = volumes_dir.display()
                );
            }
            cache.clear();
            cache.missing = true;
            return Ok(snap);
        }
        Err(e) => return Err(e),
    }
    let registry = records_dir(volumes_dir);
    let started = SystemTime::now();
    let meta = match fs::metadata(&registry) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            cache.clear();
            return Ok(snap);
        }
        Err(e) => return Err(e),
    };
    let key = (meta.dev(), FileKey::of(&meta));
    if !cache.unchanged(key) {
        let mut files = BTreeMap::new();
        for entry in fs::read_dir(&registry)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(stem) = record::record_stem(&name) else {
                continue;
            };
            // lstat: a symlink is not a record.
            let m = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let fkey = FileKey::of(&m);
            let parsed = match cache.files.remove(&name) {
                Some((k, p)) if k == fkey => p,
                _ => {
                    let path = entry.path();
                    let result = if m.file_type().is_file() {
                        read_record(&path, stem)
                    } else {
                        Err("not a regular file".to_string())
                    };
                    match result {
                        Ok(None) => continue, // removed meanwhile
                        Ok(Some(r)) => match r.state {
                            State::Ready => {
                                Parsed::Ready(Arc::new(Volume::from_record(index, volumes_dir, &r)))
                            }
                            other => Parsed::InFlight(other),
                        },
                        Err(error) => {
                            crate::warn!(
                                "skipping an unreadable registry record; run `prjquota reconcile` to inspect it",
                                file = path.display(),
                                err = error
                            );
                            Parsed::Corrupt
                        }
                    }
                }
            };
            files.insert(name, (fkey, parsed));
        }
        cache.files = files;
        cache.dir_key = Some(key);
        cache.last_full_scan = Some(started);
    }
    for (_, parsed) in cache.files.values() {
        match parsed {
            Parsed::Ready(v) => snap.volumes.push(v.clone()),
            Parsed::InFlight(State::Creating) => snap.dir.creating += 1,
            Parsed::InFlight(_) => snap.dir.deleting += 1,
            Parsed::Corrupt => snap.dir.corrupt += 1,
        }
    }
    // File names are `<volume ID>.json`, so this is volume-ID order already.
    Ok(snap)
}

/// Reads one record file; `Ok(None)` when it vanished before it was opened.
/// The open checks are the exporter's (it caches per file); the size and
/// content checks are the single record reader's, `prjquota_core::record`.
fn read_record(path: &Path, stem: &str) -> Result<Option<Record>, String> {
    // O_NONBLOCK: a FIFO swapped in after the lstat must not hang the read.
    let f = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if !f.metadata().map_err(|e| e.to_string())?.is_file() {
        return Err("not a regular file".into());
    }
    let rec = record::read_record(f, stem).map_err(|e| format!("{e:#}"))?;
    Ok(Some(rec))
}

impl Collector for Registry {
    fn name(&self) -> &'static str {
        "registry"
    }

    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            out.extend(families(&scrape.inventory));
            Ok(())
        })
    }
}

/// The registry's families for an inventory (pure, so tests can render it).
pub fn families(inv: &Inventory) -> Vec<Family> {
    let n = inv.volumes.len();
    let mut info = Family::info_metric(
        "nomad_host_volume_info",
        "Information about a Nomad dynamic host volume made by prjquota on this node; always 1.",
    )
    .with_capacity(n);
    let mut provisioned = Family::gauge(
        "nomad_host_volume_provisioned_bytes",
        "Capacity in bytes the prjquota plugin returned to Nomad at create time: the project quota hard limit it set.",
    )
    .with_capacity(n);
    let mut min = Family::gauge(
        "nomad_host_volume_requested_min_bytes",
        "capacity_min requested in the volume specification, in bytes (0 = not set).",
    )
    .with_capacity(n);
    let mut max = Family::gauge(
        "nomad_host_volume_requested_max_bytes",
        "capacity_max requested in the volume specification, in bytes (0 = not set).",
    )
    .with_capacity(n);
    for (i, v) in inv.volumes.iter().enumerate() {
        info.info(i);
        provisioned.volume(i, v.provisioned_bytes as f64);
        min.volume(i, v.capacity_min_bytes as f64);
        max.volume(i, v.capacity_max_bytes as f64);
    }
    let mut corrupt = Family::gauge(
        "prjquota_exporter_registry_corrupt_records",
        "Files in a prjquota registry that are not readable records; they are skipped (see the exporter log, and `prjquota reconcile`).",
    );
    let mut pending = Family::gauge(
        "prjquota_exporter_registry_pending_records",
        "Registry records of a volume create or delete in flight (not reported as volumes until Ready); a record stuck here means an interrupted plugin call.",
    );
    for d in &inv.dirs {
        let dir = d.path.display().to_string();
        corrupt.labelled(vec![("volumes_dir", dir.clone())], d.corrupt as f64);
        for (state, count) in [("creating", d.creating), ("deleting", d.deleting)] {
            pending.labelled(
                vec![("volumes_dir", dir.clone()), ("state", state.to_string())],
                count as f64,
            );
        }
    }
    vec![info, provisioned, min, max, corrupt, pending]
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::inventory::tests::temp_dir;

    /// The tests' shared record, with the values these tests' expected
    /// lines name.
    pub fn record(id: &str, namespace: &str, project_id: u32, state: State) -> Record {
        let mut r = prjquota_vmtests::records::record(id, namespace, project_id, state);
        r.volume_name = format!("name-{project_id}");
        r.node_id = "9f8e7d6c-0000-4000-8000-000000000001".into();
        r.path = PathBuf::from("/srv/volumes").join(id);
        r.capacity_min_bytes = 1 << 30;
        r.capacity_max_bytes = 10 << 30;
        r.provisioned_bytes = 10 << 30;
        r.params.max_inodes = Some(5000);
        r
    }

    pub fn write_record(volumes_dir: &Path, rec: &Record) {
        let dir = records_dir(volumes_dir);
        fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(record::temp_file_name(&rec.volume_id));
        fs::write(&tmp, serde_json::to_vec_pretty(rec).unwrap()).unwrap();
        fs::rename(&tmp, dir.join(record::record_file_name(&rec.volume_id))).unwrap();
    }

    const A: &str = "11111111-1111-4111-8111-111111111111";
    const B: &str = "22222222-2222-4222-8222-222222222222";
    const C: &str = "33333333-3333-4333-8333-333333333333";

    #[test]
    fn rendering_names_types_help_labels_and_values() {
        let mut recs = vec![
            record(B, "team-b", 1002, State::Ready),
            record(A, "default", 1001, State::Ready),
            record(C, "default", 1003, State::Creating),
        ];
        // B was created with excluded_from_alerts = "true"; A without.
        recs[0].params.excluded_from_alerts = true;
        let inv = Inventory::from_records(Path::new("/srv/volumes"), Some(1), &recs);
        let text = crate::exposition::encode_all(&families(&inv), &inv);
        let expect_lines = [
            "# HELP nomad_host_volume_info Information about a Nomad dynamic host volume made by prjquota on this node; always 1.",
            "# TYPE nomad_host_volume_info gauge",
            &format!("nomad_host_volume_info{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\",volume_name=\"name-1001\",node_id=\"9f8e7d6c-0000-4000-8000-000000000001\",plugin_id=\"prjquota\",fstype=\"xfs\",project_id=\"1001\"}} 1"),
            &format!("nomad_host_volume_info{{namespace=\"team-b\",node_pool=\"default\",volume_id=\"{B}\",volume_name=\"name-1002\",node_id=\"9f8e7d6c-0000-4000-8000-000000000001\",plugin_id=\"prjquota\",fstype=\"xfs\",project_id=\"1002\",excluded_from_alerts=\"true\"}} 1"),
            &format!("nomad_host_volume_provisioned_bytes{{namespace=\"team-b\",node_pool=\"default\",volume_id=\"{B}\"}} 10737418240"),
            &format!("nomad_host_volume_requested_min_bytes{{namespace=\"default\",node_pool=\"default\",volume_id=\"{A}\"}} 1073741824"),
            "# TYPE nomad_host_volume_requested_max_bytes gauge",
            "prjquota_exporter_registry_corrupt_records{volumes_dir=\"/srv/volumes\"} 0",
            "prjquota_exporter_registry_pending_records{volumes_dir=\"/srv/volumes\",state=\"creating\"} 1",
            "prjquota_exporter_registry_pending_records{volumes_dir=\"/srv/volumes\",state=\"deleting\"} 0",
        ];
        for line in expect_lines {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Only Ready volumes are series; A sorts before B.
        assert_eq!(text.matches("nomad_host_volume_info{").count(), 2);
        assert!(!text.contains(C));
        assert!(text.find(A).unwrap() < text.find(B).unwrap());
    }

    #[tokio::test]
    async fn a_corrupt_record_is_skipped_counted_and_others_survive() {
        let d = temp_dir("corrupt");
        write_record(&d, &record(A, "default", 1001, State::Ready));
        let vols = records_dir(&d);
        fs::write(vols.join(format!("{B}.json")), b"{ not json").unwrap();
        // A record whose ID does not match its file name is corrupt too.
        fs::write(
            vols.join(format!("{C}.json")),
            serde_json::to_vec(&record(A, "default", 1, State::Ready)).unwrap(),
        )
        .unwrap();
        fs::write(vols.join(".ignored.json.tmp"), b"junk").unwrap();
        fs::write(vols.join("README"), b"junk").unwrap();
        let reg = Registry::new(std::slice::from_ref(&d), Duration::from_secs(5));
        let (inv, res) = reg.load().await;
        res.unwrap();
        assert_eq!(inv.volumes.len(), 1);
        assert_eq!(inv.volumes[0].volume_id, A);
        assert_eq!(inv.volumes[0].root, d.join(A));
        assert_eq!(inv.dirs[0].corrupt, 2);
        assert!(inv.dirs[0].dev.is_some());
        fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn missing_and_empty_volumes_dirs_are_empty_inventories() {
        let d = temp_dir("empty");
        let missing = d.join("does-not-exist");
        let reg = Registry::new(&[d.clone(), missing.clone()], Duration::from_secs(5));
        let (inv, res) = reg.load().await;
        res.unwrap();
        assert!(inv.volumes.is_empty());
        assert_eq!(inv.dirs.len(), 2);
        assert_eq!(inv.dirs[1].dev, None);
        // An empty registry directory too.
        fs::create_dir_all(records_dir(&d)).unwrap();
        let (inv, res) = reg.load().await;
        res.unwrap();
        assert!(inv.volumes.is_empty());
        fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn changes_are_seen_and_deleted_volumes_vanish() {
        let d = temp_dir("changes");
        let reg = Registry::new(std::slice::from_ref(&d), Duration::from_secs(5));
        write_record(&d, &record(A, "default", 1001, State::Creating));
        let (inv, _) = reg.load().await;
        assert_eq!((inv.volumes.len(), inv.dirs[0].creating), (0, 1));
        // Creating -> Ready by rename, as the plugin does.
        write_record(&d, &record(A, "default", 1001, State::Ready));
        write_record(&d, &record(B, "other", 1002, State::Ready));
        let (inv, _) = reg.load().await;
        assert_eq!(inv.volumes.len(), 2);
        assert_eq!(inv.dirs[0].creating, 0);
        let first = inv.volumes[0].clone();
        // Unchanged records are reused, not parsed again, and so is the
        // inventory, with what collectors derived from it.
        let (again, _) = reg.load().await;
        assert!(Arc::ptr_eq(&first, &again.volumes[0]));
        assert!(Arc::ptr_eq(&inv, &again));
        let inv = again;
        fs::remove_file(records_dir(&d).join(format!("{A}.json"))).unwrap();
        let (after, _) = reg.load().await;
        assert!(!Arc::ptr_eq(&inv, &after));
        let inv = after;
        assert_eq!(inv.volumes.len(), 1);
        assert_eq!(inv.volumes[0].volume_id, B);
        fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_failed_read_serves_the_last_good_one_marked_stale() {
        let d = temp_dir("stale");
        let reg = Registry::new(std::slice::from_ref(&d), Duration::from_secs(5));
        write_record(&d, &record(A, "default", 1001, State::Ready));
        let (inv, ok) = reg.load().await;
        assert!(ok.is_ok() && !inv.dirs[0].stale);
        // The registry directory replaced by a file: reading it fails.
        let volumes = records_dir(&d);
        fs::remove_dir_all(&volumes).unwrap();
        fs::write(&volumes, b"not a directory").unwrap();
        let (inv, ok) = reg.load().await;
        assert!(ok.is_err());
        assert!(inv.dirs[0].stale);
        assert_eq!(inv.volumes.len(), 1, "the last good read");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_fast_path_needs_a_scan_a_second_after_the_last_change() {
        let k = FileKey {
            ino: 1,
            size: 10,
            mtime: (1_000, 5),
            ctime: (1_000, 5),
        };
        let mut c = DirCache {
            dir_key: Some((7, k)),
            last_full_scan: Some(UNIX_EPOCH + Duration::new(1_000, 500)),
            ..DirCache::default()
        };
        assert!(
            !c.unchanged((7, k)),
            "scan in the same second as the change"
        );
        c.last_full_scan = Some(UNIX_EPOCH + Duration::new(1_001, 5));
        assert!(c.unchanged((7, k)));
        assert!(!c.unchanged((7, FileKey { ino: 2, ..k })));
        assert!(!c.unchanged((8, k)));
    }
}
