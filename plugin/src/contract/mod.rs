//! The Nomad dynamic host volume contract: the `DHV_*` environment Nomad gives
//! `prjquota create|delete|fingerprint`, checked into typed requests, and the
//! JSON Nomad reads back from stdout.
//!
//! Everything in the environment is untrusted. Nomad validates almost nothing
//! it forwards: the volume name and the parameters are written by volume
//! authors, and the plugin is the only guard of its own invariants (see
//! `docs/nomad-dhv-contract.md`). So parsing is strict, and each refusal names
//! the variable, shows the offending value (escaped and truncated, because it
//! lands in `nomad volume create` output and in logs) and says how to fix it.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::input_error::InputError;

mod env;
mod parameters_json;

use env::{capacity, label, optional_path, volume_id, volume_name, volumes_dir, Env};
use parameters_json::parameters;

/// Names of the variables Nomad sets, so no other module spells them.
pub mod var {
    pub const OPERATION: &str = "DHV_OPERATION";
    pub const VOLUMES_DIR: &str = "DHV_VOLUMES_DIR";
    pub const PLUGIN_DIR: &str = "DHV_PLUGIN_DIR";
    pub const NODE_POOL: &str = "DHV_NODE_POOL";
    pub const CREATED_PATH: &str = "DHV_CREATED_PATH";
    pub const NAMESPACE: &str = "DHV_NAMESPACE";
    pub const VOLUME_NAME: &str = "DHV_VOLUME_NAME";
    pub const VOLUME_ID: &str = "DHV_VOLUME_ID";
    pub const CAPACITY_MIN: &str = "DHV_CAPACITY_MIN_BYTES";
    pub const CAPACITY_MAX: &str = "DHV_CAPACITY_MAX_BYTES";
    pub const NODE_ID: &str = "DHV_NODE_ID";
    pub const PARAMETERS: &str = "DHV_PARAMETERS";

    /// Every variable that any operation reads; others with the `DHV_`
    /// prefix are ignored so that a newer Nomad can add variables.
    pub(crate) const KNOWN: &[&str] = &[
        OPERATION,
        VOLUMES_DIR,
        PLUGIN_DIR,
        NODE_POOL,
        CREATED_PATH,
        NAMESPACE,
        VOLUME_NAME,
        VOLUME_ID,
        CAPACITY_MIN,
        CAPACITY_MAX,
        NODE_ID,
        PARAMETERS,
    ];
}

/// The operation Nomad asks for, from `argv[1]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Fingerprint,
    Create,
    Delete,
}

impl Operation {
    /// Exact, lowercase match: Nomad never sends anything else, and a near
    /// miss is more likely a person at a shell than a Nomad to humour.
    pub fn parse(arg: &str) -> Option<Operation> {
        match arg {
            "fingerprint" => Some(Operation::Fingerprint),
            "create" => Some(Operation::Create),
            "delete" => Some(Operation::Delete),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Fingerprint => "fingerprint",
            Operation::Create => "create",
            Operation::Delete => "delete",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// The volume ID and the parameters map are embedded in the registry record,
// which the exporter reads too, so they are defined in core.
pub use prjquota_core::volume_id::VolumeId;
pub use prjquota_core::volume_params::Parameters;

/// A checked `create` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// Absolute and normalised: no trailing or repeated `/`, no `.`/`..`.
    pub volumes_dir: PathBuf,
    /// As configured, possibly relative to the agent's working directory.
    pub plugin_dir: Option<PathBuf>,
    pub node_pool: String,
    pub namespace: String,
    pub volume_name: String,
    pub volume_id: VolumeId,
    /// 0 when the spec leaves it unset; never above `i64::MAX`.
    pub capacity_min: u64,
    /// 0 when the spec leaves it unset; never above `i64::MAX`, and not
    /// below `capacity_min` when both are set.
    pub capacity_max: u64,
    pub node_id: String,
    pub parameters: Parameters,
}

/// A checked `delete` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRequest {
    pub volumes_dir: PathBuf,
    pub plugin_dir: Option<PathBuf>,
    pub node_pool: String,
    /// What Nomad believes `create` returned, verbatim. Only a hint to check
    /// against the registry: after a failed state save Nomad sends the whole
    /// volumes directory here, so deleting it would wipe every volume.
    pub created_path: Option<PathBuf>,
    /// May be empty (Nomad's automatic delete after a failed state save).
    pub namespace: String,
    /// May be empty, for the same reason as `namespace`.
    pub volume_name: String,
    pub volume_id: VolumeId,
    pub node_id: String,
    pub parameters: Parameters,
}

/// Parses the environment of `prjquota create`.
///
/// Pass `std::env::vars_os()`. Variables without the `DHV_` prefix are
/// ignored (tests add their own), as are unknown `DHV_` ones (a newer Nomad
/// may add some); a `DHV_` variable set twice is refused.
pub fn parse_create<I, K, V>(env: I) -> Result<CreateRequest, InputError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let env = Env::collect(env)?;
    env.expect_operation(Operation::Create)?;
    let volumes_dir = volumes_dir(env.required(var::VOLUMES_DIR)?)?;
    let plugin_dir = optional_path(var::PLUGIN_DIR, env.optional(var::PLUGIN_DIR)?, false)?;
    let node_pool = label(var::NODE_POOL, env.required(var::NODE_POOL)?, false)?;
    let namespace = label(var::NAMESPACE, env.required(var::NAMESPACE)?, false)?;
    let volume_name = volume_name(env.required(var::VOLUME_NAME)?)?;
    let volume_id = volume_id(env.required(var::VOLUME_ID)?)?;
    let capacity_min = capacity(var::CAPACITY_MIN, env.required(var::CAPACITY_MIN)?)?;
    let capacity_max = capacity(var::CAPACITY_MAX, env.required(var::CAPACITY_MAX)?)?;
    // Nomad already refuses max < min; a 0 stands for "unset" and is not
    // compared, since capacity_min alone is a valid request to this plugin.
    if capacity_min > 0 && capacity_max > 0 && capacity_max < capacity_min {
        return Err(InputError::CapacityMinAboveMax {
            min: capacity_min,
            max: capacity_max,
        });
    }
    let node_id = label(var::NODE_ID, env.required(var::NODE_ID)?, false)?;
    let parameters = parameters(env.optional(var::PARAMETERS)?)?;
    Ok(CreateRequest {
        volumes_dir,
        plugin_dir,
        node_pool,
        namespace,
        volume_name,
        volume_id,
        capacity_min,
        capacity_max,
        node_id,
        parameters,
    })
}

/// Parses the environment of `prjquota delete`; see [`parse_create`].
///
/// Namespace and volume name may be empty: Nomad's automatic delete after a
/// failed state save sends them so, and refusing it would leak the volume.
pub fn parse_delete<I, K, V>(env: I) -> Result<DeleteRequest, InputError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let env = Env::collect(env)?;
    env.expect_operation(Operation::Delete)?;
    let volumes_dir = volumes_dir(env.required(var::VOLUMES_DIR)?)?;
    let plugin_dir = optional_path(var::PLUGIN_DIR, env.optional(var::PLUGIN_DIR)?, false)?;
    let node_pool = label(var::NODE_POOL, env.required(var::NODE_POOL)?, false)?;
    let created_path = optional_path(var::CREATED_PATH, env.optional(var::CREATED_PATH)?, true)?;
    let namespace = label(var::NAMESPACE, env.required(var::NAMESPACE)?, true)?;
    // Only what create would also refuse *and* what could garble a log is
    // checked here: a stricter delete could strand a volume forever.
    let volume_name = label(var::VOLUME_NAME, env.required(var::VOLUME_NAME)?, true)?;
    let volume_id = volume_id(env.required(var::VOLUME_ID)?)?;
    let node_id = label(var::NODE_ID, env.required(var::NODE_ID)?, false)?;
    let parameters = parameters(env.optional(var::PARAMETERS)?)?;
    Ok(DeleteRequest {
        volumes_dir,
        plugin_dir,
        node_pool,
        created_path,
        namespace,
        volume_name,
        volume_id,
        node_id,
        parameters,
    })
}

/// `{"path":"…","bytes":N}`, the only stdout Nomad accepts from a
/// successful create. `bytes` must not exceed `i64::MAX` (Nomad's int64);
/// [`crate::capacity::fit_to_blocks`] guarantees it.
pub fn create_response_json(path: &Path, bytes: u64) -> String {
    #[derive(Serialize)]
    struct CreateResponse<'a> {
        path: &'a str,
        bytes: u64,
    }
    debug_assert!(bytes <= i64::MAX as u64, "Nomad stores bytes as int64");
    // Lossless in practice: the path is the UTF-8 DHV_VOLUMES_DIR joined with
    // an ASCII volume ID.
    let path = path.to_string_lossy();
    to_json(&CreateResponse { path: &path, bytes })
}

/// `{"error":"…"}`, which Nomad shows to the user when the exit code is not 0.
pub fn error_json(message: &str) -> String {
    #[derive(Serialize)]
    struct ErrorResponse<'a> {
        error: &'a str,
    }
    to_json(&ErrorResponse { error: message })
}

/// `{"version":"X.Y.Z"}`. Never `{}` or a null version: some Nomad agents
/// crash on those.
pub fn fingerprint_json(version: &str) -> String {
    #[derive(Serialize)]
    struct Fingerprint<'a> {
        version: &'a str,
    }
    to_json(&Fingerprint { version })
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Structs of strings and integers cannot fail to serialise.
    serde_json::to_string(value).expect("serialising a plain struct to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input_bounds::{
        MAX_LABEL_LEN, MAX_PARAMETER_KEY_LEN, MAX_PARAMETER_VALUE_LEN, MAX_VOLUMES_DIR_LEN,
    };
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStrExt;

    const ID: &str = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
    const VOLUMES: &str = "/opt/nomad/data/host_volumes";

    type Env = Vec<(OsString, OsString)>;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    /// Exactly what Nomad's external plugin runner builds for create, in order.
    fn create_env() -> Env {
        env(&[
            ("DHV_OPERATION", "create"),
            ("DHV_VOLUMES_DIR", VOLUMES),
            ("DHV_PLUGIN_DIR", "/opt/nomad/plugins"),
            ("DHV_NODE_POOL", "default"),
            ("DHV_NAMESPACE", "default"),
            ("DHV_VOLUME_NAME", "postgres-data"),
            ("DHV_VOLUME_ID", ID),
            ("DHV_CAPACITY_MIN_BYTES", "1073741824"),
            ("DHV_CAPACITY_MAX_BYTES", "21474836480"),
            ("DHV_NODE_ID", "5b3d1f7e-2c4a-4e8b-9f6d-1a2b3c4d5e6f"),
            ("DHV_PARAMETERS", "null"),
        ])
    }

    /// Exactly what Nomad builds for delete, in order.
    fn delete_env() -> Env {
        env(&[
            ("DHV_OPERATION", "delete"),
            ("DHV_VOLUMES_DIR", VOLUMES),
            ("DHV_PLUGIN_DIR", "/opt/nomad/plugins"),
            ("DHV_NODE_POOL", "default"),
            ("DHV_CREATED_PATH", &format!("{VOLUMES}/{ID}")),
            ("DHV_NAMESPACE", "default"),
            ("DHV_VOLUME_NAME", "postgres-data"),
            ("DHV_VOLUME_ID", ID),
            ("DHV_NODE_ID", "5b3d1f7e-2c4a-4e8b-9f6d-1a2b3c4d5e6f"),
            ("DHV_PARAMETERS", "{\"mode\":\"0750\"}"),
        ])
    }

    fn with(mut e: Env, key: &str, value: impl AsRef<OsStr>) -> Env {
        match e.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.as_ref().to_owned(),
            None => e.push((key.into(), value.as_ref().to_owned())),
        }
        e
    }

    fn without(mut e: Env, key: &str) -> Env {
        e.retain(|(k, _)| k != key);
        e
    }

    fn twice(mut e: Env, key: &str, value: &str) -> Env {
        e.push((key.into(), value.into()));
        e
    }

    fn raw(bytes: &[u8]) -> OsString {
        OsStr::from_bytes(bytes).to_owned()
    }

    fn params_env(json: &str) -> Env {
        with(create_env(), "DHV_PARAMETERS", json)
    }

    #[derive(Debug, Clone, Copy)]
    enum Want {
        Missing(&'static str),
        Duplicate(&'static str),
        NotUnicode(&'static str),
        Operation,
        Invalid(&'static str),
        MinAboveMax,
        ParamsTooLarge,
        ParamsSyntax,
        ParamsNotObject,
        DupParam(&'static str),
        NotString(&'static str),
        ValueTooLong(&'static str),
        ParamName,
    }

    fn matches_want(e: &InputError, want: Want) -> bool {
        use InputError as E;
        match (e, want) {
            (E::MissingVariable { name }, Want::Missing(w)) => *name == w,
            (E::DuplicateVariable { name }, Want::Duplicate(w)) => name == w,
            (E::NotUnicode { name, .. }, Want::NotUnicode(w)) => *name == w,
            (E::OperationMismatch { .. }, Want::Operation) => true,
            (E::InvalidVariable { name, .. }, Want::Invalid(w)) => *name == w,
            (E::CapacityMinAboveMax { .. }, Want::MinAboveMax) => true,
            (E::ParametersTooLarge { .. }, Want::ParamsTooLarge) => true,
            (E::ParametersSyntax { message }, Want::ParamsSyntax) => message.contains("line "),
            (E::ParametersNotObject { .. }, Want::ParamsNotObject) => true,
            (E::DuplicateParameter { key }, Want::DupParam(w)) => key == w,
            (E::ParameterNotString { key, .. }, Want::NotString(w)) => key == w,
            (E::ParameterValueTooLong { key, .. }, Want::ValueTooLong(w)) => key == w,
            (E::InvalidParameterName { .. }, Want::ParamName) => true,
            _ => false,
        }
    }

    /// The name a message must mention for each expectation.
    fn named(want: Want) -> &'static str {
        match want {
            Want::Missing(n) | Want::Duplicate(n) | Want::NotUnicode(n) | Want::Invalid(n) => n,
            Want::Operation => "DHV_OPERATION",
            Want::MinAboveMax => "DHV_CAPACITY_MIN_BYTES",
            Want::DupParam(k) | Want::NotString(k) | Want::ValueTooLong(k) => k,
            _ => "DHV_PARAMETERS",
        }
    }

    fn nested(depth: usize) -> String {
        format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth))
    }

    /// (what, is_create, env, expected error). One line per case: a table.
    #[rustfmt::skip]
    fn hostile_cases() -> Vec<(&'static str, bool, Env, Want)> {
        use Want::*;
        let long_name = "n".repeat(10 * 1024);
        vec![
            ("id traversal", true, with(create_env(), "DHV_VOLUME_ID", "../x"), Invalid(var::VOLUME_ID)),
            ("id deep traversal of uuid length", true, with(create_env(), "DHV_VOLUME_ID", "../../../../../../../../etc/passwd.."), Invalid(var::VOLUME_ID)),
            ("id with slash, 36 chars", true, with(create_env(), "DHV_VOLUME_ID", "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f/a93"), Invalid(var::VOLUME_ID)),
            ("id with NUL", true, with(create_env(), "DHV_VOLUME_ID", "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a9\0"), Invalid(var::VOLUME_ID)),
            ("id with newline", true, with(create_env(), "DHV_VOLUME_ID", format!("{ID}\n")), Invalid(var::VOLUME_ID)),
            ("id abc", true, with(create_env(), "DHV_VOLUME_ID", "abc"), Invalid(var::VOLUME_ID)),
            ("id in braces", true, with(create_env(), "DHV_VOLUME_ID", format!("{{{ID}}}")), Invalid(var::VOLUME_ID)),
            ("id as urn", true, with(create_env(), "DHV_VOLUME_ID", format!("urn:uuid:{ID}")), Invalid(var::VOLUME_ID)),
            ("id without hyphens", true, with(create_env(), "DHV_VOLUME_ID", ID.replace('-', "")), Invalid(var::VOLUME_ID)),
            ("id non-hex", true, with(create_env(), "DHV_VOLUME_ID", ID.replace('f', "g")), Invalid(var::VOLUME_ID)),
            ("id empty", true, with(create_env(), "DHV_VOLUME_ID", ""), Invalid(var::VOLUME_ID)),
            ("id missing", true, without(create_env(), "DHV_VOLUME_ID"), Missing(var::VOLUME_ID)),
            ("delete id traversal", false, with(delete_env(), "DHV_VOLUME_ID", "../../etc"), Invalid(var::VOLUME_ID)),
            ("relative volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "data/host_volumes"), Invalid(var::VOLUMES_DIR)),
            ("dot-dot in volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "/opt/nomad/../../etc"), Invalid(var::VOLUMES_DIR)),
            ("trailing dot-dot in volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "/opt/nomad/.."), Invalid(var::VOLUMES_DIR)),
            ("dot in volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "/opt/./nomad"), Invalid(var::VOLUMES_DIR)),
            ("root as volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "/"), Invalid(var::VOLUMES_DIR)),
            ("slashes as volumes dir", false, with(delete_env(), "DHV_VOLUMES_DIR", "///"), Invalid(var::VOLUMES_DIR)),
            ("empty volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", ""), Invalid(var::VOLUMES_DIR)),
            ("NUL in volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", "/opt/nomad\0/x"), Invalid(var::VOLUMES_DIR)),
            ("huge volumes dir", true, with(create_env(), "DHV_VOLUMES_DIR", format!("/{}", "d".repeat(1024))), Invalid(var::VOLUMES_DIR)),
            ("missing volumes dir", false, without(delete_env(), "DHV_VOLUMES_DIR"), Missing(var::VOLUMES_DIR)),
            ("NUL in plugin dir", true, with(create_env(), "DHV_PLUGIN_DIR", "/opt\0"), Invalid(var::PLUGIN_DIR)),
            ("name with newline", true, with(create_env(), "DHV_VOLUME_NAME", "db\nlevel=error msg=forged"), Invalid(var::VOLUME_NAME)),
            ("name with CR", true, with(create_env(), "DHV_VOLUME_NAME", "db\r"), Invalid(var::VOLUME_NAME)),
            ("name with tab", true, with(create_env(), "DHV_VOLUME_NAME", "a\tb"), Invalid(var::VOLUME_NAME)),
            ("name with escape sequence", true, with(create_env(), "DHV_VOLUME_NAME", "\u{1b}[2Jdb"), Invalid(var::VOLUME_NAME)),
            ("name with DEL", true, with(create_env(), "DHV_VOLUME_NAME", "db\u{7f}"), Invalid(var::VOLUME_NAME)),
            ("name with NEL", true, with(create_env(), "DHV_VOLUME_NAME", "db\u{85}x"), Invalid(var::VOLUME_NAME)),
            ("name with line separator", true, with(create_env(), "DHV_VOLUME_NAME", "db\u{2028}x"), Invalid(var::VOLUME_NAME)),
            ("name with paragraph separator", true, with(create_env(), "DHV_VOLUME_NAME", "db\u{2029}x"), Invalid(var::VOLUME_NAME)),
            ("name with bidi override", true, with(create_env(), "DHV_VOLUME_NAME", "db\u{202e}atad"), Invalid(var::VOLUME_NAME)),
            ("name traversal", true, with(create_env(), "DHV_VOLUME_NAME", "../etc"), Invalid(var::VOLUME_NAME)),
            ("name dot-dot", true, with(create_env(), "DHV_VOLUME_NAME", ".."), Invalid(var::VOLUME_NAME)),
            ("name dot", true, with(create_env(), "DHV_VOLUME_NAME", "."), Invalid(var::VOLUME_NAME)),
            ("name backslash", true, with(create_env(), "DHV_VOLUME_NAME", "a\\b"), Invalid(var::VOLUME_NAME)),
            ("name 10 KB", true, with(create_env(), "DHV_VOLUME_NAME", &long_name), Invalid(var::VOLUME_NAME)),
            ("name 257 bytes", true, with(create_env(), "DHV_VOLUME_NAME", "é".repeat(128) + "x"), Invalid(var::VOLUME_NAME)),
            ("name empty on create", true, with(create_env(), "DHV_VOLUME_NAME", ""), Invalid(var::VOLUME_NAME)),
            ("name missing", true, without(create_env(), "DHV_VOLUME_NAME"), Missing(var::VOLUME_NAME)),
            ("delete name with newline", false, with(delete_env(), "DHV_VOLUME_NAME", "x\ny"), Invalid(var::VOLUME_NAME)),
            ("delete name 10 KB", false, with(delete_env(), "DHV_VOLUME_NAME", &long_name), Invalid(var::VOLUME_NAME)),
            ("namespace with CR", true, with(create_env(), "DHV_NAMESPACE", "default\r"), Invalid(var::NAMESPACE)),
            ("delete namespace with NUL", false, with(delete_env(), "DHV_NAMESPACE", "a\0b"), Invalid(var::NAMESPACE)),
            ("namespace empty on create", true, with(create_env(), "DHV_NAMESPACE", ""), Invalid(var::NAMESPACE)),
            ("node pool empty", true, with(create_env(), "DHV_NODE_POOL", ""), Invalid(var::NODE_POOL)),
            ("delete node pool empty", false, with(delete_env(), "DHV_NODE_POOL", ""), Invalid(var::NODE_POOL)),
            ("node id 300 bytes", true, with(create_env(), "DHV_NODE_ID", "a".repeat(300)), Invalid(var::NODE_ID)),
            ("node id missing", false, without(delete_env(), "DHV_NODE_ID"), Missing(var::NODE_ID)),
            ("created path relative", false, with(delete_env(), "DHV_CREATED_PATH", "host_volumes/x"), Invalid(var::CREATED_PATH)),
            ("created path with NUL", false, with(delete_env(), "DHV_CREATED_PATH", "/opt\0/x"), Invalid(var::CREATED_PATH)),
            ("parameter number", true, params_env("{\"mode\":755}"), NotString("mode")),
            ("parameter negative float", true, params_env("{\"uid\":-1.5}"), NotString("uid")),
            ("parameter boolean", true, params_env("{\"mode\":true}"), NotString("mode")),
            ("parameter null", true, params_env("{\"mode\":null}"), NotString("mode")),
            ("parameter nested object", true, params_env("{\"mode\":{\"x\":\"0750\"}}"), NotString("mode")),
            ("parameter array", true, params_env("{\"mode\":[\"0750\"]}"), NotString("mode")),
            ("parameter 10k-deep nesting", true, params_env(&nested(10_000)), NotString("a")),
            ("parameters 10k-deep top level", true, params_env(&"[".repeat(10_000)), ParamsNotObject),
            ("parameters array", true, params_env("[\"mode\",\"0750\"]"), ParamsNotObject),
            ("parameters string", true, params_env("\"mode=0750\""), ParamsNotObject),
            ("parameters number", true, params_env("42"), ParamsNotObject),
            ("duplicate parameter", true, params_env("{\"mode\":\"0700\",\"mode\":\"0777\"}"), DupParam("mode")),
            ("duplicate parameter via escape", true, params_env("{\"mode\":\"0700\",\"\\u006dode\":\"0777\"}"), DupParam("mode")),
            ("invalid JSON", true, params_env("{\"mode\":"), ParamsSyntax),
            ("single-quoted JSON", true, params_env("{'mode':'0750'}"), ParamsSyntax),
            ("trailing garbage", true, params_env("{} {}"), ParamsSyntax),
            ("whitespace only", true, params_env(" "), ParamsSyntax),
            ("1 MB value", true, params_env(&format!("{{\"mode\":\"{}\"}}", "7".repeat(1 << 20))), ParamsTooLarge),
            ("5 KB value", true, params_env(&format!("{{\"mode\":\"{}\"}}", "7".repeat(5 * 1024))), ValueTooLong("mode")),
            ("empty parameter name", true, params_env("{\"\":\"x\"}"), ParamName),
            ("100-byte parameter name", true, params_env(&format!("{{\"{}\":\"x\"}}", "k".repeat(100))), ParamName),
            ("delete with bad parameters", false, with(delete_env(), "DHV_PARAMETERS", "{\"a\":1}"), NotString("a")),
            ("capacity negative", true, with(create_env(), "DHV_CAPACITY_MIN_BYTES", "-1"), Invalid(var::CAPACITY_MIN)),
            ("capacity i64::MAX + 1", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "9223372036854775808"), Invalid(var::CAPACITY_MAX)),
            ("capacity beyond u64", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "99999999999999999999"), Invalid(var::CAPACITY_MAX)),
            ("capacity float", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "5.0"), Invalid(var::CAPACITY_MAX)),
            ("capacity leading space", true, with(create_env(), "DHV_CAPACITY_MIN_BYTES", " 5"), Invalid(var::CAPACITY_MIN)),
            ("capacity trailing newline", true, with(create_env(), "DHV_CAPACITY_MIN_BYTES", "5\n"), Invalid(var::CAPACITY_MIN)),
            ("capacity plus sign", true, with(create_env(), "DHV_CAPACITY_MIN_BYTES", "+5"), Invalid(var::CAPACITY_MIN)),
            ("capacity hex", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "0x10"), Invalid(var::CAPACITY_MAX)),
            ("capacity with unit", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "10GiB"), Invalid(var::CAPACITY_MAX)),
            ("capacity non-ASCII digits", true, with(create_env(), "DHV_CAPACITY_MAX_BYTES", "٥"), Invalid(var::CAPACITY_MAX)),
            ("capacity empty", true, with(create_env(), "DHV_CAPACITY_MIN_BYTES", ""), Invalid(var::CAPACITY_MIN)),
            ("capacity missing", true, without(create_env(), "DHV_CAPACITY_MAX_BYTES"), Missing(var::CAPACITY_MAX)),
            ("min above max", true, with(with(create_env(), "DHV_CAPACITY_MIN_BYTES", "2000"), "DHV_CAPACITY_MAX_BYTES", "1999"), MinAboveMax),
            ("duplicated volume id", true, twice(create_env(), "DHV_VOLUME_ID", "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a94"), Duplicate("DHV_VOLUME_ID")),
            ("duplicated identical value", false, twice(delete_env(), "DHV_VOLUMES_DIR", VOLUMES), Duplicate("DHV_VOLUMES_DIR")),
            ("duplicated unknown DHV variable", true, twice(twice(create_env(), "DHV_FUTURE", "a"), "DHV_FUTURE", "b"), Duplicate("DHV_FUTURE")),
            ("operation delete for create", true, with(create_env(), "DHV_OPERATION", "delete"), Operation),
            ("operation create for delete", false, with(delete_env(), "DHV_OPERATION", "create"), Operation),
            ("operation in capitals", true, with(create_env(), "DHV_OPERATION", "CREATE"), Operation),
            ("operation empty", true, with(create_env(), "DHV_OPERATION", ""), Operation),
            ("operation missing", false, without(delete_env(), "DHV_OPERATION"), Missing(var::OPERATION)),
            ("non-UTF-8 name", true, with(create_env(), "DHV_VOLUME_NAME", raw(b"db\xff\xfe")), NotUnicode(var::VOLUME_NAME)),
            ("non-UTF-8 volumes dir", false, with(delete_env(), "DHV_VOLUMES_DIR", raw(b"/opt/\xc0\xaf")), NotUnicode(var::VOLUMES_DIR)),
            ("non-UTF-8 parameters", true, with(create_env(), "DHV_PARAMETERS", raw(b"{\"mode\":\"\xff\"}")), NotUnicode(var::PARAMETERS)),
            ("non-UTF-8 volume id", true, with(create_env(), "DHV_VOLUME_ID", raw(b"\x80")), NotUnicode(var::VOLUME_ID)),
            ("non-UTF-8 created path", false, with(delete_env(), "DHV_CREATED_PATH", raw(b"/x/\xff")), NotUnicode(var::CREATED_PATH)),
        ]
    }

    #[test]
    fn hostile_environments_are_refused_with_a_specific_error() {
        let cases = hostile_cases();
        assert!(cases.len() >= 35);
        for (what, is_create, env, want) in cases {
            let result = if is_create {
                parse_create(env).map(|_| ())
            } else {
                parse_delete(env).map(|_| ())
            };
            let err = match result {
                Err(e) => e,
                Ok(()) => panic!("{what}: accepted, expected {want:?}"),
            };
            assert!(
                matches_want(&err, want),
                "{what}: expected {want:?}, got {err:?}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains(named(want)),
                "{what}: message does not name {}: {msg}",
                named(want)
            );
            // A message must stay one readable line, whatever the input.
            assert!(
                !msg.contains('\n') && !msg.contains('\r') && !msg.contains('\0'),
                "{what}: {msg:?}"
            );
            assert!(msg.len() < 800, "{what}: message is {} bytes", msg.len());
        }
    }

    #[test]
    fn create_exactly_as_nomad_sends_it() {
        let req = parse_create(create_env()).unwrap();
        assert_eq!(
            req,
            CreateRequest {
                volumes_dir: PathBuf::from(VOLUMES),
                plugin_dir: Some(PathBuf::from("/opt/nomad/plugins")),
                node_pool: "default".into(),
                namespace: "default".into(),
                volume_name: "postgres-data".into(),
                volume_id: VolumeId::parse(ID).unwrap(),
                capacity_min: 1 << 30,
                capacity_max: 20 << 30,
                node_id: "5b3d1f7e-2c4a-4e8b-9f6d-1a2b3c4d5e6f".into(),
                parameters: Parameters::new(),
            }
        );
    }

    #[test]
    fn parameters_forms_nomad_sends() {
        for json in ["null", "{}", ""] {
            assert!(
                parse_create(params_env(json))
                    .unwrap()
                    .parameters
                    .is_empty(),
                "{json:?}"
            );
        }
        let missing = without(create_env(), "DHV_PARAMETERS");
        assert!(parse_create(missing).unwrap().parameters.is_empty());
        // Go's json.Marshal: sorted keys, `<>&` escaped.
        let req = parse_create(params_env(
            r#"{"gid":"\u003c\u0026\u003e","mode":"0750","uid":"1000"}"#,
        ))
        .unwrap();
        let want: Parameters = [("gid", "<&>"), ("mode", "0750"), ("uid", "1000")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(req.parameters, want);
        // Limits are inclusive.
        let max_value = "v".repeat(MAX_PARAMETER_VALUE_LEN);
        let max_key = "k".repeat(MAX_PARAMETER_KEY_LEN);
        let req = parse_create(params_env(&format!("{{\"{max_key}\":\"{max_value}\"}}"))).unwrap();
        assert_eq!(req.parameters[&max_key], max_value);
    }

    #[test]
    fn volumes_dir_is_normalised() {
        for (given, want) in [
            ("/opt/nomad/data/host_volumes/", VOLUMES),
            ("//opt//nomad/data/host_volumes//", VOLUMES),
            ("/srv", "/srv"),
            ("/srv/.hidden/..x/x..", "/srv/.hidden/..x/x.."),
        ] {
            let req = parse_create(with(create_env(), "DHV_VOLUMES_DIR", given)).unwrap();
            assert_eq!(req.volumes_dir, PathBuf::from(want), "{given}");
            assert_eq!(req.volumes_dir.to_str().unwrap(), want);
        }
        let longest = format!("/{}", "d".repeat(MAX_VOLUMES_DIR_LEN - 1));
        parse_create(with(create_env(), "DHV_VOLUMES_DIR", &longest)).unwrap();
    }

    #[test]
    fn accepted_variations() {
        let req = parse_create(with(create_env(), "DHV_VOLUME_ID", ID.to_uppercase())).unwrap();
        assert_eq!(req.volume_id.as_str(), ID);
        let req = parse_create(with(create_env(), "DHV_PLUGIN_DIR", "")).unwrap();
        assert_eq!(req.plugin_dir, None);
        let req = parse_create(without(create_env(), "DHV_PLUGIN_DIR")).unwrap();
        assert_eq!(req.plugin_dir, None);
        let req = parse_create(with(create_env(), "DHV_PLUGIN_DIR", "plugins")).unwrap();
        assert_eq!(req.plugin_dir, Some(PathBuf::from("plugins")));
        // Unset capacities are 0; min alone and equal bounds are fine.
        for (min, max) in [
            ("0", "0"),
            ("5", "0"),
            ("0", "5"),
            ("7", "7"),
            ("0", "9223372036854775807"),
        ] {
            let e = with(
                with(create_env(), "DHV_CAPACITY_MIN_BYTES", min),
                "DHV_CAPACITY_MAX_BYTES",
                max,
            );
            let req = parse_create(e).unwrap();
            assert_eq!(
                (req.capacity_min.to_string(), req.capacity_max.to_string()),
                (min.into(), max.into())
            );
        }
        let req = parse_create(with(create_env(), "DHV_CAPACITY_MIN_BYTES", "007")).unwrap();
        assert_eq!(req.capacity_min, 7);
        // Names may be any printable Unicode up to the limit.
        let prefix = "données-é-🚀";
        let name = prefix.to_owned() + &"x".repeat(MAX_LABEL_LEN - prefix.len());
        assert_eq!(name.len(), MAX_LABEL_LEN);
        let req = parse_create(with(create_env(), "DHV_VOLUME_NAME", &name)).unwrap();
        assert_eq!(req.volume_name, name);
    }

    #[test]
    fn unrelated_and_unknown_variables_are_ignored() {
        let mut e = create_env();
        e.insert(0, ("PRJQUOTA_FAULT".into(), "after-mkdir".into()));
        e.push(("PATH".into(), "/bin".into()));
        e.push(("PATH".into(), "/usr/bin".into()));
        e.push(("DHV_SOMETHING_NEW".into(), raw(b"\xff")));
        e.push((raw(b"DHV_\xff"), "x".into()));
        e.push(("dhv_volume_id".into(), "../x".into()));
        e.push(("HOME".into(), raw(b"\xff")));
        assert_eq!(
            parse_create(e).unwrap(),
            parse_create(create_env()).unwrap()
        );
    }

    #[test]
    fn delete_exactly_as_nomad_sends_it() {
        let req = parse_delete(delete_env()).unwrap();
        assert_eq!(
            req.created_path,
            Some(PathBuf::from(format!("{VOLUMES}/{ID}")))
        );
        assert_eq!(req.volume_id.as_str(), ID);
        assert_eq!(req.parameters["mode"], "0750");
        assert_eq!(
            (req.namespace.as_str(), req.volume_name.as_str()),
            ("default", "postgres-data")
        );
        // Delete takes no capacities; stray ones are ignored, not required.
        let extra = with(delete_env(), "DHV_CAPACITY_MIN_BYTES", "garbage");
        assert_eq!(parse_delete(extra).unwrap(), req);
    }

    #[test]
    fn delete_auto_delete_trap_env_parses_so_the_plugin_can_refuse_safely() {
        // After a failed state save Nomad sends the whole volumes dir as the
        // created path, and empty name and namespace.
        let e = with(
            with(
                with(delete_env(), "DHV_CREATED_PATH", format!("{VOLUMES}/")),
                "DHV_NAMESPACE",
                "",
            ),
            "DHV_VOLUME_NAME",
            "",
        );
        let req = parse_delete(e).unwrap();
        assert_eq!(req.namespace, "");
        assert_eq!(req.volume_name, "");
        assert_eq!(req.created_path.as_deref(), Some(req.volumes_dir.as_path()));
        assert_eq!(req.volume_id.as_str(), ID);
    }

    #[test]
    fn delete_created_path_optional() {
        let req = parse_delete(with(delete_env(), "DHV_CREATED_PATH", "")).unwrap();
        assert_eq!(req.created_path, None);
        let req = parse_delete(without(delete_env(), "DHV_CREATED_PATH")).unwrap();
        assert_eq!(req.created_path, None);
        let req = parse_delete(with(delete_env(), "DHV_PARAMETERS", "null")).unwrap();
        assert!(req.parameters.is_empty());
        // Delete does not re-check what create refused, so a volume can always go.
        let req = parse_delete(with(delete_env(), "DHV_VOLUME_NAME", "a/b")).unwrap();
        assert_eq!(req.volume_name, "a/b");
    }

    #[test]
    fn error_messages_escape_and_truncate_values() {
        let e = parse_create(with(
            create_env(),
            "DHV_VOLUME_NAME",
            format!("x\n{}", "y".repeat(10_000)),
        ))
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("DHV_VOLUME_NAME=\"x\\ny"), "{msg}");
        assert!(msg.contains("… (10002 bytes in all)"), "{msg}");
        assert!(msg.contains("rename the volume"), "{msg}");
        let msg = parse_create(with(create_env(), "DHV_VOLUME_NAME", "a\u{202e}b"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("\\u{202e}"), "{msg}");
        let msg = parse_create(with(create_env(), "DHV_VOLUMES_DIR", "rel"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("host_volumes_dir") && msg.contains("absolute"),
            "{msg}"
        );
        let msg = parse_create(with(
            with(create_env(), "DHV_CAPACITY_MIN_BYTES", "2147483648"),
            "DHV_CAPACITY_MAX_BYTES",
            "1073741824",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("2147483648") && msg.contains("1073741824") && msg.contains("2 GiB"),
            "{msg}"
        );
        let msg = parse_create(params_env("{\"mode\":"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("line 1 column 8"), "{msg}");
    }

    #[test]
    fn operation_parse() {
        assert_eq!(
            Operation::parse("fingerprint"),
            Some(Operation::Fingerprint)
        );
        assert_eq!(Operation::parse("create"), Some(Operation::Create));
        assert_eq!(Operation::parse("delete"), Some(Operation::Delete));
        for bad in ["", "Create", "create ", "remove", "--help"] {
            assert_eq!(Operation::parse(bad), None, "{bad:?}");
        }
        for op in [Operation::Fingerprint, Operation::Create, Operation::Delete] {
            assert_eq!(Operation::parse(&op.to_string()), Some(op));
        }
    }

    #[test]
    fn response_json() {
        let path = Path::new(VOLUMES).join(ID);
        assert_eq!(
            create_response_json(&path, 21474836480),
            format!("{{\"path\":\"{VOLUMES}/{ID}\",\"bytes\":21474836480}}")
        );
        assert_eq!(
            create_response_json(Path::new("/v"), i64::MAX as u64),
            "{\"path\":\"/v\",\"bytes\":9223372036854775807}"
        );
        assert_eq!(
            error_json("volume \"x\"\nfailed\\"),
            r#"{"error":"volume \"x\"\nfailed\\"}"#
        );
        assert_eq!(fingerprint_json("0.1.0"), r#"{"version":"0.1.0"}"#);
        // What Nomad would decode must round-trip.
        let v: serde_json::Value = serde_json::from_str(&error_json("a\u{0}b")).unwrap();
        assert_eq!(v["error"], "a\u{0}b");
    }
}
