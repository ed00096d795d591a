//! Why write telemetry is not running, in words an operator can act on, and
//! as a bounded label for a self-metric.

use std::error::Error as StdError;
use std::fmt;
use std::io;

/// Why [`crate::WriteTelemetry::load`] failed. Never a panic: the caller
/// logs it, exports [`LoadError::reason`] and carries on without eBPF.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `/sys/kernel/btf/vmlinux` is missing: the kernel was built without
    /// `CONFIG_DEBUG_INFO_BTF`, so CO-RE programs cannot be relocated.
    #[error(
        "no kernel BTF at {path} ({source}): the kernel lacks CONFIG_DEBUG_INFO_BTF, \
         so the CO-RE programs (write telemetry, guard) cannot be relocated"
    )]
    NoBtf {
        path: &'static str,
        #[source]
        source: io::Error,
    },

    /// The kernel BTF exists but could not be read or parsed.
    #[error("cannot parse the kernel BTF at {path}: {detail}")]
    BadBtf { path: &'static str, detail: String },

    /// The `bpf(2)` syscall itself is unusable: BPF disabled, not permitted,
    /// maps cannot be created, or the object was rejected before any program
    /// was tried.
    #[error("BPF is unavailable: {detail}")]
    BpfUnavailable { errno: Option<i32>, detail: String },

    /// Every program failed to load or attach; each failure says why.
    #[error("no {component} program could be attached: {}", ProgramFailures(.failures))]
    NoProgram {
        /// `write telemetry` or `quota-escape guard`.
        component: &'static str,
        failures: Vec<ProgramFailure>,
    },

    /// [`crate::telemetry_mode::Mode::Required`]: some programs attached, others did not.
    #[error(
        "{component} is required but incomplete: {}",
        ProgramFailures(.failures)
    )]
    Incomplete {
        component: &'static str,
        failures: Vec<ProgramFailure>,
    },
}

impl LoadError {
    /// A short, bounded label for a self-metric or log field:
    /// `no_btf`, `bad_btf`, `bpf_unavailable`, `permission`,
    /// `function_not_found`, `verifier`, `kernel_too_old`, `attach`, `other`.
    /// For program failures, the reason shared by all of them, else `other`.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::NoBtf { .. } => "no_btf",
            LoadError::BadBtf { .. } => "bad_btf",
            LoadError::BpfUnavailable { errno, .. } => {
                if matches!(errno, Some(libc::EPERM | libc::EACCES)) {
                    "permission"
                } else {
                    "bpf_unavailable"
                }
            }
            LoadError::NoProgram { failures, .. } | LoadError::Incomplete { failures, .. } => {
                let mut reasons = failures.iter().map(|f| f.reason);
                match reasons.next() {
                    Some(first) if reasons.all(|r| r == first) => first.label(),
                    _ => "other",
                }
            }
        }
    }

    /// The per-program failures, when the error is about programs.
    pub fn failures(&self) -> &[ProgramFailure] {
        match self {
            LoadError::NoProgram { failures, .. } | LoadError::Incomplete { failures, .. } => {
                failures
            }
            _ => &[],
        }
    }
}

/// One hook that could not be loaded or attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramFailure {
    /// The hook, as in [`crate::WriteTelemetry::programs`].
    pub program: &'static str,
    /// The BPF program that failed (`fexit/…` or `fentry/…` and its symbol).
    pub part: String,
    pub reason: FailureReason,
    /// The kernel's or aya's words, including the last verifier lines.
    pub detail: String,
}

impl fmt::Display for ProgramFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}: {}",
            self.program,
            self.part,
            self.reason.describe(),
            self.detail
        )
    }
}

struct ProgramFailures<'a>(&'a [ProgramFailure]);

impl fmt::Display for ProgramFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = match self.0.split_first() {
            Some((first, rest)) if rest.iter().all(|p| p.reason == first.reason) => {
                Some(first.reason)
            }
            _ => None,
        };
        if let Some(reason) = shared {
            write!(f, "{}: ", reason.describe())?;
        }
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            if shared.is_some() {
                write!(f, "{} ({}): {}", p.program, p.part, p.detail)?;
            } else {
                write!(f, "{p}")?;
            }
        }
        Ok(())
    }
}

/// Why one program failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// EPERM/EACCES with no verifier complaint: missing CAP_BPF+CAP_PERFMON,
    /// or a sandbox/LSM policy that refuses fentry/fexit even to root (as on
    /// the development host).
    PermissionDenied,
    /// The kernel function is not in vmlinux BTF (renamed, inlined, or in a
    /// module).
    FunctionNotFound,
    /// The verifier rejected the program.
    Verifier,
    /// The running kernel predates what the program needs.
    KernelTooOld,
    /// Loaded, but attaching (the BPF link) failed.
    Attach,
    Other,
}

impl FailureReason {
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::PermissionDenied => "permission",
            FailureReason::FunctionNotFound => "function_not_found",
            FailureReason::Verifier => "verifier",
            FailureReason::KernelTooOld => "kernel_too_old",
            FailureReason::Attach => "attach",
            FailureReason::Other => "other",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            FailureReason::PermissionDenied => {
                "permission denied: the kernel refused a BPF tracing (fentry/fexit) program \
                 (needs root or CAP_BPF+CAP_PERFMON; some sandboxes and LSM policies refuse \
                 fentry/fexit even to root)"
            }
            FailureReason::FunctionNotFound => "kernel function not found in vmlinux BTF",
            FailureReason::Verifier => "rejected by the BPF verifier",
            FailureReason::KernelTooOld => "kernel too old",
            FailureReason::Attach => "attach failed",
            FailureReason::Other => "load failed",
        }
    }
}

/// Errors of [`crate::WriteTelemetry::set_roots`] and
/// [`crate::WriteTelemetry::read`] (map syscalls).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("BPF map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("BPF map `{map}` is missing from the loaded object")]
    MissingMap { map: &'static str },
    #[error("cannot enable BPF run-time statistics: {0}")]
    Stats(String),
    #[error("cannot size a per-CPU value for the possible CPUs: {0}")]
    Cpus(String),
    #[error("too many volume roots: {given} given, the map holds {max}")]
    TooManyRoots { given: usize, max: u32 },
    #[error("volume roots span {given} devices, the map holds {max}")]
    TooManyDevices { given: usize, max: u32 },
}

/// The first `io::Error` errno in an error's source chain.
pub(crate) fn errno_of(e: &(dyn StdError + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if let Some(n) = io.raw_os_error() {
                return Some(n);
            }
        }
        cur = err.source();
    }
    None
}

/// The symbolic name of the few errnos this crate reports.
pub(crate) fn errno_name(n: i32) -> String {
    let name = match n {
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::ENOENT => "ENOENT",
        libc::ENOSYS => "ENOSYS",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::ENOTSUP => "ENOTSUP",
        _ => return format!("errno {n}"),
    };
    name.to_string()
}

/// The whole source chain of an error on one line.
pub(crate) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

pub(crate) fn map_err<T>(
    map: &'static str,
    r: Result<T, aya::maps::MapError>,
) -> Result<T, TelemetryError> {
    r.map_err(|source| TelemetryError::Map { map, source })
}

/// A key that vanished meanwhile is as good as removed.
pub(crate) fn remove_ok(r: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match r {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(e) if errno_of(&e) == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// The object's map called `name`; missing is an error naming it.
pub(crate) fn named_map<'a>(
    ebpf: &'a aya::Ebpf,
    name: &'static str,
) -> Result<&'a aya::maps::Map, TelemetryError> {
    ebpf.map(name)
        .ok_or(TelemetryError::MissingMap { map: name })
}

/// [`named_map`], to write.
pub(crate) fn named_map_mut<'a>(
    ebpf: &'a mut aya::Ebpf,
    name: &'static str,
) -> Result<&'a mut aya::maps::Map, TelemetryError> {
    ebpf.map_mut(name)
        .ok_or(TelemetryError::MissingMap { map: name })
}
