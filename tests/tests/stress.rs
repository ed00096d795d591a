//! Races: rounds of 32 concurrent plugin runs — create, restore, resize and
//! delete in random interleavings over a small pool of volume IDs, as Nomad's
//! restore storms and parallel jobs produce them — and after every round the
//! records, the directories and the kernel's project quotas must agree.
//!
//! CI runs a few rounds. `PRJQUOTA_STRESS_SECS=N` (set by `cargo xtask
//! stress`) keeps going for N seconds instead; the seed is printed so a
//! failing interleaving can be replayed with `PRJQUOTA_STRESS_SEED`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{Fixture, FsCase, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::records::assert_ledger_agrees;
use prjquota_vmtests::witness;

on_every_fs!(concurrent_creates_restores_resizes_and_deletes_stay_consistent);

const POOL: usize = 10;
const THREADS: usize = 32;
const CI_ROUNDS: u64 = 3;

/// xorshift64*: deterministic for a seed, no dependency.
struct Rng(AtomicU64);

impl Rng {
    fn next(&self) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        loop {
            let mut y = x;
            y ^= y >> 12;
            y ^= y << 25;
            y ^= y >> 27;
            match self
                .0
                .compare_exchange(x, y, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return y.wrapping_mul(0x2545_f491_4f6c_dd1d),
                Err(now) => x = now,
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Create(u64),
    Restore,
    Delete,
}

fn concurrent_creates_restores_resizes_and_deletes_stay_consistent(fs: &FsCase) {
    let f = fs.fixture("stress");
    let seed = std::env::var("PRJQUOTA_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("stress seed {seed} (replay with PRJQUOTA_STRESS_SEED={seed})");
    let rng = Rng(AtomicU64::new(seed));
    let pool: Vec<Spec> = (0..POOL)
        .map(|i| Spec::new(&format!("p{i}"), 4 * MIB as i64))
        .collect();
    let budget = std::env::var("PRJQUOTA_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let start = Instant::now();
    let mut rounds = 0u64;
    let mut runs = 0u64;
    loop {
        let done = match budget {
            Some(b) => start.elapsed() >= b,
            None => rounds >= CI_ROUNDS,
        };
        if done {
            break;
        }
        let ops: Vec<(usize, Op)> = (0..THREADS)
            .map(|_| {
                let i = (rng.next() % POOL as u64) as usize;
                let op = match rng.next() % 4 {
                    // The volumes hold no data, so every size fits and
                    // every run must succeed.
                    0 | 1 => Op::Create(4 + rng.next() % 3 * 4),
                    2 => Op::Restore,
                    _ => Op::Delete,
                };
                (i, op)
            })
            .collect();
        std::thread::scope(|s| {
            for (i, op) in &ops {
                let spec = &pool[*i];
                let f = &f;
                s.spawn(move || match *op {
                    Op::Create(mib) => {
                        let mut sp = spec.clone();
                        sp.max = (mib * MIB) as i64;
                        f.node.create(&sp).created();
                    }
                    // A restore replays the request of the last create: the
                    // size in force now (or a fresh create if it is gone).
                    Op::Restore => {
                        let mut sp = spec.clone();
                        if let Some(rec) = f.record(&spec.id) {
                            sp.max = rec["provisioned_bytes"].as_i64().unwrap();
                        }
                        f.node.create(&sp).created();
                    }
                    Op::Delete => f.node.delete(spec).ok(),
                });
            }
        });
        runs += ops.len() as u64;
        rounds += 1;
        assert_consistent(&f, &pool, rounds);
        assert_witnessed(fs, &f, &pool, rounds);
    }
    // A budget of zero seconds (or a leaked host variable) must not turn
    // this into a test that checks nothing.
    assert!(
        rounds > 0 && runs == rounds * THREADS as u64,
        "the stress test ran {rounds} rounds and {runs} plugin runs: \
         PRJQUOTA_STRESS_SECS={:?} left no time for a single round",
        std::env::var("PRJQUOTA_STRESS_SECS").ok()
    );
    eprintln!(
        "MEASURE stress_{}_rounds {rounds} plugin_runs {runs} seconds {:.1}",
        fs.name,
        start.elapsed().as_secs_f64()
    );
}

/// Records, directories and the kernel agree; no project ID is shared.
fn assert_consistent(f: &Fixture, pool: &[Spec], round: u64) {
    assert_ledger_agrees(&f.node.volumes_dir, &format!("round {round}"));
    let mut ids: BTreeMap<u32, String> = BTreeMap::new();
    for spec in pool {
        let path = f.node.volumes_dir.join(&spec.id);
        match f.record(&spec.id) {
            Some(rec) => {
                assert_eq!(
                    rec["state"], "ready",
                    "round {round}: {} left {rec}",
                    spec.id
                );
                let pid = rec["project_id"].as_u64().unwrap() as u32;
                if let Some(other) = ids.insert(pid, spec.id.clone()) {
                    panic!(
                        "round {round}: project {pid} held by {other} and {}",
                        spec.id
                    );
                }
                assert_eq!(
                    Fixture::project_of(&path),
                    (pid, true),
                    "round {round}: {}",
                    spec.id
                );
                let q = f.quota(pid);
                assert_eq!(
                    q.limits.bytes_hard,
                    rec["provisioned_bytes"].as_u64().unwrap(),
                    "round {round}: kernel limit of {}",
                    spec.id
                );
            }
            None => assert!(
                !path.exists(),
                "round {round}: {} has a directory but no record",
                spec.id
            ),
        }
    }
    // No project in the node's range is limited without a record.
    let dir = std::fs::File::open(&f.node.volumes_dir).unwrap();
    let live: BTreeSet<u32> = ids.keys().copied().collect();
    for q in
        prjquota_core::quota::list(std::os::fd::AsFd::as_fd(&dir), f.id_min..=f.id_max).unwrap()
    {
        assert!(
            live.contains(&q.id) || q.is_unused(),
            "round {round}: project {} has limits or usage but no volume: {q:?}",
            q.id
        );
    }
}

/// The filesystem's own quota tool agrees with the records: every volume's
/// limit as `xfs_quota`/`repquota` see it, not as `prjquota_core::quota` reads it.
fn assert_witnessed(fs: &FsCase, f: &Fixture, pool: &[Spec], round: u64) {
    let seen = witness::hard_limits(fs, &(fs.mount)());
    let mut checked = 0;
    for spec in pool {
        let Some(rec) = f.record(&spec.id) else {
            continue;
        };
        let pid = rec["project_id"].as_u64().unwrap() as u32;
        assert_eq!(
            seen.get(&pid).copied(),
            rec["provisioned_bytes"].as_u64(),
            "round {round}: {} (project {pid}) per the filesystem's quota tool",
            spec.id
        );
        checked += 1;
    }
    for (pid, hard) in seen.range(f.id_min..=f.id_max) {
        assert!(
            *hard == 0 || pool.iter().any(|s| f.record(&s.id).is_some_and(|r| r["project_id"].as_u64() == Some(u64::from(*pid)))),
            "round {round}: project {pid} is limited to {hard} bytes per the filesystem's quota tool, but no volume holds it"
        );
    }
    eprintln!("round {round}: quota tool witnessed {checked} volumes");
}
