//! What the plugin's announcements of new volumes did (`crate::announce`
//! listens and counts, here), published with the exporter's own metrics at
//! every scrape.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::exposition::Family;

/// What the announcements did, for `/metrics`.
#[derive(Debug)]
pub struct Stats {
    /// Per volumes directory: whether its socket is listening.
    listening: Vec<(PathBuf, AtomicBool)>,
    registered: AtomicU64,
    failed: AtomicU64,
    refused: AtomicU64,
}

impl Stats {
    pub fn new(dirs: &[PathBuf]) -> Stats {
        Stats {
            listening: dirs
                .iter()
                .map(|d| (d.clone(), AtomicBool::new(false)))
                .collect(),
            registered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Directory `i` (of the volumes directories given to [`Stats::new`])
    /// is listening.
    pub fn set_listening(&self, i: usize) {
        if let Some((_, on)) = self.listening.get(i) {
            on.store(true, Ordering::Relaxed);
        }
    }

    /// `n` announcements answered by a registration that succeeded.
    pub fn registered(&self, n: usize) {
        self.registered.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` announcements answered by a registration that failed.
    pub fn failed(&self, n: usize) {
        self.failed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One announcement refused (not from root, or not a valid request).
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn families(&self) -> Vec<Family> {
        let mut listening = Family::gauge(
            "prjquota_exporter_announce_listening",
            "Whether the exporter listens for the plugin's announcements of new volumes for this volumes directory (1); at 0 a new volume is watched only from the next scrape, and the log says why.",
        );
        for (dir, on) in &self.listening {
            listening.labelled(
                vec![("volumes_dir", dir.display().to_string())],
                if on.load(Ordering::Relaxed) { 1.0 } else { 0.0 },
            );
        }
        let mut total = Family::counter(
            "prjquota_exporter_announcements_total",
            "Announcements of new volumes from the plugin, by result: registered (the volume's root is in the eBPF maps), failed (registration failed: see the log), refused (not from root, or not a valid request).",
        );
        for (result, c) in [
            ("registered", &self.registered),
            ("failed", &self.failed),
            ("refused", &self.refused),
        ] {
            total.labelled(
                vec![("result", result.to_string())],
                c.load(Ordering::Relaxed) as f64,
            );
        }
        vec![listening, total]
    }
}
