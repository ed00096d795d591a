//! The plugin's one error for bad input: the environment, the parameters, a
//! size that cannot be granted. A module of its own so that the contract,
//! parameter and capacity code can all return it without depending on each
//! other.

use prjquota_core::quoted::shown;
use prjquota_core::units::{human, human_ceil};

use crate::input_bounds::{MAX_PARAMETERS_LEN, MAX_PARAMETER_VALUE_LEN};

/// Why the plugin refuses its input. `Display` is the whole message the
/// operator sees in `nomad volume create` output: what, which value, and the fix.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(
        "{name} is missing from the plugin's environment; Nomad always sets it, so \
         this is either an incompatible Nomad version or a manual run: run the plugin \
         through Nomad, or set {name} as Nomad would"
    )]
    MissingVariable { name: &'static str },

    #[error(
        "{} is set more than once in the plugin's environment; refusing to guess \
         which value is meant: set it exactly once",
        shown(.name)
    )]
    DuplicateVariable { name: String },

    #[error(
        "{name}={} is not valid UTF-8; Nomad only passes UTF-8 text, so fix whatever \
         runs the plugin (or the client's host_volumes_dir / host_volume_plugin_dir)",
        shown(.value)
    )]
    NotUnicode {
        name: &'static str,
        /// The value with invalid bytes replaced by U+FFFD.
        value: String,
    },

    #[error(
        "DHV_OPERATION={} but the plugin was run as `prjquota {expected}`; Nomad always \
         sets both to the same operation: run `prjquota {expected}` with \
         DHV_OPERATION={expected}",
        shown(.found)
    )]
    OperationMismatch {
        expected: &'static str,
        found: String,
    },

    #[error("{name}={}: {reason}", shown(.value))]
    InvalidVariable {
        name: &'static str,
        value: String,
        reason: String,
    },

    #[error(
        "DHV_CAPACITY_MIN_BYTES={min} ({}) is larger than DHV_CAPACITY_MAX_BYTES={max} \
         ({}): set capacity_min no larger than capacity_max in the volume spec",
        human(*.min), human(*.max)
    )]
    CapacityMinAboveMax { min: u64, max: u64 },

    #[error(
        "DHV_PARAMETERS is {len} bytes, more than the {MAX_PARAMETERS_LEN} this plugin \
         accepts: shorten the parameters block of the volume spec"
    )]
    ParametersTooLarge { len: usize },

    #[error(
        "DHV_PARAMETERS is not valid JSON ({message}); Nomad always sends valid JSON, so \
         something other than Nomad ran the plugin: pass a JSON object of strings such \
         as {{\"mode\":\"0750\"}}"
    )]
    ParametersSyntax {
        /// serde_json's message, with its line and column.
        message: String,
    },

    #[error(
        "DHV_PARAMETERS is {found}, not a JSON object: pass an object of strings such \
         as {{\"mode\":\"0750\"}}, or null for no parameters"
    )]
    ParametersNotObject { found: &'static str },

    #[error(
        "parameter {} appears more than once in DHV_PARAMETERS; refusing to guess which \
         value is meant: set it once in the volume spec",
        shown(.key)
    )]
    DuplicateParameter { key: String },

    #[error(
        "parameter {} is {found}, but parameter values must be strings: quote it in the \
         volume spec's parameters block, e.g. {} = \"…\"",
        shown(.key), hcl_key(.key)
    )]
    ParameterNotString { key: String, found: &'static str },

    #[error(
        "parameter {} is {len} bytes long, more than the {MAX_PARAMETER_VALUE_LEN} this \
         plugin accepts: shorten it in the volume spec",
        shown(.key)
    )]
    ParameterValueTooLong { key: String, len: usize },

    #[error("parameter name {} in DHV_PARAMETERS: {reason}", shown(.key))]
    InvalidParameterName { key: String, reason: String },

    #[error(
        "unknown parameter {}: this plugin accepts only {accepted}; remove it from the \
         volume spec's parameters block (or check its spelling)",
        shown(.key)
    )]
    UnknownParameter { key: String, accepted: String },

    #[error(
        "parameter {} is not allowed on this node: allowed_parameters in {config} permits \
         {allowed}; remove it from the volume spec's parameters block, or ask the node's \
         operator to add it to allowed_parameters",
        shown(.key)
    )]
    ParameterNotAllowed {
        key: String,
        /// The config file's path, or "the built-in defaults".
        config: String,
        /// Human list of what is allowed ("only mode, uid", "no parameters").
        allowed: String,
    },

    #[error("parameter {key} = {}: {reason}", shown(.value))]
    InvalidParameter {
        key: &'static str,
        value: String,
        reason: String,
    },

    #[error(
        "the volume has no capacity: set capacity_max (or capacity_min) in the volume \
         spec, e.g. capacity_max = \"10GiB\", or have the node's operator set \
         default_capacity in prjquota.toml next to the plugin"
    )]
    NoCapacity,

    #[error(
        "a capacity of {requested} bytes ({}), rounded up to the filesystem's {block}-byte \
         blocks, exceeds the largest size Nomad can record ({} bytes): request less",
        human(*.requested), i64::MAX
    )]
    CapacityTooLarge { requested: u64, block: u64 },

    #[error(
        "no whole number of the filesystem's {block}-byte blocks lies between capacity_min \
         ({min} bytes) and capacity_max ({max} bytes), and the kernel limits project usage in \
         blocks: widen the range, e.g. capacity_max = \"{}\"",
        human_ceil((*.min).max(1).next_multiple_of(*.block))
    )]
    NoBlockFits { min: u64, max: u64, block: u64 },

    #[error(
        "the volumes filesystem reports a block size of {block} bytes, not a power of two \
         of at least 512; host_volumes_dir must be on XFS or ext4"
    )]
    InvalidBlockSize { block: u64 },

    #[error(
        "volume {volume_id} holds {} ({used} bytes), more than the requested capacity of \
         {} ({requested} bytes); the plugin never shrinks a volume below its usage: delete \
         data from the volume first, or request at least capacity_max = \"{}\"",
        human(*.used), human(*.requested), human_ceil(*.used)
    )]
    ShrinkBelowUsage {
        volume_id: String,
        requested: u64,
        used: u64,
    },

    #[error(
        "volume {volume_id} holds {used} files and directories, more than the requested \
         max_inodes = \"{requested}\"; the plugin never lowers a limit below usage: delete \
         files from the volume first, or set max_inodes to at least \"{used}\""
    )]
    InodesBelowUsage {
        volume_id: String,
        requested: u64,
        used: u64,
    },
}

/// How a parameter name would be written in an HCL parameters block.
fn hcl_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        key.to_owned()
    } else {
        shown(key)
    }
}
