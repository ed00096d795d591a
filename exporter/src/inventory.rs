//! The inventory: every `Ready` volume the prjquota registries list, built
//! once per scrape by the registry collector and shared by the others.

use foldhash::{HashMap, HashSet, HashSetExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prjquota_core::guard_contract::kernel_dev;
use prjquota_core::record::Record;

/// What the exporter keeps of a registry record: the labels and numbers it
/// reports, not the volume's parameters or timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Index of the volumes directory in [`Inventory::dirs`].
    pub dir: usize,
    pub volume_id: String,
    pub volume_name: String,
    pub namespace: String,
    pub node_pool: String,
    pub node_id: String,
    pub plugin_id: String,
    pub fstype: String,
    pub project_id: u32,
    pub capacity_min_bytes: u64,
    pub capacity_max_bytes: u64,
    pub provisioned_bytes: u64,
    pub max_inodes: Option<u64>,
    /// The volume's `excluded_from_alerts` parameter: its info series says
    /// so, and the alerts on its fullness skip it.
    pub excluded_from_alerts: bool,
    /// When the plugin last wrote the record (a create, a restore, a resize):
    /// the newest record carries the node's current pool.
    pub updated_unix: u64,
    /// The volume root, `<volumes dir>/<volume ID>`: built from the validated
    /// ID, never taken from the record, so a tampered record cannot point the
    /// exporter's statfs at another path.
    pub root: PathBuf,
}

impl Volume {
    pub fn from_record(dir: usize, volumes_dir: &Path, r: &Record) -> Volume {
        Volume {
            dir,
            volume_id: r.volume_id.as_str().to_string(),
            volume_name: r.volume_name.clone(),
            namespace: r.namespace.clone(),
            node_pool: r.node_pool.clone(),
            node_id: r.node_id.clone(),
            plugin_id: r.plugin_id.clone(),
            fstype: r.fstype.clone(),
            project_id: r.project_id,
            capacity_min_bytes: r.capacity_min_bytes,
            capacity_max_bytes: r.capacity_max_bytes,
            provisioned_bytes: r.provisioned_bytes,
            max_inodes: r.params.max_inodes,
            excluded_from_alerts: r.params.excluded_from_alerts,
            updated_unix: r.updated_unix,
            root: volumes_dir.join(r.volume_id.as_str()),
        }
    }
}

/// One configured volumes directory as the last registry read saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dir {
    pub path: PathBuf,
    /// `st_dev` of the directory: the filesystem its volumes live on and the
    /// device the kernel names in quota warnings. `None` when it is missing.
    pub dev: Option<u64>,
    /// Registry files that could not be read as records.
    pub corrupt: usize,
    /// Records of a create or delete in flight.
    pub creating: usize,
    pub deleting: usize,
    /// The last read of the registry failed: the volumes listed are those of
    /// the last good read (none if there was none), so their absence proves
    /// nothing.
    pub stale: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub dirs: Vec<Dir>,
    /// Ready volumes, grouped by directory, in volume-ID order within one.
    pub volumes: Vec<Arc<Volume>>,
    /// [`Inventory::by_kernel_project`], made by the first caller: the
    /// registry hands the same inventory to scrape after scrape while no
    /// record changes, so it is made once per change, not per scrape.
    by_kernel_project: std::sync::OnceLock<HashMap<(u64, u32), usize>>,
}

impl Inventory {
    pub fn new(dirs: Vec<Dir>, volumes: Vec<Arc<Volume>>) -> Inventory {
        Inventory {
            dirs,
            volumes,
            by_kernel_project: std::sync::OnceLock::new(),
        }
    }

    /// Each volume's index by `(device in the kernel's encoding, project
    /// ID)`, the key the guard's and the quota's kernel state use. Two
    /// volumes with one key (a record copied by hand) leave the later one.
    pub fn by_kernel_project(&self) -> &HashMap<(u64, u32), usize> {
        self.by_kernel_project.get_or_init(|| {
            self.volumes
                .iter()
                .enumerate()
                .filter_map(|(i, v)| Some((self.kernel_key(v)?, i)))
                .collect()
        })
    }

    /// `v`'s `(device in the kernel's encoding, project ID)`; `None` when
    /// its directory's device is unknown.
    fn kernel_key(&self, v: &Volume) -> Option<(u64, u32)> {
        let dev = self.dirs.get(v.dir)?.dev.and_then(kernel_dev)?;
        Some((dev, v.project_id))
    }

    /// Whether `other` lists the same directories, as read, and the very
    /// same volumes: a reader of `other` sees nothing this one does not.
    pub fn same_as(&self, other: &Inventory) -> bool {
        self.dirs == other.dirs && self.same_volumes(other)
    }

    /// Whether `other` holds the very same volumes, in the same order: the
    /// registry reuses an unchanged record's `Arc`, and a holder of the old
    /// inventory keeps its addresses from being reused.
    pub fn same_volumes(&self, other: &Inventory) -> bool {
        self.volumes.len() == other.volumes.len()
            && self
                .volumes
                .iter()
                .zip(&other.volumes)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Whether [`Inventory::assemble`] of `dirs` and `per_dir` would give
    /// this inventory: the same directories, as read, and the very same
    /// volumes in the same order, none dropped.
    pub fn lists(&self, dirs: &[Dir], per_dir: &[Vec<Arc<Volume>>]) -> bool {
        self.dirs == dirs
            && per_dir.iter().map(Vec::len).sum::<usize>() == self.volumes.len()
            && per_dir
                .iter()
                .flatten()
                .zip(&self.volumes)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Assembles an inventory; a volume ID seen in an earlier directory is
    /// dropped (the same directory configured twice, or a bind mount of it),
    /// since two series with one label set would make the scrape invalid.
    /// Returns the dropped IDs too.
    pub fn assemble(dirs: Vec<Dir>, per_dir: Vec<Vec<Arc<Volume>>>) -> (Inventory, Vec<String>) {
        let all: Vec<Arc<Volume>> = per_dir.into_iter().flatten().collect();
        // Borrowed IDs: every scrape runs this over every volume, and a
        // copied ID is an allocation per volume per scrape.
        let first: Vec<bool> = {
            let mut seen = HashSet::with_capacity(all.len());
            all.iter()
                .map(|v| seen.insert(v.volume_id.as_str()))
                .collect()
        };
        let mut dropped = Vec::new();
        let mut volumes = Vec::with_capacity(all.len());
        for (v, first) in all.into_iter().zip(first) {
            if first {
                volumes.push(v);
            } else {
                dropped.push(v.volume_id.clone());
            }
        }
        (Inventory::new(dirs, volumes), dropped)
    }

    /// An inventory of one directory from records, as a test would build it;
    /// records that are not `Ready` are counted, not listed.
    pub fn from_records(volumes_dir: &Path, dev: Option<u64>, records: &[Record]) -> Inventory {
        use prjquota_core::record::State;
        let mut dir = Dir {
            path: volumes_dir.to_path_buf(),
            dev,
            ..Dir::default()
        };
        let mut vols: Vec<Arc<Volume>> = Vec::new();
        for r in records {
            match r.state {
                State::Ready => vols.push(Arc::new(Volume::from_record(0, volumes_dir, r))),
                State::Creating => dir.creating += 1,
                State::Deleting => dir.deleting += 1,
            }
        }
        vols.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Inventory::assemble(vec![dir], vec![vols]).0
    }

    /// Indices of the volumes of directory `dir`.
    pub fn volumes_of(&self, dir: usize) -> impl Iterator<Item = usize> + '_ {
        self.volumes
            .iter()
            .enumerate()
            .filter(move |(_, v)| v.dir == dir)
            .map(|(i, _)| i)
    }

    /// The node ID and node pool that directory `dir`'s newest record
    /// carries (Nomad's restore at each agent start rewrites them all); `None`
    /// while the directory has no volume.
    pub fn node_of(&self, dir: usize) -> Option<(&str, &str)> {
        self.volumes_of(dir)
            .map(|i| &self.volumes[i])
            .max_by_key(|v| v.updated_unix)
            .map(|v| (v.node_id.as_str(), v.node_pool.as_str()))
    }

    #[cfg(test)]
    pub fn for_tests(volumes: Vec<Volume>) -> Inventory {
        Inventory::new(
            vec![Dir {
                path: "/srv/volumes".into(),
                dev: Some(libc::makedev(8, 16)),
                ..Dir::default()
            }],
            volumes.into_iter().map(Arc::new).collect(),
        )
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A fresh directory of this test process under the system's temp dir.
    pub fn temp_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "prjq-exporter-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Volumes 1..=n whose roots are real directories under `base` (made
    /// afresh).
    pub fn volumes_with_roots(base: &Path, n: u32) -> Vec<Arc<Volume>> {
        let _ = std::fs::remove_dir_all(base);
        (1..=n)
            .map(|id| {
                let mut v = volume("a", "p", id);
                v.root = base.join(format!("root-{id}"));
                std::fs::create_dir_all(&v.root).unwrap();
                Arc::new(v)
            })
            .collect()
    }

    /// A volume in directory 0 whose ID ends in `project_id`.
    pub fn volume(namespace: &str, node_pool: &str, project_id: u32) -> Volume {
        let volume_id = format!("00000000-0000-4000-8000-{project_id:012}");
        Volume {
            dir: 0,
            root: Path::new("/srv/volumes").join(&volume_id),
            volume_id,
            volume_name: format!("vol-{project_id}"),
            namespace: namespace.into(),
            node_pool: node_pool.into(),
            node_id: "node-1".into(),
            plugin_id: "prjquota".into(),
            fstype: "xfs".into(),
            project_id,
            capacity_min_bytes: 1 << 30,
            capacity_max_bytes: 2 << 30,
            provisioned_bytes: 2 << 30,
            max_inodes: None,
            excluded_from_alerts: false,
            updated_unix: 0,
        }
    }

    #[test]
    fn duplicate_volume_ids_across_dirs_are_dropped() {
        let a = Arc::new(volume("a", "p", 1));
        let mut b = volume("b", "p", 1);
        b.dir = 1;
        let (inv, dropped) = Inventory::assemble(
            vec![Dir::default(), Dir::default()],
            vec![vec![a.clone()], vec![Arc::new(b)]],
        );
        assert_eq!(inv.volumes.len(), 1);
        assert_eq!(inv.volumes[0].namespace, "a");
        assert_eq!(dropped, vec![a.volume_id.clone()]);
    }

    /// What lets the registry keep its last inventory: the very same
    /// volumes in the same directories, none dropped; anything else is
    /// assembled afresh.
    #[test]
    fn an_inventory_lists_only_what_assembles_into_it() {
        let (a, b) = (Arc::new(volume("a", "p", 1)), Arc::new(volume("a", "p", 2)));
        let dirs = vec![Dir::default(), Dir::default()];
        let per_dir = vec![vec![a.clone()], vec![b.clone()]];
        let (inv, _) = Inventory::assemble(dirs.clone(), per_dir.clone());
        assert!(inv.lists(&dirs, &per_dir));
        // A rewritten record: an equal volume, another `Arc`.
        let b2 = Arc::new(volume("a", "p", 2));
        assert!(!inv.lists(&dirs, &[vec![a.clone()], vec![b2]]));
        // Another order, one volume fewer or more.
        assert!(!inv.lists(&dirs, &[vec![b.clone()], vec![a.clone()]]));
        assert!(!inv.lists(&dirs, &[vec![a.clone()], vec![]]));
        assert!(!inv.lists(&dirs, &[vec![a.clone()], vec![b.clone(), b.clone()]]));
        // A directory read stale this time.
        let mut stale = dirs.clone();
        stale[1].stale = true;
        assert!(!inv.lists(&stale, &per_dir));
        // One dropped as a duplicate: its assembly never lists it.
        let dup = vec![vec![a.clone()], vec![a.clone()]];
        let (inv, dropped) = Inventory::assemble(dirs.clone(), dup.clone());
        assert_eq!(dropped.len(), 1);
        assert!(!inv.lists(&dirs, &dup));
    }

    #[test]
    fn the_project_index_keeps_the_later_of_one_key_and_skips_unknown_devices() {
        let mut in_missing_dir = volume("c", "p", 3);
        in_missing_dir.volume_id = "00000000-0000-4000-8000-00000000000c".into();
        in_missing_dir.dir = 1;
        let mut copy = volume("b", "p", 1);
        copy.volume_id = "00000000-0000-4000-8000-00000000000b".into();
        let mut inv = Inventory::for_tests(vec![volume("a", "p", 1), volume("a", "p", 2), copy]);
        inv.volumes.push(Arc::new(in_missing_dir));
        inv.dirs.push(Dir::default());
        let dev = kernel_dev(libc::makedev(8, 16)).unwrap();
        let index = inv.by_kernel_project();
        assert_eq!(index.len(), 2);
        assert_eq!(
            index.get(&(dev, 1)),
            Some(&2),
            "the later volume of project 1"
        );
        assert_eq!(index.get(&(dev, 2)), Some(&1));
    }
}
