//! Volumes placed where they fit (`--nomad.publish-unprovisioned`): what
//! the plugin's admission would still accept in the volumes directory is
//! published as the node's dynamic metadata
//! [`META_KEY`] (`POST /v1/client/metadata` on the local agent, Nomad 1.5
//! and later), which a volume spec's `constraint` compares its size with
//! (docs/nomad.md). Nomad compares two numbers as numbers
//! (`checkOrder`), so the value is a plain count of bytes.
//!
//! The key is in Nomad's `unique.` namespace: a node's computed class
//! hashes its metadata but for those keys, and a value that changes with
//! every create would otherwise give the node a new class each time, and
//! void the scheduler's per-class feasibility cache for every job.
//!
//! The figure is measured here, off the scrape's path, with readers of its
//! own (the scrapes' would take a concurrent read for a stuck mount), and
//! published when it matters: at once after a create, grow or delete (the
//! volumes' promised bytes changed), otherwise only when it moved by more
//! than the hysteresis (files outside volumes come and go), and every
//! [`REFRESH`] (an agent whose state was wiped). A figure that cannot be
//! measured is not published; the last one stays.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::blocking::InFlight;
use crate::collector::dir_stat::DirStatReader;
use crate::collector::filesystem::{probe, unprovisioned, Health};
use crate::collector::quota::QuotaReader;
use crate::collector::registry::Registry;

/// The node metadata key: `${meta.unique.prjquota.unprovisioned_bytes}`
/// in a constraint.
pub const META_KEY: &str = "unique.prjquota.unprovisioned_bytes";

/// How often the figure is published even when it did not move.
pub const REFRESH: Duration = Duration::from_secs(300);

/// One measure of the volumes directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    pub unprovisioned: u64,
    /// The sum of the volumes' provisioned bytes: a change is a create, a
    /// grow or a delete.
    pub promised: u64,
}

/// What was last published.
#[derive(Clone, Copy, Debug)]
pub struct Published {
    pub value: Measured,
    pub at: Instant,
}

/// Whether `now`'s measure is to be published, given the last one
/// published and the hysteresis `band` in bytes.
pub fn due(last: Option<&Published>, now: Measured, band: u64, at: Instant) -> bool {
    let Some(last) = last else { return true };
    last.value.promised != now.promised
        || last.value.unprovisioned.abs_diff(now.unprovisioned) >= band.max(1)
        || at.duration_since(last.at) >= REFRESH
}

/// Measures the volumes directory as a scrape does.
pub struct Measure {
    volumes_dir: PathBuf,
    plugin_dir: Option<PathBuf>,
    timeout: Duration,
    registry: Registry,
    quota: QuotaReader,
    stat: DirStatReader,
    inflight: InFlight,
}

impl Measure {
    pub fn new(volumes_dir: PathBuf, plugin_dir: Option<PathBuf>, timeout: Duration) -> Measure {
        Measure {
            registry: Registry::new(std::slice::from_ref(&volumes_dir), timeout),
            quota: QuotaReader::new(timeout),
            stat: DirStatReader::new(timeout),
            inflight: InFlight::new("placement measure"),
            volumes_dir,
            plugin_dir,
            timeout,
        }
    }

    pub fn volumes_dir(&self) -> &std::path::Path {
        &self.volumes_dir
    }

    /// What admission would accept now, or why it cannot be told.
    pub async fn measure(&self) -> Result<Measured, String> {
        let (inv, loaded) = self.registry.load().await;
        loaded.map_err(|e| format!("{e:#}"))?;
        let shown = self.volumes_dir.display().to_string();
        let Some(dir) = inv.dirs.first() else {
            return Err(format!("{shown}: no such volumes directory"));
        };
        if dir.dev.is_none() {
            return Err(format!(
                "{shown} does not exist: Nomad's client makes its host_volumes_dir at start"
            ));
        }
        let stat = match self.stat.read(&inv).await.into_iter().next().flatten() {
            Some(Ok(st)) => st,
            Some(Err(e)) => return Err(format!("statfs of {shown}: {e}")),
            None => return Err(format!("{shown}: no statfs")),
        };
        let path = self.volumes_dir.clone();
        let health = self
            .inflight
            .run(&format!("{shown} (probe)"), self.timeout, move || {
                probe(&path)
            })
            .await
            .unwrap_or_else(|b| Health {
                unhealthy: Some(format!("probe: {b}")),
                enforced: None,
            });
        // Off the runtime's thread, the plugin directory's stat too: its
        // storage may stop answering.
        let Some(dir) = self.plugin_dir.clone() else {
            return Err(
                "no plugin directory (--plugin-dir): the overcommit_ratio creates are \
                        admitted with is unknown"
                    .into(),
            );
        };
        let read = self
            .inflight
            .run("plugin directory", self.timeout, move || {
                dir.is_dir()
                    .then(|| prjquota_core::config::load(&dir).map(|c| c.overcommit_ratio))
            })
            .await;
        let ratio = match read {
            Ok(Some(Ok(r))) => Some(r),
            // Every create is refused with the same error.
            Ok(Some(Err(_))) => Some(0.0),
            Ok(None) => {
                return Err(
                    "the plugin directory (--plugin-dir) does not exist: the overcommit_ratio \
                     creates are admitted with is unknown"
                        .into(),
                )
            }
            Err(b) => return Err(format!("reading the plugin's prjquota.toml: {b}")),
        };
        let reading = self.quota.read(&inv).await;
        let usage: Option<u64> = reading
            .per_volume
            .iter()
            .try_fold(0u64, |sum, q| q.map(|q| sum.saturating_add(q.used_bytes)));
        let promised = inv
            .volumes
            .iter()
            .map(|v| v.provisioned_bytes)
            .fold(0u64, u64::saturating_add);
        let left = unprovisioned(&stat, &health, usage, promised, ratio).ok_or_else(|| {
            format!(
                "the volumes' usage could not be read: {}",
                reading.errors.join("; ")
            )
        })?;
        Ok(Measured {
            unprovisioned: left,
            promised,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn m(unprovisioned: u64, promised: u64) -> Measured {
        Measured {
            unprovisioned,
            promised,
        }
    }

    /// Published at first, at once after any create, grow or delete, and
    /// otherwise only past the band or the refresh: files outside volumes
    /// moving a little do not make an update each.
    #[test]
    fn published_on_promises_past_the_band_and_at_the_refresh() {
        let t0 = Instant::now();
        let band = GIB / 4;
        assert!(due(None, m(10 * GIB, 0), band, t0));
        let last = Published {
            value: m(10 * GIB, 5 * GIB),
            at: t0,
        };
        let soon = t0 + Duration::from_secs(10);
        assert!(!due(Some(&last), m(10 * GIB, 5 * GIB), band, soon));
        assert!(!due(
            Some(&last),
            m(10 * GIB - band + 1, 5 * GIB),
            band,
            soon
        ));
        assert!(!due(
            Some(&last),
            m(10 * GIB + band - 1, 5 * GIB),
            band,
            soon
        ));
        assert!(due(Some(&last), m(10 * GIB - band, 5 * GIB), band, soon));
        assert!(due(Some(&last), m(10 * GIB + band, 5 * GIB), band, soon));
        // A create of one block is published, however small.
        assert!(due(
            Some(&last),
            m(10 * GIB - 4096, 5 * GIB + 4096),
            band,
            soon
        ));
        assert!(due(Some(&last), m(10 * GIB, 5 * GIB), band, t0 + REFRESH));
        // A band of 0 still needs a change to publish.
        assert!(!due(Some(&last), m(10 * GIB, 5 * GIB), 0, soon));
    }
}
