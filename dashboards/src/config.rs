//! The one place where the rules and the dashboard are configured, in the
//! manner of a monitoring mixin's `_config` (kubernetes-mixin, node-mixin):
//! the selector of the exporter's series, the cluster label, the alert
//! thresholds and durations, the runbook base URL, and the dashboard's uid,
//! title, tags and refresh.
//!
//! `dashboards/config.toml` lists every field with its default; a config of
//! one's own needs only the fields it changes (the others keep their
//! defaults, as `_config+::` does in jsonnet). [`crate::render`] turns a
//! config into `alerts.yaml` and `prjquota.json`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

/// The shipped config, beside the templates.
pub const FILE: &str = "config.toml";

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Label matchers added to every selector of every rule and panel,
    /// e.g. `job="prjquota"`. Empty: no rule names a job, and an exporter is
    /// known by its own `prjquota_exporter_build_info`.
    pub selector: String,
    /// The label that tells clusters apart (set by external labels or
    /// relabelling); the rules join and count per cluster, the dashboard's
    /// `cluster` variable reads it.
    pub cluster_label: String,
    /// Each alert's `runbook_url` is this, `#`, and the alert's name in
    /// lower case; the dashboard links it too.
    pub runbook_url: String,
    /// `NomadHostVolumeFillingUp`.
    pub space: FillingUp,
    /// `NomadHostVolumeInodesFillingUp`.
    pub inodes: FillingUp,
    /// `NomadAllocEphemeralDiskFillingUp`.
    pub alloc_disk: AllocDisk,
    /// The `for:` of every other alert that has one, by alert name.
    #[serde(rename = "for", deserialize_with = "for_map")]
    pub for_: BTreeMap<String, Duration>,
    /// Nomad's own series, which the allocation rules join.
    pub nomad: Nomad,
    pub dashboard: Dashboard,
}

/// Where Nomad's allocation series (`nomad_client_allocs_*`, published by
/// agents with `telemetry { prometheus_metrics = true,
/// publish_allocation_metrics = true }`) are found, and under which labels
/// they arrive: the rules join them to `nomad_alloc_disk_used_*` for each
/// allocation's job, namespace and task group.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Nomad {
    /// Label matchers added to every selector of Nomad's series instead
    /// of the top-level `selector` (they come from another scrape job).
    pub selector: String,
    /// The label that carries the Nomad job's name. Nomad labels its
    /// series `job`, which a scrape job without `honor_labels` keeps as
    /// `exported_job` (Prometheus' own `job` wins).
    pub job_label: String,
    /// The label that carries the allocation's Nomad namespace: `namespace`,
    /// unless the scrape job sets a target label of that name.
    pub namespace_label: String,
}

impl Default for Nomad {
    fn default() -> Self {
        Nomad {
            selector: String::new(),
            job_label: "exported_job".into(),
            namespace_label: "namespace".into(),
        }
    }
}

/// The two rules of a filling-up alert (kubernetes-mixin's
/// KubePersistentVolumeFillingUp): critical under `critical_available`,
/// warning under `warning_available` when the trend over
/// `prediction_window` says it is full within `prediction_horizon`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FillingUp {
    /// Ratio (0..1) of the volume still available below which it is critical.
    pub critical_available: f64,
    pub critical_for: Duration,
    /// Ratio (0..1) below which a falling trend makes it a warning.
    pub warning_available: f64,
    pub warning_for: Duration,
    /// The range `predict_linear` fits its trend over.
    pub prediction_window: Duration,
    /// How far ahead the trend must reach 0 for the warning.
    pub prediction_horizon: Duration,
}

impl Default for FillingUp {
    fn default() -> Self {
        FillingUp {
            critical_available: 0.03,
            critical_for: Duration::new(1, 'm'),
            warning_available: 0.15,
            warning_for: Duration::new(1, 'h'),
            prediction_window: Duration::new(6, 'h'),
            prediction_horizon: Duration::new(4, 'd'),
        }
    }
}

/// `NomadAllocEphemeralDiskFillingUp`: an allocation whose usage has been
/// above `warning_used` of its ephemeral disk limit for `warning_for`
/// (`prjquota-exporter --nomad.enforce-ephemeral-disk`): the warning
/// before its writes are refused.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocDisk {
    /// Ratio (0..1) of the limit used above which it fires.
    pub warning_used: f64,
    pub warning_for: Duration,
}

impl Default for AllocDisk {
    fn default() -> Self {
        AllocDisk {
            warning_used: 0.9,
            warning_for: Duration::new(5, 'm'),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Dashboard {
    /// Grafana's uid: what links and provisioning refer to (1 to 40 of
    /// `A-Za-z0-9_-`).
    pub uid: String,
    pub title: String,
    pub tags: Vec<String>,
    /// Auto-refresh interval (`1m`, `30s`), or empty for none.
    pub refresh: String,
    /// Start of the default time range, e.g. `now-6h`.
    pub time_from: String,
    /// `browser`, `utc` or an IANA zone.
    pub timezone: String,
}

impl Default for Dashboard {
    fn default() -> Self {
        Dashboard {
            uid: "prjquota-volumes".into(),
            title: "Nomad host volumes (prjquota)".into(),
            tags: ["nomad", "prjquota", "storage"].map(String::from).to_vec(),
            refresh: "1m".into(),
            time_from: "now-6h".into(),
            timezone: "browser".into(),
        }
    }
}

/// The `for:` of the alerts outside [`FillingUp`], as shipped: every alert
/// has one (a host test fails for a rule without), 0 where the condition is
/// an event.
pub const DEFAULT_FOR: &[(&str, u64, char)] = &[
    ("NomadHostVolumeWriteErrors", 15, 'm'),
    ("NomadHostVolumeStatsUnavailable", 15, 'm'),
    ("PrjquotaExporterDown", 15, 'm'),
    ("PrjquotaExporterEbpfDetached", 30, 'm'),
    ("PrjquotaExporterGuardOff", 30, 'm'),
    ("PrjquotaExporterGuardNotPinned", 10, 'm'),
    ("PrjquotaExporterGuardNotEnforcing", 15, 'm'),
    ("PrjquotaExporterGuardCannotEnforce", 1, 'h'),
    ("PrjquotaExporterAnnouncementsUnheard", 5, 'm'),
    ("PrjquotaExporterWebConfigReloadFailed", 10, 'm'),
    ("PrjquotaExporterAllocAccountingDown", 10, 'm'),
    ("NomadHostVolumesOvercommitted", 15, 'm'),
    ("NomadHostVolumesFilesystemUnhealthy", 2, 'm'),
    ("NomadHostVolumesQuotaNotEnforced", 2, 'm'),
    ("PrjquotaExporterCollectorFailed", 15, 'm'),
    ("PrjquotaExporterQuotaEventsUnsubscribed", 10, 'm'),
    ("NomadHostVolumesRecordUnreadable", 5, 'm'),
    ("NomadHostVolumesOperationUnfinished", 10, 'm'),
    ("PrjquotaExporterVolumesDirUnwatched", 10, 'm'),
    ("PrjquotaExporterAllocFilesUntagged", 1, 'h'),
    // Events: the condition is a count that rose, already over when it is
    // seen, which its increase() window keeps firing; a `for:` would only
    // delay the page (see each rule's comment).
    ("NomadHostVolumeQuotaLimitHit", 0, 'm'),
    ("NomadHostVolumeQuotaEscapeAttempt", 0, 'm'),
    ("NomadAllocQuotaEscapeAttempt", 0, 'm'),
    ("NomadHostVolumeRootDrifted", 0, 'm'),
    ("PrjquotaExporterGuardPinsRestored", 0, 'm'),
    ("PrjquotaExporterEbpfSelftestFailed", 0, 'm'),
    ("PrjquotaExporterEbpfMapFull", 0, 'm'),
    ("PrjquotaExporterEbpfMissedRuns", 0, 'm'),
    ("PrjquotaExporterEbpfWritesLost", 0, 'm'),
    ("PrjquotaExporterGuardMissedRuns", 0, 'm'),
    ("PrjquotaExporterGuardOutsideAttempts", 0, 'm'),
    ("PrjquotaExporterGuardPinsNotOwn", 5, 'm'),
    ("NomadAllocEphemeralDiskOverSize", 5, 'm'),
    ("PrjquotaExporterAllocDiskUnlimited", 30, 'm'),
    ("PrjquotaExporterNomadDown", 10, 'm'),
];

fn default_for() -> BTreeMap<String, Duration> {
    DEFAULT_FOR
        .iter()
        .map(|(a, n, u)| (a.to_string(), Duration::new(*n, *u)))
        .collect()
}

/// A `[for]` table: the defaults with the entries it gives replaced; an
/// alert name without a `for:` is refused.
fn for_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Duration>, D::Error> {
    let given = BTreeMap::<String, Duration>::deserialize(d)?;
    let mut out = default_for();
    for (alert, v) in given {
        if !out.contains_key(&alert) {
            return Err(serde::de::Error::custom(format!(
                "[for] {alert}: not an alert with a `for:` outside [space] and [inodes]; one of {}",
                out.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        out.insert(alert, v);
    }
    Ok(out)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            selector: String::new(),
            cluster_label: "cluster".into(),
            runbook_url: release_runbooks(),
            space: FillingUp::default(),
            inodes: FillingUp::default(),
            alloc_disk: AllocDisk::default(),
            for_: default_for(),
            nomad: Nomad::default(),
            dashboard: Dashboard::default(),
        }
    }
}

/// A Prometheus duration of one unit (`90s`, `15m`, `6h`, `4d`, `1w`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Duration {
    n: u64,
    unit: char,
}

impl Duration {
    pub const fn new(n: u64, unit: char) -> Self {
        Duration { n, unit }
    }

    pub fn seconds(self) -> u64 {
        self.n * unit_seconds(self.unit)
    }

    /// Its length in seconds as a PromQL expression that reads as the
    /// duration: `4 * 24 * 3600` for 4d.
    pub fn promql_seconds(self) -> String {
        let n = self.n;
        match self.unit {
            's' => format!("{n}"),
            'm' => format!("{n} * 60"),
            'h' => format!("{n} * 3600"),
            'd' => format!("{n} * 24 * 3600"),
            _ => format!("{n} * 7 * 24 * 3600"),
        }
    }
}

fn unit_seconds(unit: char) -> u64 {
    match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => 7 * 86400,
    }
}

impl TryFrom<String> for Duration {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad = || {
            format!("{s:?} is not a duration: write a number and one unit of s, m, h, d, w (15m, 6h, 4d)")
        };
        let unit = s.chars().last().ok_or_else(bad)?;
        if !"smhdw".contains(unit) {
            return Err(bad());
        }
        let digits = &s[..s.len() - 1];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        Ok(Duration { n, unit })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.n, self.unit)
    }
}

/// Seconds in words for an annotation: `15 minutes`, `four days`, `one
/// hour` (numbers under ten spelled out), in the largest unit that divides
/// them.
pub fn human(seconds: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (7 * 86400, "week"),
        (86400, "day"),
        (3600, "hour"),
        (60, "minute"),
        (1, "second"),
    ];
    const WORDS: [&str; 10] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    let (size, name) = UNITS
        .iter()
        .copied()
        .find(|(size, _)| seconds > 0 && seconds % size == 0)
        .unwrap_or((1, "second"));
    let n = seconds / size;
    let count = match WORDS.get(n as usize) {
        Some(w) => (*w).to_string(),
        None => n.to_string(),
    };
    format!("{count} {name}{}", if n == 1 { "" } else { "s" })
}

/// Label names the rules already group by next to the cluster label.
const GROUPED: &[&str] = &[
    "job",
    "instance",
    "namespace",
    "node_pool",
    "volume_id",
    "volume_name",
];

/// A label name a config may give: PromQL's, without the reserved `__`.
fn is_label_name(l: &str) -> bool {
    l.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !l.starts_with("__")
}

impl Config {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read the dashboards config {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and checks a config's text.
    pub fn parse(text: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        c.check()?;
        Ok(c)
    }

    /// Refuses what would render invalid or misleading rules: each error
    /// names the field and what it takes.
    pub fn check(&self) -> Result<(), String> {
        crate::promql::parse_matchers(&self.selector).map_err(|e| {
            format!("selector: {e}; write label matchers as in PromQL, e.g. selector = 'job=\"prjquota\"'")
        })?;
        let l = &self.cluster_label;
        if !is_label_name(l) {
            return Err(format!(
                "cluster_label = {l:?}: a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __reserved)"
            ));
        }
        if GROUPED.contains(&l.as_str()) {
            return Err(format!(
                "cluster_label = {l:?}: the rules already group by it; name the label that tells clusters apart (e.g. cluster)"
            ));
        }
        let url = &self.runbook_url;
        if !(url.starts_with("https://") || url.starts_with("http://"))
            || url.contains(|c: char| c.is_whitespace() || "#'\"{}".contains(c))
        {
            // Braces would be read as Prometheus' annotation templating.
            return Err(format!(
                "runbook_url = {url:?}: an http(s) URL without #, quotes, braces or spaces (the alert's anchor is appended)"
            ));
        }
        for (name, f) in [("space", &self.space), ("inodes", &self.inodes)] {
            let (c, w) = (f.critical_available, f.warning_available);
            if !(c > 0.0 && c <= w && w < 1.0) {
                return Err(format!(
                    "[{name}] critical_available = {c}, warning_available = {w}: ratios of what is left, 0 < critical <= warning < 1 (0.03 is 3 %)"
                ));
            }
            for (field, d) in [
                ("prediction_window", f.prediction_window),
                ("prediction_horizon", f.prediction_horizon),
            ] {
                if d.seconds() == 0 {
                    return Err(format!("[{name}] {field} = \"{d}\": must be longer than 0"));
                }
            }
        }
        let u = self.alloc_disk.warning_used;
        if !(u > 0.0 && u < 1.0) {
            return Err(format!(
                "[alloc_disk] warning_used = {u}: a ratio of the limit used, 0 < warning_used < 1 (0.9 is 90 %)"
            ));
        }
        let n = &self.nomad;
        crate::promql::parse_matchers(&n.selector).map_err(|e| {
            format!("[nomad] selector: {e}; write label matchers as in PromQL, e.g. selector = 'job=\"nomad\"'")
        })?;
        for (field, l) in [
            ("job_label", &n.job_label),
            ("namespace_label", &n.namespace_label),
        ] {
            if !is_label_name(l) {
                return Err(format!(
                    "[nomad] {field} = {l:?}: a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __reserved)"
                ));
            }
        }
        let d = &self.dashboard;
        if d.uid.is_empty()
            || d.uid.len() > 40
            || !d
                .uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "[dashboard] uid = {:?}: 1 to 40 characters of A-Z a-z 0-9 - _",
                d.uid
            ));
        }
        if d.title.trim().is_empty() {
            return Err("[dashboard] title: must not be empty".into());
        }
        if !d.refresh.is_empty() && Duration::try_from(d.refresh.clone()).is_err() {
            return Err(format!(
                "[dashboard] refresh = {:?}: an interval such as 1m or 30s, or \"\" for none",
                d.refresh
            ));
        }
        if d.time_from.trim().is_empty() {
            return Err("[dashboard] time_from: a Grafana time such as now-6h".into());
        }
        Ok(())
    }
}

/// The runbooks of this release: docs/runbooks.md at the tag of the
/// workspace's version, so an alert fired by a node running this version
/// opens the runbook written for it, not whatever `main` says later.
pub fn release_runbooks() -> String {
    format!(
        "https://github.com/prjquota/prjquota/blob/v{}/docs/runbooks.md",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_read_as_the_annotations_do() {
        assert_eq!(human(15 * 60), "15 minutes");
        assert_eq!(human(4 * 86400), "four days");
        assert_eq!(human(3600), "one hour");
        assert_eq!(human(90 * 60), "90 minutes");
        assert_eq!(human(14 * 86400), "two weeks");
        assert_eq!(human(0), "zero seconds");
    }

    #[test]
    fn durations_parse_one_unit_only() {
        let d = |s: &str| Duration::try_from(s.to_string());
        assert_eq!(d("4d").unwrap().promql_seconds(), "4 * 24 * 3600");
        assert_eq!(d("90s").unwrap().seconds(), 90);
        assert_eq!(d("12h").unwrap().to_string(), "12h");
        for bad in ["", "m", "1h30m", "-1m", "1.5h", "10", "5y"] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }

    /// The shipped config's runbooks are this release's: bumping the
    /// version means `cargo xtask dashboards` after the config's line.
    #[test]
    fn the_shipped_runbooks_are_this_releases() {
        let shipped = Config::load(&crate::artefacts::dir().join(FILE)).unwrap();
        assert_eq!(
            shipped.runbook_url,
            release_runbooks(),
            "dashboards/config.toml's runbook_url is not this version's tag: set it to {}, \
             then run `cargo xtask dashboards`",
            release_runbooks()
        );
        assert_eq!(Config::default().runbook_url, release_runbooks());
    }

    #[test]
    fn a_partial_config_keeps_the_other_defaults() {
        let c = Config::parse(
            "selector = 'job=\"prjquota\"'\n[space]\ncritical_available = 0.05\n[for]\nPrjquotaExporterDown = \"5m\"\n",
        )
        .unwrap();
        let d = Config::default();
        assert_eq!(c.space.critical_available, 0.05);
        assert_eq!(c.space.warning_available, d.space.warning_available);
        assert_eq!(c.inodes, d.inodes);
        assert_eq!(c.for_["PrjquotaExporterDown"], Duration::new(5, 'm'));
        assert_eq!(c.for_.len(), d.for_.len());
        assert_eq!(c.dashboard, d.dashboard);
    }

    #[test]
    fn bad_configs_are_refused_naming_the_field() {
        for (text, field) in [
            ("selector = 'job=prjquota'", "selector"),
            ("selector = '__name__=\"x\"'", "selector"),
            ("selector = 'job=\"a\"}'", "selector"),
            ("cluster_label = 'job'", "cluster_label"),
            ("cluster_label = '1x'", "cluster_label"),
            ("runbook_url = 'ftp://x'", "runbook_url"),
            ("runbook_url = 'https://x/r.md#a'", "runbook_url"),
            ("runbook_url = 'https://x/{{$labels.job}}'", "runbook_url"),
            ("[space]\ncritical_available = 0.2", "critical_available"),
            ("[inodes]\nwarning_available = 1.5", "warning_available"),
            ("[inodes]\nprediction_horizon = '0d'", "prediction_horizon"),
            ("[space]\ncritical_for = '1 hour'", "not a duration"),
            (
                "[for]\nNomadHostVolumeFillingUp = '5m'",
                "NomadHostVolumeFillingUp",
            ),
            ("[nomad]\nselector = 'job=nomad'", "[nomad] selector"),
            ("[nomad]\njob_label = 'exported-job'", "job_label"),
            ("[nomad]\nnamespace_label = '__ns'", "namespace_label"),
            ("[dashboard]\nuid = 'a b'", "uid"),
            ("[dashboard]\nrefresh = 'often'", "refresh"),
            ("treshold = 1", "treshold"),
        ] {
            let e = Config::parse(text).expect_err(text);
            assert!(e.contains(field), "{text}: {e}");
        }
    }
}
