//! How the exporter treats write telemetry (`--ebpf`): off, auto or
//! required.

use std::fmt;
use std::str::FromStr;

/// How the exporter treats write telemetry (a config value: `off`, `auto`,
/// `required`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Do not load anything.
    Off,
    /// Load what the kernel allows; on failure run without (and say why).
    #[default]
    Auto,
    /// Every program must attach, or start-up fails.
    Required,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(Mode::Off),
            "auto" => Ok(Mode::Auto),
            "required" => Ok(Mode::Required),
            _ => Err(format!(
                "unknown eBPF mode `{s}` (want off, auto or required)"
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::Required => "required",
        })
    }
}
