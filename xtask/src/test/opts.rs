//! What a run of `cargo xtask test` is asked for.

use std::time::Duration;

use crate::kernels::Kernel;

pub(super) const VM_PACKAGE: &str = "prjquota-vmtests";

pub struct Opts {
    pub host: bool,
    pub vm: bool,
    pub filter: Option<String>,
    pub vm_threads: u32,
    pub extra: Vec<String>,
    /// The kernels the VM passes boot, in order.
    pub kernels: Vec<Kernel>,
    /// Run the full suite on every kernel, not the compatibility selection.
    pub full: bool,
    /// What the guest tests get beyond the fixed variables (stress settings).
    pub guest_env: Vec<(String, String)>,
    /// The VM limit per pass, when the pass's default does not fit.
    pub vm_timeout: Option<Duration>,
    /// Virtual CPUs per VM, when the default (two; one for a compatibility
    /// pass beside another VM) does not fit.
    pub vm_cpus: Option<u32>,
    /// How many VMs run at once (`DEFAULT_VM_LANES` when not given).
    pub vm_lanes: Option<u32>,
    /// The package tests install the release .deb of `cargo xtask dist`
    /// (minutes of release build cold), not the test .deb.
    pub release_deb: bool,
}

/// Volumes the exporter churn test creates in `cargo xtask test` (CI);
/// `cargo xtask stress` runs the 10,000-volume soak. 400 still turn its 64
/// live volumes over six times; its RSS bound (16 MiB) then catches state
/// leaked at 40 KiB per volume rather than 16. 1,000 took 323 to 397 s of
/// the full pass, its longest test by three times.
pub const CHURN_VOLUMES: &str = "400";

/// Volumes of the plugin's restore storm in `cargo xtask test` (CI): 100
/// processes at once already contend for every lock; `cargo xtask stress`
/// runs 1,000. A storm of 200 took five minutes per filesystem of the full
/// pass under emulation and starved the tests beside it.
pub const STORM_VOLUMES: &str = "100";

/// Directories of the big allocation the walk's budget test makes in
/// `cargo xtask test` (CI); `cargo xtask stress` makes a million.
pub const ALLOC_DIRS: &str = "20000";
