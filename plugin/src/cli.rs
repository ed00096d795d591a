//! The `prjquota` command line, defined once: the binary parses the
//! operator commands with it, `--help` and the man page (help2man, in
//! `cargo xtask dist`) print it, and the packages' shell completions are
//! generated from it (`xtask/src/completions.rs`).
//!
//! Nomad's own operations (`fingerprint`, `create`, `delete`: argv exactly
//! `[path, op]`, only `DHV_*` variables) are dispatched by `main` before
//! this parser is built, so a restore storm pays nothing for it; they are
//! described here so that the help lists them, and answer `--help` like
//! every other command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueHint};

use crate::admin::{list::Filter, Flags};
use prjquota_core::units;

const ABOUT: &str =
    "Nomad dynamic host volume plugin enforcing volume sizes with XFS/ext4 project quotas";

const AFTER_HELP: &str = "\
Nomad runs `prjquota fingerprint|create|delete` with one argument and DHV_* variables; the other
commands are for operators, and Nomad never runs them. --volumes-dir defaults to Nomad's
/opt/nomad/data/host_volumes, --plugin-dir to the directory of this executable (where
prjquota.toml is looked up).

Install: `prjquota install --plugin-dir` Nomad's host_volume_plugin_dir, and put host_volumes_dir
on an XFS filesystem mounted with -o prjquota (see docs/install.md). Exit status: see
docs/operations.md.";

/// Nomad's operations, which take no flags (and are not an operator's to
/// complete).
pub const NOMAD_OPERATIONS: [&str; 3] = ["fingerprint", "create", "delete"];

/// `prjquota`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "prjquota",
    version,
    about = ABOUT,
    after_help = AFTER_HELP,
    disable_help_subcommand = true,
    subcommand_required = true,
    arg_required_else_help = true,
    // /usr/bin/prjquota (deploy/package/prjquota) passes the node's
    // directories first; the operator's own, after them, win.
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// One command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// (Nomad) print {"version": ...}; takes no input
    Fingerprint,
    /// (Nomad) create, restore or resize the volume DHV_VOLUME_ID
    Create,
    /// (Nomad) delete the volume DHV_VOLUME_ID
    Delete,
    /// Is this node ready for a volume? One line per requirement, with fixes
    Check {
        #[command(flatten)]
        node: NodeArgs,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// The volumes on this node, fullest first
    List(ListArgs),
    /// Raise a volume's size (and inode limit) now, while allocations use it
    #[command(
        long_about = "Raise a volume's size (and inode limit) now, while allocations use it.\n\n\
            Nomad refuses to update a volume that an allocation claims; this raises the \
            project quota in place, admitted like any grow (never more promised than the \
            disk holds), and writes it into the volume's record, so that Nomad's restore \
            at every agent start keeps the larger size and `reconcile --fix` never undoes \
            it. It prints what Nomad still believes and the `nomad volume create` that \
            brings Nomad's view in line once the volume is free. `--to` is safe to repeat; \
            a repeated `--by` grows again."
    )]
    Grow(GrowArgs),
    /// Compare records, directories and quotas; --fix repairs what loses no data
    Reconcile {
        #[command(flatten)]
        node: NodeArgs,
        /// Repair what loses no data (re-apply limits and tags, clear stale files); with --nomad,
        /// also delete the volumes Nomad does not know, as `nomad volume delete` would
        #[arg(long)]
        fix: bool,
        /// Also compare with Nomad's list of host volumes, asked through this node's
        /// prjquota-exporter (its --nomad.addr and token)
        #[arg(long)]
        nomad: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Put this executable into Nomad's plugin directory as prjquota, replacing the old one in one step
    Install {
        /// Nomad's host_volume_plugin_dir
        #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
        plugin_dir: PathBuf,
    },
}

/// Where a node's volumes and plugin are: every volume command takes them.
#[derive(Debug, Args, Clone, Default)]
pub struct NodeArgs {
    /// Nomad's host_volumes_dir [default: /opt/nomad/data/host_volumes]
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub volumes_dir: Option<PathBuf>,
    /// Nomad's host_volume_plugin_dir, where prjquota.toml is [default: this executable's directory]
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    pub plugin_dir: Option<PathBuf>,
}

impl NodeArgs {
    /// The flags the check, list and reconcile modules read.
    pub fn flags(&self) -> Flags {
        Flags {
            volumes_dir: self.volumes_dir.clone(),
            plugin_dir: self.plugin_dir.clone(),
            ..Flags::default()
        }
    }
}

/// `prjquota list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON (schema: docs/list.schema.json)
    #[arg(long)]
    pub json: bool,
    /// Sizes in bytes
    #[arg(long)]
    pub bytes: bool,
    /// Only volumes of this namespace
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Only volumes of this node pool
    #[arg(long, value_name = "POOL")]
    pub node_pool: Option<String>,
    /// Only volumes whose name matches: exact, or a glob with * and ?
    #[arg(long, value_name = "NAME|GLOB")]
    pub name: Option<String>,
    /// Only volumes at least this full, e.g. 80% (of their size)
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
    pub min_used: Option<f64>,
}

impl ListArgs {
    pub fn filter(&self) -> Filter {
        Filter {
            namespace: self.namespace.clone(),
            node_pool: self.node_pool.clone(),
            name: self.name.clone(),
            min_used_percent: self.min_used,
        }
    }
}

/// `prjquota grow`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("size").args(["to", "by"]).multiple(false))]
#[command(group = clap::ArgGroup::new("what").args(["to", "by", "inodes"]).required(true).multiple(true))]
pub struct GrowArgs {
    /// The volume: its ID, or its name (unique in --namespace)
    #[arg(value_name = "VOLUME")]
    pub volume: String,
    /// The namespace of a volume given by name
    #[arg(long, value_name = "NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// The new size, e.g. 40GiB (rounded up to the filesystem's block)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub to: Option<u64>,
    /// Add this much to the size in force, e.g. 10GiB
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub by: Option<u64>,
    /// The new inode limit (of a volume that has one: the max_inodes parameter)
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub inodes: Option<u64>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    match units::parse_size(s)? {
        0 => Err("a size of 0 grows nothing: give the size, e.g. 40GiB".into()),
        n => Ok(n),
    }
}

fn parse_count(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a count of files: give a whole number above 0"))
}

/// "80%" or "80": a percentage from 0 to 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    s.trim()
        .strip_suffix('%')
        .unwrap_or(s.trim())
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| format!("{s:?} is not a percentage: give e.g. 80% (0 to 100)"))
}

/// The whole command line: the parser, and `--help` with every command's
/// own help appended, so that the man page (help2man reads `--help`)
/// describes every flag, as `-h` stays short.
pub fn command() -> clap::Command {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut text = String::from(AFTER_HELP);
    for sub in cmd
        .get_subcommands()
        .filter(|c| !NOMAD_OPERATIONS.contains(&c.get_name()))
    {
        append_help(&mut text, sub, "prjquota");
    }
    cmd.after_long_help(text)
}

/// `sub`'s long help, and its own commands' after it.
fn append_help(text: &mut String, sub: &clap::Command, parent: &str) {
    let name = format!("{parent} {}", sub.get_name());
    let mut c = sub.clone().bin_name(&name);
    text.push_str(&format!("\n\n{name}\n\n{}", c.render_long_help()));
    for s in sub.get_subcommands() {
        append_help(text, s, &name);
    }
}

/// Parses `args` (argv, the program's name first) with [`command`].
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::FromArgMatches;
    let mut cmd = command();
    cmd.try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m))
        .map_err(|e| e.format(&mut cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(std::iter::once("prjquota").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    /// Every command answers --help (clap exits 0 for it), the top level too.
    #[test]
    fn every_command_answers_help() {
        let cmd = command();
        let mut paths: Vec<Vec<&str>> = vec![vec![]];
        for sub in cmd.get_subcommands() {
            paths.push(vec![sub.get_name()]);
            for subsub in sub.get_subcommands() {
                paths.push(vec![sub.get_name(), subsub.get_name()]);
            }
        }
        assert!(paths.len() > 8, "{paths:?}");
        for mut p in paths {
            p.push("--help");
            let e = parse(&p).expect_err("--help stops the parse");
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{p:?}");
            assert_eq!(e.exit_code(), 0, "{p:?}");
        }
    }

    /// `--help` (what the man page is made from) holds every command's
    /// flags; `-h` stays short.
    #[test]
    fn the_long_help_describes_every_flag() {
        let long = command().render_long_help().to_string();
        let short = command().render_help().to_string();
        let mut cmds = vec![command()];
        while let Some(c) = cmds.pop() {
            for a in c.get_arguments().filter_map(|a| a.get_long()) {
                assert!(
                    long.contains(&format!("--{a}")),
                    "--{a} of {}",
                    c.get_name()
                );
            }
            cmds.extend(c.get_subcommands().cloned());
        }
        assert!(long.contains("Usage: prjquota grow "), "{long}");
        assert!(!short.contains("--min-used"), "{short}");
    }

    #[test]
    fn a_typo_gets_a_suggestion() {
        let e = parse(&["lsit"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSubcommand);
        assert!(e.to_string().contains("'list'"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let e = parse(&["list", "--volume-dir", "/v"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--volumes-dir"), "{e}");
        let e = parse(&["reconcile", "--fixx"]).unwrap_err();
        assert!(e.to_string().contains("--fix"), "{e}");
    }

    #[test]
    fn grow_takes_one_size_or_an_inode_limit() {
        let Command::Grow(g) = parse(&["grow", "db", "--to", "40GiB"]).unwrap().command else {
            panic!("not grow")
        };
        assert_eq!(
            (g.to, g.by, g.namespace.as_str()),
            (Some(40 << 30), None, "default")
        );
        let Command::Grow(g) = parse(&["grow", "db", "--inodes", "5000"]).unwrap().command else {
            panic!("not grow")
        };
        assert_eq!(g.inodes, Some(5000));
        for bad in [
            &["grow", "db"][..],
            &["grow", "db", "--to", "1GiB", "--by", "1GiB"],
            &["grow", "db", "--to", "0"],
            &["grow", "db", "--to", "10gb"],
            &["grow", "db", "--inodes", "-1"],
            &["grow", "--to", "1GiB"],
        ] {
            let e = parse(bad).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn list_filters_parse() {
        let Command::List(l) = parse(&[
            "list",
            "--namespace",
            "prod",
            "--node-pool",
            "gpu",
            "--name",
            "db-*",
            "--min-used",
            "80%",
        ])
        .unwrap()
        .command
        else {
            panic!("not list")
        };
        let f = l.filter();
        assert_eq!(f.namespace.as_deref(), Some("prod"));
        assert_eq!(f.node_pool.as_deref(), Some("gpu"));
        assert_eq!(f.name.as_deref(), Some("db-*"));
        assert_eq!(f.min_used_percent, Some(80.0));
        assert_eq!(parse_percent("12.5"), Ok(12.5));
        assert!(parse_percent("101%").is_err() && parse_percent("x").is_err());
    }

    /// The packages' wrapper passes the node's directories before the
    /// operator's arguments: the operator's win.
    #[test]
    fn a_later_flag_wins() {
        let Command::Grow(g) = parse(&[
            "grow",
            "--volumes-dir",
            "/node",
            "--plugin-dir",
            "/p",
            "db",
            "--volumes-dir",
            "/mine",
            "--to",
            "1GiB",
        ])
        .unwrap()
        .command
        else {
            panic!("not grow")
        };
        assert_eq!(g.node.volumes_dir, Some(PathBuf::from("/mine")));
        assert_eq!(g.node.plugin_dir, Some(PathBuf::from("/p")));
    }

    #[test]
    fn nomads_operations_take_no_argument() {
        assert!(matches!(
            parse(&["create"]).unwrap().command,
            Command::Create
        ));
        assert!(parse(&["create", "--volumes-dir", "/v"]).is_err());
    }
}
