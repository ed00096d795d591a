//! What a volume's parameters are: the raw map Nomad sends, the names this
//! plugin understands and the typed values kept in each volume's record.
//! In core because the record embeds them and the node configuration (which
//! the exporter reads too) checks `allowed_parameters` and `default_mode`
//! against them; checking a volume spec's parameters is the plugin's
//! (`prjquota::param_check`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Volume parameters exactly as Nomad sent them. Sorted, like Nomad's own
/// JSON, so records are stable.
pub type Parameters = BTreeMap<String, String>;

/// Every parameter this plugin understands, in documentation order.
pub const KNOWN: &[&str] = &["mode", "uid", "gid", "max_inodes", "excluded_from_alerts"];

/// Largest `mode`: permission bits plus setuid, setgid and sticky.
pub const MAX_MODE: u32 = 0o7777;

/// What a volume's parameters ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeParams {
    /// Mode of the volume's root directory.
    pub mode: u32,
    /// Owner of the volume's root directory; `None` keeps the plugin's own
    /// (root), as `uid = "-1"` does in Nomad's mkdir plugin.
    pub uid: Option<u32>,
    /// Group of the volume's root directory; `None` as for `uid`.
    pub gid: Option<u32>,
    /// Hard limit on the number of files and directories in the volume;
    /// `None` sets no inode limit.
    pub max_inodes: Option<u64>,
    /// The volume is kept out of the alerts on its fullness (a volume full
    /// on purpose: an archive, a seeded data set), as kubernetes-mixin's
    /// `excluded_from_alerts` label: the exporter labels its
    /// `nomad_host_volume_info` so. Absent from records that predate it
    /// (false), and not written while false, so that they stay as they were.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub excluded_from_alerts: bool,
}

/// Parses an octal mode as Nomad's mkdir does (`strconv.ParseUint(v, 8, 32)`):
/// digits 0-7, an optional `0` or `0o` prefix, at most `07777`. The error is
/// a reason to follow "mode = …: ".
pub fn parse_mode(value: &str) -> Result<u32, String> {
    let digits = value.strip_prefix("0o").unwrap_or(value);
    if digits.is_empty() {
        return Err("empty; write an octal mode such as \"0750\"".to_owned());
    }
    if !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err("not an octal mode: use only the digits 0-7, e.g. \"0750\"".to_owned());
    }
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= MAX_MODE => Ok(mode),
        _ => Err(format!(
            "larger than {MAX_MODE:04o} (permission bits plus setuid, setgid and sticky); \
             use e.g. \"0750\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's parameters as a release before `excluded_from_alerts`
    /// wrote them still read (as not excluded), and a volume not excluded
    /// writes them as that release did.
    #[test]
    fn parameters_of_an_older_record_read_and_are_written_alike() {
        let older = r#"{"mode":448,"uid":null,"gid":null,"max_inodes":null}"#;
        let p: VolumeParams = serde_json::from_str(older).unwrap();
        assert!(!p.excluded_from_alerts);
        assert_eq!(serde_json::to_string(&p).unwrap(), older);
        let excluded = VolumeParams {
            excluded_from_alerts: true,
            ..p
        };
        let text = serde_json::to_string(&excluded).unwrap();
        assert!(text.ends_with(r#","excluded_from_alerts":true}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<VolumeParams>(&text).unwrap(),
            excluded
        );
    }
}
