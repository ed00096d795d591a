//! The allocations' directories, handed from the scan thread to the
//! guard's sync: the guard keeps an allocation's files in its project as it
//! keeps a volume's (`docs/security.md`).
//!
//! An allocation joins at its claim, before its directory takes the
//! project ID, so that no moment passes between the claim and the end of
//! its walk in which a task could move files out unseen. The walk's own
//! changes give each entry the root's project (and directories
//! PROJINHERIT), which the guard does not count as attempts. The scrapes
//! read only the walked allocations: a claimed one's usage is not
//! complete until its walk is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One accounted allocation directory, as the guard keys its roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedAlloc {
    /// Shared with every scrape's samples of the allocation: a scrape
    /// labels two series per allocation without copying the ID.
    pub alloc_id: Arc<str>,
    /// `st_dev` of the alloc directory.
    pub dev: u64,
    pub ino: u64,
    /// The directory's inode generation: a reused inode number never
    /// matches.
    pub gen: u32,
    pub project_id: u32,
}

/// Whether this exporter's guard is the one an allocation joins: only the
/// exporter that owns the guard of the volumes directory the allocations'
/// roots are written beside accounts them, or two exporters would split
/// them, and the owner's sync would take out every root the other wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GuardOwner {
    /// The guard has not claimed its pins yet.
    #[default]
    Pending,
    /// This exporter owns the guard.
    Mine,
    /// Another exporter does (the reason, for the collector's error).
    Elsewhere(String),
    /// No guard will load here (it failed, or is off): accounting runs
    /// without one, as with `--guard=off`.
    None,
}

#[derive(Debug, Default)]
struct State {
    /// Walked: their usage is complete.
    accounted: Arc<Vec<GuardedAlloc>>,
    /// Claimed, their walk not finished (under way, or failed and retried
    /// at the next scan).
    claimed: Vec<GuardedAlloc>,
    /// Both, as the guard wants them.
    roots: Arc<Vec<GuardedAlloc>>,
    /// The scan thread has said what it holds at least once (its first
    /// scan, or that accounting cannot run yet).
    settled: bool,
    owner: GuardOwner,
}

/// Shared by the scan thread (writer) and the guard's sync (reader).
#[derive(Debug, Default)]
pub struct GuardedRoots {
    state: Mutex<State>,
    settled: Condvar,
    wake: tokio::sync::Notify,
    /// Allocation roots the sync's last successful write put in the maps.
    in_guard: AtomicU64,
}

impl GuardedRoots {
    pub fn new() -> Arc<GuardedRoots> {
        Arc::new(GuardedRoots::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a scan found: the walked allocations and the claimed ones
    /// whose walk is not finished. Wakes the sync when it changed.
    pub fn publish(&self, accounted: Vec<GuardedAlloc>, claimed: Vec<GuardedAlloc>) {
        let mut s = self.lock();
        let mut changed = !s.settled;
        if *s.accounted != accounted || s.claimed != claimed {
            s.roots = Arc::new(accounted.iter().chain(&claimed).cloned().collect());
            s.accounted = Arc::new(accounted);
            s.claimed = claimed;
            changed = true;
        }
        s.settled = true;
        drop(s);
        if changed {
            self.settled.notify_all();
            self.wake.notify_one();
        }
    }

    /// An allocation being claimed: a root from now on, before its
    /// directory takes the project, so that a sync round never removes
    /// what the scan thread writes into the guard's maps for it, and a
    /// guard still loading takes it over. The sync is not woken: a round
    /// costs every root, and the scan thread writes the claim into the
    /// pinned maps itself ([`GuardedRoots::nudge`] when it cannot).
    pub fn join(&self, alloc: GuardedAlloc) {
        let mut s = self.lock();
        if s.roots.contains(&alloc) {
            return;
        }
        s.claimed.push(alloc.clone());
        Arc::make_mut(&mut s.roots).push(alloc);
    }

    /// Asks the sync for a round now: a claim found no pinned maps to
    /// write into (a guard between its load and its pins).
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Accounting cannot run: nothing to hand over, and nobody need wait
    /// for it. What was handed over before stays until a scan says
    /// otherwise (a directory that went away is still one the guard knew).
    pub fn settle(&self) {
        let mut s = self.lock();
        if !s.settled {
            s.settled = true;
            drop(s);
            self.settled.notify_all();
            self.wake.notify_one();
        }
    }

    /// The roots now (walked and claimed), and whether the scan thread
    /// has settled.
    pub fn current(&self) -> (Arc<Vec<GuardedAlloc>>, bool) {
        let s = self.lock();
        (s.roots.clone(), s.settled)
    }

    /// The walked allocations, whose usage a scrape publishes.
    pub fn accounted(&self) -> Arc<Vec<GuardedAlloc>> {
        self.lock().accounted.clone()
    }

    /// Says whose the guard is, once the guard's start has claimed (or
    /// failed to claim) its pins; wakes a scan thread waiting to know.
    pub fn set_owner(&self, owner: GuardOwner) {
        self.lock().owner = owner;
        self.settled.notify_all();
    }

    pub fn owner(&self) -> GuardOwner {
        self.lock().owner.clone()
    }

    /// Waits up to `within` for the guard's start to say whose the guard
    /// is; [`GuardOwner::Pending`] when it did not.
    pub fn wait_owner(&self, within: Duration) -> GuardOwner {
        let deadline = Instant::now() + within;
        let mut s = self.lock();
        while s.owner == GuardOwner::Pending {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .settled
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s.owner.clone()
    }

    /// Waits up to `within` for the first scan, so that a starting guard
    /// takes its maps over with the allocations in them; `false` when it
    /// did not come.
    pub fn wait_settled(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut s = self.lock();
        while !s.settled {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .settled
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Resolves when a scan handed over something new.
    pub async fn changed(&self) {
        self.wake.notified().await
    }

    pub fn set_in_guard(&self, n: usize) {
        self.in_guard.store(n as u64, Ordering::Relaxed);
    }

    pub fn in_guard(&self) -> u64 {
        self.in_guard.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(id: &str, ino: u64) -> GuardedAlloc {
        GuardedAlloc {
            alloc_id: id.into(),
            dev: 1,
            ino,
            gen: 7,
            project_id: 2_000_000_000,
        }
    }

    #[test]
    fn a_waiter_is_released_by_the_first_scan_or_by_a_refusal() {
        let r = GuardedRoots::new();
        assert!(!r.wait_settled(Duration::from_millis(10)));
        let r2 = r.clone();
        let t = std::thread::spawn(move || r2.wait_settled(Duration::from_secs(30)));
        r.publish(vec![root("a", 5)], vec![]);
        assert!(t.join().unwrap());
        assert_eq!(r.current().0.len(), 1);

        let down = GuardedRoots::new();
        down.settle();
        assert!(down.wait_settled(Duration::ZERO));
        assert!(down.current().0.is_empty());
    }

    #[test]
    fn settling_keeps_what_was_handed_over() {
        let r = GuardedRoots::new();
        r.publish(vec![root("a", 5)], vec![]);
        r.settle();
        assert_eq!(*r.current().0, vec![root("a", 5)]);
    }

    #[tokio::test]
    async fn only_a_change_wakes_the_sync() {
        let r = GuardedRoots::new();
        r.publish(vec![root("a", 5)], vec![]);
        // The first publish left a wake-up: taken here.
        tokio::time::timeout(Duration::from_secs(5), r.changed())
            .await
            .expect("a wake-up for the first publish");
        r.publish(vec![root("a", 5)], vec![]);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), r.changed())
                .await
                .is_err(),
            "the same roots again woke the sync"
        );
        r.publish(vec![root("a", 5), root("b", 6)], vec![]);
        tokio::time::timeout(Duration::from_secs(5), r.changed())
            .await
            .expect("a wake-up for a new root");
    }

    #[tokio::test]
    async fn a_claimed_allocation_is_a_root_at_once_and_counted_once_walked() {
        let r = GuardedRoots::new();
        r.publish(vec![root("a", 5)], vec![]);
        r.changed().await;
        r.join(root("b", 6));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), r.changed())
                .await
                .is_err(),
            "a claim woke the sync: a round per claim costs every root per claim"
        );
        r.nudge();
        tokio::time::timeout(Duration::from_secs(5), r.changed())
            .await
            .expect("a wake-up when asked for");
        assert_eq!(*r.current().0, vec![root("a", 5), root("b", 6)]);
        assert_eq!(*r.accounted(), vec![root("a", 5)], "not walked yet");
        // Joining again (a walk retried) adds nothing.
        r.join(root("b", 6));
        assert_eq!(r.current().0.len(), 2);
        // The scan's own list is the truth: walked, or dropped.
        r.publish(vec![root("a", 5), root("b", 6)], vec![]);
        assert_eq!(*r.accounted(), vec![root("a", 5), root("b", 6)]);
        r.join(root("c", 7));
        r.publish(vec![root("a", 5)], vec![]);
        assert_eq!(*r.current().0, vec![root("a", 5)]);
    }

    #[test]
    fn the_scan_waits_for_the_guard_to_say_whose_it_is() {
        let r = GuardedRoots::new();
        assert_eq!(r.wait_owner(Duration::from_millis(10)), GuardOwner::Pending);
        let r2 = r.clone();
        let t = std::thread::spawn(move || r2.wait_owner(Duration::from_secs(30)));
        r.set_owner(GuardOwner::Mine);
        assert_eq!(t.join().unwrap(), GuardOwner::Mine);
        r.set_owner(GuardOwner::Elsewhere("another".into()));
        assert_eq!(
            r.wait_owner(Duration::ZERO),
            GuardOwner::Elsewhere("another".into())
        );
    }
}
