//! What the two kernel-map collectors (ebpf, guard) share besides their
//! lifecycle (`background`): each volume's slot in a program's roots map,
//! synced with the inventory.
//!
//! Each volume ID keeps one index, assigned at first sight, for as long as
//! it is in the inventory. Indexes stay low (the write counters are an
//! array of `--ebpf.max-volumes` slots): a freed index is given out again,
//! but only [`REUSE_AFTER`] after its volume left, so that no count for the
//! old volume can still be in flight when the program's maps zero the slot
//! for the new one. A volumes directory whose registry read failed keeps
//! its roots as they were (for the guard too: a registry that cannot be
//! read must not leave its volumes unguarded), and a root whose stat timed
//! out keeps its last known identity. The map is rewritten only when the
//! roots changed.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prjquota_ebpf::{RootsUpdate, TelemetryError};

use super::Scrape;

/// How long an index rests after its volume left before another volume
/// gets it. A program holds an index from a root lookup to its count: the
/// length of one write, or of one O_DIRECT completion, which can wait on
/// the filesystem's log (seconds at worst). Ten minutes is far beyond that,
/// and costs only the indexes of the volumes deleted in the last ten
/// minutes on top of the live ones.
pub(super) const REUSE_AFTER: Duration = Duration::from_secs(600);

/// One volume's place in a program's maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    pub index: u32,
    /// Index of its volumes directory in the inventory.
    pub dir: usize,
    /// `(st_dev, st_ino)` of its root, as last seen; `None` when the root
    /// could not be stat'ed (missing, not a directory).
    pub root: Option<(u64, u64)>,
    pub project_id: u32,
}

/// The slots of one program, and what its roots map holds.
#[derive(Debug)]
pub(super) struct Roots<R> {
    pub by_id: HashMap<String, Slot>,
    /// The lowest index never given out.
    next: u32,
    /// Indexes whose volume left, oldest first, with when it left.
    freed: VecDeque<(u32, Instant)>,
    /// What the map holds (sorted), so an unchanged set is not rewritten.
    applied: Option<Vec<R>>,
    /// A slot with a root as the program's `set_roots` takes it.
    entry: fn(&Slot, (u64, u64)) -> R,
    /// What the last [`sync_roots`] saw and answered.
    last: Option<Synced>,
}

/// The inputs and the answer of one sync: the inventory (whose volumes'
/// `Arc`s the registry reuses while their records are unchanged; held, so
/// their addresses cannot be reused), each root's stat, each directory's
/// staleness, and each volume's index.
#[derive(Debug)]
struct Synced {
    inventory: Arc<crate::inventory::Inventory>,
    stats: Vec<super::roots::RootId>,
    index_of: Vec<Option<u32>>,
}

impl Synced {
    /// Whether a sync of `scrape` with `stats` would find what this one
    /// found: the same volumes, roots and stale directories.
    fn same_inputs(&self, scrape: &Scrape, stats: &[super::roots::RootId]) -> bool {
        let (old, new) = (&self.inventory, &scrape.inventory);
        old.same_volumes(new)
            && old.dirs.len() == new.dirs.len()
            && old
                .dirs
                .iter()
                .zip(&new.dirs)
                .all(|(a, b)| a.stale == b.stale)
            && self.stats == stats
    }
}

impl<R: Ord + Clone> Roots<R> {
    pub fn new(entry: fn(&Slot, (u64, u64)) -> R) -> Roots<R> {
        Roots {
            by_id: HashMap::new(),
            next: 0,
            freed: VecDeque::new(),
            applied: None,
            entry,
            last: None,
        }
    }

    /// Folds this scrape's stat results into the slots and returns the
    /// roots to register. `stats[i]` is volume `i`'s: `Some(Ok)` its
    /// identity, `Some(Err(()))` not a usable root, `None` no answer.
    pub fn update(&mut self, scrape: &Scrape, stats: &[super::roots::RootId]) -> Vec<R> {
        self.update_at(scrape, stats, Instant::now())
    }

    /// An index for a new volume: the longest-freed one once it has rested
    /// [`REUSE_AFTER`], else one never given out.
    fn take_index(&mut self, now: Instant) -> u32 {
        if let Some(&(index, left)) = self.freed.front() {
            if now.saturating_duration_since(left) >= REUSE_AFTER {
                self.freed.pop_front();
                return index;
            }
        }
        let index = self.next;
        self.next = self.next.wrapping_add(1);
        index
    }

    /// [`Roots::update`] at `now` (tests move the clock).
    pub fn update_at(
        &mut self,
        scrape: &Scrape,
        stats: &[super::roots::RootId],
        now: Instant,
    ) -> Vec<R> {
        let inv = &scrape.inventory;
        let mut present = HashSet::with_capacity(inv.volumes.len());
        for (v, stat) in inv.volumes.iter().zip(stats) {
            present.insert(v.volume_id.as_str());
            if !self.by_id.contains_key(&v.volume_id) {
                let index = self.take_index(now);
                self.by_id.insert(
                    v.volume_id.clone(),
                    Slot {
                        index,
                        dir: v.dir,
                        root: None,
                        project_id: v.project_id,
                    },
                );
            }
            let slot = self.by_id.get_mut(&v.volume_id).expect("inserted above");
            slot.dir = v.dir;
            slot.project_id = v.project_id;
            match stat {
                Some(Ok(id)) => slot.root = Some(*id),
                Some(Err(())) => slot.root = None,
                None => {} // no answer: keep what was known
            }
        }
        // A volume gone from the inventory goes, unless its directory's
        // registry could not be read (then its last state stands).
        let freed = &mut self.freed;
        self.by_id.retain(|id, slot| {
            let keep =
                present.contains(id.as_str()) || inv.dirs.get(slot.dir).is_some_and(|d| d.stale);
            if !keep {
                freed.push_back((slot.index, now));
            }
            keep
        });
        let entry = self.entry;
        let mut roots: Vec<R> = self
            .by_id
            .values()
            .filter_map(|s| s.root.map(|r| entry(s, r)))
            .collect();
        roots.sort_unstable();
        roots
    }
}

/// Brings a program's roots map up to this scrape's inventory (`set` is the
/// program's `set_roots`, run on the blocking pool); returns each volume's
/// index (`None`: not registered) and the errors met. The one path for a
/// scrape and for a plugin's announcement ([`super::Collector::register`]).
pub(super) async fn sync_roots<P, R>(
    state: &Arc<Mutex<Roots<R>>>,
    scrape: &Scrape,
    program: &Arc<Mutex<P>>,
    component: &'static str,
    set: fn(&mut P, &[R]) -> Result<RootsUpdate, TelemetryError>,
) -> (Vec<Option<u32>>, Vec<String>)
where
    P: Send + 'static,
    R: Ord + Clone + Send + 'static,
{
    let ids = scrape.root_ids().await;
    let (stats, mut errors) = (&ids.ids, ids.errors.clone());
    let (apply, index_of) = {
        let mut r = state.lock().unwrap_or_else(|e| e.into_inner());
        // Nothing changed since a sync whose roots are in the map: the same
        // answer, without hashing every volume ID again (two programs, each
        // several lookups per volume, at every scrape).
        if r.applied.is_some() {
            if let Some(last) = r.last.as_ref().filter(|l| l.same_inputs(scrape, stats)) {
                return (last.index_of.clone(), errors);
            }
        }
        let roots = r.update(scrape, stats);
        let apply = (r.applied.as_ref() != Some(&roots)).then_some(roots);
        let index_of: Vec<Option<u32>> = scrape
            .inventory
            .volumes
            .iter()
            .map(|v| r.by_id.get(&v.volume_id).map(|s| s.index))
            .collect();
        r.last = Some(Synced {
            inventory: scrape.inventory.clone(),
            stats: stats.to_vec(),
            index_of: index_of.clone(),
        });
        (apply, index_of)
    };
    let Some(roots) = apply else {
        return (index_of, errors);
    };
    let (p, state) = (program.clone(), state.clone());
    let done = tokio::task::spawn_blocking(move || {
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        match set(&mut p, &roots) {
            Ok(u) => {
                if !u.rejected.is_empty() {
                    crate::warn!(
                        "volume roots on devices the kernel cannot name were skipped",
                        component = component,
                        roots = u.rejected.len()
                    );
                }
                crate::debug!(
                    "volume roots updated",
                    component = component,
                    added = u.added,
                    changed = u.changed,
                    removed = u.removed,
                    pruned_counters = u.pruned_counters
                );
                state.lock().unwrap_or_else(|e| e.into_inner()).applied = Some(roots);
                None
            }
            Err(e) => {
                // Retried at the next scrape.
                state.lock().unwrap_or_else(|e| e.into_inner()).applied = None;
                Some(format!("cannot update the {component}'s volume roots: {e}"))
            }
        }
    })
    .await;
    match done {
        Ok(e) => errors.extend(e),
        Err(e) => errors.push(format!(
            "updating the {component}'s volume roots panicked: {e}"
        )),
    }
    (index_of, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Inventory;

    /// A program that counts the times its roots are set.
    #[derive(Default)]
    struct Program {
        sets: Vec<Vec<(u64, u64, u32)>>,
    }

    fn set(p: &mut Program, roots: &[(u64, u64, u32)]) -> Result<RootsUpdate, TelemetryError> {
        p.sets.push(roots.to_vec());
        Ok(RootsUpdate::default())
    }

    #[tokio::test]
    async fn an_unchanged_inventory_is_answered_without_a_new_sync() {
        let base = std::env::temp_dir().join(format!("prjq-kmaps-{}", std::process::id()));
        let vols = crate::inventory::tests::volumes_with_roots(&base, 3);
        let inventory = |vols: &[Arc<crate::inventory::Volume>]| {
            let mut inv = Inventory::for_tests(Vec::new());
            inv.volumes = vols.to_vec();
            Scrape::new(inv)
        };
        let state = Arc::new(Mutex::new(Roots::new(|s, (dev, ino)| (dev, ino, s.index))));
        let program = Arc::new(Mutex::new(Program::default()));
        let sync = |scrape: Scrape| {
            let (state, program) = (state.clone(), program.clone());
            async move { sync_roots(&state, &scrape, &program, "test", set).await }
        };

        let (first, errors) = sync(inventory(&vols)).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(first, vec![Some(0), Some(1), Some(2)]);
        assert_eq!(program.lock().unwrap().sets.len(), 1);
        // The same volumes (the registry's Arcs) in a new scrape: the same
        // answer, nothing set again.
        let (again, _) = sync(inventory(&vols)).await;
        assert_eq!(again, first);
        assert_eq!(program.lock().unwrap().sets.len(), 1);
        // A changed record (a new Arc) of the same volume: synced again; its
        // root is the same, so the map is not rewritten and it keeps its
        // index.
        let mut changed = vols.clone();
        changed[1] = Arc::new((*vols[1]).clone());
        let (same, _) = sync(inventory(&changed)).await;
        assert_eq!(same, first);
        assert_eq!(program.lock().unwrap().sets.len(), 1);
        // A root gone: synced, and the map rewritten without it.
        std::fs::remove_dir(&vols[2].root).unwrap();
        let (gone, _) = sync(inventory(&changed)).await;
        assert_eq!(gone, first, "the volume keeps its index while listed");
        let sets = &program.lock().unwrap().sets;
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[1].len(), 2);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
