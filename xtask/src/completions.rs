//! Shell completions for the packages (bash, zsh, fish), one file per shell
//! and command, where Debian and Fedora look for them.
//!
//! `prjquota-exporter` parses its flags with clap: its scripts come from the
//! binary being packaged (`--completion-script SHELL`), as its man page
//! comes from its `--help`, so they cannot drift from it.
//!
//! `prjquota`'s come from its one command-line definition
//! (`prjquota::cli`), which its parser and `--help` (so its man page) use
//! too. Nomad's own operations (fingerprint, create, delete) are not
//! offered: an operator never runs them. `prjquota-dashboards`'s come
//! from its definition (`prjquota_dashboards::cli`) the same way.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap_complete::Shell;
use prjquota::cli::NOMAD_OPERATIONS;

/// The shells whose completions the packages ship.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// zsh's directory for packaged completions on Debian (on its fpath by
/// zsh-common).
pub const ZSH_DEB: &str = "usr/share/zsh/vendor-completions";
/// zsh's directory for packaged completions on Fedora and RHEL.
pub const ZSH_RPM: &str = "usr/share/zsh/site-functions";

/// Where `shell`'s completion file for the command `bin` is installed
/// (relative to /), with zsh's files in `zsh_dir`.
pub fn path(shell: Shell, bin: &str, zsh_dir: &str) -> String {
    match shell {
        Shell::Zsh => format!("{zsh_dir}/_{bin}"),
        Shell::Fish => format!("usr/share/fish/vendor_completions.d/{bin}.fish"),
        _ => format!("usr/share/bash-completion/completions/{bin}"),
    }
}

/// Writes every command's completions for every shell under the staged
/// tree `d`.
pub fn stage(exporter: &Path, d: &Path, zsh_dir: &str) -> Result<()> {
    for shell in SHELLS {
        for (bin, text) in [
            ("prjquota-exporter", from_binary(exporter, shell)?),
            ("prjquota", plugin_script(shell)),
            ("prjquota-dashboards", dashboards_script(shell)),
        ] {
            let to = d.join(path(shell, bin, zsh_dir));
            std::fs::create_dir_all(to.parent().context("a completion's directory")?)?;
            std::fs::write(&to, text).with_context(|| format!("write {}", to.display()))?;
        }
    }
    Ok(())
}

/// What `exporter --completion-script SHELL` prints.
fn from_binary(exporter: &Path, shell: Shell) -> Result<Vec<u8>> {
    let o = Command::new(exporter)
        .args(["--completion-script", &shell.to_string()])
        .output()
        .with_context(|| format!("run {} --completion-script", exporter.display()))?;
    if !o.status.success() || o.stdout.is_empty() {
        bail!(
            "{} --completion-script {shell} failed: {}",
            exporter.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(o.stdout)
}

/// The completion script of `prjquota` for `shell`.
pub fn plugin_script(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut plugin_command(), "prjquota", &mut out);
    out
}

/// The completion script of `prjquota-dashboards` for `shell`.
pub fn dashboards_script(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(
        shell,
        &mut prjquota_dashboards::cli::command(),
        "prjquota-dashboards",
        &mut out,
    );
    out
}

/// What `prjquota` accepts from an operator: its command line less
/// Nomad's operations.
pub fn plugin_command() -> clap::Command {
    // Rebuilt without them: clap's scripts offer hidden subcommands too.
    let full = prjquota::cli::command();
    let operators = full
        .get_subcommands()
        .filter(|c| !NOMAD_OPERATIONS.contains(&c.get_name()))
        .cloned()
        .collect::<Vec<_>>();
    clap::Command::new("prjquota")
        .about(full.get_about().cloned().unwrap_or_default())
        .version(env!("CARGO_PKG_VERSION"))
        .disable_help_subcommand(true)
        .subcommands(operators)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bash loads the plugin's script and completes `prjquota` with it;
    /// zsh's and fish's name the command.
    #[test]
    fn the_plugin_scripts_load() {
        let dir = std::env::temp_dir().join(format!("xtask-compl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("prjquota");
        std::fs::write(&file, plugin_script(Shell::Bash)).unwrap();
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(". {}; complete -p prjquota", file.display()))
            .output()
            .expect("run bash");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("prjquota"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let zsh = String::from_utf8(plugin_script(Shell::Zsh)).unwrap();
        assert!(zsh.starts_with("#compdef prjquota"), "{zsh}");
        let fish = String::from_utf8(plugin_script(Shell::Fish)).unwrap();
        assert!(fish.contains("complete -c prjquota"), "{fish}");
        for s in [&zsh, &fish] {
            for f in [
                "volumes-dir",
                "plugin-dir",
                "json",
                "bytes",
                "fix",
                "reconcile",
                "grow",
                "min-used",
                "node-pool",
            ] {
                assert!(s.contains(f), "{f}");
            }
        }
        let bash = String::from_utf8(plugin_script(Shell::Bash)).unwrap();
        for nomads in NOMAD_OPERATIONS {
            assert!(!bash.contains(nomads), "Nomad's {nomads} is offered");
        }
    }

    #[test]
    fn the_dashboards_scripts_offer_render_and_its_flags() {
        for shell in SHELLS {
            let s = String::from_utf8(dashboards_script(shell)).unwrap();
            for word in ["prjquota-dashboards", "render", "config", "out"] {
                assert!(s.contains(word), "{shell}: {word} in\n{s}");
            }
        }
    }

    #[test]
    fn paths_are_where_the_distributions_look() {
        assert_eq!(
            path(Shell::Bash, "prjquota", ZSH_DEB),
            "usr/share/bash-completion/completions/prjquota"
        );
        assert_eq!(
            path(Shell::Zsh, "prjquota-exporter", ZSH_RPM),
            "usr/share/zsh/site-functions/_prjquota-exporter"
        );
        assert_eq!(
            path(Shell::Fish, "prjquota", ZSH_DEB),
            "usr/share/fish/vendor_completions.d/prjquota.fish"
        );
    }
}
