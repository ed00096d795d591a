//! prjquota: capacity-enforced Nomad host volumes on project quotas.
//!
//! The crate is both the `prjquota` plugin executable and the library the VM
//! tests drive it through; what the exporter shares with it (the record, the
//! node configuration, the quota layer) is in `prjquota-core`. Pure logic
//! (the Nomad contract, capacity arithmetic, parameters) is free of syscalls and
//! unit-tested on any host; everything that talks to the kernel goes through
//! core's `sys` (the plugin itself has no `unsafe` code) and the thin safe
//! layers above it (core's `quota`; [`fs`], [`registry`], [`remove`]).

pub mod admin;
pub mod admission;
pub mod capacity;
pub mod cli;
pub mod contract;
pub mod diag;
pub mod fault;
pub mod fs;
pub mod input_bounds;
pub mod input_error;
pub mod ledger;
pub mod ops;
pub mod param_check;
pub mod quota_control;
pub mod registry;
pub mod remove;

// Moved to prjquota-core (shared with the exporter); re-exported so the
// plugin's own `prjquota_core::sys` and `prjquota_core::config` paths keep working.
pub use prjquota_core::{announce, config, mountinfo, quota, sys};
