//! `cargo xtask dashboards [--config FILE] [--out DIR]`: renders
//! `alerts.yaml` and `prjquota.json` from a config (dashboards/config.toml
//! by default) into DIR (dashboards/ by default, over the shipped files).
//! The rendering is the dashboards crate's (`prjquota_dashboards::render`),
//! which the host tests hold the shipped files to, and which the installed
//! `prjquota-dashboards render` runs too.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use prjquota_dashboards::config;
use prjquota_dashboards::render;

pub fn main(args: &[String]) -> Result<u8> {
    let dir = crate::paths::repo_root().join("dashboards");
    let mut config = dir.join(config::FILE);
    let mut out = dir.clone();
    let mut i = 0;
    while i < args.len() {
        if let Some(v) = crate::args::take_value(args, &mut i, "--config")? {
            config = PathBuf::from(v);
        } else if let Some(v) = crate::args::take_value(args, &mut i, "--out")? {
            out = PathBuf::from(v);
        } else {
            bail!(
                "usage: cargo xtask dashboards [--config FILE] [--out DIR] (got `{}`)",
                args[i]
            );
        }
        i += 1;
    }
    let written = render::config_into(&config, &out).map_err(|e| anyhow!(e))?;
    for p in written {
        println!("wrote {} (from {})", p.display(), config.display());
    }
    Ok(0)
}
