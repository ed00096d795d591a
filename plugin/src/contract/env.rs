//! The `DHV_*` variables one by one: collected once each, and every scalar
//! one (paths, labels, the volume ID, capacities) checked. The parameters
//! object has its own parser (`parameters`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use prjquota_core::volume_id::EXAMPLE_UUID;

use super::{var, Operation, VolumeId};
use crate::input_bounds::{MAX_LABEL_LEN, MAX_VOLUMES_DIR_LEN};
use crate::input_error::InputError;

/// The `DHV_*` part of the environment, each variable seen at most once.
pub(super) struct Env {
    vars: BTreeMap<&'static str, OsString>,
}

impl Env {
    pub(super) fn collect<I, K, V>(env: I) -> Result<Self, InputError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let mut seen = BTreeSet::new();
        let mut vars = BTreeMap::new();
        for (key, value) in env {
            let key = key.as_ref();
            if !key.as_encoded_bytes().starts_with(b"DHV_") {
                continue;
            }
            if !seen.insert(key.to_owned()) {
                return Err(InputError::DuplicateVariable {
                    name: key.to_string_lossy().into_owned(),
                });
            }
            if let Some(known) = var::KNOWN.iter().find(|k| OsStr::new(k) == key) {
                vars.insert(*known, value.as_ref().to_owned());
            }
        }
        Ok(Env { vars })
    }

    pub(super) fn optional(&self, name: &'static str) -> Result<Option<&str>, InputError> {
        match self.vars.get(name) {
            None => Ok(None),
            Some(v) => v.to_str().map(Some).ok_or_else(|| InputError::NotUnicode {
                name,
                value: v.to_string_lossy().into_owned(),
            }),
        }
    }

    pub(super) fn required(&self, name: &'static str) -> Result<&str, InputError> {
        self.optional(name)?
            .ok_or(InputError::MissingVariable { name })
    }

    pub(super) fn expect_operation(&self, expected: Operation) -> Result<(), InputError> {
        let found = self.required(var::OPERATION)?;
        if Operation::parse(found) == Some(expected) {
            Ok(())
        } else {
            Err(InputError::OperationMismatch {
                expected: expected.as_str(),
                found: found.to_owned(),
            })
        }
    }
}

pub(super) fn invalid(name: &'static str, value: &str, reason: impl Into<String>) -> InputError {
    InputError::InvalidVariable {
        name,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

pub(super) fn volumes_dir(value: &str) -> Result<PathBuf, InputError> {
    const FIX: &str = "set host_volumes_dir in the client block of the Nomad agent \
                       configuration to an absolute directory such as /srv/nomad/volumes";
    let bad = |why: &str| invalid(var::VOLUMES_DIR, value, format!("{why}; {FIX}"));
    if value.is_empty() {
        return Err(bad("empty"));
    }
    if value.len() > MAX_VOLUMES_DIR_LEN {
        return Err(bad(&format!(
            "{} bytes long, more than the {MAX_VOLUMES_DIR_LEN} this plugin accepts",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if !value.starts_with('/') {
        return Err(bad("not an absolute path"));
    }
    let components: Vec<&str> = value.split('/').filter(|c| !c.is_empty()).collect();
    // `..` would make the volume path's parent something other than the
    // directory every check and the exporter look at.
    if let Some(dot) = components.iter().find(|c| **c == "." || **c == "..") {
        return Err(bad(&format!("contains a {dot:?} component")));
    }
    if components.is_empty() {
        return Err(bad(
            "the filesystem root; volumes need a directory of their own",
        ));
    }
    Ok(PathBuf::from(format!("/{}", components.join("/"))))
}

/// `DHV_PLUGIN_DIR` (raw, possibly relative) and `DHV_CREATED_PATH` (a hint,
/// kept verbatim so it can be compared with what the registry says).
pub(super) fn optional_path(
    name: &'static str,
    value: Option<&str>,
    must_be_absolute: bool,
) -> Result<Option<PathBuf>, InputError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if value.contains('\0') {
        return Err(invalid(
            name,
            value,
            "contains a NUL byte, which no path can; Nomad never sends one, so check what runs the plugin",
        ));
    }
    if must_be_absolute && !value.starts_with('/') {
        return Err(invalid(
            name,
            value,
            "not an absolute path; Nomad sends the path that create returned, which is always absolute",
        ));
    }
    Ok(Some(PathBuf::from(value)))
}

/// Characters refused in names: C0/C1 controls (newline, tab, escape, DEL,
/// U+0085), the Unicode line and paragraph separators, and bidirectional
/// overrides. Each can forge or hide a log line or a metric label.
fn is_forbidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn fix_for(name: &'static str) -> &'static str {
    match name {
        var::VOLUME_NAME => "rename the volume (the `name` of its spec)",
        var::NAMESPACE => "use a Nomad namespace with a plain name",
        var::NODE_POOL => "use a Nomad node pool with a plain name",
        _ => "Nomad never sends such a value, so check what runs the plugin",
    }
}

/// Node pool, namespace, node ID and (for delete) volume name.
pub(super) fn label(
    name: &'static str,
    value: &str,
    may_be_empty: bool,
) -> Result<String, InputError> {
    let fix = fix_for(name);
    if value.is_empty() && !may_be_empty {
        return Err(invalid(name, value, format!("must not be empty; {fix}")));
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(invalid(
            name,
            value,
            format!(
                "{} bytes long, more than the {MAX_LABEL_LEN} this plugin accepts; {fix}",
                value.len()
            ),
        ));
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| is_forbidden_char(*c)) {
        return Err(invalid(
            name,
            value,
            format!(
                "contains the control or invisible character {:?} at byte {at}, which could \
                 forge or hide lines in logs; {fix}",
                c
            ),
        ));
    }
    Ok(value.to_owned())
}

/// The volume name is never part of a path (the volume lives at
/// `<volumes dir>/<volume ID>`). Path-looking names (`/`, `\`, `.`, `..`)
/// are still refused, so that logs, registry records and metric labels
/// cannot be read as a path by a person or a script.
pub(super) fn volume_name(value: &str) -> Result<String, InputError> {
    let value = label(var::VOLUME_NAME, value, false)?;
    let fix = fix_for(var::VOLUME_NAME);
    if value == "." || value == ".." {
        return Err(invalid(
            var::VOLUME_NAME,
            &value,
            format!("looks like a path, which names must not; {fix}"),
        ));
    }
    if let Some(sep) = value.chars().find(|c| *c == '/' || *c == '\\') {
        return Err(invalid(
            var::VOLUME_NAME,
            &value,
            format!("contains {sep:?}, and names must not look like paths; {fix}"),
        ));
    }
    Ok(value)
}

pub(super) fn volume_id(value: &str) -> Result<VolumeId, InputError> {
    VolumeId::parse(value).map_err(|_| {
        invalid(
            var::VOLUME_ID,
            value,
            format!(
                "not a Nomad volume ID (a UUID of 8-4-4-4-12 hexadecimal digits such as \
                 {EXAMPLE_UUID}); Nomad always generates one, so check what runs the plugin"
            ),
        )
    })
}

/// Nomad writes capacities with Go's `%d` of an int64: plain ASCII digits.
/// Anything else is a caller that is not Nomad, and guessing what it meant
/// (a sign, a float, hex) could size a volume wrongly.
pub(super) fn capacity(name: &'static str, value: &str) -> Result<u64, InputError> {
    if value.is_empty() {
        return Err(invalid(
            name,
            value,
            "empty; Nomad sends 0 when the volume spec leaves it unset",
        ));
    }
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            name,
            value,
            "not a whole number of bytes: only the digits 0-9 are accepted (no sign, spaces, \
             decimal point, unit or hex); set capacity_min/capacity_max in the volume spec",
        ));
    }
    match value.parse::<u64>() {
        Ok(n) if n <= i64::MAX as u64 => Ok(n),
        _ => Err(invalid(
            name,
            value,
            format!(
                "larger than {}, the largest size Nomad can record; request less in the \
                 volume spec",
                i64::MAX
            ),
        )),
    }
}
