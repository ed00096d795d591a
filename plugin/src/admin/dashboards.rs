//! `prjquota dashboards render [--config FILE] --out DIR`: the Prometheus
//! rules and the Grafana dashboard rendered from an operator's config, on a
//! host that has the package and no checkout. The rendering is the
//! dashboards crate's (`prjquota_dashboards::render::config_into`), the one
//! `cargo xtask dashboards` runs for the shipped files, so a copy rendered
//! from the shipped config is byte for byte the shipped one.

use std::path::PathBuf;

use anyhow::{anyhow, Result};

/// Where the packages install the default config (every field with its
/// default), to copy and edit.
pub const DEFAULT_CONFIG: &str = "/usr/share/prjquota/dashboards/config.toml";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Render {
    pub config: PathBuf,
    pub out: PathBuf,
}

/// Renders both files; the paths written.
pub fn run(r: &Render) -> Result<Vec<PathBuf>> {
    prjquota_dashboards::render::config_into(&r.config, &r.out).map_err(|e| {
        if !r.config.exists() {
            anyhow!(
                "{e}; copy {DEFAULT_CONFIG} (installed by the prjquota package), edit it and \
                 pass it with --config"
            )
        } else {
            anyhow!(e)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_config_names_the_shipped_one() {
        let r = Render {
            config: PathBuf::from("/nonexistent/prjquota-dashboards.toml"),
            out: std::env::temp_dir().join("prjquota-dashboards-never-written"),
        };
        let e = format!("{:#}", run(&r).unwrap_err());
        assert!(e.contains("/nonexistent/prjquota-dashboards.toml"), "{e}");
        assert!(e.contains(DEFAULT_CONFIG), "{e}");
    }
}
