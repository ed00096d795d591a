//! Shell completions for the packages (bash, zsh, fish), one file per shell
//! and command, where Debian and Fedora look for them.
//!
//! `prjquota-exporter` parses its flags with clap: its scripts come from the
//! binary being packaged (`--completion-script SHELL`), as its man page
//! comes from its `--help`, so they cannot drift from it.
//!
//! `prjquota` parses by hand (Nomad runs it on every create and it stays
//! small: no clap in the plugin). Its scripts come from [`plugin_command`],
//! a clap description of the operator commands used only here; the tests
//! below hold it to the table the plugin's parser uses
//! (`prjquota::admin::COMMANDS`), and run that parser on every flag it
//! completes. Nomad's own operations (fingerprint, create, delete) are not
//! offered: an operator never runs them.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, ValueHint};
use clap_complete::Shell;

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

/// Writes both commands' completions for every shell under the staged
/// tree `d`.
pub fn stage(exporter: &Path, d: &Path, zsh_dir: &str) -> Result<()> {
    for shell in SHELLS {
        for (bin, text) in [
            ("prjquota-exporter", from_binary(exporter, shell)?),
            ("prjquota", plugin_script(shell)),
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

/// What `prjquota` accepts from an operator, for completion only (the
/// binary parses in plugin/src/main.rs and plugin/src/admin/mod.rs).
pub fn plugin_command() -> clap::Command {
    let dir = |name: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_name("DIR")
            .value_hint(ValueHint::DirPath)
            .action(ArgAction::Set)
            .help(help)
    };
    let flag = |name: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .action(ArgAction::SetTrue)
            .help(help)
    };
    // No -h/--help on the commands: the plugin refuses them there.
    let command = |name: &'static str, about: &'static str| {
        clap::Command::new(name)
            .about(about)
            .disable_help_flag(true)
            .arg(dir("volumes-dir", "Nomad's host_volumes_dir"))
            .arg(dir("plugin-dir", "Nomad's host_volume_plugin_dir"))
            .arg(flag("json", "print JSON"))
    };
    clap::Command::new("prjquota")
        .about("Nomad dynamic host volume plugin enforcing volume sizes with project quotas")
        .version(env!("CARGO_PKG_VERSION"))
        .disable_help_subcommand(true)
        .subcommand(command(
            "check",
            "is this node ready for a volume? one line per requirement",
        ))
        .subcommand(
            command("list", "the volumes on this node, fullest first")
                .arg(flag("bytes", "sizes in bytes")),
        )
        .subcommand(
            command("reconcile", "compare records, directories and quotas")
                .arg(flag("fix", "repair what loses no data")),
        )
        .subcommand(dashboards_command())
}

/// `prjquota dashboards render`, which takes its own flags
/// (`prjquota::admin::dashboards::FLAGS`), not the volume commands'.
fn dashboards_command() -> clap::Command {
    let value = |name: &'static str, v: &'static str, hint: ValueHint, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_name(v)
            .value_hint(hint)
            .action(ArgAction::Set)
            .help(help)
    };
    clap::Command::new(DASHBOARDS)
        .about("the Prometheus rules and Grafana dashboard from a config")
        .disable_help_flag(true)
        .disable_help_subcommand(true)
        .subcommand_required(true)
        .subcommand(
            clap::Command::new("render")
                .about("write alerts.yaml and prjquota.json rendered from a config")
                .disable_help_flag(true)
                .arg(value(
                    "config",
                    "FILE",
                    ValueHint::FilePath,
                    "the config (default: the shipped one)",
                ))
                .arg(value(
                    "out",
                    "DIR",
                    ValueHint::DirPath,
                    "where to write the two files",
                )),
        )
}

/// The command whose flags are not the volume commands' table.
const DASHBOARDS: &str = "dashboards";

#[cfg(test)]
mod tests {
    use super::*;
    use prjquota::admin;

    fn longs(c: &clap::Command) -> Vec<String> {
        let mut v: Vec<String> = c
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        v.sort();
        v
    }

    /// The description names the plugin's commands and, for each, exactly
    /// the flags the plugin's parser takes from its table, values where it
    /// wants values.
    #[test]
    fn the_plugin_description_matches_the_parsers_table() {
        let cmd = plugin_command();
        let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
        let mut table: Vec<&str> = admin::COMMANDS.iter().map(|(c, _)| *c).collect();
        table.push(DASHBOARDS);
        assert_eq!(names, table, "the completed commands are not the plugin's");
        for sub in volume_commands(&cmd) {
            let booleans = admin::booleans(sub.get_name()).unwrap();
            let mut want: Vec<String> = admin::VALUE_FLAGS
                .iter()
                .chain(booleans)
                .map(|f| f.to_string())
                .collect();
            want.sort();
            assert_eq!(longs(sub), want, "{}", sub.get_name());
            for a in sub.get_arguments() {
                let long = format!("--{}", a.get_long().unwrap());
                let takes_value = matches!(a.get_action(), ArgAction::Set);
                assert_eq!(
                    takes_value,
                    admin::VALUE_FLAGS.contains(&long.as_str()),
                    "{} {long}",
                    sub.get_name()
                );
            }
        }
    }

    /// The plugin's real parser accepts every flag completed for a command,
    /// and refuses the other commands' flags that are not completed there.
    /// The commands that take the table's flags (all but `dashboards`).
    fn volume_commands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
        cmd.get_subcommands().filter(|s| s.get_name() != DASHBOARDS)
    }

    /// `dashboards render` completes exactly the flags its parser takes,
    /// and the parser accepts each.
    #[test]
    fn the_dashboards_render_flags_match_its_parser() {
        let cmd = plugin_command();
        let d = cmd.find_subcommand(DASHBOARDS).unwrap();
        let names: Vec<&str> = d.get_subcommands().map(|s| s.get_name()).collect();
        assert_eq!(names, [admin::dashboards::SUBCOMMAND]);
        let render = d.get_subcommands().next().unwrap();
        let mut want: Vec<String> = admin::dashboards::FLAGS
            .iter()
            .map(|f| f.to_string())
            .collect();
        want.sort();
        assert_eq!(longs(render), want);
        for long in longs(render) {
            let mut args = vec!["render".to_string(), long.clone(), "/x".into()];
            if long != "--out" {
                args.extend(["--out".into(), "/o".into()]);
            }
            assert!(admin::dashboards::parse(&args).is_ok(), "{args:?}");
        }
    }

    #[test]
    fn the_plugin_parser_accepts_what_is_completed_and_no_more() {
        let cmd = plugin_command();
        let every: Vec<String> = volume_commands(&cmd).flat_map(longs).collect();
        for sub in volume_commands(&cmd) {
            let booleans = admin::booleans(sub.get_name()).unwrap();
            let completed = longs(sub);
            for long in &every {
                let args: Vec<String> = if admin::VALUE_FLAGS.contains(&long.as_str()) {
                    vec![long.clone(), "/d".into()]
                } else {
                    vec![long.clone()]
                };
                let parsed = admin::parse_flags(&args, booleans);
                assert_eq!(
                    parsed.is_ok(),
                    completed.contains(long),
                    "prjquota {} {long}: parser says {parsed:?}",
                    sub.get_name()
                );
            }
            assert!(admin::parse_flags(&["--help".into()], booleans).is_err());
        }
    }

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
            ] {
                assert!(s.contains(f), "{f}");
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
