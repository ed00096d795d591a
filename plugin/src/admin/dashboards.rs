//! `prjquota dashboards render [--config FILE] --out DIR`: the Prometheus
//! rules and the Grafana dashboard rendered from an operator's config, on a
//! host that has the package and no checkout. The rendering is the
//! dashboards crate's (`prjquota_dashboards::render::config_into`), the one
//! `cargo xtask dashboards` runs for the shipped files, so a copy rendered
//! from the shipped config is byte for byte the shipped one.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};

/// Where the packages install the default config (every field with its
/// default), to copy and edit.
pub const DEFAULT_CONFIG: &str = "/usr/share/prjquota/dashboards/config.toml";

/// The one subcommand, and the flags it takes, each with a value: the
/// binary parses with these, and the completions are checked against them.
pub const SUBCOMMAND: &str = "render";
pub const FLAGS: [&str; 2] = ["--config", "--out"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Render {
    pub config: PathBuf,
    pub out: PathBuf,
}

const USAGE: &str = "usage: prjquota dashboards render [--config FILE] --out DIR";

/// Parses `render [--config FILE] --out DIR` (also as `--x=VALUE`).
pub fn parse(args: &[String]) -> Result<Render> {
    let Some((sub, rest)) = args.split_first() else {
        bail!("no subcommand ({USAGE})");
    };
    if sub != SUBCOMMAND {
        bail!("unknown subcommand {sub:?}: the one there is is `render` ({USAGE})");
    }
    let (mut config, mut out) = (None, None);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let slot = match name {
            "--config" => &mut config,
            "--out" => &mut out,
            other => bail!(
                "{} ({USAGE})",
                prjquota_core::suggest::unknown_flag(other, FLAGS.iter().copied())
            ),
        };
        match inline.or_else(|| it.next().cloned()) {
            Some(v) if !v.is_empty() => *slot = Some(PathBuf::from(v)),
            _ => bail!(
                "{name} needs a {} ({USAGE})",
                if name == "--out" { "directory" } else { "file" }
            ),
        }
    }
    let Some(out) = out else {
        bail!(
            "--out DIR is required: the directory to write alerts.yaml and prjquota.json \
             into (not /usr/share/prjquota, which the package owns) ({USAGE})"
        );
    };
    Ok(Render {
        config: config.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG)),
        out,
    })
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

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_render_with_and_without_a_config() {
        let r = parse(&s(&["render", "--config", "/c.toml", "--out=/o"])).unwrap();
        assert_eq!(r.config, PathBuf::from("/c.toml"));
        assert_eq!(r.out, PathBuf::from("/o"));
        let r = parse(&s(&["render", "--out", "/o"])).unwrap();
        assert_eq!(r.config, PathBuf::from(DEFAULT_CONFIG));
    }

    #[test]
    fn refuses_with_the_fix() {
        let e = parse(&[]).unwrap_err().to_string();
        assert!(e.contains("prjquota dashboards render"), "{e}");
        let e = parse(&s(&["rendr"])).unwrap_err().to_string();
        assert!(e.contains("`render`"), "{e}");
        let e = parse(&s(&["render"])).unwrap_err().to_string();
        assert!(e.starts_with("--out DIR is required"), "{e}");
        let e = parse(&s(&["render", "--out"])).unwrap_err().to_string();
        assert!(e.starts_with("--out needs a directory"), "{e}");
        let e = parse(&s(&["render", "--confg", "x", "--out", "o"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean --config?"), "{e}");
    }

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
