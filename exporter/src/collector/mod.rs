//! Collectors and the scrape driver (node_exporter's collector pattern).
//!
//! Each source of metrics is one module implementing [`Collector`]; none of
//! them knows about HTTP. A scrape is:
//!
//! 1. `registry` reads the prjquota registries into the [`Inventory`] (the
//!    Ready volumes), shared by everything after it;
//! 2. `quota`, `statfs`, `filesystem`, `quota_events`, `ebpf`, `guard`,
//!    `served_dirs` (and `allocs` with `--nomad.alloc-dir`), all at once, their output joined in that order: what several of them
//!    read (each project's quota, each root's identity) is computed once
//!    per scrape by the first that asks ([`Scrape::quota`],
//!    [`Scrape::root_ids`]).
//!
//! The driver times every collector and turns a failure into
//! `prjquota_exporter_scrape_collector_success{collector} 0` plus one log line
//! when the error first appears (and one when it clears), never into a failed
//! scrape: whatever a failing collector produced before failing is served.
//!
//! The eBPF programs and the guard load once, in the background, when the
//! [`Exporter`] is made (`background`); [`Exporter::collector_ready`] waits
//! for one (`--ebpf=required`, `--guard=enforce`), [`Exporter::warm_up`]
//! for every collector's [`Collector::ready`].

pub mod allocs;
pub mod announcements;
mod background;
pub mod dir_stat;
pub mod ebpf;
pub mod filesystem;
pub mod guard;
mod kernel_maps;
pub mod nomad;
pub mod quota;
pub mod quota_events;
pub mod registry;
pub mod roots;
mod selftest;
pub mod served_dirs;
pub mod statfs;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use prjquota_ebpf::guard::GuardMode;
pub use prjquota_ebpf::Mode as EbpfMode;

use crate::exposition::Family;
use crate::inventory::Inventory;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the collectors of one scrape share.
#[derive(Debug)]
pub struct Scrape {
    pub inventory: Arc<Inventory>,
    quota_reader: Arc<quota::QuotaReader>,
    quota: tokio::sync::OnceCell<quota::QuotaReading>,
    root_stat: Arc<roots::RootStat>,
    root_ids: tokio::sync::OnceCell<roots::RootIds>,
    dir_stat: Arc<dir_stat::DirStatReader>,
    dir_stats: tokio::sync::OnceCell<Vec<dir_stat::DirStat>>,
}

impl Scrape {
    pub fn new(inventory: Inventory) -> Scrape {
        Scrape::with_quota_reader(inventory, quota::QuotaReader::new(Duration::from_secs(5)))
    }

    /// A scrape whose quotas come from `reader` (tests: a fake listing).
    pub fn with_quota_reader(inventory: Inventory, reader: quota::QuotaReader) -> Scrape {
        Scrape::with_sources(
            Arc::new(inventory),
            Arc::new(reader),
            Arc::new(roots::RootStat::new(Duration::from_secs(5))),
            Arc::new(dir_stat::DirStatReader::new(Duration::from_secs(5))),
        )
    }

    /// This scrape with the volumes directories' statfs from `stat`
    /// (tests: a fake filesystem).
    pub fn with_dir_stat(self, timeout: Duration, stat: dir_stat::StatFn) -> Scrape {
        Scrape {
            dir_stat: Arc::new(dir_stat::DirStatReader::with_stat(timeout, stat)),
            ..self
        }
    }

    fn with_sources(
        inventory: Arc<Inventory>,
        quota_reader: Arc<quota::QuotaReader>,
        root_stat: Arc<roots::RootStat>,
        dir_stat: Arc<dir_stat::DirStatReader>,
    ) -> Scrape {
        Scrape {
            inventory,
            quota_reader,
            quota: tokio::sync::OnceCell::new(),
            root_stat,
            root_ids: tokio::sync::OnceCell::new(),
            dir_stat,
            dir_stats: tokio::sync::OnceCell::new(),
        }
    }

    /// Every volume's project quota usage and limits, read (one pass per
    /// filesystem) by the first collector that asks in this scrape and
    /// shared with the others: no collector depends on running after
    /// another.
    pub async fn quota(&self) -> &quota::QuotaReading {
        self.quota
            .get_or_init(|| self.quota_reader.read(&self.inventory))
            .await
    }

    /// Every volume root's identity, stat'ed by the first collector that
    /// asks in this scrape (or reused from a recent pass over the same
    /// volumes: [`roots::RootStat::stat_all_or_reuse`]) and shared with the
    /// others.
    pub async fn root_ids(&self) -> &roots::RootIds {
        self.root_ids
            .get_or_init(|| self.root_stat.stat_all_or_reuse(&self.inventory))
            .await
    }

    /// The statfs of every volumes directory (same index as the
    /// inventory's `dirs`), made by the first collector that asks in this
    /// scrape and shared with the others.
    pub async fn dir_stats(&self) -> &[dir_stat::DirStat] {
        self.dir_stats
            .get_or_init(|| self.dir_stat.read(&self.inventory))
            .await
    }
}

/// One source of metrics.
pub trait Collector: Send + Sync {
    /// The `collector` label value.
    fn name(&self) -> &'static str;

    /// Pushes this scrape's families to `out`. An error marks the collector
    /// failed for this scrape; families pushed before it are still served.
    fn collect<'a>(
        &'a self,
        scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Waits until this collector's start-up work is done (the eBPF loads
    /// run in the background): `Err` with the reason when it does not run
    /// as its flags asked. Most have none.
    fn ready(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// What this collector runs as, in a few words for the `ready:` log
    /// line (the guard's mode in force and why); most have nothing to say.
    fn summary(&self) -> Option<String> {
        None
    }

    /// Registers the volumes of `scrape` with whatever kernel state this
    /// collector keeps per volume (the eBPF maps), without collecting:
    /// what a plugin's announcement of a new volume runs. Most keep none.
    fn register<'a>(&'a self, _scrape: &'a Scrape) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// The collectors `--no-collector.<name>` can switch off (node_exporter's
/// flags), each with the families it alone publishes. The registry is what
/// every other collector reads and stays; eBPF and the guard have their
/// own switches, `--ebpf=off` and `--guard=off`, which also report that
/// they are off.
pub const SWITCHABLE: [&str; 4] = ["quota", "statfs", "filesystem", "quota_events"];

/// Settings of an [`Exporter`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Nomad `host_volumes_dir`s whose prjquota registries to export.
    pub volumes_dirs: Vec<PathBuf>,
    /// How long a collector's call into a volumes directory's filesystem
    /// (statfs, quotactl, a registry read, a root's stat) may take before
    /// its directory is treated as stuck (`--collector.mount-timeout`).
    pub mount_timeout: Duration,
    /// Subscribe to the kernel's quota netlink warnings.
    pub quota_events: bool,
    /// Collectors switched off (`--no-collector.<name>`, names from
    /// [`SWITCHABLE`]): not made, never run, nothing published
    /// (`quota_events` off also opens no netlink socket).
    pub disabled_collectors: Vec<&'static str>,
    /// Whether to load the eBPF write-telemetry programs (`--ebpf`).
    pub ebpf: EbpfMode,
    /// The quota-escape guard (`--guard`).
    pub guard: GuardMode,
    /// Where the guard is pinned in bpffs (`--guard.pin-root`).
    pub guard_pin_root: PathBuf,
    /// How often the guard's maps are synced with the registries and the
    /// roots' project IDs checked (`--guard.sync-interval`).
    pub guard_sync_interval: Duration,
    pub guard_verify_interval: Duration,
    /// `--guard.replace-stronger`.
    pub guard_replace_stronger: bool,
    /// Volumes the eBPF counters maps hold (`--ebpf.max-volumes`).
    pub max_volumes: u32,
    /// The plugin's directory, whose prjquota.toml holds the
    /// overcommit_ratio in force (`--plugin-dir`).
    pub plugin_dir: Option<PathBuf>,
    /// Per-allocation disk usage (`--nomad.alloc-dir`); off when `None`.
    pub allocs: Option<allocs::AllocsSetup>,
    /// Nomad's API (`--nomad.*`); off when `None`.
    pub nomad: Option<Arc<crate::nomad::Nomad>>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            volumes_dirs: vec![PathBuf::from("/opt/nomad/data/host_volumes")],
            mount_timeout: Duration::from_secs(5),
            quota_events: true,
            disabled_collectors: Vec::new(),
            ebpf: EbpfMode::Auto,
            guard: GuardMode::Auto,
            guard_pin_root: PathBuf::from(prjquota_ebpf::guard::pins::PIN_ROOT),
            guard_sync_interval: Duration::from_secs(2),
            guard_verify_interval: Duration::from_secs(60),
            guard_replace_stronger: false,
            max_volumes: prjquota_ebpf::LoadOptions::default().max_volumes,
            plugin_dir: None,
            allocs: None,
            nomad: None,
        }
    }
}

/// One finished scrape, ready to encode.
#[derive(Debug)]
pub struct Scraped {
    pub inventory: Arc<Inventory>,
    pub families: Vec<Family>,
}

impl Scraped {
    /// The whole exposition as one string (tests; HTTP streams instead).
    pub fn to_text(&self) -> String {
        crate::exposition::encode_all(&self.families, &self.inventory)
    }
}

/// Runs every collector once per scrape.
pub struct Exporter {
    registry: registry::Registry,
    collectors: Vec<Box<dyn Collector>>,
    /// Longest any one collector may run before the driver gives up on it.
    deadline: Duration,
    /// The last error of each failing collector, so that a persistent
    /// failure is logged once, not at every scrape.
    failing: Mutex<HashMap<&'static str, String>>,
    /// Set once the programs are loaded and every volume of the registry
    /// is registered with them ([`Exporter::warm_up`]): before that, a
    /// scrape would report zeros that mean "not measured".
    ready: tokio::sync::watch::Sender<bool>,
    root_stat: Arc<roots::RootStat>,
    quota_reader: Arc<quota::QuotaReader>,
    dir_stat: Arc<dir_stat::DirStatReader>,
    /// Held by a scrape and by [`Exporter::register_volumes`], each of which
    /// reads the registry and then writes the programs' roots maps: without
    /// it, a scrape that read the registry before a create could rewrite
    /// the maps after a registration that saw it, dropping the new volume.
    roots_sync: tokio::sync::Mutex<()>,
    /// Plugin announcements of new volumes (see `crate::announce`).
    pub announcements: Arc<announcements::Stats>,
    /// Of [`SWITCHABLE`], those switched off.
    disabled: Vec<&'static str>,
    /// Nomad's API, when configured: `prjquota reconcile --nomad` asks it
    /// through the announcement socket.
    nomad: Option<Arc<crate::nomad::Nomad>>,
}

pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git revision it was built from (`exporter/build.rs`).
pub const BUILD_REVISION: &str = env!("PRJQUOTA_REVISION");

impl Exporter {
    pub fn new(config: &Config) -> Exporter {
        let on = |name: &str| !config.disabled_collectors.contains(&name);
        let events = if !on("quota_events") {
            None
        } else if config.quota_events {
            Some(quota_events::QuotaEvents::start())
        } else {
            Some(quota_events::QuotaEvents::disabled(
                "disabled by configuration",
            ))
        };
        let opts = prjquota_ebpf::LoadOptions {
            max_volumes: config.max_volumes,
            max_roots: config
                .max_volumes
                .max(prjquota_ebpf::LoadOptions::default().max_roots),
            ..prjquota_ebpf::LoadOptions::default()
        };
        let ebpf = ebpf::Ebpf::start(
            config.ebpf,
            config.mount_timeout,
            opts.clone(),
            config.volumes_dirs.clone(),
        );
        let guarded_allocs = config
            .allocs
            .as_ref()
            .map(|_| crate::allocs::GuardedRoots::new());
        let guard = guard::GuardCollector::start(
            guard::GuardSetup {
                mode: config.guard,
                volumes_dirs: config.volumes_dirs.clone(),
                pin_root: config.guard_pin_root.clone(),
                sync_interval: config.guard_sync_interval,
                verify_interval: config.guard_verify_interval,
                replace_stronger: config.guard_replace_stronger,
                allocs: guarded_allocs.clone(),
                plugin_dir: config.plugin_dir.clone(),
            },
            config.mount_timeout,
            opts,
        );
        let mut collectors: Vec<Box<dyn Collector>> = Vec::new();
        if on("quota") {
            collectors.push(Box::new(quota::Quota));
        }
        if on("statfs") {
            collectors.push(Box::new(statfs::Statfs::new(config.mount_timeout)));
        }
        if on("filesystem") {
            collectors.push(Box::new(filesystem::Filesystem::new(
                config.mount_timeout,
                config.plugin_dir.clone(),
            )));
        }
        if let Some(events) = events {
            collectors.push(Box::new(events));
        }
        collectors.push(Box::new(ebpf));
        collectors.push(Box::new(guard));
        collectors.push(Box::new(served_dirs::ServedDirs::new(
            &config.volumes_dirs,
            config.mount_timeout,
        )));
        if let (Some(setup), Some(guarded)) = (&config.allocs, guarded_allocs) {
            let pins = match (config.guard, config.volumes_dirs.first()) {
                (GuardMode::Off, _) | (_, None) => None,
                (_, Some(d)) => Some(allocs::GuardPins {
                    pin_root: config.guard_pin_root.clone(),
                    volumes_dir: d.clone(),
                }),
            };
            collectors.push(Box::new(allocs::Allocs::start(
                setup.clone(),
                config.mount_timeout,
                guarded,
                pins,
            )));
        }
        if let Some(n) = &config.nomad {
            collectors.push(Box::new(nomad::NomadCollector(n.clone())));
        }
        Exporter::with_collectors(config, collectors)
    }

    /// Waits until the collector called `name` has done its start-up work
    /// ([`Collector::ready`]): `Err` with the reason when it does not run
    /// as asked (the eBPF programs did not load; the guard cannot enforce
    /// or be pinned). `Ok` when there is no such collector.
    pub async fn collector_ready(&self, name: &str) -> Result<(), String> {
        match self.collectors.iter().find(|c| c.name() == name) {
            Some(c) => c.ready().await,
            None => Ok(()),
        }
    }

    /// The [`Collector::summary`] of the collector called `name`.
    pub fn collector_summary(&self, name: &str) -> Option<String> {
        self.collectors
            .iter()
            .find(|c| c.name() == name)
            .and_then(|c| c.summary())
    }

    /// Start-up: waits for the eBPF loads, then scrapes once, which
    /// registers every volume root of the registry with the programs; then
    /// the exporter is ready (`/healthz` 200, `/metrics` served). Returns
    /// how long it took.
    pub async fn warm_up(&self) -> Duration {
        let start = Instant::now();
        // Failures are reported by the scrape itself; only the wait matters.
        for c in &self.collectors {
            let _ = c.ready().await;
        }
        drop(self.scrape().await);
        self.ready.send_replace(true);
        start.elapsed()
    }

    /// Whether [`Exporter::warm_up`] has finished.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// An exporter with the registry of `config` and the given collectors
    /// after it (tests replace sources with fakes this way).
    pub fn with_collectors(config: &Config, collectors: Vec<Box<dyn Collector>>) -> Exporter {
        Exporter {
            registry: registry::Registry::new(&config.volumes_dirs, config.mount_timeout),
            collectors,
            deadline: (config.mount_timeout * 3).max(Duration::from_secs(10)),
            failing: Mutex::default(),
            ready: tokio::sync::watch::Sender::new(false),
            root_stat: Arc::new(roots::RootStat::new(config.mount_timeout)),
            quota_reader: Arc::new(quota::QuotaReader::new(config.mount_timeout)),
            dir_stat: Arc::new(dir_stat::DirStatReader::new(config.mount_timeout)),
            roots_sync: tokio::sync::Mutex::new(()),
            announcements: Arc::new(announcements::Stats::new(&config.volumes_dirs)),
            disabled: SWITCHABLE
                .into_iter()
                .filter(|n| config.disabled_collectors.contains(n))
                .collect(),
            nomad: config.nomad.clone(),
        }
    }

    /// Nomad's API, when configured.
    pub fn nomad(&self) -> Option<&Arc<crate::nomad::Nomad>> {
        self.nomad.as_ref()
    }

    /// The registries' Ready volumes now, read outside a scrape (under the
    /// lock a scrape holds, so that the two reads never meet in a stuck
    /// mount's bookkeeping): what `prjquota reconcile --nomad` asks about.
    pub async fn inventory(&self) -> (Arc<Inventory>, anyhow::Result<()>) {
        let _sync = self.roots_sync.lock().await;
        self.registry.load().await
    }

    /// Waits until [`Exporter::warm_up`] has finished.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Reads the registries and registers every Ready volume with the
    /// kernel state the collectors keep (the eBPF roots maps), without a
    /// scrape: run when the plugin announces a new volume, so that its
    /// first write is counted and its project ID guarded.
    pub async fn register_volumes(&self) -> anyhow::Result<()> {
        let _sync = self.roots_sync.lock().await;
        let (inventory, loaded) = self.registry.load().await;
        loaded?;
        let scrape = Scrape::with_sources(
            inventory,
            self.quota_reader.clone(),
            self.root_stat.clone(),
            self.dir_stat.clone(),
        );
        let mut errors = Vec::new();
        for c in &self.collectors {
            match tokio::time::timeout(self.deadline, c.register(&scrape)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(format!("{}: {e:#}", c.name())),
                Err(_) => errors.push(format!(
                    "{}: gave up after {:.0}s",
                    c.name(),
                    self.deadline.as_secs_f64()
                )),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow::anyhow!(errors.join("; ")))
        }
    }

    pub async fn scrape(&self) -> Scraped {
        let _sync = self.roots_sync.lock().await;
        let mut families = Vec::new();
        let mut outcomes: Vec<(&'static str, f64, bool)> = Vec::new();

        let start = Instant::now();
        let (inventory, loaded) = self.registry.load().await;
        let load_time = start.elapsed();
        let scrape = Scrape::with_sources(
            inventory,
            self.quota_reader.clone(),
            self.root_stat.clone(),
            self.dir_stat.clone(),
        );

        // Every collector at once, as node_exporter runs them: a scrape takes
        // as long as its slowest collector, not the sum of all, and their
        // filesystem calls (statfs, quotactl, the roots' stat: each on the
        // blocking pool) overlap. Each pushes to a list of its own; the lists
        // join in the collectors' order, so the text's order is fixed.
        let all: Vec<&dyn Collector> = std::iter::once(&self.registry as &dyn Collector)
            .chain(self.collectors.iter().map(|c| c.as_ref()))
            .collect();
        let runs = all.iter().map(|c| {
            let scrape = &scrape;
            async move {
                let start = Instant::now();
                let mut out = Vec::new();
                let result =
                    match tokio::time::timeout(self.deadline, c.collect(scrape, &mut out)).await {
                        Ok(r) => r,
                        Err(_) => Err(anyhow::anyhow!(
                            "gave up after {:.0}s (a bug: collectors time their own calls out)",
                            self.deadline.as_secs_f64()
                        )),
                    };
                (out, result, start.elapsed())
            }
        });
        let mut loaded = Some(loaded);
        for (i, (out, mut result, mut took)) in join_all(runs).await.into_iter().enumerate() {
            families.extend(out);
            let c = all[i];
            if i == 0 {
                // The registry: its account includes the read the others
                // waited for.
                result = loaded.take().expect("once").and(result);
                took += load_time;
            }
            let ok = self.note(c.name(), result);
            outcomes.push((c.name(), took.as_secs_f64(), ok));
        }

        families.extend(self_metrics(&scrape.inventory, &outcomes, &self.disabled));
        families.extend(self.announcements.families());
        Scraped {
            inventory: scrape.inventory,
            families,
        }
    }

    /// Logs a collector's error when it first appears or changes, and its
    /// recovery; returns whether it succeeded.
    fn note(&self, name: &'static str, result: anyhow::Result<()>) -> bool {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                if failing.remove(name).is_some() {
                    crate::info!("collector succeeded again", collector = name);
                }
                true
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if failing.get(name) != Some(&msg) {
                    crate::warn!("collector failed", collector = name, err = msg);
                    failing.insert(name, msg);
                } else {
                    crate::debug!("collector still failing", collector = name, err = msg);
                }
                false
            }
        }
    }
}

/// Drives every future of `futures` on the calling task until all are done;
/// their outputs in order. (A handful of collectors: polling each on every
/// wake-up costs nothing worth a dependency.)
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (f, out) in pending.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future was polled to completion"))
        .collect()
}

fn self_metrics(
    inventory: &Inventory,
    outcomes: &[(&'static str, f64, bool)],
    disabled: &[&'static str],
) -> Vec<Family> {
    let mut build = Family::info_metric(
        "prjquota_exporter_build_info",
        "A metric with a constant '1' value labelled by the version of prjquota-exporter and the git revision it was built from.",
    );
    build.labelled(
        vec![
            ("revision", BUILD_REVISION.to_string()),
            ("version", BUILD_VERSION.to_string()),
        ],
        1.0,
    );
    let mut duration = Family::gauge(
        "prjquota_exporter_scrape_collector_duration_seconds",
        "prjquota_exporter: Duration of a collector scrape.",
    );
    let mut success = Family::gauge(
        "prjquota_exporter_scrape_collector_success",
        "prjquota_exporter: Whether a collector succeeded.",
    );
    for (name, secs, ok) in outcomes {
        duration.labelled(vec![("collector", name.to_string())], *secs);
        success.labelled(
            vec![("collector", name.to_string())],
            if *ok { 1.0 } else { 0.0 },
        );
    }
    let mut volumes = Family::gauge(
        "prjquota_exporter_volumes",
        "Number of Ready volumes in the prjquota registries of the configured volumes directories.",
    );
    volumes.plain(inventory.volumes.len() as f64);
    // node_exporter leaves a switched-off collector out of
    // scrape_collector_success, as here; this says it was switched off,
    // rather than absent from an older exporter or a failed scrape.
    let mut enabled = Family::gauge(
        "prjquota_exporter_collector_enabled",
        "Whether a collector that --no-collector.<name> can switch off is on (1) or off (0, publishing nothing).",
    );
    for name in SWITCHABLE {
        enabled.labelled(
            vec![("collector", name.to_string())],
            if disabled.contains(&name) { 0.0 } else { 1.0 },
        );
    }
    vec![build, duration, success, volumes, enabled]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exporter of `collectors` over a volumes directory that does not
    /// exist (a registry of no volumes).
    fn without_volumes(name: &str, collectors: Vec<Box<dyn Collector>>) -> Exporter {
        let dir = std::env::temp_dir().join(format!("prjq-exp-{name}-{}", std::process::id()));
        let config = Config {
            volumes_dirs: vec![dir],
            ..Config::default()
        };
        Exporter::with_collectors(&config, collectors)
    }

    struct Failing;

    impl Collector for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn collect<'a>(
            &'a self,
            _: &'a Scrape,
            out: &'a mut Vec<Family>,
        ) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                let mut f = Family::gauge("partial_metric", "Pushed before failing.");
                f.plain(1.0);
                out.push(f);
                anyhow::bail!("broken on purpose")
            })
        }
    }

    /// Waits `secs` (a filesystem call taking its time), then pushes one
    /// family named after itself.
    struct Slow(&'static str, u64);

    impl Collector for Slow {
        fn name(&self) -> &'static str {
            self.0
        }
        fn collect<'a>(
            &'a self,
            _: &'a Scrape,
            out: &'a mut Vec<Family>,
        ) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(self.1)).await;
                let mut f = Family::gauge(self.0, "A slow collector's metric.");
                f.plain(self.1 as f64);
                out.push(f);
                Ok(())
            })
        }
    }

    /// Two collectors each waiting up to their timeout (a stuck statfs, a
    /// stuck quotactl) make a scrape as long as the longer, not the sum:
    /// 5 s + 5 s would be past Prometheus' default scrape timeout of 10 s.
    /// Their series still come in the collectors' order.
    #[tokio::test(start_paused = true)]
    async fn collectors_run_at_once_and_their_output_keeps_their_order() {
        let exporter = without_volumes(
            "slow",
            vec![Box::new(Slow("slow_a", 5)), Box::new(Slow("slow_b", 4))],
        );
        let start = tokio::time::Instant::now();
        let text = exporter.scrape().await.to_text();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(5) && took < Duration::from_secs(6),
            "a scrape took {took:?}"
        );
        let (a, b) = (text.find("\nslow_a 5\n"), text.find("\nslow_b 4\n"));
        assert!(a.is_some() && b.is_some() && a < b, "{text}");
    }

    #[tokio::test]
    async fn a_failing_collector_is_a_metric_not_a_failed_scrape() {
        let exporter = without_volumes("none", vec![Box::new(Failing)]);
        let text = exporter.scrape().await.to_text();
        assert!(
            text.contains("prjquota_exporter_scrape_collector_success{collector=\"failing\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("prjquota_exporter_scrape_collector_success{collector=\"registry\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("partial_metric 1\n"), "{text}");
        assert!(text.contains("prjquota_exporter_volumes 0\n"), "{text}");
        assert!(text.contains(&format!(
            "prjquota_exporter_build_info{{revision=\"{BUILD_REVISION}\",version=\"{BUILD_VERSION}\"}} 1\n"
        )));
        assert!(exporter.failing.lock().unwrap().contains_key("failing"));
    }
}
