//! The `prjquota-dashboards` command line, defined once: the executable
//! parses with it, its `--help` (and so its man page, help2man in `cargo
//! xtask dist`) prints it, and the packages' shell completions are
//! generated from it (`xtask/src/completions.rs`).
//!
//! An executable of its own, not a command of the plugin: Nomad runs the
//! plugin for every volume operation, and the renderer's YAML library and
//! templates have no business in it.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser, Subcommand, ValueHint};

/// Where the packages install the default config (every field with its
/// default), to copy and edit.
pub const DEFAULT_CONFIG: &str = "/usr/share/prjquota/dashboards/config.toml";

const ABOUT: &str =
    "The Prometheus rules and the Grafana dashboard of prjquota, rendered from a config";

const AFTER_HELP: &str = "\
The package installs the rules and the dashboard rendered from the default config
(/usr/share/prjquota). To change a threshold, a `for:`, the dashboard's uid or the selector
every expression gets, copy /usr/share/prjquota/dashboards/config.toml, edit it and render
your own copies (docs/dashboards.md#customising lists the fields). A bad config writes nothing.";

/// `prjquota-dashboards`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "prjquota-dashboards",
    version,
    about = ABOUT,
    after_help = AFTER_HELP,
    disable_help_subcommand = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// One command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write alerts.yaml and prjquota.json rendered from a config (see docs/dashboards.md#customising)
    Render {
        /// A copy of the shipped config with the fields you change
        #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath,
              default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Where to write the two files (not /usr/share/prjquota, which the package owns)
        #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
        out: PathBuf,
    },
}

/// The command's clap definition, for completions and tests.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Renders both files from `config` into `out`: the paths written. A
/// missing config names the shipped one to copy.
pub fn render(config: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    crate::render::config_into(config, out).map_err(|e| {
        if config.exists() {
            e
        } else {
            format!(
                "{e}; copy {DEFAULT_CONFIG} (installed by the prjquota package), edit it and \
                 pass it with --config"
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn a_missing_config_names_the_shipped_one() {
        let e = render(
            Path::new("/nonexistent/prjquota-dashboards.toml"),
            &std::env::temp_dir().join("prjquota-dashboards-never-written"),
        )
        .unwrap_err();
        assert!(e.contains("/nonexistent/prjquota-dashboards.toml"), "{e}");
        assert!(e.contains(DEFAULT_CONFIG), "{e}");
    }

    #[test]
    fn help_and_typos() {
        let e = Cli::try_parse_from(["prjquota-dashboards", "--help"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayHelp);
        assert!(e.to_string().contains("render"), "{e}");
        let e = Cli::try_parse_from(["prjquota-dashboards", "rendr"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSubcommand);
        assert!(e.to_string().contains("render"), "{e}");
    }
}
