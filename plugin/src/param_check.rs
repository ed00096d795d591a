//! Volume parameters: the `parameters` block of a volume spec, given meaning.
//!
//! Names and meanings follow Nomad's built-in `mkdir` plugin where they
//! overlap (`mode`, `uid`, `gid`), so a spec can switch plugins without
//! surprises; `max_inodes` and `excluded_from_alerts` are this plugin's own. The node operator decides,
//! through `allowed_parameters` in the node config, which of them volume
//! authors may set.

use std::collections::BTreeSet;
use std::path::Path;

use prjquota_core::volume_params::{parse_mode, Parameters, VolumeParams, KNOWN, MAX_MODE};

use crate::input_error::InputError;
use prjquota_core::config::Config;

/// The node settings that decide what a volume spec's parameters may say:
/// the few fields of [`Config`] this module reads, so checking parameters
/// does not depend on the whole node configuration.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    /// Parameters volume authors may set.
    pub allowed: &'a BTreeSet<String>,
    /// Mode of a volume's root when its spec sets none.
    pub default_mode: u32,
    /// The file the policy came from, named when a parameter is refused;
    /// `None` for the built-in defaults.
    pub source: Option<&'a Path>,
}

impl<'a> From<&'a Config> for Policy<'a> {
    fn from(cfg: &'a Config) -> Self {
        Policy {
            allowed: &cfg.allowed_parameters,
            default_mode: cfg.default_mode,
            source: cfg.source.as_deref(),
        }
    }
}

/// Checks `params` against what this plugin knows and what the node's
/// configuration allows, and parses their values.
pub fn parse(params: &Parameters, policy: &Policy<'_>) -> Result<VolumeParams, InputError> {
    for key in params.keys() {
        if !KNOWN.contains(&key.as_str()) {
            return Err(InputError::UnknownParameter {
                key: key.clone(),
                accepted: KNOWN.join(", "),
            });
        }
        if !policy.allowed.contains(key) {
            return Err(InputError::ParameterNotAllowed {
                key: key.clone(),
                config: match policy.source {
                    Some(path) => path.display().to_string(),
                    None => "the built-in defaults".to_owned(),
                },
                allowed: if policy.allowed.is_empty() {
                    "no parameters".to_owned()
                } else {
                    let names: Vec<&str> = policy.allowed.iter().map(String::as_str).collect();
                    format!("only {}", names.join(", "))
                },
            });
        }
    }
    let mode = value(params, "mode", parse_mode_param)?.unwrap_or(policy.default_mode);
    let uid = value(params, "uid", |v| parse_owner(v, "user"))?.flatten();
    let gid = value(params, "gid", |v| parse_owner(v, "group"))?.flatten();
    let max_inodes = value(params, "max_inodes", parse_max_inodes)?;
    let excluded_from_alerts =
        value(params, "excluded_from_alerts", parse_excluded_from_alerts)?.unwrap_or(false);
    Ok(VolumeParams {
        mode,
        uid,
        gid,
        max_inodes,
        excluded_from_alerts,
    })
}

fn value<T>(
    params: &Parameters,
    key: &'static str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, InputError> {
    params
        .get(key)
        .map(|v| {
            parse(v).map_err(|reason| InputError::InvalidParameter {
                key,
                value: v.clone(),
                reason,
            })
        })
        .transpose()
}

/// The `mode` parameter, with a hint for Nomad's trap: an unquoted HCL
/// `mode = 0755` reaches the plugin as "493" (its decimal value). Most such
/// numbers contain an 8 or 9 and are caught here; a few (`0644` arrives as
/// "420") are valid octal and cannot be told apart from a deliberate mode.
fn parse_mode_param(value: &str) -> Result<u32, String> {
    let decimal_only = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    if decimal_only && value.bytes().any(|b| b == b'8' || b == b'9') {
        let meant = match value.parse::<u32>() {
            Ok(n) if n <= MAX_MODE => format!("{n:04o}"),
            _ => "0755".to_owned(),
        };
        return Err(format!(
            "not an octal mode; this looks like an unquoted HCL number, which arrives in \
             decimal (mode = 0755 arrives as \"493\"): quote it: mode = \"{meant}\""
        ));
    }
    parse_mode(value)
}

/// `uid`/`gid`: a decimal ID, or "-1" for "leave as created" (`None`), like
/// Nomad's mkdir. 4294967295 is refused: it is -1 to `chown(2)`.
fn parse_owner(value: &str, what: &str) -> Result<Option<u32>, String> {
    if value == "-1" {
        return Ok(None);
    }
    let range = format!(
        "use a numeric {what} ID from 0 to 4294967294 (names are not looked up), or -1 \
         to keep the plugin's own"
    );
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a decimal {what} ID; {range}"));
    }
    match value.parse::<u32>() {
        Ok(id) if id != u32::MAX => Ok(Some(id)),
        _ => Err(format!("out of range; {range}")),
    }
}

/// `excluded_from_alerts`: exactly `true` or `false`, as Nomad's HCL
/// writes a boolean it quotes; anything else is refused rather than read
/// as one or the other (a typo must not silence a volume's alerts).
fn parse_excluded_from_alerts(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(
            "neither \"true\" nor \"false\": write excluded_from_alerts = \"true\" to keep \
             the volume out of the alerts on its fullness (an archive, a data set full on \
             purpose), or remove the parameter"
                .to_owned(),
        ),
    }
}

fn parse_max_inodes(value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(
            "not a whole number: write the most files and directories the volume may hold, \
             e.g. max_inodes = \"100000\""
                .to_owned(),
        );
    }
    match value.parse::<u64>() {
        // The kernel reads a 0 limit as "no limit": say so rather than
        // quietly granting the opposite of what was written.
        Ok(0) => Err(
            "0 would mean no inode limit at all; remove max_inodes for that, or set at \
             least \"1\""
                .to_owned(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("larger than {}; request fewer", u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn params(pairs: &[(&str, &str)]) -> Parameters {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ok(pairs: &[(&str, &str)]) -> VolumeParams {
        parse(&params(pairs), &Policy::from(&Config::default())).unwrap()
    }

    fn err(pairs: &[(&str, &str)]) -> InputError {
        parse(&params(pairs), &Policy::from(&Config::default())).unwrap_err()
    }

    fn invalid(pairs: &[(&str, &str)], want_key: &str) -> String {
        match err(pairs) {
            e @ InputError::InvalidParameter { key, .. } if key == want_key => e.to_string(),
            other => panic!("{pairs:?}: expected InvalidParameter({want_key}), got {other:?}"),
        }
    }

    #[test]
    fn no_parameters_gives_the_config_defaults() {
        let cfg = Config {
            default_mode: 0o750,
            ..Config::default()
        };
        let got = parse(&Parameters::new(), &Policy::from(&cfg)).unwrap();
        assert_eq!(
            got,
            VolumeParams {
                mode: 0o750,
                uid: None,
                gid: None,
                max_inodes: None,
                excluded_from_alerts: false,
            }
        );
        assert_eq!(ok(&[]).mode, 0o700);
    }

    #[test]
    fn all_parameters() {
        let got = ok(&[
            ("mode", "0750"),
            ("uid", "1000"),
            ("gid", "0"),
            ("max_inodes", "100000"),
            ("excluded_from_alerts", "true"),
        ]);
        assert_eq!(
            got,
            VolumeParams {
                mode: 0o750,
                uid: Some(1000),
                gid: Some(0),
                max_inodes: Some(100_000),
                excluded_from_alerts: true,
            }
        );
    }

    #[test]
    fn mode_forms_accepted() {
        for (text, want) in [
            ("0755", 0o755),
            ("755", 0o755),
            ("0o755", 0o755),
            ("0", 0),
            ("00000000000000000000700", 0o700),
            ("7777", 0o7777),
            ("1777", 0o1777),
        ] {
            assert_eq!(ok(&[("mode", text)]).mode, want, "{text}");
        }
    }

    #[test]
    fn unquoted_hcl_mode_gets_the_quote_it_hint() {
        let msg = invalid(&[("mode", "493")], "mode");
        assert!(msg.contains("quote it: mode = \"0755\""), "{msg}");
        assert!(msg.contains("\"493\""), "{msg}");
        // 0750 unquoted arrives as 488.
        let msg = invalid(&[("mode", "488")], "mode");
        assert!(msg.contains("quote it: mode = \"0750\""), "{msg}");
        // Too large to be a mode in any base: the generic example.
        let msg = invalid(&[("mode", "99999")], "mode");
        assert!(msg.contains("quote it: mode = \"0755\""), "{msg}");
    }

    #[test]
    fn bad_modes_refused() {
        for text in [
            "",
            "0o",
            "10000",
            "17777",
            "0x1ed",
            "rwxr-x---",
            "-755",
            "+755",
            " 755",
            "0O755",
            "7.5",
            "0o0o7",
        ] {
            let msg = invalid(&[("mode", text)], "mode");
            assert!(msg.starts_with("parameter mode = "), "{msg}");
        }
        assert!(invalid(&[("mode", "10000")], "mode").contains("larger than 7777"));
    }

    #[test]
    fn owner_ids() {
        let got = ok(&[("uid", "-1"), ("gid", "4294967294")]);
        assert_eq!((got.uid, got.gid), (None, Some(4_294_967_294)));
        for text in [
            "4294967295",
            "4294967296",
            "-2",
            "",
            "root",
            "1000 ",
            "+1000",
            "0x10",
            "1e3",
        ] {
            invalid(&[("uid", text)], "uid");
            let msg = invalid(&[("gid", text)], "gid");
            assert!(msg.contains("group ID"), "{msg}");
        }
    }

    #[test]
    fn max_inodes() {
        assert_eq!(ok(&[("max_inodes", "1")]).max_inodes, Some(1));
        assert_eq!(
            ok(&[("max_inodes", "18446744073709551615")]).max_inodes,
            Some(u64::MAX)
        );
        let msg = invalid(&[("max_inodes", "0")], "max_inodes");
        assert!(msg.contains("remove max_inodes"), "{msg}");
        for text in ["-1", "", "1.5", "1k", "18446744073709551616"] {
            invalid(&[("max_inodes", text)], "max_inodes");
        }
    }

    /// Only the two words; what might be meant as either is refused, so a
    /// typo never silences a volume's alerts, nor a volume author's "yes"
    /// leaves them on unseen.
    #[test]
    fn excluded_from_alerts_is_true_or_false_and_nothing_else() {
        assert!(ok(&[("excluded_from_alerts", "true")]).excluded_from_alerts);
        assert!(!ok(&[("excluded_from_alerts", "false")]).excluded_from_alerts);
        assert!(!ok(&[]).excluded_from_alerts);
        for text in [
            "", "TRUE", "True", "yes", "1", "on", " true", "true\n", "false ", "t", "\0",
        ] {
            let msg = invalid(&[("excluded_from_alerts", text)], "excluded_from_alerts");
            assert!(msg.contains("excluded_from_alerts = \"true\""), "{msg}");
        }
        // The node's allowed_parameters decides whether volume authors may.
        let cfg = Config {
            allowed_parameters: ["mode".to_string()].into(),
            ..Config::default()
        };
        let p: Parameters = [("excluded_from_alerts".to_string(), "true".to_string())].into();
        assert!(matches!(
            parse(&p, &Policy::from(&cfg)),
            Err(InputError::ParameterNotAllowed { .. })
        ));
    }

    #[test]
    fn unknown_parameter_lists_the_accepted_ones() {
        for key in ["size", "Mode", "uid ", "owner", ""] {
            match err(&[(key, "1")]) {
                e @ InputError::UnknownParameter { .. } => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("mode, uid, gid, max_inodes, excluded_from_alerts"),
                        "{msg}"
                    );
                    assert!(msg.contains(&format!("{key:?}")), "{msg}");
                }
                other => panic!("{key:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn parameter_outside_allowed_parameters_names_the_config_file() {
        let cfg = Config {
            allowed_parameters: ["mode".to_owned()].into(),
            source: Some(PathBuf::from("/opt/nomad/plugins/prjquota.toml")),
            ..Config::default()
        };
        assert_eq!(
            parse(&params(&[("mode", "0750")]), &Policy::from(&cfg))
                .unwrap()
                .mode,
            0o750
        );
        let e = parse(
            &params(&[("mode", "0750"), ("uid", "0")]),
            &Policy::from(&cfg),
        )
        .unwrap_err();
        assert!(matches!(&e, InputError::ParameterNotAllowed { key, .. } if key == "uid"));
        let msg = e.to_string();
        assert!(msg.contains("/opt/nomad/plugins/prjquota.toml"), "{msg}");
        assert!(msg.contains("permits only mode"), "{msg}");

        let none = Config {
            allowed_parameters: Default::default(),
            source: None,
            ..Config::default()
        };
        let msg = parse(&params(&[("mode", "0750")]), &Policy::from(&none))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("in the built-in defaults permits no parameters"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_key_is_reported_before_an_allowed_list_check() {
        let cfg = Config {
            allowed_parameters: Default::default(),
            ..Config::default()
        };
        assert!(matches!(
            parse(&params(&[("bogus", "1")]), &Policy::from(&cfg)),
            Err(InputError::UnknownParameter { .. })
        ));
    }

    #[test]
    fn volume_params_round_trip_through_json() {
        let p = ok(&[("mode", "0750"), ("max_inodes", "5")]);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<VolumeParams>(&json).unwrap(), p);
    }
}
