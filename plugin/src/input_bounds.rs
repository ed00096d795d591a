//! How much of Nomad's environment the plugin accepts. A leaf, because both
//! the parsers (`contract`) and the messages that state the limits
//! (`input_error`) need these numbers.

/// Longest `DHV_VOLUMES_DIR` accepted: the volume path, the registry and
/// temporary names are appended to it and must stay well under `PATH_MAX`.
pub const MAX_VOLUMES_DIR_LEN: usize = 1024;
/// Longest node pool, namespace, node ID or volume name, in bytes. Nomad's own
/// names are far shorter; the bound keeps registry records and metric labels
/// small whatever a volume author writes.
pub const MAX_LABEL_LEN: usize = 256;
/// Longest `DHV_PARAMETERS`, checked before any JSON parsing.
pub const MAX_PARAMETERS_LEN: usize = 64 * 1024;
/// Longest value of one parameter, in bytes after JSON unescaping.
pub const MAX_PARAMETER_VALUE_LEN: usize = 4 * 1024;
/// Longest parameter name, in bytes.
pub const MAX_PARAMETER_KEY_LEN: usize = 64;
