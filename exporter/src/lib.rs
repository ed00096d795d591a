//! prjquota-exporter: Prometheus metrics for Nomad dynamic host volumes made
//! by the prjquota plugin.
//!
//! [`collector`] holds the sources (one module each) and the scrape driver,
//! [`http`] serves what they produce, [`exposition`] is the compact metric
//! model and its two text formats (text 0.0.4 and OpenMetrics, and which
//! one a scraper asked for), [`inventory`] the volumes a scrape reports, [`allocs`] the projects of
//! Nomad's allocation directories (`--nomad.alloc-dir`), [`nomad`] Nomad's
//! HTTP API (off unless configured). The binary (`main.rs`) only parses flags and wires these up, so
//! tests can run an exporter against any volumes directory in-process.
//!
//! No `unsafe` here: the project's syscalls live in `prjquota-core`'s `sys`
//! and `prjquota-ebpf`'s `raw` modules; netlink goes through nix's safe
//! socket API.

#![forbid(unsafe_code)]

pub mod log;

pub mod allocs;
pub mod announce;
pub mod blocking;
pub mod collector;
pub mod deflate;
pub mod exposition;
pub mod genetlink;
pub mod guard;
pub mod http;
pub mod inventory;
pub mod listen;
pub mod nomad;
pub mod plugin_config;
pub mod process;
pub mod web_config;

pub use collector::{Config, Exporter};
