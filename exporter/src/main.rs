//! `prjquota-exporter`: flags, logging, the runtime and signal handling.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use prjquota_exporter::collector::{EbpfMode, GuardMode};
use prjquota_exporter::log::{self, Level};
use prjquota_exporter::{error, info, warn, Config, Exporter};

/// Default listen address.
///
/// Port 14646 is outside the Prometheus "default port allocations" wiki
/// ranges (9090-9094 for core components, 9100-9999 for exporters, full
/// since 2023, and the 10000+ block newer exporters now take), below Nomad's
/// default dynamic port range (20000-32000, where a static port could
/// collide with an allocation on the same client) and the Linux ephemeral
/// range (32768-60999); it echoes Nomad's own 4646. writing_exporters.md
/// recommends a port outside the allocations for exporters of internal
/// applications.
const DEFAULT_LISTEN: &str = ":14646";

/// Prometheus exporter for Nomad dynamic host volumes made by prjquota: size,
/// usage, inodes and quota limit hits per volume, read from the plugin's
/// registry, statfs, quotactl and the kernel's quota netlink warnings, and
/// bytes written, write operations and write errors per volume from eBPF.
/// Run it as root on every Nomad client (quotactl needs CAP_SYS_ADMIN, the
/// eBPF programs CAP_BPF and CAP_PERFMON).
#[derive(Debug, Parser)]
#[command(
    name = "prjquota-exporter",
    version = concat!(env!("CARGO_PKG_VERSION"), " (revision ", env!("PRJQUOTA_REVISION"), ")")
)]
struct Flags {
    /// A Nomad client's host_volumes_dir whose prjquota registry
    /// (<DIR>/.prjquota) to export. Repeat for several directories.
    #[arg(
        long = "volumes-dir",
        value_name = "DIR",
        default_value = "/opt/nomad/data/host_volumes"
    )]
    volumes_dirs: Vec<PathBuf>,

    /// The Nomad client's host_volume_plugin_dir holding the plugin's
    /// prjquota.toml: nomad_host_volumes_overcommit_ratio is its
    /// overcommit_ratio (1 when the directory has no such file). When the
    /// directory does not exist, that series is absent.
    #[arg(
        long = "plugin-dir",
        value_name = "DIR",
        default_value = "/opt/nomad/data/host_volume_plugins"
    )]
    plugin_dir: PathBuf,

    /// Address to serve /metrics on: HOST:PORT, [IPV6]:PORT, or :PORT for
    /// every address, IPv4 and IPv6. Repeat to listen on several.
    #[arg(long = "web.listen-address", value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    listen_addresses: Vec<String>,
    /// Serve on the sockets systemd passes (socket activation, from a
    /// .socket unit) instead of --web.listen-address, which is then
    /// ignored.
    #[arg(long = "web.systemd-socket")]
    systemd_socket: bool,
    /// Path to serve the metrics on.
    #[arg(long = "web.telemetry-path", value_name = "PATH", default_value = "/metrics", value_parser = telemetry_path)]
    telemetry_path: String,
    /// TLS and basic auth: a YAML file in exporter-toolkit's web
    /// configuration format (as node_exporter's --web.config.file):
    /// tls_server_config (cert_file, key_file, client_auth_type,
    /// client_ca_file, min_version, max_version), http_server_config
    /// (headers: exporter-toolkit's five security headers on every answer;
    /// http2) and basic_auth_users (user: bcrypt hash). Re-read on SIGHUP;
    /// a bad file stops the start-up, a bad reload keeps the configuration
    /// in force.
    #[arg(long = "web.config.file", value_name = "FILE")]
    web_config_file: Option<PathBuf>,
    /// Never gzip the metrics, even for a scraper that sends
    /// Accept-Encoding: gzip (Prometheus does).
    #[arg(long = "web.disable-compression")]
    disable_compression: bool,
    /// Give every counter a `_created` line in OpenMetrics scrapes, so that
    /// a Prometheus that ingests created timestamps (Prometheus 3 with
    /// --enable-feature=created-timestamp-zero-ingestion) sees the first
    /// event of a new series in rate() and increase(). Off by default: a
    /// Prometheus that does not ingest them stores each `_created` as one
    /// more series per counter series.
    #[arg(long = "web.openmetrics.created-samples")]
    created_samples: bool,

    /// Least severe log level to print (logs are lines on stderr).
    #[arg(
        long = "log.level",
        value_name = "LEVEL",
        value_enum,
        default_value = "info"
    )]
    log_level: Level,

    /// How each log line is written: logfmt, or one JSON object per line.
    #[arg(
        long = "log.format",
        value_name = "FORMAT",
        value_enum,
        default_value = "logfmt"
    )]
    log_format: log::Format,

    /// How long any collector's call into a volumes directory's filesystem
    /// (statfs, quotactl, reading the registry, the roots' stat) may take
    /// before that directory is reported as stuck
    /// (nomad_host_volume_stats_error{reason="timeout"}) and not queried again
    /// until the blocked call returns, as node_exporter's
    /// --collector.filesystem.mount-timeout. A Prometheus duration (5s,
    /// 1500ms, 1m30s), at most 1h.
    /// (--statfs-timeout, its name before, still works.)
    #[arg(long = "collector.mount-timeout", alias = "statfs-timeout", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    mount_timeout: Duration,

    /// eBPF write telemetry (written bytes, write operations and write
    /// errors per volume): off (do not load), auto (load; if the kernel
    /// refuses, log why once, report
    /// prjquota_exporter_ebpf_program_attached 0 and serve everything else)
    /// or required (exit at start-up unless every program attaches).
    #[arg(long = "ebpf", value_name = "MODE", default_value = "auto", value_parser = parse_ebpf_mode)]
    ebpf: EbpfMode,

    /// Quota-escape guard: auto, off, detect (count and log attempts to
    /// change the project ID of files under a volume root) or enforce (also
    /// deny them with EPERM through a BPF LSM program, unless the caller
    /// has CAP_SYS_ADMIN in the initial user namespace). auto enforces
    /// where the BPF LSM is active and detects, logging and publishing why,
    /// where it is not or an LSM program does not attach. The guard is
    /// pinned in bpffs (--guard.pin-root) and keeps working while no
    /// exporter runs. With enforce the exporter refuses to start, saying
    /// why, when it cannot enforce: the BPF LSM is not active (bpf missing
    /// from the kernel's lsm= list), a guard program does not load, or the
    /// guard cannot be pinned.
    #[arg(long = "guard", value_name = "MODE", default_value = "auto", value_parser = parse_guard_mode)]
    guard: GuardMode,

    /// Where the guard is pinned (a directory on a bpf filesystem, made
    /// root-only): it keeps enforcing while no exporter runs (restart,
    /// crash, upgrade), and the plugin writes new volumes into it. With
    /// --guard=off, the pins of the --volumes-dir directories are removed
    /// (not those of an exporter that still runs: one owns each). The
    /// plugin looks where prjquota.toml's guard_pin_root says (in
    /// --plugin-dir; /sys/fs/bpf/prjquota by default), which is this flag's
    /// default: a value of its own elsewhere is refused, saying so.
    #[arg(long = "guard.pin-root", value_name = "DIR")]
    guard_pin_root: Option<PathBuf>,

    /// How often the guard's maps are synced with the registries and the
    /// volume roots checked (and put back) when a registry, the pins or
    /// the guard's counters changed. A Prometheus duration (2s, 500ms,
    /// 1m), at most 1h.
    #[arg(long = "guard.sync-interval", value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    guard_sync_interval: Duration,

    /// The longest the sync goes without opening every volume root to
    /// check its identity, project ID and PROJINHERIT when nothing said it
    /// changed: what catches a root replaced, or re-tagged, by root through
    /// a path the guard does not see. At most 1h.
    #[arg(long = "guard.verify-interval", value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    guard_verify_interval: Duration,

    /// Replace a pinned guard that enforces with this start's, which will
    /// only detect (--guard=detect). Without it such a start leaves the
    /// enforcing guard in place for those volumes directories and says so.
    /// A guard whose exporter still runs is never replaced.
    #[arg(long = "guard.replace-stronger")]
    guard_replace_stronger: bool,

    /// Account each Nomad allocation's disk usage with a project quota of
    /// its own (nomad_alloc_disk_used_bytes{alloc_id}): the agent's
    /// <data_dir>/alloc. Off unless set. Each allocation directory is put
    /// into a project (prjquota.toml's alloc_project_id_min..max) when its
    /// first task starts; the directory must be on a filesystem with
    /// project quota and not on the mount of /usr (docs/allocations.md).
    #[arg(long = "nomad.alloc-dir", value_name = "DIR")]
    nomad_alloc_dir: Option<PathBuf>,

    /// How often the alloc directory is checked for allocations whose
    /// first task started (a listing of it when it changed, a look at each
    /// waiting allocation): a started task is accounted within one
    /// interval. A Prometheus duration, at most 1h.
    #[arg(long = "nomad.alloc-scan-interval", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    nomad_alloc_scan_interval: Duration,

    /// A source of the chroots Nomad's exec and java drivers build (the
    /// client's chroot_env keys). Allocation accounting refuses to run
    /// when the alloc directory shares a mount with one: those chroots are
    /// hard links, which an accounted allocation turns into copies.
    /// Repeat for each; the default is Nomad's default chroot_env.
    #[arg(long = "nomad.chroot-source", value_name = "DIR", default_values = prjquota_exporter::collector::allocs::CHROOT_SOURCES)]
    nomad_chroot_sources: Vec<PathBuf>,

    /// Nomad's HTTP API, for --nomad.publish-unprovisioned,
    /// --nomad.enforce-ephemeral-disk and `prjquota reconcile --nomad`:
    /// http://HOST:PORT, https://HOST:PORT or unix:///PATH (as NOMAD_ADDR,
    /// which it overrides; Nomad's http://127.0.0.1:4646 when neither is
    /// given). The client is off unless this, NOMAD_ADDR or one of those
    /// flags is given.
    #[arg(long = "nomad.addr", value_name = "URL", help_heading = "Nomad API")]
    nomad_addr: Option<String>,
    /// A file holding the Nomad ACL token's secret ID (root's, mode 600),
    /// rather than NOMAD_TOKEN: a token on a command line is every user's
    /// to read. Its policy: /usr/share/prjquota/nomad/prjquota-exporter.policy.hcl.
    #[arg(
        long = "nomad.token-file",
        value_name = "FILE",
        help_heading = "Nomad API"
    )]
    nomad_token_file: Option<PathBuf>,
    /// The CA of Nomad's TLS certificates (as NOMAD_CACERT); the system's
    /// bundle when not given.
    #[arg(
        long = "nomad.ca-cert",
        value_name = "FILE",
        help_heading = "Nomad API"
    )]
    nomad_ca_cert: Option<PathBuf>,
    /// A client certificate, for a Nomad with verify_https_client (as
    /// NOMAD_CLIENT_CERT); with --nomad.client-key.
    #[arg(
        long = "nomad.client-cert",
        value_name = "FILE",
        help_heading = "Nomad API"
    )]
    nomad_client_cert: Option<PathBuf>,
    /// The client certificate's key (as NOMAD_CLIENT_KEY).
    #[arg(
        long = "nomad.client-key",
        value_name = "FILE",
        help_heading = "Nomad API"
    )]
    nomad_client_key: Option<PathBuf>,
    /// The name Nomad's certificate is checked for (as
    /// NOMAD_TLS_SERVER_NAME; e.g. client.global.nomad), else the host of
    /// the address.
    #[arg(
        long = "nomad.tls-server-name",
        value_name = "NAME",
        help_heading = "Nomad API"
    )]
    nomad_tls_server_name: Option<String>,
    /// The region of every request (as NOMAD_REGION).
    #[arg(
        long = "nomad.region",
        value_name = "REGION",
        help_heading = "Nomad API"
    )]
    nomad_region: Option<String>,
    /// The namespace of requests that name none (as NOMAD_NAMESPACE).
    #[arg(
        long = "nomad.namespace",
        value_name = "NAMESPACE",
        help_heading = "Nomad API"
    )]
    nomad_namespace: Option<String>,
    /// The longest one request to Nomad may take. A Prometheus duration,
    /// at most 1h.
    #[arg(long = "nomad.timeout", value_name = "DURATION", default_value = "10s", value_parser = parse_duration, help_heading = "Nomad API")]
    nomad_timeout: Duration,
    /// How often the unprovisioned bytes are measured and allocations'
    /// sizes asked for; after a failure the pause doubles, up to 5m. A
    /// Prometheus duration, at most 1h.
    #[arg(long = "nomad.interval", value_name = "DURATION", default_value = "10s", value_parser = parse_duration, help_heading = "Nomad API")]
    nomad_interval: Duration,
    /// Publish what the plugin would still admit in the (first) volumes
    /// directory as this node's metadata unique.prjquota.unprovisioned_bytes
    /// (Nomad 1.5+, ACL node:write), for a volume spec's constraint
    /// (docs/nomad.md): at once after a create, grow or delete, otherwise
    /// when it moved by --nomad.unprovisioned-hysteresis.
    #[arg(long = "nomad.publish-unprovisioned", help_heading = "Nomad API")]
    nomad_publish_unprovisioned: bool,
    /// How far the unprovisioned bytes move (files outside volumes come and
    /// go) before they are published again, e.g. 256MiB.
    #[arg(long = "nomad.unprovisioned-hysteresis", value_name = "SIZE", default_value = "256MiB", value_parser = parse_size, help_heading = "Nomad API")]
    nomad_unprovisioned_hysteresis: u64,
    /// Give each accounted allocation's project a hard limit of its
    /// ephemeral_disk.size, as Nomad reserved it (ACL read-job); needs
    /// --nomad.alloc-dir. Off: no allocation is limited, and limits an
    /// earlier start set are lifted (docs/allocations.md).
    #[arg(long = "nomad.enforce-ephemeral-disk", help_heading = "Nomad API")]
    nomad_enforce_ephemeral_disk: bool,

    /// How many volumes the eBPF counters maps hold (write telemetry and
    /// guard alike; per-CPU entries, about 64 bytes per volume per CPU).
    /// A deleted volume's slot is given to a new one after ten minutes, so
    /// what counts is the live volumes plus those deleted in the last ten
    /// minutes. Writes into volumes beyond it are counted in
    /// prjquota_exporter_ebpf_unattributed_writes_total{reason="map_full"},
    /// never lost.
    #[arg(long = "ebpf.max-volumes", value_name = "N", default_value = "16384", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    max_volumes: u32,

    /// Collector quota: nomad_host_volume_quota_hard_limit_inodes, a volume's inode hard limit (quotactl). On by default; --no-collector.quota switches it
    /// off: it then publishes nothing and does none of its work.
    #[arg(
        long = "collector.quota",
        help_heading = "Collectors",
        overrides_with = "no_collector_quota"
    )]
    collector_quota: bool,
    /// Switches the quota collector off (see --collector.quota).
    #[arg(
        long = "no-collector.quota",
        help_heading = "Collectors",
        overrides_with = "collector_quota"
    )]
    no_collector_quota: bool,

    /// Collector statfs: a volume's capacity, usage and inodes (statfs on its root: 6 series per volume). On by default; --no-collector.statfs switches it
    /// off: it then publishes nothing and does none of its work.
    #[arg(
        long = "collector.statfs",
        help_heading = "Collectors",
        overrides_with = "no_collector_statfs"
    )]
    collector_statfs: bool,
    /// Switches the statfs collector off (see --collector.statfs).
    #[arg(
        long = "no-collector.statfs",
        help_heading = "Collectors",
        overrides_with = "collector_statfs"
    )]
    no_collector_statfs: bool,

    /// Collector filesystem: the nomad_host_volumes_* series, per volumes directory: its filesystem's size, health and quota enforcement, provisioned and used bytes, overcommit ratio. On by default; --no-collector.filesystem switches it
    /// off: it then publishes nothing and does none of its work.
    #[arg(
        long = "collector.filesystem",
        help_heading = "Collectors",
        overrides_with = "no_collector_filesystem"
    )]
    collector_filesystem: bool,
    /// Switches the filesystem collector off (see --collector.filesystem).
    #[arg(
        long = "no-collector.filesystem",
        help_heading = "Collectors",
        overrides_with = "collector_filesystem"
    )]
    no_collector_filesystem: bool,

    /// Collector quota_events: nomad_host_volume_quota_limit_hits_total from the kernel's quota netlink warnings (off: no netlink socket). On by default; --no-collector.quota_events switches it
    /// off: it then publishes nothing and does none of its work.
    #[arg(
        long = "collector.quota_events",
        help_heading = "Collectors",
        overrides_with = "no_collector_quota_events"
    )]
    collector_quota_events: bool,
    /// Switches the quota_events collector off (see --collector.quota_events).
    #[arg(
        long = "no-collector.quota_events",
        help_heading = "Collectors",
        overrides_with = "collector_quota_events"
    )]
    no_collector_quota_events: bool,
}

impl Flags {
    /// The collectors switched off: the last of --collector.X and
    /// --no-collector.X given wins, as in node_exporter.
    fn disabled_collectors(&self) -> Vec<&'static str> {
        [
            ("quota", self.no_collector_quota),
            ("statfs", self.no_collector_statfs),
            ("filesystem", self.no_collector_filesystem),
            ("quota_events", self.no_collector_quota_events),
        ]
        .into_iter()
        .filter(|(_, off)| *off)
        .map(|(name, _)| name)
        .collect()
    }
}

/// `prjquota-exporter --completion-script SHELL` prints the completion
/// script for SHELL (bash, zsh, fish) and exits: the packages install its
/// output, made by the very binary it completes (as node_exporter's hidden
/// --completion-script-bash). Read before the flags, not one of them:
/// clap_complete completes hidden flags too, and this one is for the
/// packaging, not for operators.
fn completion_request() -> Option<Result<clap_complete::Shell, String>> {
    use clap::ValueEnum;
    let args: Vec<String> = std::env::args().skip(1).take(3).collect();
    match args.as_slice() {
        [flag, shell] if flag == "--completion-script" => Some(
            clap_complete::Shell::from_str(shell, false)
                .map_err(|_| format!("--completion-script {shell:?}: give bash, zsh or fish")),
        ),
        [flag, ..] if flag == "--completion-script" => Some(Err(
            "usage: prjquota-exporter --completion-script bash|zsh|fish".into(),
        )),
        _ => None,
    }
}

/// The completion script for `shell`, from the flags above.
fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Flags::command(), "prjquota-exporter", &mut out);
    out
}

/// The command line, or the process exits with clap's answer; an unknown
/// flag is answered with the nearest known one, as the plugin's commands
/// answer theirs (clap's own suggestions would take its `suggestions`
/// feature and another crate, and word it differently).
fn parse_flags() -> Flags {
    Flags::try_parse().unwrap_or_else(|e| match unknown_flag(&e) {
        Some(message) => {
            use clap::CommandFactory;
            eprintln!(
                "error: {message}\n\n{}\n\nFor more information, try '--help'.",
                Flags::command().render_usage()
            );
            std::process::exit(2);
        }
        None => e.exit(),
    })
}

/// "unknown flag --x; did you mean --y?" when `e` is about a `--` flag
/// clap does not know.
fn unknown_flag(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let typed = arg.split_once('=').map_or(arg.as_str(), |(name, _)| name);
    if !typed.starts_with("--") {
        return None;
    }
    let command = Flags::command();
    let known: Vec<String> = command
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .chain(["help", "version"])
        .map(|l| format!("--{l}"))
        .collect();
    Some(prjquota_core::suggest::unknown_flag(
        typed,
        known.iter().map(String::as_str),
    ))
}

fn parse_guard_mode(s: &str) -> Result<GuardMode, String> {
    s.parse()
}

fn parse_ebpf_mode(s: &str) -> Result<EbpfMode, String> {
    s.parse()
}

/// The longest --collector.mount-timeout and --guard.sync-interval take:
/// past it a stuck filesystem or an unsynced guard would go unnoticed for
/// longer than any operator means.
const MAX_FLAG_DURATION: Duration = Duration::from_secs(3600);

/// A Prometheus duration (`1m30s`, `500ms`), above 0 and at most 1h.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = prjquota_core::units::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} is no time at all: give more than 0, e.g. 5s"
        ));
    }
    if d > MAX_FLAG_DURATION {
        return Err(format!("{s:?} is longer than 1h, the most this flag takes"));
    }
    Ok(d)
}

/// A size such as 256MiB or 1GB.
fn parse_size(s: &str) -> Result<u64, String> {
    prjquota_core::units::parse_size(s)
}

/// `:PORT` means every IPv4 address, as in node_exporter.
fn telemetry_path(s: &str) -> Result<String, String> {
    if !s.starts_with('/') || s == "/" || s == "/healthz" {
        return Err(format!(
            "{s:?} is not a usable path for the metrics: give one that starts with / \
             and is not / or /healthz, e.g. /metrics"
        ));
    }
    Ok(s.to_string())
}

fn main() {
    match completion_request() {
        Some(Ok(shell)) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if let Err(e) = out
                .write_all(&completion_script(shell))
                .and_then(|()| out.flush())
            {
                error!("cannot write the completion script to stdout", err = e);
                std::process::exit(1);
            }
            return;
        }
        Some(Err(e)) => {
            error!("bad arguments", err = e);
            std::process::exit(2);
        }
        None => {}
    }
    let flags = parse_flags();
    log::set_level(flags.log_level);
    log::set_format(flags.log_format);
    // A daemon that builds and frees megabytes per scrape: keep its RSS to
    // what it uses, not to its busiest scrape so far.
    prjquota_core::sys::cap_retained_heap(2 << 20, 128 << 10);
    // One async thread: scrapes run one at a time and every filesystem call
    // is on the blocking pool (bounded, so stuck filesystems cannot pile up
    // threads). A second worker only added wake-ups between the two for
    // each of a scrape's hand-offs, which made small scrapes slower.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(16)
        .thread_name("prjquota-exporter")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the async runtime", err = e);
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(flags)) {
        error!("exiting", err = format!("{e:#}"));
        std::process::exit(1);
    }
}

/// Where the guard is pinned: `--guard.pin-root`, which must be where the
/// plugin looks (prjquota.toml's `guard_pin_root` in `plugin_dir`), or
/// the plugin would write new volumes into no guard; that place when the
/// flag is not given.
fn guard_pin_root(
    flag: Option<&Path>,
    plugin_dir: &Path,
    within: Duration,
) -> anyhow::Result<PathBuf> {
    use prjquota_exporter::plugin_config::{load_within, Read};
    let plugins = match load_within(plugin_dir, within) {
        Read::Done(Ok(cfg)) => Some(cfg.guard_pin_root),
        Read::Done(Err(e)) => {
            warn!(
                "cannot read the plugin's prjquota.toml; the guard is pinned where the flag or the default says",
                plugin_dir = plugin_dir.display(),
                err = e
            );
            None
        }
        Read::Stuck => {
            warn!(
                "the plugin's prjquota.toml did not answer within the mount timeout; the guard is pinned where the flag or the default says",
                plugin_dir = plugin_dir.display(),
            );
            None
        }
    };
    match (flag, plugins) {
        (Some(f), Some(p)) if f != p => anyhow::bail!(
            "--guard.pin-root {} is not where the plugin finds the guard ({}: guard_pin_root in \
             {}/prjquota.toml): a volume it creates would not be guarded until the exporter's \
             next sync; set guard_pin_root = \"{}\" there, or drop the flag",
            f.display(),
            p.display(),
            plugin_dir.display(),
            f.display()
        ),
        (Some(f), _) => Ok(f.to_path_buf()),
        (None, Some(p)) => Ok(p),
        (None, None) => Ok(PathBuf::from(prjquota_ebpf::guard::pins::PIN_ROOT)),
    }
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    use anyhow::Context;
    // Registered first: from here on SIGHUP never takes its default action
    // (exit), even during a slow start-up (loading eBPF, a costly web
    // config) and without a web config, so `systemctl reload` cannot stop
    // an exporter by accident (systemd counts death by SIGHUP as a clean
    // exit, and does not restart it).
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let disabled_collectors = flags.disabled_collectors();
    let guard_pin_root = guard_pin_root(
        flags.guard_pin_root.as_deref(),
        &flags.plugin_dir,
        flags.mount_timeout,
    )?;
    if flags.nomad_enforce_ephemeral_disk && flags.nomad_alloc_dir.is_none() {
        anyhow::bail!(
            "--nomad.enforce-ephemeral-disk limits accounted allocations: give \
             --nomad.alloc-dir too (NOMAD_ALLOC_DIR in /etc/default/prjquota, docs/allocations.md)"
        );
    }
    let disk_limits = prjquota_exporter::allocs::disk_limits::DiskLimits::new(
        if flags.nomad_enforce_ephemeral_disk {
            prjquota_exporter::allocs::disk_limits::Mode::Enforce
        } else {
            prjquota_exporter::allocs::disk_limits::Mode::Off
        },
    );
    let nomad = nomad_client(&flags, &disk_limits)?;
    let config = Config {
        volumes_dirs: flags.volumes_dirs,
        mount_timeout: flags.mount_timeout,
        quota_events: true,
        disabled_collectors,
        ebpf: flags.ebpf,
        guard: flags.guard,
        guard_pin_root,
        guard_sync_interval: flags.guard_sync_interval,
        guard_verify_interval: flags.guard_verify_interval,
        guard_replace_stronger: flags.guard_replace_stronger,
        max_volumes: flags.max_volumes,
        allocs: flags.nomad_alloc_dir.map(|alloc_dir| {
            prjquota_exporter::collector::allocs::AllocsSetup {
                alloc_dir,
                plugin_dir: Some(flags.plugin_dir.clone()),
                scan_interval: flags.nomad_alloc_scan_interval,
                chroot_sources: flags.nomad_chroot_sources.clone(),
                disk_limits: disk_limits.clone(),
            }
        }),
        plugin_dir: Some(flags.plugin_dir),
        nomad: nomad.clone(),
    };
    // Before binding or loading anything: a bad web config is the
    // operator's to fix, and says so at once.
    let web = match &flags.web_config_file {
        Some(file) => Some(Arc::new(
            prjquota_exporter::web_config::Web::load(file)
                .map_err(|e| anyhow::anyhow!("{e} (--web.config.file)"))?,
        )),
        None => None,
    };
    let mut listeners = Vec::new();
    if flags.systemd_socket {
        for l in prjquota_exporter::listen::systemd_sockets().context("--web.systemd-socket")? {
            listeners.push(
                tokio::net::TcpListener::from_std(l)
                    .context("a socket systemd passed (--web.systemd-socket)")?,
            );
        }
    } else {
        for addr in &flags.listen_addresses {
            let l = prjquota_exporter::listen::bind(addr)
                .and_then(tokio::net::TcpListener::from_std)
                .with_context(|| format!("cannot listen on {addr} (--web.listen-address)"))?;
            listeners.push(l);
        }
    }
    // Starts loading the eBPF programs in the background.
    let exporter = Arc::new(Exporter::new(&config));
    if config.ebpf == EbpfMode::Required {
        exporter.collector_ready("ebpf").await.map_err(|e| {
            anyhow::anyhow!(
                "eBPF write telemetry is required (--ebpf=required) but did not load: {e}"
            )
        })?;
    }
    if config.guard == GuardMode::Enforce {
        exporter.collector_ready("guard").await.map_err(|e| {
            anyhow::anyhow!(
                "the quota-escape guard cannot enforce (--guard=enforce): {e}; fix that, or run \
                 with --guard=detect to count attempts without refusing them (a guard pinned \
                 by an earlier exporter, if any, still enforces)"
            )
        })?;
    }
    if let Some(n) = &nomad {
        n.start();
    }
    // New volumes are registered when the plugin announces them, not at the
    // next scrape (answered once the warm-up below is done).
    prjquota_exporter::announce::start(exporter.clone(), &config.volumes_dirs);
    // Registers every existing volume with the programs before /healthz
    // says ready, so no write after that goes uncounted.
    let warm = exporter.clone();
    tokio::spawn(async move {
        let took = warm.warm_up().await;
        info!(
            "ready: the eBPF loads are done (see above for what attached) and every volume is registered",
            took = format!("{:.3}s", took.as_secs_f64()),
            guard = warm.collector_summary("guard").unwrap_or_else(|| "-".into())
        );
        notify_ready();
    });
    info!(
        "starting prjquota-exporter",
        version = env!("CARGO_PKG_VERSION"),
        revision = env!("PRJQUOTA_REVISION"),
        addresses = listeners
            .iter()
            .map(|l| l
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| a.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        volumes_dirs = config
            .volumes_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(","),
        mount_timeout = format!("{:?}", config.mount_timeout),
        ebpf = config.ebpf,
        guard = config.guard,
        disabled_collectors = config.disabled_collectors.join(","),
        tls = web.as_ref().is_some_and(|w| w.config().tls().is_some()),
        basic_auth = web.as_ref().is_some_and(|w| w.config().basic_auth()),
    );
    match hup {
        Ok(hup) => {
            tokio::spawn(reload_on_sighup(web.clone(), hup));
        }
        Err(e) => error!(
            "cannot listen for SIGHUP: the web config will not be reloaded",
            err = e
        ),
    }
    let options = prjquota_exporter::http::Options {
        compression: !flags.disable_compression,
        created_samples: flags.created_samples,
        telemetry_path: flags.telemetry_path,
        web,
    };
    prjquota_exporter::http::serve_on(listeners, exporter, options, shutdown_signal()).await?;
    info!("stopped");
    Ok(())
}

/// The Nomad client the flags and the environment ask for, `None` when
/// they ask for none; an error naming the setting when one is wrong.
fn nomad_client(
    flags: &Flags,
    disk_limits: &Arc<prjquota_exporter::allocs::disk_limits::DiskLimits>,
) -> anyhow::Result<Option<Arc<prjquota_exporter::nomad::Nomad>>> {
    use prjquota_exporter::nomad::{settings, Nomad, Settings, Setup};
    let env = |k: &str| std::env::var(k).ok();
    let wanted = flags.nomad_addr.is_some()
        || env("NOMAD_ADDR").is_some_and(|a| !a.is_empty())
        || flags.nomad_publish_unprovisioned
        || flags.nomad_enforce_ephemeral_disk;
    if !wanted {
        return Ok(None);
    }
    let settings = Settings::resolve(
        &settings::Flags {
            addr: flags.nomad_addr.clone(),
            token_file: flags.nomad_token_file.clone(),
            ca_cert: flags.nomad_ca_cert.clone(),
            client_cert: flags.nomad_client_cert.clone(),
            client_key: flags.nomad_client_key.clone(),
            tls_server_name: flags.nomad_tls_server_name.clone(),
            region: flags.nomad_region.clone(),
            namespace: flags.nomad_namespace.clone(),
            timeout: flags.nomad_timeout,
        },
        env,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    for why in &settings.ignored {
        prjquota_exporter::warn!("a Nomad setting is not used", why = why);
    }
    info!(
        "talking to Nomad's API",
        nomad_addr = settings.addr,
        token = settings
            .token_source
            .as_deref()
            .unwrap_or("none (ACLs off)"),
        publish_unprovisioned = flags.nomad_publish_unprovisioned,
        enforce_ephemeral_disk = flags.nomad_enforce_ephemeral_disk,
    );
    let setup = Setup {
        settings,
        interval: flags.nomad_interval,
        publish_unprovisioned: flags
            .nomad_publish_unprovisioned
            .then_some(flags.nomad_unprovisioned_hysteresis),
        volumes_dir: flags
            .volumes_dirs
            .first()
            .cloned()
            .unwrap_or_else(|| PathBuf::from("/opt/nomad/data/host_volumes")),
        plugin_dir: Some(flags.plugin_dir.clone()),
        mount_timeout: flags.mount_timeout,
        disk_limits: flags
            .nomad_enforce_ephemeral_disk
            .then(|| disk_limits.clone()),
    };
    Nomad::new(setup)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Tells systemd (`Type=notify`) that start-up is done: `READY=1` on the
/// datagram socket `$NOTIFY_SOCKET` names (a path, or `@` for an abstract
/// name). Without the variable there is nobody to tell.
fn notify_ready() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(std::path::Path::new(&path)),
    };
    let sent = addr.and_then(|addr| {
        let sock = UnixDatagram::unbound()?;
        sock.send_to_addr(b"READY=1", &addr)
    });
    if let Err(e) = sent {
        error!(
            "cannot tell systemd the exporter is ready",
            socket = path.to_string_lossy(),
            err = e
        );
    }
}

/// Re-reads the web config on every SIGHUP (certificate rotation).
async fn reload_on_sighup(
    web: Option<Arc<prjquota_exporter::web_config::Web>>,
    mut hup: tokio::signal::unix::Signal,
) {
    while hup.recv().await.is_some() {
        let Some(web) = &web else {
            info!("SIGHUP: nothing to reload (no --web.config.file)");
            continue;
        };
        let w = web.clone();
        // Reads files and parses keys: off the async workers.
        let result = tokio::task::spawn_blocking(move || w.reload()).await;
        match result {
            Ok(Ok(())) => info!(
                "web config reloaded; new connections use it",
                file = web.file().display()
            ),
            Ok(Err(e)) => prjquota_exporter::warn!(
                "web config reload failed; still serving with the configuration loaded before",
                file = e.file.display(),
                field = e.field,
                err = e.message
            ),
            Err(e) => error!("web config reload panicked", err = e),
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            error!("cannot listen for SIGTERM", err = e);
            return std::future::pending().await;
        }
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    };
    info!("shutting down", signal = name);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_prometheus_writes_them_within_the_flags_bounds() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(
            parse_duration("59m59s999ms"),
            Ok(Duration::from_millis(3_599_999))
        );
        for (text, says) in [
            ("0", "no time at all"),
            ("0s", "no time at all"),
            ("1h1ms", "longer than 1h"),
            ("2h", "longer than 1h"),
            ("1d", "longer than 1h"),
            ("2", "2 needs a unit, e.g. 2s"),
            ("1.5s", "fractions"),
            ("1m1h", "units go from the largest"),
            ("fast", "needs a number"),
        ] {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let e = Flags::try_parse_from(["prjquota-exporter", "--guard.sync-interval=1.5s"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--guard.sync-interval") && e.contains("1h30m"),
            "{e}"
        );
    }

    #[test]
    fn a_mistyped_flag_is_answered_with_the_nearest_one() {
        let answer = |args: &[&str]| {
            let argv = std::iter::once("prjquota-exporter").chain(args.iter().copied());
            unknown_flag(&Flags::try_parse_from(argv).unwrap_err())
        };
        assert_eq!(
            answer(&["--web.listen-adress", ":1"]).as_deref(),
            Some("unknown flag --web.listen-adress; did you mean --web.listen-address?")
        );
        assert_eq!(
            answer(&["--web.config-file=/etc/web.yml"]).as_deref(),
            Some("unknown flag --web.config-file; did you mean --web.config.file?")
        );
        assert_eq!(
            answer(&["--no-collector.statf"]).as_deref(),
            Some("unknown flag --no-collector.statf; did you mean --no-collector.statfs?")
        );
        assert_eq!(
            answer(&["--verbose"]).as_deref(),
            Some("unknown flag --verbose")
        );
        // Not about a flag's name: clap's own answer stands.
        assert_eq!(answer(&["--ebpf=maybe"]), None);
        assert_eq!(answer(&["stray"]), None);
    }

    #[test]
    fn flags_have_documented_defaults_and_repeat() {
        let f = Flags::parse_from(["prjquota-exporter"]);
        assert_eq!(
            f.volumes_dirs,
            vec![PathBuf::from("/opt/nomad/data/host_volumes")]
        );
        assert_eq!(f.listen_addresses, vec![":14646"]);
        assert_eq!(f.mount_timeout, Duration::from_secs(5));
        assert_eq!(f.log_level, Level::Info);
        assert_eq!(f.ebpf, EbpfMode::Auto);
        let f = Flags::parse_from([
            "prjquota-exporter",
            "--volumes-dir",
            "/a",
            "--volumes-dir=/b",
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.listen-address=[::1]:0",
            "--log.level",
            "debug",
            "--ebpf=off",
        ]);
        assert_eq!(
            f.volumes_dirs,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(f.listen_addresses, vec!["127.0.0.1:0", "[::1]:0"]);
        assert_eq!(f.log_level, Level::Debug);
        assert_eq!(f.log_format, log::Format::Logfmt);
        assert_eq!(f.ebpf, EbpfMode::Off);
        let f = Flags::parse_from(["prjquota-exporter", "--log.format=json"]);
        assert_eq!(f.log_format, log::Format::Json);
        assert!(Flags::try_parse_from(["prjquota-exporter", "--ebpf=maybe"]).is_err());
    }

    /// The timeout's name before --collector.mount-timeout still sets it,
    /// and neither --help nor the completions show it.
    #[test]
    fn the_mount_timeout_keeps_its_old_name_hidden() {
        use clap::CommandFactory;
        let f = Flags::parse_from(["prjquota-exporter", "--collector.mount-timeout=2s"]);
        assert_eq!(f.mount_timeout, Duration::from_secs(2));
        let f = Flags::parse_from(["prjquota-exporter", "--statfs-timeout", "1500ms"]);
        assert_eq!(f.mount_timeout, Duration::from_millis(1500));
        assert!(Flags::try_parse_from(["prjquota-exporter", "--statfs-timeout=0s"]).is_err());
        let help = Flags::command().render_long_help().to_string();
        assert!(
            help.contains("--collector.mount-timeout <DURATION>"),
            "{help}"
        );
        assert!(!help.contains("--statfs-timeout <"), "{help}");
        let bash = String::from_utf8(completion_script(clap_complete::Shell::Bash)).unwrap();
        assert!(bash.contains("--collector.mount-timeout"));
        assert!(
            !bash.contains("statfs-timeout"),
            "a hidden alias is not completed"
        );
    }

    /// Each collector --no-collector.X can switch off has its pair of
    /// flags, and the last one given wins.
    #[test]
    fn collector_switches_pair_up_and_the_last_wins() {
        use clap::CommandFactory;
        // The switches; --collector.mount-timeout is a setting of them all.
        let mut names: Vec<String> = Flags::command()
            .get_arguments()
            .filter(|a| matches!(a.get_action(), clap::ArgAction::SetTrue))
            .filter_map(|a| a.get_long()?.strip_prefix("collector.").map(str::to_string))
            .collect();
        names.sort();
        let mut switchable: Vec<String> = prjquota_exporter::collector::SWITCHABLE
            .iter()
            .map(|s| s.to_string())
            .collect();
        switchable.sort();
        assert_eq!(names, switchable);
        for name in prjquota_exporter::collector::SWITCHABLE {
            let on = format!("--collector.{name}");
            let off = format!("--no-collector.{name}");
            let f = Flags::parse_from(["prjquota-exporter"]);
            assert!(f.disabled_collectors().is_empty());
            let f = Flags::parse_from(["prjquota-exporter", &off]);
            assert_eq!(f.disabled_collectors(), vec![name]);
            let f = Flags::parse_from(["prjquota-exporter", &off, &on]);
            assert!(f.disabled_collectors().is_empty(), "{on} after {off}");
            let f = Flags::parse_from(["prjquota-exporter", &on, &off]);
            assert_eq!(f.disabled_collectors(), vec![name], "{off} after {on}");
        }
        assert!(Flags::try_parse_from(["prjquota-exporter", "--no-collector.registry"]).is_err());
    }

    /// Every visible flag is completed, the hidden generator flag is not,
    /// and bash (as /usr/share/bash-completion loads it) takes the script.
    #[test]
    fn completion_scripts_cover_every_flag_and_bash_loads_them() {
        use clap::CommandFactory;
        use clap_complete::Shell;
        let longs: Vec<String> = Flags::command()
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        assert!(longs.len() >= 14, "{longs:?}");
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completion_script(shell)).unwrap();
            for long in &longs {
                // fish names a flag without its dashes (-l web.listen-address).
                let name = long.trim_start_matches('-');
                assert!(script.contains(name), "{shell}: {long} missing");
            }
            assert!(!script.contains("completion-script"), "{shell}");
        }
        let dir =
            std::env::temp_dir().join(format!("prjquota-exporter-compl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("prjquota-exporter");
        std::fs::write(&file, completion_script(Shell::Bash)).unwrap();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                ". {}; complete -p prjquota-exporter",
                file.display()
            ))
            .output()
            .expect("run bash");
        std::fs::remove_dir_all(&dir).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("prjquota-exporter"),
            "bash did not load the completion: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// docs/configuration.md's flags table lists exactly the flags `--help`
    /// shows: a flag added, renamed or removed fails here until the page
    /// follows.
    #[test]
    fn the_flags_table_of_the_docs_is_the_binarys() {
        use clap::CommandFactory;
        let mut help: Vec<String> = Flags::command()
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| !l.starts_with("--no-collector.") && l != "--help" && l != "--version")
            .collect();
        help.sort();
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
        )
        .expect("read docs/configuration.md");
        let mut documented: Vec<String> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `--"))
            .map(|l| {
                let flag = l.split(['`', ' ']).next().unwrap_or_default();
                format!("--{}", flag.replace("[no-]", ""))
            })
            .collect();
        documented.sort();
        assert_eq!(documented, help, "docs/configuration.md's flags table");
    }
}
