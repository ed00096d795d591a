//! Operator commands: `prjquota check`, `list`, `grow` and `reconcile`, and
//! `install` (the plugin into Nomad's plugin directory). The rules and
//! dashboard from an operator's config are `prjquota-dashboards render`'s
//! (the dashboards crate), which the plugin Nomad runs does not link.
//!
//! Nomad never runs these; they share the plugin's library so that what they
//! report is exactly what `create` and `delete` would see. They never change
//! how `fingerprint`, `create` or `delete` behave.

pub mod check;
pub mod grow;
pub mod install;
pub mod list;
pub mod reconcile;

use std::path::PathBuf;

/// Nomad's default `host_volumes_dir` (`<data_dir>/host_volumes`).
pub const DEFAULT_VOLUMES_DIR: &str = "/opt/nomad/data/host_volumes";

/// What the check, list and reconcile commands are given (`crate::cli`
/// parses the command line into it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    pub volumes_dir: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    pub json: bool,
    pub bytes: bool,
    pub fix: bool,
    /// `reconcile --nomad`: compare with Nomad's list too.
    pub nomad: bool,
}

impl Flags {
    pub fn volumes_dir(&self) -> PathBuf {
        self.volumes_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_VOLUMES_DIR))
    }
}
