//! `prjquota-dashboards render [--config FILE] --out DIR`: the Prometheus
//! rules and the Grafana dashboard rendered from an operator's config, on a
//! host that has the package and no checkout. The rendering is the one
//! `cargo xtask dashboards` runs for the shipped files
//! (`prjquota_dashboards::render::config_into`), so a copy rendered from
//! the shipped config is byte for byte the shipped one.

use std::process::ExitCode;

use clap::Parser;
use prjquota_dashboards::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print and exit 0; a mistake exits 2
            // with clap's message and, for a typo, its suggestion.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match cli.command {
        Command::Render { config, out } => match cli::render(&config, &out) {
            Ok(written) => {
                for p in written {
                    println!("wrote {} (from {})", p.display(), config.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("prjquota-dashboards render: {e}");
                ExitCode::from(1)
            }
        },
    }
}
