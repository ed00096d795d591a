//! Renders and checks the operator-facing artefacts of `dashboards/`: the
//! Grafana dashboard (`prjquota.json`) and the Prometheus rules
//! (`alerts.yaml`, tested by `alerts_test.yaml`), rendered from a config
//! (`config`, `render`) by `cargo xtask dashboards` and the
//! `prjquota-dashboards` executable (`cli`). The checks themselves are the
//! integration tests in `tests/`; `artefacts`, `exprs` and `promql` are what
//! they read the files with.

pub mod artefacts;
pub mod cli;
pub mod config;
pub mod exprs;
pub mod grafana;
pub mod promql;
pub mod render;

// The tests' and xtask's names, as they were before the modules.
pub use artefacts::*;
pub use exprs::*;
pub use promql::*;
