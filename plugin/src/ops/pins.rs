//! The guard the exporter pinned for a volumes directory.

use anyhow::{anyhow, Result};
use prjquota_core::guard_pins::PinnedGuard;

use crate::fs::VolumesFs;

/// The guard pinned for this volumes directory, if an exporter pinned one.
/// Pins that exist but cannot be used are an error: a volume must not be
/// handed out unguarded while a guard is meant to be in force.
pub(crate) fn open_guard(vfs: &VolumesFs) -> Result<Option<PinnedGuard>> {
    PinnedGuard::open(&vfs.path).map_err(|e| anyhow!("{e}"))
}
