//! Per-volume write telemetry from eBPF: bytes written, successful writes
//! and failed writes by errno, for every file below a registered volume root
//! directory, whatever the submission path (write/pwrite/writev, O_DIRECT,
//! io_uring, libaio).
//!
//! The programs are CO-RE C (`src/bpf/`), compiled by clang at build time
//! and embedded here; [`WriteTelemetry::load`] relocates them against the
//! running kernel's BTF and attaches them with aya. See
//! `src/bpf/write_telemetry.c` for the hook points and why.
//!
//! # Use from a collector
//!
//! ```no_run
//! use prjquota_ebpf::{Mode, WriteTelemetry};
//!
//! // Once, at start-up. Degrade, never die: keep the error for a self-metric.
//! let mode = Mode::Auto;
//! let mut telemetry = match WriteTelemetry::start(mode, &Default::default()) {
//!     Ok(t) => t, // None when mode is Off
//!     Err(e) if mode == Mode::Required => panic!("{e}"),
//!     Err(e) => {
//!         eprintln!("write telemetry off: {e} (reason {})", e.reason());
//!         None
//!     }
//! };
//!
//! // On every scrape: volume roots from the registry, each with a stable
//! // index the caller chooses (e.g. assigned per volume ID), then counters.
//! if let Some(t) = telemetry.as_mut() {
//!     let (dev, ino) = prjquota_ebpf::root_of("/srv/volumes/3f2a…".as_ref()).unwrap();
//!     t.set_roots(&[(dev, ino, 7)]).unwrap();
//!     let counters = t.read().unwrap();
//!     let v = counters.volume(7);
//!     println!("{} bytes in {} writes", v.written_bytes, v.write_ops);
//! }
//! ```
//!
//! Counters are cumulative from load (Prometheus counters). An index whose
//! roots all disappear from [`WriteTelemetry::set_roots`] loses its counters
//! (so the maps never fill up); if it comes back it starts again at zero.

mod error;
pub mod guard;
mod loader;
// The crate's kernel boundary: raw bpf(2) and the C layouts shared with
// the programs. Every block states its SAFETY invariant
// (clippy::undocumented_unsafe_blocks).
#[allow(unsafe_code)]
mod raw;
mod roots;
mod telemetry_mode;
mod write_counters;
mod write_telemetry;

pub use error::{FailureReason, LoadError, ProgramFailure, TelemetryError};
pub use loader::{LoadOptions, Variant, KERNEL_BTF};
pub use roots::{kernel_dev, root_of, RootsUpdate, MAX_DEPTH};
pub use telemetry_mode::Mode;
pub use write_counters::{Counters, ErrnoBucket, ProgramStats, Unattributed, VolumeCounters};
pub use write_telemetry::{
    WriteTelemetry, HOOK_BUFFERED_GENERIC, HOOK_BUFFERED_IOMAP, HOOK_DIRECT, HOOK_NAMES,
    HOOK_RENAME,
};

#[cfg(test)]
mod tests;
