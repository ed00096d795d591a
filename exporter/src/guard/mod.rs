//! The quota-escape guard's control plane in the exporter: what keeps the
//! guard `prjquota_ebpf::guard` loads in force between scrapes. The
//! guard's metrics are a collector (`crate::collector::guard`), which
//! starts it; the BPF side is `prjquota_ebpf::guard`, its contract with
//! the plugin `prjquota_core::guard_contract`.
//!
//! - [`owner`]: one exporter owns each volumes directory's pinned guard
//!   (its owner lock), and puts back pins changed behind its back;
//! - [`ranges`]: the project-ID ranges of `prjquota.toml` the guard keeps
//!   for prjquota outside the roots;
//! - [`sync`]: the sync timer's round, keeping the guard's maps equal to
//!   the registries (and the allocations) and re-tagging roots that lost
//!   their project.

pub mod owner;
pub mod ranges;
pub mod sync;
