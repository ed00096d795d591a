//! Operator commands: `prjquota check`, `list` and `reconcile`,
//! `install` (the plugin into Nomad's plugin directory) and `dashboards
//! render` (the rules and dashboard from an operator's config).
//!
//! Nomad never runs these; they share the plugin's library so that what they
//! report is exactly what `create` and `delete` would see. They never change
//! how `fingerprint`, `create` or `delete` behave.

pub mod check;
pub mod dashboards;
pub mod install;
pub mod list;
pub mod reconcile;

use std::path::PathBuf;

use anyhow::{bail, Result};

/// Nomad's default `host_volumes_dir` (`<data_dir>/host_volumes`).
pub const DEFAULT_VOLUMES_DIR: &str = "/opt/nomad/data/host_volumes";

/// The operator commands and the boolean flags each accepts; every one
/// also takes the [`VALUE_FLAGS`]. The binary parses with this table, and
/// the packages' shell completions are checked against it.
pub const COMMANDS: [(&str, &[&str]); 3] = [
    ("check", &["--json"]),
    ("list", &["--json", "--bytes"]),
    ("reconcile", &["--json", "--fix"]),
];

/// The flags every operator command takes, each with a directory.
pub const VALUE_FLAGS: [&str; 2] = ["--volumes-dir", "--plugin-dir"];

/// The boolean flags `op` accepts, or `None` when `op` is no operator
/// command.
pub fn booleans(op: &str) -> Option<&'static [&'static str]> {
    COMMANDS.iter().find(|(c, _)| *c == op).map(|(_, b)| *b)
}

/// Flags shared by the operator commands.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    pub volumes_dir: Option<PathBuf>,
    pub plugin_dir: Option<PathBuf>,
    pub json: bool,
    pub bytes: bool,
    pub fix: bool,
}

impl Flags {
    pub fn volumes_dir(&self) -> PathBuf {
        self.volumes_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_VOLUMES_DIR))
    }
}

/// Parses `--volumes-dir DIR`, `--plugin-dir DIR` (also as `--x=DIR`) and
/// the boolean flags a command accepts.
pub fn parse_flags(args: &[String], booleans: &[&str]) -> Result<Flags> {
    let mut f = Flags::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |flag: &str| -> Result<PathBuf> {
            match inline.clone().or_else(|| it.next().cloned()) {
                Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
                _ => bail!("{flag} needs a directory"),
            }
        };
        match name {
            "--volumes-dir" => f.volumes_dir = Some(value(name)?),
            "--plugin-dir" => f.plugin_dir = Some(value(name)?),
            "--json" if booleans.contains(&"--json") => f.json = true,
            "--bytes" if booleans.contains(&"--bytes") => f.bytes = true,
            "--fix" if booleans.contains(&"--fix") => f.fix = true,
            other => {
                let known = ["--volumes-dir", "--plugin-dir"]
                    .iter()
                    .chain(booleans)
                    .copied();
                bail!(
                    "{} (accepted: --volumes-dir DIR, --plugin-dir DIR{})",
                    prjquota_core::suggest::unknown_flag(other, known),
                    booleans
                        .iter()
                        .map(|b| format!(", {b}"))
                        .collect::<String>()
                )
            }
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_take_separate_and_inline_values() {
        let f = parse_flags(
            &s(&["--volumes-dir", "/v", "--plugin-dir=/p", "--json"]),
            &["--json"],
        )
        .unwrap();
        assert_eq!(f.volumes_dir.as_deref(), Some(std::path::Path::new("/v")));
        assert_eq!(f.plugin_dir.as_deref(), Some(std::path::Path::new("/p")));
        assert!(f.json && !f.fix);
    }

    #[test]
    fn unknown_and_unaccepted_flags_are_refused() {
        assert!(parse_flags(&s(&["--fix"]), &["--json"]).is_err());
        assert!(parse_flags(&s(&["--nope"]), &[]).is_err());
        let e = parse_flags(&s(&["--volume-dir=/v"]), &["--json"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown flag --volume-dir; did you mean --volumes-dir? (accepted: --volumes-dir \
             DIR, --plugin-dir DIR, --json)"
        );
        let e = parse_flags(&s(&["--jsno"]), &["--json"]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown flag --jsno; did you mean --json?"),
            "{e}"
        );
        let e = parse_flags(&s(&["--fix"]), &["--json"]).unwrap_err();
        assert!(!e.to_string().contains("did you mean"), "{e}");
        assert!(parse_flags(&s(&["--volumes-dir"]), &[]).is_err());
        assert_eq!(
            parse_flags(&[], &[]).unwrap().volumes_dir(),
            PathBuf::from(DEFAULT_VOLUMES_DIR)
        );
    }
}
