//! What the guard is asked to do (`--guard`), and why enforcement may
//! not be in force: the BPF LSM's state, read from the kernel's list.

use std::fmt;
use std::io;
use std::str::FromStr;

use crate::error::ProgramFailure;
pub use prjquota_core::guard_contract::{bpf_lsm_active, LSM_LIST};

/// What the guard does (the exporter's `--guard` flag: `auto`, `off`,
/// `detect`, `enforce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GuardMode {
    /// Load nothing.
    Off,
    /// Count attempts by outcome; refuse nothing.
    Detect,
    /// Count, and refuse attempts with EPERM (needs the BPF LSM; falls back
    /// to [`GuardMode::Detect`] without it).
    Enforce,
    /// [`GuardMode::Enforce`] where the BPF LSM is active, else
    /// [`GuardMode::Detect`]: [`GuardMode::resolve`] decides before the
    /// load. A project-ID change by an unprivileged caller inside a volume
    /// is never legitimate, so refusing is the default wherever the kernel
    /// can.
    #[default]
    Auto,
}

impl GuardMode {
    /// The modes a guard can be in (what `auto` resolves to, and off).
    pub const ALL: [GuardMode; 3] = [GuardMode::Off, GuardMode::Detect, GuardMode::Enforce];

    pub fn label(self) -> &'static str {
        match self {
            GuardMode::Off => "off",
            GuardMode::Detect => "detect",
            GuardMode::Enforce => "enforce",
            GuardMode::Auto => "auto",
        }
    }

    /// The mode to load for this requested mode, given whether the BPF LSM
    /// is active ([`bpf_lsm_active`]): `auto` becomes enforce where it is,
    /// and detect, with the reason, where it is not or cannot be told.
    /// Other modes load as asked (enforce without the LSM is refused by the
    /// load's [`Guard::not_enforcing`], not here).
    pub fn resolve(
        self,
        lsm: Result<(bool, String), io::Error>,
    ) -> (GuardMode, Option<NotEnforcing>) {
        match (self, lsm) {
            (GuardMode::Auto, Ok((true, _))) => (GuardMode::Enforce, None),
            (GuardMode::Auto, Ok((false, active))) => (
                GuardMode::Detect,
                Some(NotEnforcing::LsmInactive { active }),
            ),
            (GuardMode::Auto, Err(source)) => {
                (GuardMode::Detect, Some(NotEnforcing::LsmUnknown { source }))
            }
            (m, _) => (m, None),
        }
    }
}

impl FromStr for GuardMode {
    type Err = String;
    fn from_str(s: &str) -> Result<GuardMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(GuardMode::Auto),
            "off" => Ok(GuardMode::Off),
            "detect" => Ok(GuardMode::Detect),
            "enforce" => Ok(GuardMode::Enforce),
            _ => Err(format!(
                "unknown guard mode `{s}` (want auto, off, detect or enforce)"
            )),
        }
    }
}

impl fmt::Display for GuardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why [`GuardMode::Enforce`] runs as detect.
#[derive(Debug)]
pub enum NotEnforcing {
    /// The BPF LSM is built in but not in the kernel's active list (boot
    /// parameter `lsm=`): its programs would load and never run.
    LsmInactive { active: String },
    /// `/sys/kernel/security/lsm` could not be read (securityfs not
    /// mounted?), so whether the BPF LSM runs is unknown.
    LsmUnknown { source: io::Error },
    /// The LSM program did not load or attach (each variant's failure).
    Program { failures: Vec<ProgramFailure> },
}

impl NotEnforcing {
    /// A bounded label: `lsm_inactive`, `lsm_unknown`, or the programs'
    /// shared [`FailureReason::label`] (`permission`, `verifier`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            NotEnforcing::LsmInactive { .. } => "lsm_inactive",
            NotEnforcing::LsmUnknown { .. } => "lsm_unknown",
            NotEnforcing::Program { failures } => {
                let mut reasons = failures.iter().map(|f| f.reason);
                match reasons.next() {
                    Some(first) if reasons.all(|r| r == first) => first.label(),
                    _ => "other",
                }
            }
        }
    }
}

impl fmt::Display for NotEnforcing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotEnforcing::LsmInactive { active } => write!(
                f,
                "the BPF LSM is not active ({LSM_LIST} lists `{active}`): add `bpf` to the \
                 kernel's `lsm=` boot parameter to enforce; detecting only"
            ),
            NotEnforcing::LsmUnknown { source } => write!(
                f,
                "cannot tell whether the BPF LSM is active ({LSM_LIST}: {source}; is securityfs \
                 mounted?); detecting only"
            ),
            NotEnforcing::Program { failures } => {
                f.write_str("the BPF LSM program could not be attached; detecting only: ")?;
                for (i, p) in failures.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Guard;
    use crate::loader::LoadOptions;

    #[test]
    fn auto_enforces_only_where_the_bpf_lsm_is_active() {
        let active = || {
            Ok((
                true,
                "lockdown,capability,landlock,yama,apparmor,bpf".to_string(),
            ))
        };
        let inactive = || Ok((false, "lockdown,capability,yama,apparmor".to_string()));
        let unknown = || Err(io::Error::from_raw_os_error(libc::ENOENT));
        let (m, why) = GuardMode::Auto.resolve(active());
        assert_eq!((m, why.is_none()), (GuardMode::Enforce, true));
        let (m, why) = GuardMode::Auto.resolve(inactive());
        let why = why.expect("a reason");
        assert_eq!((m, why.reason()), (GuardMode::Detect, "lsm_inactive"));
        assert!(
            why.to_string().contains("add `bpf` to the kernel's `lsm=`"),
            "{why}"
        );
        let (m, why) = GuardMode::Auto.resolve(unknown());
        assert_eq!(
            (m, why.unwrap().reason()),
            (GuardMode::Detect, "lsm_unknown")
        );
        // Explicit modes load as asked: enforce's own load reports the LSM.
        for m in GuardMode::ALL {
            for lsm in [active(), inactive(), unknown()] {
                let (r, why) = m.resolve(lsm);
                assert_eq!((r, why.is_none()), (m, true));
            }
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!("off".parse::<GuardMode>(), Ok(GuardMode::Off));
        assert_eq!("Detect".parse::<GuardMode>(), Ok(GuardMode::Detect));
        assert_eq!("enforce".parse::<GuardMode>(), Ok(GuardMode::Enforce));
        assert!("on"
            .parse::<GuardMode>()
            .unwrap_err()
            .contains("auto, off, detect or enforce"));
        assert_eq!("AUTO".parse::<GuardMode>(), Ok(GuardMode::Auto));
        for m in GuardMode::ALL.into_iter().chain([GuardMode::Auto]) {
            assert_eq!(m.to_string().parse::<GuardMode>(), Ok(m));
        }
        assert_eq!(GuardMode::default(), GuardMode::Auto);
        assert!(Guard::start(GuardMode::Off, &LoadOptions::default())
            .unwrap()
            .is_none());
        assert!(Guard::load(GuardMode::Off)
            .unwrap_err()
            .to_string()
            .contains("--guard=off"));
    }
}
