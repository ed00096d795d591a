//! Nomad's HTTP API, off unless configured (`--nomad.*`, and Nomad's own
//! `NOMAD_*` variables): what the exporter tells Nomad and reads from it.
//!
//! - [`placement`]: the volumes directory's unprovisioned bytes as the
//!   node's dynamic metadata, for a volume spec's constraint
//!   (`--nomad.publish-unprovisioned`);
//! - [`disk_sizes`]: each allocation's `ephemeral_disk.size`, which the
//!   allocation scan sets as its project's limit
//!   (`--nomad.enforce-ephemeral-disk`, `crate::allocs::disk_limits`);
//! - [`volumes`]: which volumes Nomad knows, for `prjquota reconcile
//!   --nomad` (asked through the announcement socket);
//! - [`settings`]: where the agent is and how to talk to it, checked at
//!   start-up; [`client`]: the requests; [`status`]: whether Nomad answers;
//!   [`api`]: the shapes of Nomad's answers.
//!
//! Nothing here runs on a scrape's path: one task makes the requests, every
//! `--nomad.interval` and with a growing pause after a failure, and a
//! scrape reads what it last learned. When Nomad is away nothing on the
//! node changes because of it: no limit is lifted, no metadata cleared.

pub mod api;
pub mod client;
pub mod disk_sizes;
pub mod placement;
pub mod settings;
pub mod status;
pub mod volumes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use client::Client;
pub use settings::Settings;
pub use status::Status;

use crate::allocs::disk_limits::DiskLimits;
use crate::exposition::Family;
use api::{Endpoint, NodeMetaApplyRequest, NodeMetaResponse};
use client::Failure;
use placement::{Measure, Measured, Published, META_KEY};

/// The longest pause after failures: a Nomad that is back is seen within
/// this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What the flags ask of Nomad.
#[derive(Debug)]
pub struct Setup {
    pub settings: Settings,
    /// Between two rounds of requests (`--nomad.interval`).
    pub interval: Duration,
    /// Publish the unprovisioned bytes (`--nomad.publish-unprovisioned`),
    /// moved by at least this many bytes (`--nomad.unprovisioned-hysteresis`).
    pub publish_unprovisioned: Option<u64>,
    /// The node's volumes directory (the first `--volumes-dir`).
    pub volumes_dir: PathBuf,
    pub plugin_dir: Option<PathBuf>,
    pub mount_timeout: Duration,
    /// The allocations' limits (`--nomad.enforce-ephemeral-disk`).
    pub disk_limits: Option<Arc<DiskLimits>>,
}

/// The client and what its task last learned, shared with the scrapes
/// (through the `nomad` collector) and the announcement socket.
pub struct Nomad {
    pub client: Client,
    interval: Duration,
    hysteresis: Option<u64>,
    measure: Measure,
    disk_limits: Option<Arc<DiskLimits>>,
    published: Mutex<Option<Published>>,
    /// The last reason the figure could not be measured, logged once.
    unmeasured: Mutex<Option<String>>,
}

impl std::fmt::Debug for Nomad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nomad")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Nomad {
    /// The client of `setup`, its TLS files read now (a bad one stops the
    /// start-up with the reason).
    pub fn new(setup: Setup) -> Result<Arc<Nomad>, String> {
        let client = Client::new(setup.settings, Arc::new(Status::new()))?;
        Ok(Arc::new(Nomad {
            client,
            interval: setup.interval,
            hysteresis: setup.publish_unprovisioned,
            measure: Measure::new(setup.volumes_dir, setup.plugin_dir, setup.mount_timeout),
            disk_limits: setup.disk_limits,
            published: Mutex::default(),
            unmeasured: Mutex::default(),
        }))
    }

    /// Starts the task that makes the periodic requests (none when only
    /// `prjquota reconcile --nomad` is served).
    pub fn start(self: &Arc<Nomad>) {
        if self.hysteresis.is_none() && self.disk_limits.is_none() {
            return;
        }
        tokio::spawn(run(self.clone()));
    }

    /// One round: publish the figure if due, ask the sizes wanted; `Err`
    /// when Nomad failed (the next round waits longer). The task runs one
    /// every interval; tests drive it.
    pub async fn round(&self, sizes: &mut disk_sizes::Sizes) -> Result<(), Failure> {
        let mut result = Ok(());
        if let Some(band) = self.hysteresis {
            if let Err(f) = self.publish_if_due(band).await {
                result = Err(f);
            }
        }
        if let Some(limits) = &self.disk_limits {
            if let Err(f) = sizes.step(&self.client, limits).await {
                result = Err(f);
            }
        }
        result
    }

    async fn publish_if_due(&self, band: u64) -> Result<(), Failure> {
        let now = match self.measure.measure().await {
            Ok(m) => {
                if self.lock_unmeasured().take().is_some() {
                    crate::info!(
                        "the unprovisioned bytes can be measured again",
                        volumes_dir = self.measure.volumes_dir().display()
                    );
                }
                m
            }
            Err(why) => {
                let mut last = self.lock_unmeasured();
                if last.as_ref() != Some(&why) {
                    crate::warn!(
                        "cannot measure the unprovisioned bytes: Nomad keeps the last figure published",
                        volumes_dir = self.measure.volumes_dir().display(),
                        err = why
                    );
                    *last = Some(why);
                }
                return Ok(());
            }
        };
        let at = Instant::now();
        let last = *self.lock_published();
        if !placement::due(last.as_ref(), now, band, at) {
            return Ok(());
        }
        self.publish(now).await?;
        *self.lock_published() = Some(Published { value: now, at });
        Ok(())
    }

    /// `POST /v1/client/metadata` with the figure, checked in the answer.
    async fn publish(&self, m: Measured) -> Result<(), Failure> {
        let value = m.unprovisioned.to_string();
        let req = NodeMetaApplyRequest {
            node_id: "",
            meta: BTreeMap::from([(META_KEY, Some(value.clone()))]),
        };
        let body = serde_json::to_vec(&req).expect("serialisable");
        let answer = self
            .client
            .post(
                Endpoint::ClientMetadata,
                "/v1/client/metadata",
                body,
                &[200],
            )
            .await?;
        let applied: NodeMetaResponse = answer.json()?;
        if applied.meta.get(META_KEY) != Some(&value) {
            return Err(Failure::Decode(format!(
                "the node's metadata after the update holds {META_KEY} = {:?}, not {value:?}",
                applied.meta.get(META_KEY)
            )));
        }
        crate::debug!(
            "published the unprovisioned bytes as node metadata",
            key = META_KEY,
            value = value,
            promised = m.promised
        );
        Ok(())
    }

    fn lock_published(&self) -> std::sync::MutexGuard<'_, Option<Published>> {
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_unmeasured(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.unmeasured.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Which of `volumes` Nomad knows (`prjquota reconcile --nomad`).
    pub async fn volumes(
        &self,
        volumes: &[Arc<crate::inventory::Volume>],
    ) -> Result<prjquota_core::announce::NomadVolumes, String> {
        let verdicts = volumes::verdicts(&self.client, volumes)
            .await
            .map_err(|f| format!("Nomad at {}: {f}", self.client.settings().addr))?;
        Ok(prjquota_core::announce::NomadVolumes {
            nomad_addr: self.client.settings().addr.to_string(),
            volumes: verdicts,
        })
    }

    /// What the scrapes publish of it.
    pub fn families(&self) -> Vec<Family> {
        let mut out = self.client.status.families();
        let mut published = published_family();
        if let Some(p) = *self.lock_published() {
            published.labelled(
                vec![(
                    "volumes_dir",
                    self.measure.volumes_dir().display().to_string(),
                )],
                p.value.unprovisioned as f64,
            );
        }
        out.push(published);
        out.extend(disk_families(self.disk_limits.as_deref()));
        out
    }
}

fn published_family() -> Family {
    Family::gauge(
        "prjquota_exporter_nomad_published_unprovisioned_bytes",
        "The unprovisioned bytes last published as the node's metadata unique.prjquota.unprovisioned_bytes (--nomad.publish-unprovisioned); absent until published.",
    )
}

/// The allocations' reserved sizes and how their limits stand.
fn disk_families(limits: Option<&DiskLimits>) -> Vec<Family> {
    let mut reserved = Family::gauge(
        "nomad_alloc_disk_reserved_bytes",
        "The allocation's ephemeral_disk.size as Nomad reserved it (AllocatedResources.Shared.DiskMB), read with --nomad.enforce-ephemeral-disk: its project's limit, unless it was over that size when limited.",
    );
    let mut states = Family::gauge(
        "prjquota_exporter_alloc_disk_limits",
        "Accounted allocations by the state of their ephemeral disk limit (--nomad.enforce-ephemeral-disk): limited (at their size), over (over their size when limited: above their usage), pending (no size from Nomad yet: unlimited), failed (the kernel refused; retried every scan).",
    );
    if let Some(l) = limits {
        for (id, bytes) in l.reserved() {
            reserved.labelled_shared("alloc_id", &id, &[], bytes as f64);
        }
        let c = l.census();
        for (state, n) in [
            ("limited", c.limited),
            ("over", c.over),
            ("pending", c.pending),
            ("failed", c.failed),
        ] {
            states.labelled(vec![("state", state.into())], n as f64);
        }
    }
    vec![reserved, states]
}

/// Every family the `nomad` collector can publish (the dashboards' lint).
pub fn catalogue() -> Vec<Family> {
    let mut out = Status::new().families();
    out.push(published_family());
    out.extend(disk_families(None));
    out
}

/// The task: a round every interval, a growing pause after a failure, and
/// at once when an allocation without a size appears.
async fn run(nomad: Arc<Nomad>) {
    let mut sizes = disk_sizes::Sizes::default();
    let mut pause = nomad.interval;
    loop {
        let ok = nomad.round(&mut sizes).await.is_ok();
        pause = if ok {
            nomad.interval
        } else {
            (pause * 2).clamp(nomad.interval, MAX_BACKOFF.max(nomad.interval))
        };
        match (&nomad.disk_limits, ok) {
            (Some(limits), true) => {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = limits.new_allocation() => {}
                }
            }
            _ => tokio::time::sleep(pause).await,
        }
    }
}
