//! Node configuration: `prjquota.toml`, next to the plugin executable.
//!
//! The file is optional; without it the built-in defaults below apply. Every
//! key is optional, and an unknown key is an error, so that a misspelt
//! setting is never silently ignored. The plugin reads the file on every
//! operation: a change takes effect at the next create or delete, no agent
//! restart needed. The defaults and `allowed_parameters` are applied when a
//! volume is created (or its spec updated) and kept in its record: Nomad's
//! replay of an unchanged spec at agent start is answered from the record,
//! whatever the file says now (see `prjquota::ops::settled`).
//!
//! The file is the plugin's, but it lives in core with its one reader: the
//! exporter reports `overcommit_ratio` from it and must read the file exactly
//! as the next create will, failing where the plugin would fail.
//!
//! ```toml
//! # /opt/nomad/plugins/prjquota.toml
//!
//! # Project IDs the plugin may give to volumes on the volumes filesystem
//! # (inclusive; 1 to 4294967294). Keep this range clear of IDs that other
//! # tools or an /etc/projects file use on the same filesystem.
//! # Default: 1000000000 to 1999999999.
//! project_id_min = 1000000000
//! project_id_max = 1999999999
//!
//! # Project IDs the exporter may give to Nomad's allocation directories
//! # when it accounts them (`--nomad.alloc-dir`); never meets the range
//! # above. Default: 2000000000 to 2999999999.
//! alloc_project_id_min = 2000000000
//! alloc_project_id_max = 2999999999
//!
//! # Size of a volume whose spec sets neither capacity_min nor capacity_max:
//! # a size with a unit ("10GiB", "500MB", "1.5TiB") or a number of bytes.
//! # Default: none, and such volumes are refused.
//! default_capacity = "10GiB"
//!
//! # Mode of a new volume's root directory when its spec sets no `mode`;
//! # a quoted octal string. Default: "0700".
//! default_mode = "0750"
//!
//! # Parameters volume authors may set in a volume spec, out of
//! # "mode", "uid", "gid", "max_inodes" and "excluded_from_alerts".
//! # Default: all five.
//! allowed_parameters = ["mode", "max_inodes"]
//!
//! # How far the volumes' hard limits together may exceed the space the
//! # filesystem has for them (its size minus what files outside volumes
//! # use). A create or grow past it is refused. 1.0 promises no more than
//! # the disk holds; 2.0 bets that volumes fill at most half. Default: 1.0.
//! overcommit_ratio = 1.5
//!
//! # Where the exporter pins the quota-escape guard and the plugin finds it
//! # (a directory on a bpf filesystem, root's alone): the exporter's
//! # --guard.pin-root must name the same one, or it refuses to start.
//! # Default: /sys/fs/bpf/prjquota.
//! guard_pin_root = "/sys/fs/bpf/prjquota"
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::quoted::shown;
use crate::trusted_file;
use crate::units::parse_size;
use crate::volume_params;

/// Name of the configuration file, looked up in the plugin's directory.
pub const FILE_NAME: &str = "prjquota.toml";

/// The allocations' project IDs when the file names none.
pub const DEFAULT_ALLOC_PROJECT_IDS: std::ops::RangeInclusive<u32> = 2_000_000_000..=2_999_999_999;

/// Highest project ID: 4294967295 is -1 to the quota interfaces.
pub const MAX_PROJECT_ID: u32 = u32::MAX - 1;

/// The node's settings, after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Smallest project ID to allocate; at least 1.
    pub project_id_min: u32,
    /// Largest project ID to allocate; at least `project_id_min`.
    pub project_id_max: u32,
    /// Project IDs for allocation directories (the exporter's allocation
    /// accounting), never overlapping the volumes' range; `None` when the
    /// file widened the volumes' range over the default one and set none
    /// (such a file stays valid for the plugin; only the accounting
    /// refuses to start, see [`Config::alloc_project_ids`]).
    pub alloc_project_ids: Option<std::ops::RangeInclusive<u32>>,
    /// Size of a volume whose spec gives none; never `Some(0)`.
    pub default_capacity: Option<u64>,
    /// Mode of a volume's root when its spec sets none; at most `0o7777`.
    pub default_mode: u32,
    /// Parameters volume authors may set; a subset of [`volume_params::KNOWN`].
    pub allowed_parameters: BTreeSet<String>,
    /// How far the volumes' hard limits may exceed the filesystem's space
    /// for them; finite and above 0.
    pub overcommit_ratio: f64,
    /// Where the quota-escape guard is pinned: the plugin writes new
    /// volumes' roots into the maps there; an absolute path.
    pub guard_pin_root: PathBuf,
    /// The file these settings came from; `None` for the built-in defaults.
    pub source: Option<PathBuf>,
}

impl Default for Config {
    /// High project IDs, because IDs from 1 up are what administrators
    /// and `/etc/projects` examples pick by hand; never 0, the project of
    /// every file that has none. No default capacity, so a spec without a
    /// size fails loudly instead of getting a surprise size. Mode 0700, as
    /// Nomad's mkdir plugin.
    fn default() -> Self {
        Config {
            project_id_min: 1_000_000_000,
            project_id_max: 1_999_999_999,
            alloc_project_ids: Some(DEFAULT_ALLOC_PROJECT_IDS),
            default_capacity: None,
            default_mode: 0o700,
            allowed_parameters: volume_params::KNOWN.iter().map(|s| s.to_string()).collect(),
            overcommit_ratio: 1.0,
            guard_pin_root: PathBuf::from(crate::guard_contract::PIN_ROOT),
            source: None,
        }
    }
}

impl Config {
    /// The allocations' project IDs, or why there are none to use.
    pub fn alloc_project_ids(&self) -> Result<std::ops::RangeInclusive<u32>, String> {
        self.alloc_project_ids.clone().ok_or_else(|| {
            format!(
                "{} gives volumes the project IDs {}..={}, which cover the allocations' default \
                 range {}..={}: set alloc_project_id_min and alloc_project_id_max there to a \
                 range clear of the volumes' (IDs no volume holds)",
                self.source
                    .as_ref()
                    .map_or_else(|| FILE_NAME.to_string(), |p| p.display().to_string()),
                self.project_id_min,
                self.project_id_max,
                DEFAULT_ALLOC_PROJECT_IDS.start(),
                DEFAULT_ALLOC_PROJECT_IDS.end(),
            )
        })
    }
}

/// Why the node configuration cannot be used. Each message starts with the
/// file's path and, when known, the line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "cannot read the node configuration {}: {error}; fix it, or remove it to use the \
         built-in defaults",
        path.display()
    )]
    Read { path: PathBuf, error: io::Error },

    /// A file that is not safe to take settings from: a link, not a regular
    /// file, or one another user could have written.
    #[error("refusing the node configuration {}: {reason}", path.display())]
    Unsafe { path: PathBuf, reason: String },

    /// Not valid TOML, an unknown key, or a value of the wrong type.
    #[error("{}: {message}", Location(path, *line))]
    Syntax {
        path: PathBuf,
        line: Option<usize>,
        message: String,
    },

    /// Valid TOML with a value this plugin cannot use.
    #[error("{}: {message}", Location(path, *line))]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        key: &'static str,
        message: String,
    },
}

struct Location<'a>(&'a Path, Option<usize>);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(line) => write!(f, "{} line {line}", self.0.display()),
            None => write!(f, "{}", self.0.display()),
        }
    }
}

/// Reads `dir/prjquota.toml`; an absent file gives the defaults. Any other
/// failure to read it is an error rather than a silent fallback, because
/// defaults could allocate project IDs the operator meant to keep free.
pub fn load(dir: &Path) -> Result<Config, ConfigError> {
    let path = dir.join(FILE_NAME);
    match read_trusted(&path) {
        Ok(Some(text)) => parse(&text, &path),
        Ok(None) => Ok(Config::default()),
        Err(e) => Err(e),
    }
}

/// Largest node configuration read; a real one is a few hundred bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The file's text, or `None` when there is none. The file decides which
/// project IDs the plugin (running as root) hands out and what volume
/// authors may set, and is read on every operation within Nomad's deadline:
/// see [`trusted_file::read`] for what is refused.
fn read_trusted(path: &Path) -> Result<Option<String>, ConfigError> {
    let bytes = trusted_file::read(
        path,
        MAX_CONFIG_BYTES,
        "chooses the project IDs and parameters of every volume",
    )
    .map_err(|e| match e {
        trusted_file::Refused::Read(error) => ConfigError::Read {
            path: path.to_owned(),
            error,
        },
        trusted_file::Refused::Unsafe(reason) => ConfigError::Unsafe {
            path: path.to_owned(),
            reason: reason.replace(
                "remove it if it is not needed",
                "remove it to use the built-in defaults",
            ),
        },
    })?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| ConfigError::Read {
                path: path.to_owned(),
                error: io::Error::new(io::ErrorKind::InvalidData, "it is not UTF-8 text"),
            })
        })
        .transpose()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    project_id_min: Option<Spanned<i64>>,
    project_id_max: Option<Spanned<i64>>,
    alloc_project_id_min: Option<Spanned<i64>>,
    alloc_project_id_max: Option<Spanned<i64>>,
    default_capacity: Option<Spanned<toml::Value>>,
    default_mode: Option<Spanned<toml::Value>>,
    allowed_parameters: Option<Vec<Spanned<String>>>,
    overcommit_ratio: Option<Spanned<toml::Value>>,
    guard_pin_root: Option<Spanned<String>>,
}

/// Parses the text of a configuration file; `origin` is its path, for
/// messages and [`Config::source`].
pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
    let line_of = |span: Range<usize>| {
        let end = span.start.min(text.len());
        text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let line = e.span().map(line_of);
        // serde's type errors do not name the key: quote the line instead.
        let quoted = line
            .and_then(|n| text.lines().nth(n - 1))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| format!(" (in {})", shown(l)))
            .unwrap_or_default();
        let message = e
            .message()
            .trim_end()
            .replace('\n', "; ")
            .replace("expected i64", "expected an integer");
        ConfigError::Syntax {
            path: origin.to_owned(),
            line,
            message: format!("{message}{quoted}"),
        }
    })?;
    let invalid = |key: &'static str, span: Range<usize>, message: String| ConfigError::Invalid {
        path: origin.to_owned(),
        line: Some(line_of(span)),
        key,
        message,
    };

    let mut cfg = Config {
        source: Some(origin.to_owned()),
        ..Config::default()
    };

    let project_id = |key: &'static str, value: &Spanned<i64>| {
        let id = *value.get_ref();
        if id < 1 {
            Err(invalid(
                key,
                value.span(),
                format!(
                    "{key} must be at least 1 (0 is the filesystem's default project and would \
                     put the volume in every other file's quota), not {id}"
                ),
            ))
        } else if id > i64::from(MAX_PROJECT_ID) {
            Err(invalid(
                key,
                value.span(),
                format!(
                    "{key} must be at most {MAX_PROJECT_ID} (4294967295 means \"no ID\" to the \
                     quota interfaces), not {id}"
                ),
            ))
        } else {
            Ok(id as u32)
        }
    };
    let default_note = |set: bool| if set { "" } else { ", the built-in default" };
    let range = |min_key: &'static str,
                 max_key: &'static str,
                 min: &Option<Spanned<i64>>,
                 max: &Option<Spanned<i64>>,
                 lo: &mut u32,
                 hi: &mut u32| {
        if let Some(v) = min {
            *lo = project_id(min_key, v)?;
        }
        if let Some(v) = max {
            *hi = project_id(max_key, v)?;
        }
        if *lo > *hi {
            let span = max
                .as_ref()
                .or(min.as_ref())
                .map(|v| v.span())
                .unwrap_or(0..0);
            return Err(invalid(
                max_key,
                span,
                format!(
                    "{min_key} ({lo}{}) is larger than {max_key} ({hi}{}): the range of \
                     project IDs is empty; set {min_key} <= {max_key}",
                    default_note(min.is_some()),
                    default_note(max.is_some()),
                ),
            ));
        }
        Ok(())
    };
    range(
        "project_id_min",
        "project_id_max",
        &raw.project_id_min,
        &raw.project_id_max,
        &mut cfg.project_id_min,
        &mut cfg.project_id_max,
    )?;
    let (mut lo, mut hi) = DEFAULT_ALLOC_PROJECT_IDS.into_inner();
    range(
        "alloc_project_id_min",
        "alloc_project_id_max",
        &raw.alloc_project_id_min,
        &raw.alloc_project_id_max,
        &mut lo,
        &mut hi,
    )?;
    let alloc_set = raw.alloc_project_id_min.is_some() || raw.alloc_project_id_max.is_some();
    // One filesystem may hold both volumes and allocations: an ID in both
    // ranges could be given twice.
    let overlaps = lo <= cfg.project_id_max && cfg.project_id_min <= hi;
    cfg.alloc_project_ids = match (overlaps, alloc_set) {
        (false, _) => Some(lo..=hi),
        // A file written before allocations had a range of their own may
        // span it: the plugin keeps working, the accounting refuses.
        (true, false) => None,
        (true, true) => {
            let span = raw
                .alloc_project_id_min
                .as_ref()
                .or(raw.alloc_project_id_max.as_ref())
                .map(|v| v.span())
                .unwrap_or(0..0);
            return Err(invalid(
                "alloc_project_id_min",
                span,
                format!(
                    "the allocations' project IDs ({lo}..={hi}) overlap the volumes' ({}..={}{}): \
                     one ID could be given to a volume and to an allocation on the same \
                     filesystem; move alloc_project_id_min/alloc_project_id_max clear of \
                     project_id_min/project_id_max",
                    cfg.project_id_min,
                    cfg.project_id_max,
                    default_note(raw.project_id_min.is_some() || raw.project_id_max.is_some()),
                ),
            ));
        }
    };

    if let Some(v) = &raw.default_capacity {
        const FIX: &str = "write a size such as \"10GiB\" or a number of bytes, or remove \
                           default_capacity so that every volume must set its own";
        let bytes = match v.get_ref() {
            toml::Value::String(s) => parse_size(s).map_err(|reason| {
                invalid(
                    "default_capacity",
                    v.span(),
                    format!("default_capacity: {reason}"),
                )
            })?,
            toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| {
                invalid(
                    "default_capacity",
                    v.span(),
                    format!("default_capacity must not be negative ({n}); {FIX}"),
                )
            })?,
            other => {
                return Err(invalid(
                    "default_capacity",
                    v.span(),
                    format!(
                        "default_capacity must be a string or an integer, not {}; {FIX}",
                        kind(other)
                    ),
                ))
            }
        };
        if bytes == 0 {
            return Err(invalid(
                "default_capacity",
                v.span(),
                format!("default_capacity must be more than 0; {FIX}"),
            ));
        }
        cfg.default_capacity = Some(bytes);
    }

    if let Some(v) = &raw.default_mode {
        cfg.default_mode = match v.get_ref() {
            toml::Value::String(s) => volume_params::parse_mode(s).map_err(|reason| {
                invalid(
                    "default_mode",
                    v.span(),
                    format!("default_mode = {}: {reason}", shown(s)),
                )
            })?,
            other => {
                return Err(invalid(
                    "default_mode",
                    v.span(),
                    format!(
                        "default_mode must be a quoted octal string such as \"0750\", not {} \
                         (a bare number is too easily read in the wrong base)",
                        kind(other)
                    ),
                ))
            }
        };
    }

    if let Some(list) = &raw.allowed_parameters {
        let mut allowed = BTreeSet::new();
        for name in list {
            if !volume_params::KNOWN.contains(&name.get_ref().as_str()) {
                return Err(invalid(
                    "allowed_parameters",
                    name.span(),
                    format!(
                        "allowed_parameters: unknown parameter {}; the parameters are {}",
                        shown(name.get_ref()),
                        volume_params::KNOWN.join(", ")
                    ),
                ));
            }
            allowed.insert(name.get_ref().clone());
        }
        cfg.allowed_parameters = allowed;
    }

    if let Some(v) = &raw.overcommit_ratio {
        const FIX: &str = "write a number above 0 such as 1.0 (promise no more than the disk \
                           holds) or 2.0, or remove overcommit_ratio for the default 1.0";
        let ratio = match v.get_ref() {
            toml::Value::Float(f) => *f,
            toml::Value::Integer(n) => *n as f64,
            other => {
                return Err(invalid(
                    "overcommit_ratio",
                    v.span(),
                    format!(
                        "overcommit_ratio must be a number, not {}; {FIX}",
                        kind(other)
                    ),
                ))
            }
        };
        // NaN compares false both ways: test for the good case.
        if !(ratio.is_finite() && ratio > 0.0) {
            return Err(invalid(
                "overcommit_ratio",
                v.span(),
                format!("overcommit_ratio must be a finite number above 0, not {ratio}; {FIX}"),
            ));
        }
        cfg.overcommit_ratio = ratio;
    }

    if let Some(v) = &raw.guard_pin_root {
        let p = PathBuf::from(v.get_ref());
        if !p.is_absolute() || p.parent().is_none() {
            return Err(invalid(
                "guard_pin_root",
                v.span(),
                format!(
                    "guard_pin_root must be an absolute path of a directory on a bpf                      filesystem, not {}; remove it for the default {}",
                    shown(v.get_ref()),
                    crate::guard_contract::PIN_ROOT
                ),
            ));
        }
        cfg.guard_pin_root = p;
    }

    Ok(cfg)
}

fn kind(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "/opt/nomad/plugins/prjquota.toml";

    fn parse_ok(text: &str) -> Config {
        parse(text, Path::new(ORIGIN)).unwrap()
    }

    fn parse_err(text: &str) -> ConfigError {
        parse(text, Path::new(ORIGIN)).unwrap_err()
    }

    /// (line, message) of an error, checking every message names the file.
    fn located(e: &ConfigError) -> (Option<usize>, String) {
        let msg = e.to_string();
        assert!(msg.starts_with(ORIGIN), "{msg}");
        match e {
            ConfigError::Syntax { line, .. } | ConfigError::Invalid { line, .. } => (*line, msg),
            ConfigError::Read { .. } | ConfigError::Unsafe { .. } => (None, msg),
        }
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "prjquota-config-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn defaults() {
        let d = Config::default();
        assert_eq!(
            (d.project_id_min, d.project_id_max),
            (1_000_000_000, 1_999_999_999)
        );
        assert_eq!(d.default_capacity, None);
        assert_eq!(d.default_mode, 0o700);
        assert_eq!(
            d.allowed_parameters.iter().collect::<Vec<_>>(),
            ["excluded_from_alerts", "gid", "max_inodes", "mode", "uid"]
        );
        assert_eq!(d.source, None);
        assert_eq!(d.overcommit_ratio, 1.0);
    }

    #[test]
    fn empty_file_is_the_defaults_with_its_source() {
        let cfg = parse_ok("# nothing set\n");
        assert_eq!(
            cfg,
            Config {
                source: Some(PathBuf::from(ORIGIN)),
                ..Config::default()
            }
        );
    }

    #[test]
    fn documented_example_parses() {
        let source = include_str!("config.rs");
        let example: String = source
            .lines()
            .skip_while(|l| *l != "//! ```toml")
            .skip(1)
            .take_while(|l| *l != "//! ```")
            .map(|l| l.strip_prefix("//!").unwrap().trim_start_matches(' '))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(example.contains("project_id_min"), "{example}");
        let cfg = parse_ok(&example);
        assert_eq!(cfg.default_capacity, Some(10 << 30));
        assert_eq!(cfg.default_mode, 0o750);
        assert_eq!(
            cfg.allowed_parameters.iter().collect::<Vec<_>>(),
            ["max_inodes", "mode"]
        );
        assert_eq!(cfg.overcommit_ratio, 1.5);
    }

    #[test]
    fn every_key() {
        let cfg = parse_ok(
            "project_id_min = 1\nproject_id_max = 4294967294\ndefault_capacity = 1073741824\n\
             default_mode = \"0o2770\"\nallowed_parameters = []\n",
        );
        assert_eq!(
            (cfg.project_id_min, cfg.project_id_max),
            (1, MAX_PROJECT_ID)
        );
        assert_eq!(cfg.default_capacity, Some(1 << 30));
        assert_eq!(cfg.default_mode, 0o2770);
        assert!(cfg.allowed_parameters.is_empty());
        assert_eq!(
            parse_ok("project_id_min = 7\nproject_id_max = 7\n").project_id_min,
            7
        );
        assert_eq!(
            parse_ok("default_capacity = \"1.5 GiB\"").default_capacity,
            Some(3 << 29)
        );
    }

    #[test]
    fn project_id_zero_names_file_line_and_reason() {
        let e = parse_err("# ids\n\nproject_id_min = 0\nproject_id_max = 10\n");
        assert!(matches!(
            e,
            ConfigError::Invalid {
                key: "project_id_min",
                ..
            }
        ));
        let (line, msg) = located(&e);
        assert_eq!(line, Some(3));
        assert!(
            msg.starts_with(&format!(
                "{ORIGIN} line 3: project_id_min must be at least 1 (0 is the filesystem's default project"
            )),
            "{msg}"
        );
    }

    #[test]
    fn project_id_out_of_range() {
        for (text, key, line) in [
            ("project_id_min = -5", "project_id_min", 1),
            ("\nproject_id_max = 4294967295", "project_id_max", 2),
            ("\n\n\nproject_id_max = 99999999999999", "project_id_max", 4),
        ] {
            let e = parse_err(text);
            assert!(
                matches!(&e, ConfigError::Invalid { key: k, .. } if *k == key),
                "{e:?}"
            );
            assert_eq!(located(&e).0, Some(line), "{text}");
        }
    }

    #[test]
    fn min_above_max_is_refused_naming_both() {
        let e = parse_err("project_id_min = 500\nproject_id_max = 400\n");
        let (line, msg) = located(&e);
        assert_eq!(line, Some(2));
        assert!(msg.contains("(500)") && msg.contains("(400)"), "{msg}");
        // Against a built-in default, say which value was not written.
        let e = parse_err("project_id_max = 400\n");
        let (line, msg) = located(&e);
        assert_eq!(line, Some(1));
        assert!(msg.contains("1000000000, the built-in default"), "{msg}");
    }

    #[test]
    fn unknown_key_is_refused_with_its_line() {
        let e = parse_err("project_id_min = 5\n\ndefault_capacty = \"1GiB\"\n");
        assert!(matches!(e, ConfigError::Syntax { .. }));
        let (line, msg) = located(&e);
        assert_eq!(line, Some(3));
        assert!(msg.contains("default_capacty"), "{msg}");
        assert!(
            msg.contains("default_capacity"),
            "lists the valid keys: {msg}"
        );
    }

    #[test]
    fn wrong_types_and_bad_toml_have_lines() {
        for (text, line, needle) in [
            ("project_id_min = \"5\"", 1, "project_id_min"),
            ("\nproject_id_max = 1.5", 2, ""),
            ("\n\nallowed_parameters = \"mode\"", 3, ""),
            ("\nallowed_parameters = [\"mode\", 3]", 2, ""),
            ("project_id_min = 5\nproject_id_min = 6\n", 2, ""),
            ("a = [\n", 2, ""),
            ("\n\n\n\ndefault_mode = 0755", 5, ""),
        ] {
            let e = parse_err(text);
            assert!(matches!(e, ConfigError::Syntax { .. }), "{text:?}: {e:?}");
            let (got, msg) = located(&e);
            assert_eq!(got, Some(line), "{text:?}: {msg}");
            assert!(msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn bad_default_capacity() {
        for (text, needle) in [
            ("default_capacity = \"10 gigs\"", "unknown unit"),
            ("default_capacity = \"\"", "not a size"),
            ("default_capacity = 0", "more than 0"),
            ("default_capacity = \"0GiB\"", "more than 0"),
            ("default_capacity = -1", "negative"),
            ("default_capacity = \"9000PiB\"", "larger than"),
            ("default_capacity = 1.5", "not a float"),
            ("default_capacity = true", "not a boolean"),
        ] {
            let e = parse_err(&format!("\n{text}\n"));
            assert!(
                matches!(
                    e,
                    ConfigError::Invalid {
                        key: "default_capacity",
                        ..
                    }
                ),
                "{e:?}"
            );
            let (line, msg) = located(&e);
            assert_eq!(line, Some(2));
            assert!(msg.contains(needle), "{text}: {msg}");
        }
    }

    #[test]
    fn overcommit_ratio_takes_floats_and_integers() {
        assert_eq!(parse_ok("overcommit_ratio = 2.5").overcommit_ratio, 2.5);
        assert_eq!(parse_ok("overcommit_ratio = 3").overcommit_ratio, 3.0);
        assert_eq!(parse_ok("overcommit_ratio = 0.5").overcommit_ratio, 0.5);
    }

    #[test]
    fn bad_overcommit_ratio_names_key_file_and_line() {
        for (text, needle) in [
            ("overcommit_ratio = \"2\"", "not a string"),
            ("overcommit_ratio = 0", "above 0, not 0"),
            ("overcommit_ratio = 0.0", "above 0, not 0"),
            ("overcommit_ratio = -1.5", "above 0, not -1.5"),
            ("overcommit_ratio = nan", "not NaN"),
            ("overcommit_ratio = inf", "not inf"),
            ("overcommit_ratio = true", "not a boolean"),
        ] {
            let e = parse_err(&format!("\n{text}\n"));
            assert!(
                matches!(
                    e,
                    ConfigError::Invalid {
                        key: "overcommit_ratio",
                        ..
                    }
                ),
                "{text}: {e:?}"
            );
            let (line, msg) = located(&e);
            assert_eq!(line, Some(2), "{text}");
            assert!(
                msg.contains(needle) && msg.contains("overcommit_ratio"),
                "{text}: {msg}"
            );
        }
    }

    #[test]
    fn bad_default_mode() {
        for (text, needle) in [
            ("default_mode = \"0755x\"", "not an octal mode"),
            ("default_mode = \"10000\"", "larger than 7777"),
            // TOML strings are already quoted: no HCL advice here.
            ("default_mode = \"493\"", "use only the digits 0-7"),
            ("default_mode = 0o755", "quoted octal string"),
            ("default_mode = 448", "quoted octal string"),
        ] {
            let e = parse_err(text);
            assert!(
                matches!(
                    e,
                    ConfigError::Invalid {
                        key: "default_mode",
                        ..
                    }
                ),
                "{e:?}"
            );
            let (line, msg) = located(&e);
            assert_eq!(line, Some(1));
            assert!(msg.contains(needle), "{text}: {msg}");
            assert!(!msg.contains("HCL"), "{msg}");
        }
    }

    #[test]
    fn unknown_allowed_parameter_points_at_its_line() {
        let e = parse_err("allowed_parameters = [\n  \"mode\",\n  \"size\",\n]\n");
        assert!(matches!(
            e,
            ConfigError::Invalid {
                key: "allowed_parameters",
                ..
            }
        ));
        let (line, msg) = located(&e);
        assert_eq!(line, Some(3));
        assert!(
            msg.contains("\"size\"") && msg.contains("mode, uid, gid, max_inodes"),
            "{msg}"
        );
    }

    #[test]
    fn allocation_ids_default_clear_of_volumes_and_refuse_an_overlap() {
        let d = parse_ok("");
        assert_eq!(d.alloc_project_ids(), Ok(DEFAULT_ALLOC_PROJECT_IDS));
        let own = parse_ok("alloc_project_id_min = 10\nalloc_project_id_max = 20\n");
        assert_eq!(own.alloc_project_ids(), Ok(10..=20));
        // A file that widened the volumes' range before allocations had one
        // stays valid for the plugin; the accounting says what to set.
        let wide = parse_ok("project_id_min = 1\nproject_id_max = 4294967294\n");
        assert_eq!(
            (wide.project_id_min, wide.project_id_max),
            (1, MAX_PROJECT_ID)
        );
        let why = wide.alloc_project_ids().unwrap_err();
        assert!(why.contains("alloc_project_id_min"), "{why}");
        let e = parse_err("project_id_max = 2000000005\nalloc_project_id_max = 2000000010\n");
        let msg = e.to_string();
        assert!(msg.contains("line 2") && msg.contains("overlap"), "{msg}");
        let e = parse_err("alloc_project_id_min = 30\nalloc_project_id_max = 20\n");
        assert!(
            e.to_string()
                .contains("alloc_project_id_min (30) is larger"),
            "{e}"
        );
    }

    #[test]
    fn load_absent_file_gives_defaults() {
        let dir = scratch_dir("absent");
        assert_eq!(load(&dir).unwrap(), Config::default());
        // A directory that does not exist either: still "no file".
        assert_eq!(load(&dir.join("missing")).unwrap(), Config::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_reads_the_file_and_records_its_path() {
        let dir = scratch_dir("present");
        std::fs::write(dir.join(FILE_NAME), "default_mode = \"0750\"\n").unwrap();
        let cfg = load(&dir).unwrap();
        assert_eq!(cfg.default_mode, 0o750);
        assert_eq!(cfg.source, Some(dir.join(FILE_NAME)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_refuses_unreadable_file() {
        let dir = scratch_dir("unreadable");
        // A directory in the file's place is not a configuration.
        std::fs::create_dir(dir.join(FILE_NAME)).unwrap();
        let e = load(&dir).unwrap_err();
        assert!(matches!(e, ConfigError::Unsafe { .. }), "{e:?}");
        assert!(e.to_string().contains(FILE_NAME));
        assert!(e.to_string().contains("a directory"), "{e}");
        std::fs::remove_dir(dir.join(FILE_NAME)).unwrap();
        std::fs::write(dir.join(FILE_NAME), b"default_mode = \"\xff\"\n").unwrap();
        assert!(matches!(load(&dir), Err(ConfigError::Read { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The node configuration decides which project IDs a root process hands
    /// out: a FIFO in its place must not hang a create past Nomad's
    /// deadline, a link is not followed, and a file others can write is
    /// refused; each error names the file and the fix.
    #[test]
    fn load_refuses_a_fifo_a_symlink_and_a_file_others_can_write() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch_dir("unsafe");
        let path = dir.join(FILE_NAME);
        let refused = |dir: &Path, needle: &str| {
            let start = std::time::Instant::now();
            let e = load(dir).unwrap_err();
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "load blocked on {needle}"
            );
            assert!(matches!(e, ConfigError::Unsafe { .. }), "{e:?}");
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(needle), "{msg}");
        };

        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Run in a thread: before the fix a FIFO blocks the read forever.
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(load(&d).map_err(|e| e.to_string()));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("load of a FIFO returns at once instead of waiting for a writer");
        let msg = got.unwrap_err();
        assert!(
            msg.contains("FIFO") && msg.contains("regular file"),
            "{msg}"
        );
        std::fs::remove_file(&path).unwrap();

        let real = dir.join("real.toml");
        std::fs::write(&real, "default_mode = \"0750\"\n").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        refused(&dir, "symlink");
        std::fs::remove_file(&path).unwrap();

        std::fs::write(&path, "default_mode = \"0750\"\n").unwrap();
        for (mode, needle) in [(0o666, "chmod go-w"), (0o664, "its group")] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            refused(&dir, needle);
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load(&dir).unwrap().default_mode, 0o750);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_guards_pin_root_is_an_absolute_path() {
        let cfg = parse_ok("guard_pin_root = \"/sys/fs/bpf/other\"\n");
        assert_eq!(cfg.guard_pin_root, PathBuf::from("/sys/fs/bpf/other"));
        assert_eq!(
            Config::default().guard_pin_root,
            PathBuf::from("/sys/fs/bpf/prjquota")
        );
        for bad in ["\"relative/dir\"", "\"/\""] {
            let e = parse_err(&format!("guard_pin_root = {bad}\n"));
            assert!(e.to_string().contains("guard_pin_root"), "{e}");
        }
    }
}
