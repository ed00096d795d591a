//! Loading BPF objects against the running kernel, shared by write
//! telemetry and the guard: the kernel's BTF parsed once at a time, hook
//! parts attached all or nothing, and a refusal classified into a
//! [`FailureReason`] with its detail.

use aya::programs::{FEntry, FExit, ProgramError};
use aya::{Btf, BtfError, Ebpf, EbpfError, EbpfLoader};

use crate::error::{chain, errno_name, errno_of};
use crate::error::{FailureReason, LoadError, ProgramFailure};
use crate::raw;

/// Where aya reads the kernel's BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Which build of the programs runs (the write telemetry's and the
/// guard's): chosen at load time by
/// what the kernel offers, never by its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `bpf_get_func_ret` and task-local storage (Linux 5.17 on): one
    /// program per hook whatever the function's arity.
    Helpers,
    /// Each return value read from the fexit context (Linux 5.5 on), one
    /// program per signature; O_DIRECT hands its start over in a hash map
    /// alone.
    Context,
}

impl Variant {
    /// `helpers` or `context`, as logged and labelled.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Helpers => "helpers",
            Variant::Context => "context",
        }
    }
}

/// Load-time knobs; [`LoadOptions::default`] suits a node with up to
/// 16,384 volumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Distinct volume indexes with counters (per-CPU map entries): the
    /// exporter's `--ebpf.max-volumes`. A write into a volume beyond it is
    /// counted as [`Unattributed::map_full`], never lost.
    pub max_volumes: u32,
    /// Root directories (usually one per volume).
    pub max_roots: u32,
    /// Fail unless every program attaches ([`crate::telemetry_mode::Mode::Required`]).
    pub require_all: bool,
    /// The program build to load; `None` (the default) picks by what the
    /// kernel offers. Set to compare both on one kernel.
    pub variant: Option<Variant>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_volumes: raw::MAX_VOLUMES,
            max_roots: raw::MAX_ROOTS,
            require_all: false,
            variant: None,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    FEntry,
    FExit,
}

/// One BPF program: the kernel function and the symbols in the object that
/// can trace it, tried in order until one loads (one per signature the
/// function has had).
pub(crate) struct Part {
    pub(crate) progs: &'static [&'static str],
    pub(crate) func: &'static str,
    pub(crate) kind: Kind,
}

/// A hook point as reported by [`crate::WriteTelemetry::programs`]: one or two
/// programs that attach together or not at all.
pub(crate) struct Hook {
    pub(crate) name: &'static str,
    pub(crate) parts: &'static [Part],
}

/// Runs a load (this crate's or the guard's) while no other runs, then hands
/// the heap it freed back to the kernel.
///
/// Each load parses the kernel's BTF, some 35 MiB of heap at its peak
/// (measured); the exporter starts both loads at once, which doubled its
/// peak to ~70 MiB (its Nomad job reserves 128 MiB, with the eBPF maps
/// charged to the same cgroup).
pub(crate) fn one_load_at_a_time<T>(load: impl FnOnce() -> T) -> T {
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = load();
    // The parsed BTF is dropped by now; its pages go back too.
    prjquota_core::sys::trim_heap();
    loaded
}

/// The kernel's BTF, and a loader to give it to.
///
/// aya's `EbpfLoader::new` parses the kernel's BTF for itself, which
/// `.btf(Some(&ours))` then drops. Made while ours was alive, the two parses
/// coexisted and doubled a load's peak heap (measured with heaptrack on 6.1:
/// 18.9 MB, two parses of 9.4 MB). So the loader is made first and emptied
/// before ours is parsed: one parse at a time.
pub(crate) fn kernel_btf() -> Result<(EbpfLoader<'static>, Btf), LoadError> {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    if let Err(source) = std::fs::metadata(KERNEL_BTF) {
        return Err(LoadError::NoBtf {
            path: KERNEL_BTF,
            source,
        });
    }
    let btf = Btf::from_sys_fs().map_err(|e| LoadError::BadBtf {
        path: KERNEL_BTF,
        detail: chain(&e),
    })?;
    Ok((loader, btf))
}

/// Whether the kernel's BTF has a function (a hook point) by that name.
pub(crate) fn has_function(btf: &Btf, name: &str) -> bool {
    btf.id_by_type_name_kind(name, aya_obj::btf::BtfKind::Func)
        .is_ok()
}

/// Why a program object (of `component`) did not load before any program
/// was tried: `bpf(2)` refused maps or BTF (errno and a hint), or the object
/// does not fit this kernel.
pub(crate) fn object_error(component: &'static str, e: EbpfError) -> LoadError {
    let errno = errno_of(&e);
    let detail = chain(&e);
    match &e {
        EbpfError::MapError(_) | EbpfError::BtfError(BtfError::LoadError { .. }) => {
            let hint = match errno {
                Some(libc::EPERM | libc::EACCES) => {
                    " (not permitted: needs root or CAP_BPF; unprivileged BPF or a sandbox \
                     policy may forbid it)"
                }
                Some(libc::ENOSYS) => " (the kernel has no bpf(2): CONFIG_BPF_SYSCALL is off)",
                _ => "",
            };
            LoadError::BpfUnavailable {
                errno,
                detail: format!("the {component}'s object: {detail}{hint}"),
            }
        }
        _ => LoadError::BpfUnavailable {
            errno,
            detail: format!("the {component} object does not fit this kernel: {detail}"),
        },
    }
}

pub(crate) fn failure(
    hook: &Hook,
    part: &Part,
    reason: FailureReason,
    detail: String,
) -> ProgramFailure {
    ProgramFailure {
        program: hook.name,
        part: format!(
            "{}/{} as {}",
            match part.kind {
                Kind::FEntry => "fentry",
                Kind::FExit => "fexit",
            },
            part.func,
            part.progs.join(" or ")
        ),
        reason,
        detail,
    }
}

/// A refusal by a verifier that does not know a helper the program calls.
pub(crate) fn unknown_helper(f: &ProgramFailure) -> bool {
    f.reason == FailureReason::Verifier
        && (f.detail.contains("unknown func") || f.detail.contains("invalid func"))
}

/// Attaches every part of `hook` (all or nothing); returns the programs
/// that loaded.
pub(crate) fn attach_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    hook: &Hook,
) -> Result<Vec<&'static str>, ProgramFailure> {
    let mut done: Vec<(&Part, &'static str)> = Vec::new();
    for part in hook.parts {
        let mut first_err = None;
        let mut loaded = None;
        for prog in part.progs {
            match load_part(ebpf, btf, part, prog) {
                Ok(()) => {
                    loaded = Some(*prog);
                    break;
                }
                Err(e) => {
                    unload_part(ebpf, part, prog);
                    first_err.get_or_insert(e);
                }
            }
        }
        match (loaded, first_err) {
            (Some(prog), _) => done.push((part, prog)),
            (None, e) => {
                // All or nothing: undo the parts already attached.
                for (p, prog) in &done {
                    unload_part(ebpf, p, prog);
                }
                let (reason, detail) = match e {
                    Some(e) => classify(&e),
                    None => (FailureReason::Other, "no program".to_string()),
                };
                return Err(failure(hook, part, reason, detail));
            }
        }
    }
    Ok(done.into_iter().map(|(_, prog)| prog).collect())
}

pub(crate) fn load_part(
    ebpf: &mut Ebpf,
    btf: &Btf,
    part: &Part,
    prog: &str,
) -> Result<(), ProgramError> {
    let program = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?;
    match part.kind {
        Kind::FExit => {
            let p: &mut FExit = program.try_into()?;
            p.load(part.func, btf)?;
            p.attach()?;
        }
        Kind::FEntry => {
            let p: &mut FEntry = program.try_into()?;
            p.load(part.func, btf)?;
            p.attach()?;
        }
    }
    Ok(())
}

pub(crate) fn unload_part(ebpf: &mut Ebpf, part: &Part, prog: &str) {
    let Some(program) = ebpf.program_mut(prog) else {
        return;
    };
    // Unloading also drops the program's links (detaches it).
    let _ = match part.kind {
        Kind::FExit => <&mut FExit>::try_from(program).map(|p| p.unload()),
        Kind::FEntry => <&mut FEntry>::try_from(program).map(|p| p.unload()),
    };
}

pub(crate) fn classify(e: &ProgramError) -> (FailureReason, String) {
    let errno = errno_of(e);
    let errno_text = errno.map(errno_name).unwrap_or_default();
    match e {
        ProgramError::Btf(BtfError::UnknownBtfTypeName { type_name }) => (
            FailureReason::FunctionNotFound,
            format!("`{type_name}` is not a function in {KERNEL_BTF} (renamed, inlined, or in a module)"),
        ),
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail[tail.len().saturating_sub(6)..].join(" | ");
            if tail.is_empty() && matches!(errno, Some(libc::EPERM | libc::EACCES)) {
                (
                    FailureReason::PermissionDenied,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error}) with no verifier output"),
                )
            } else if !tail.is_empty() {
                (
                    FailureReason::Verifier,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error}); verifier: {tail}"),
                )
            } else {
                (
                    FailureReason::Other,
                    format!("BPF_PROG_LOAD returned {errno_text} ({io_error})"),
                )
            }
        }
        ProgramError::SyscallError(s) => {
            let reason = if matches!(errno, Some(libc::EPERM | libc::EACCES)) {
                FailureReason::PermissionDenied
            } else {
                FailureReason::Attach
            };
            (reason, format!("{} returned {errno_text} ({})", s.call, s.io_error))
        }
        other => (FailureReason::Other, chain(other)),
    }
}

/// A program's skipped runs, when the kernel that filled `filled` bytes of
/// `info` knows the field (Linux 5.12+): unknown is not zero.
pub(crate) fn recursion_misses(
    info: &aya_obj::generated::bpf_prog_info,
    filled: usize,
) -> Option<u64> {
    let end = std::mem::offset_of!(aya_obj::generated::bpf_prog_info, recursion_misses)
        + std::mem::size_of::<u64>();
    (filled >= end).then_some(info.recursion_misses)
}
