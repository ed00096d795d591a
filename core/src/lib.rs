//! prjquota-core: the parts the `prjquota` plugin and `prjquota-exporter`
//! both need, so the exporter depends on this contract and not on the
//! plugin's admin, ops and config code.
//!
//! [`sys`] is the only module allowed `unsafe` code (the workspace denies it
//! everywhere else); [`quota`], [`mountinfo`] and [`announce`] are the safe
//! layers above it.

pub mod announce;
pub mod mountinfo;
pub mod quota;
// The kernel boundary: raw syscalls and C layouts that libc lacks. Every
// block states its SAFETY invariant (clippy::undocumented_unsafe_blocks).
#[allow(unsafe_code)]
pub mod sys;
