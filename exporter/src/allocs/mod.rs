//! Per-allocation disk usage (`--nomad.alloc-dir`, off unless named): each
//! allocation directory `<alloc dir>/<alloc id>/` gets a project ID of its
//! own, so the kernel keeps its usage and a scrape reads it in the one
//! quota pass, however many files it holds.
//!
//! When: an allocation is put into its project once its first task has
//! started (`<alloc id>/<task>/tmp` exists), never before. Nomad moves a
//! sticky or migrated ephemeral disk into a new allocation with a plain
//! `rename(2)` and no copy fallback, and the kernel refuses a rename into a
//! `PROJINHERIT` directory of another project (EXDEV): tagging earlier would
//! cost the user their data. Those moves are over before any task runs.
//!
//! How ([`tag_walk`]): the allocation directory gets the project ID and
//! `PROJINHERIT` first (what is made in it from then on inherits), then one
//! walk of the tree on its mount gives each directory both right before it
//! is read and each file the ID; a `trusted.` extended attribute on the
//! allocation directory marks the walk complete, so a walk stopped by a
//! crash is made again at the next start. Nomad's alloc directory
//! itself is never tagged: Nomad's garbage collector and storage
//! fingerprint statfs it.
//!
//! State ([`Accounting`]): the project ID on each allocation's directory
//! is the only state. A restarted exporter reads it back with one
//! `FS_IOC_FSGETXATTR` per allocation, without a walk. An ID is reused only
//! once the kernel counts nothing to it: a file held open or renamed out of
//! a collected allocation keeps its ID out of use
//! ([`prjquota_core::project_ids`]). The range is `prjquota.toml`'s
//! `alloc_project_id_min`..`alloc_project_id_max`, clear of the volumes'.
//!
//! Limited ([`disk_limits`], `--nomad.enforce-ephemeral-disk`): each
//! walked allocation's project gets its `ephemeral_disk.size` as its hard
//! limit.
//!
//! Guarded ([`guarded`]): from its claim, before its directory takes the
//! ID, an allocation's directory is a root of the quota-escape guard, as a
//! volume's is.

pub mod accounting;
pub mod disk_limits;
pub mod guarded;
pub mod tag_walk;

pub use accounting::{Accounting, AllocProject, Census, GuardLink};
pub use guarded::{GuardOwner, GuardedAlloc, GuardedRoots};
