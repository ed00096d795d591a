//! The guard the exporter pinned for a volumes directory.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use prjquota_core::guard_contract::PinnedGuard;

use crate::fs::VolumesFs;

/// The guard pinned for this volumes directory under `pin_root`
/// (prjquota.toml's `guard_pin_root`, where the exporter pins it), if an
/// exporter pinned one. Pins that exist but cannot be used are an error: a
/// volume must not be handed out unguarded while a guard is meant to be in
/// force.
pub(crate) fn open_guard(vfs: &VolumesFs, pin_root: &Path) -> Result<Option<PinnedGuard>> {
    PinnedGuard::open_in(pin_root, &vfs.path).map_err(|e| anyhow!("{e}"))
}

/// The pin root a delete looks in: prjquota.toml's, or the default when the
/// file cannot be read (a delete never fails for the configuration; a root
/// left in a guard elsewhere names a gone inode, and the exporter's sync
/// takes it out).
pub(crate) fn pin_root_for_delete(plugin_dir: Option<&Path>) -> PathBuf {
    plugin_dir
        .and_then(|d| prjquota_core::config::load(d).ok())
        .map(|c| c.guard_pin_root)
        .unwrap_or_else(|| PathBuf::from(prjquota_core::guard_contract::PIN_ROOT))
}
