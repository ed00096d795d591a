//! prjquota-core: the parts the `prjquota` plugin and `prjquota-exporter`
//! both need, so the exporter depends on this contract and not on the
//! plugin's admin, ops and request-handling code.
//!
//! [`sys`] is this crate's only module allowed `unsafe` code (the workspace
//! denies it everywhere but there and `prjquota-ebpf`'s `raw`); [`quota`], [`mountinfo`], [`announce`] and [`guard_contract`]
//! are the safe layers above it. [`record`] is the registry record and its one reader,
//! [`config`] the node configuration and its one reader, [`holdings`]
//! the admission rule's arithmetic, [`project_ids`]
//! the rule both follow to choose a free project ID, [`fs_type`] the
//! filesystems it runs on; [`volume_id`],
//! [`volume_params`], [`units`] and [`quoted`] are what those two are made of;
//! [`suggest`] answers both binaries' mistyped flags; [`run_dir`] holds the
//! host-wide locks in `/run/prjquota` and [`served_dirs`] the markers of
//! the volumes directories the plugin served there; [`entry_open`] opens an
//! entry of a tree a tenant writes without acting on what it has not seen,
//! and [`fault`] holds the pause the race tests stop it with.

pub mod announce;
pub mod config;
pub mod entry_open;
pub mod fault;
pub mod fs_type;
pub mod guard_contract;
pub mod holdings;
pub mod lock_file;
pub mod mountinfo;
pub mod project_ids;
pub mod quota;
pub mod quoted;
pub mod record;
pub mod run_dir;
pub mod served_dirs;
pub mod suggest;
pub mod volume_params;
// The kernel boundary: raw syscalls and C layouts that libc lacks. Every
// block states its SAFETY invariant (clippy::undocumented_unsafe_blocks).
#[allow(unsafe_code)]
pub mod sys;
pub mod trusted_file;
pub mod units;
pub mod volume_id;
