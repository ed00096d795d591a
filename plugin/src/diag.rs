//! The plugin's diagnostic lines.

use crate::contract::VolumeId;

/// A diagnostic line on stderr, which Nomad logs. stdout is reserved for the
/// one JSON value Nomad parses.
pub fn log(volume: &VolumeId, msg: impl std::fmt::Display) {
    eprintln!("prjquota: volume={volume} {msg}");
}
