//! `cargo xtask dashboards [--config FILE] [--out DIR]`: renders
//! `alerts.yaml` and `prjquota.json` from a config (dashboards/config.toml
//! by default) into DIR (dashboards/ by default, over the shipped files).
//! The rendering is the dashboards crate's (`prjquota_dashboards::render`),
//! which the host tests hold the shipped files to, and which the installed
//! `prjquota-dashboards render` runs too.

use anyhow::{anyhow, Result};
use prjquota_dashboards::config;
use prjquota_dashboards::render;

pub fn main(args: crate::cli::DashboardsArgs) -> Result<u8> {
    let dir = crate::paths::repo_root().join("dashboards");
    let config = args.config.unwrap_or_else(|| dir.join(config::FILE));
    let out = args.out.unwrap_or(dir);
    let written = render::config_into(&config, &out).map_err(|e| anyhow!(e))?;
    for p in written {
        println!("wrote {} (from {})", p.display(), config.display());
    }
    Ok(0)
}
