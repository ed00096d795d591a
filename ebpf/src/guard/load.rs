//! Loading the guard: which build and which hooks this kernel offers
//! (the plan), the object's maps, the detecting fexit programs and the
//! enforcing BPF LSM programs, attached all or nothing; with pins, the
//! order that keeps the guard before in force until the swap.

use std::path::{Path, PathBuf};

use aya::maps::RingBuf;
use aya::programs::{FExit, Lsm, ProgramError};
use aya::util::KernelVersion;
use aya::{Btf, Ebpf, EbpfLoader};

use super::maps::{MAP_COUNTERS, MAP_EVENTS, MAP_PROJECTS, MAP_ROOTS};
use super::pinning::{pin_name, Attached, LinkId, Pinned};
use super::{pins, Guard, GuardMode, NotEnforcing};
use crate::error::{chain, errno_of};
use crate::error::{FailureReason, LoadError, ProgramFailure};
use crate::loader::LoadOptions;
use crate::loader::Variant;
use crate::loader::{classify, has_function, kernel_btf, object_error, one_load_at_a_time};
use prjquota_core::guard_contract::{
    bpf_lsm_active, LsmHook, LSM_FILEATTR, LSM_IOCTL, LSM_IOCTL_COMPAT, LSM_VERSION,
    LSM_VERSION_COMPAT,
};

const COMPONENT: &str = "quota-escape guard";

/// The detecting fexit programs: `hook` judges the request, and with the
/// parts after it (if any) counts its result.
#[derive(Clone, Copy, Debug)]
pub(super) struct Detect {
    pub(super) hook: &'static str,
    /// Attached in this order, all or nothing.
    pub(super) parts: &'static [DetectPart],
}

#[derive(Debug)]
pub(super) struct DetectPart {
    pub(super) prog: &'static str,
    /// The functions it can trace, the first the kernel's BTF has.
    pub(super) funcs: &'static [&'static str],
}

/// Every attribute change ends in vfs_fileattr_set (5.13+).
pub(super) const DETECT_FILEATTR: Detect = Detect {
    hook: "vfs_fileattr_set",
    parts: &[DetectPart {
        prog: "guard_fileattr_set_exit",
        funcs: &["vfs_fileattr_set"],
    }],
};
/// The count of a judged ioctl, at the exit of the native system call (a
/// 32-bit caller's goes uncounted), shared by both ioctl detections.
const SYS_IOCTL_EXIT: DetectPart = DetectPart {
    prog: "guard_sys_ioctl_exit",
    funcs: &["__x64_sys_ioctl", "__arm64_sys_ioctl"],
};

/// Before 5.13 (context build only): the ioctl judged at the exit of
/// security_file_ioctl, counted at the exit of the native system call (a
/// 32-bit caller's goes uncounted). The exit first: no judgement is kept
/// without a program to take it.
const DETECT_IOCTL: Detect = Detect {
    hook: "security_file_ioctl",
    parts: &[
        SYS_IOCTL_EXIT,
        DetectPart {
            prog: "guard_ioctl_judge",
            funcs: &["security_file_ioctl"],
        },
    ],
};

/// From 5.13, where nothing enforces: the generation ioctls, which never
/// reach vfs_fileattr_set, judged at the exit of security_file_ioctl and
/// counted at the exit of the native system call. Exit first, as above.
const DETECT_VERSION: Detect = Detect {
    hook: "security_file_ioctl",
    parts: &[
        SYS_IOCTL_EXIT,
        DetectPart {
            prog: "guard_version_judge",
            funcs: &["security_file_ioctl"],
        },
    ],
};

/// The oldest kernel the guard is built and tested for (fexit 5.5, the
/// BPF ring buffer 5.8; Debian 11's 5.10 is the oldest tested). Which build
/// and which hooks load above it is probed, not read from the version.
const MIN_KERNEL: (u8, u8) = (5, 10);

/// The compiled `src/bpf/guard.c` of a build, 8-byte aligned as ELF
/// parsing wants.
fn object(variant: Variant) -> &'static [u8] {
    match variant {
        Variant::Helpers => aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard.o")),
        Variant::Context => {
            aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/guard_compat.o"))
        }
    }
}

/// Which build runs on this kernel, and its detect program: the helpers
/// build where the kernel has `bpf_loop` (a helper probe) and
/// `vfs_fileattr_set` (its BTF), else the context build, on
/// `vfs_fileattr_set` where the BTF has it and on the ioctl before.
pub(super) fn choose(btf: &Btf) -> (Variant, Detect) {
    let fileattr = has_function(btf, DETECT_FILEATTR.hook);
    let bpf_loop = aya::sys::is_helper_supported(
        aya::programs::ProgramType::KProbe,
        aya::sys::BpfHelper::BPF_FUNC_loop,
    )
    .unwrap_or(false);
    match (fileattr, bpf_loop) {
        (true, true) => (Variant::Helpers, DETECT_FILEATTR),
        (true, false) => (Variant::Context, DETECT_FILEATTR),
        (false, _) => (Variant::Context, DETECT_IOCTL),
    }
}

impl Guard {
    /// Loads the guard pinned under `pin_root` for `volumes_dirs` (see
    /// [`pins`]): fresh maps pinned in a new directory, `fill`
    /// called to put the registry's roots in, the programs attached and
    /// their links pinned there, and only then every volumes directory's
    /// symlink swapped to it; `fill` once more for the roots the plugin
    /// wrote into the maps the symlinks led to until the swap, then the
    /// directories they pointed at before removed. The programs stay
    /// attached after the `Guard` (and the process) is gone. A start that
    /// fails or dies before its swap leaves the guard before it in force.
    ///
    /// The second value says how pinning went: `Err` (the guard runs,
    /// attached to this process at least, and earlier pins are left in
    /// place) with what failed.
    pub fn load_pinned(
        mode: GuardMode,
        opts: &LoadOptions,
        pin_root: &Path,
        volumes_dirs: &[PathBuf],
        fill: &mut dyn FnMut(&mut Guard),
    ) -> Result<(Guard, Result<Pinned, String>), LoadError> {
        one_load_at_a_time(|| {
            Guard::load_attach(mode, opts, Some((pin_root, volumes_dirs)), fill)
                .map(|(g, p)| (g, p.expect("pinned load")))
        })
    }

    pub(super) fn load_attach(
        mode: GuardMode,
        opts: &LoadOptions,
        pin: Option<(&Path, &[PathBuf])>,
        fill: &mut dyn FnMut(&mut Guard),
    ) -> Result<(Guard, Option<Result<Pinned, String>>), LoadError> {
        if mode == GuardMode::Off {
            return Err(LoadError::BpfUnavailable {
                errno: None,
                detail: "the quota-escape guard is off (--guard=off): nothing to load".into(),
            });
        }
        let (loader, btf) = kernel_btf()?;
        let (variant, detect) = match opts.variant {
            // A build asked for (tests): its detect hook as probed.
            Some(Variant::Context) => (Variant::Context, choose(&btf).1),
            Some(Variant::Helpers) => (Variant::Helpers, DETECT_FILEATTR),
            None => choose(&btf),
        };
        if let Some(f) = too_old(
            detect.hook,
            &format!("fexit/{} ({} build)", detect.hook, variant.as_str()),
        ) {
            return Err(LoadError::NoProgram {
                component: COMPONENT,
                failures: vec![f],
            });
        }
        // Attach first, swap last: until the symlinks point at the new pin
        // directory, the plugin writes new roots into the guard that runs
        // now, so a start that fails or is killed at any step leaves that
        // guard in force. The new one runs beside it from its attach on.
        let mut pinning: Option<Result<PathBuf, String>> = None;
        if let Some((root, _)) = pin {
            pinning = Some(
                pins::ensure_root(root)
                    .and_then(|()| pins::new_dir(root))
                    .map_err(|e| e.to_string()),
            );
        }
        let dir = pinning.as_ref().and_then(|p| p.as_ref().ok()).cloned();
        let mut g = Guard::open(loader, &btf, opts, mode, variant, detect, dir.as_deref())?;
        // A directory left by a start that stops before its swap holds no
        // symlink's target: `pins::remove_unused` takes it as an orphan.
        let abandon = |pinning: &mut Option<Result<PathBuf, String>>, why: String| {
            if let Some(Ok(d)) = pinning.take() {
                let _ = pins::remove_dir(&d);
            }
            *pinning = Some(Err(why));
        };
        if let Some(d) = &dir {
            if let Err(e) = g.pin_maps(d) {
                abandon(&mut pinning, e);
            }
        }
        fault_point("pinned-maps");
        fill(&mut g);
        fault_point("filled");
        let mut attached: Attached = Vec::new();
        match load_detect(&mut g.ebpf, &btf, detect) {
            Ok(links) => attached.extend(links.into_iter().map(|(p, id)| (p, LinkId::FExit(id)))),
            Err((part, e)) => {
                let (reason, detail) = classify(&e);
                if let Some(Ok(d)) = &pinning {
                    let _ = pins::remove_dir(d);
                }
                return Err(LoadError::NoProgram {
                    component: COMPONENT,
                    failures: vec![ProgramFailure {
                        program: detect.hook,
                        part: format!("{part} ({} build)", variant.as_str()),
                        reason,
                        detail,
                    }],
                });
            }
        }
        if mode == GuardMode::Enforce {
            match attach_enforcement(&mut g.ebpf, &btf) {
                Ok(progs) => {
                    g.lsm = progs.iter().map(|(_, section, _)| *section).collect();
                    attached.extend(progs.into_iter().map(|(p, _, id)| (p, LinkId::Lsm(id))));
                }
                Err(why) => {
                    // The exporter refuses to start without enforcement: a
                    // guard pinned before this start (one that enforces)
                    // must go on, not give way to this detect-only one.
                    if matches!(pinning, Some(Ok(_))) {
                        abandon(
                            &mut pinning,
                            format!(
                                "not pinned: enforcement did not attach ({why}), so the guard \
                                 pinned before this start, if any, stays in place"
                            ),
                        );
                    }
                    g.not_enforcing = Some(why);
                }
            }
        }
        // Detecting only, from 5.13: the generation ioctls too. Without
        // them such a change goes uncounted (the sync still re-keys the
        // root); a guard that cannot attach them says so and runs.
        if !g.enforcing() && detect.hook == DETECT_FILEATTR.hook {
            match load_detect(&mut g.ebpf, &btf, DETECT_VERSION) {
                Ok(links) => {
                    attached.extend(links.into_iter().map(|(p, id)| (p, LinkId::FExit(id))));
                    g.version_detected = true;
                }
                Err((part, e)) => {
                    g.version_detected = false;
                    g.version_detect_error = Some(format!("{part}: {}", chain(&e)));
                }
            }
        }
        fault_point("attached");
        let Some((root, volumes_dirs)) = pin else {
            return Ok((g, None));
        };
        let d = match pinning.expect("set when pinning") {
            Err(e) => return Ok((g, Some(Err(e)))),
            Ok(d) => d,
        };
        let result = g.pin_links(&d, attached).and_then(|links| {
            fault_point("links-pinned");
            // From here the new programs run without this process: only
            // now may the plugin be sent to their maps.
            let swapped = pins::swap_links(root, volumes_dirs, &d).map_err(|e| {
                format!(
                    "the guard is attached and pinned in {}, but the volumes directories' \
                     symlinks could not be pointed at it (the guard before, if any, goes on \
                     beside it): {e}",
                    d.display()
                )
            })?;
            fault_point("swapped");
            // Roots the plugin wrote into the maps the symlinks led to
            // before the swap. The registry again rather than a copy of
            // those maps: the plugin stores a volume's record before it
            // writes the root, so the registry holds all of them, and a
            // round also takes out what a delete removed meanwhile.
            fill(&mut g);
            fault_point("refilled");
            let removed = pins::remove_unused(root, &swapped.previous(), &d).map_err(|e| {
                format!(
                    "the guard is pinned in {}, but the pins of an earlier start could not be \
                     removed: {e}",
                    d.display()
                )
            })?;
            Ok(Pinned {
                dir: d,
                links,
                removed,
            })
        });
        Ok((g, Some(result)))
    }

    /// Parses the object and creates its maps, attaching nothing; with
    /// `pin_events`, the ring buffer is pinned there before it is taken.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open<'a>(
        mut loader: EbpfLoader<'a>,
        btf: &'a Btf,
        opts: &LoadOptions,
        requested: GuardMode,
        variant: Variant,
        detect: Detect,
        pin_events: Option<&Path>,
    ) -> Result<Guard, LoadError> {
        let mut ebpf = loader
            .btf(Some(btf))
            .map_max_entries(MAP_COUNTERS, opts.max_volumes)
            .map_max_entries(MAP_PROJECTS, opts.max_volumes)
            .map_max_entries(MAP_ROOTS, opts.max_roots)
            .load(object(variant))
            .map_err(|e| object_error(COMPONENT, e))?;
        if let Some(dir) = pin_events {
            // A failure shows when the other maps are pinned, in the same
            // directory: pin_maps checks this one is there.
            if let Some(m) = ebpf.map(MAP_EVENTS) {
                let _ = m.pin(dir.join(pin_name(MAP_EVENTS)));
            }
        }
        let events = ebpf
            .take_map(MAP_EVENTS)
            .ok_or_else(|| LoadError::BpfUnavailable {
                errno: None,
                detail: format!("the guard object has no `{MAP_EVENTS}` map"),
            })
            .and_then(|m| {
                RingBuf::try_from(m).map_err(|e| LoadError::BpfUnavailable {
                    errno: errno_of(&e),
                    detail: format!("the guard's ring buffer: {}", chain(&e)),
                })
            })?;
        Ok(Guard {
            ebpf,
            variant,
            detect,
            events,
            requested,
            lsm: Vec::new(),
            not_enforcing: None,
            version_detected: false,
            version_detect_error: None,
            max_roots: opts.max_roots,
            held: Vec::new(),
        })
    }
}

fn too_old(program: &'static str, part: &str) -> Option<ProgramFailure> {
    let k = KernelVersion::current().ok()?;
    let (maj, min) = MIN_KERNEL;
    (k < KernelVersion::new(maj, min, 0)).then(|| ProgramFailure {
        program,
        part: part.to_string(),
        reason: FailureReason::KernelTooOld,
        detail: format!("running {k}, the guard needs {maj}.{min} or later"),
    })
}

/// Attaches every part of `detect` (all or nothing); on failure, which
/// part (`fexit/FUNC as PROG`) and why.
#[allow(clippy::type_complexity)]
fn load_detect(
    ebpf: &mut Ebpf,
    btf: &Btf,
    detect: Detect,
) -> Result<Vec<(&'static str, aya::programs::fexit::FExitLinkId)>, (String, ProgramError)> {
    let mut links = Vec::new();
    let mut result = Ok(());
    for part in detect.parts {
        let Some(func) = part.funcs.iter().find(|f| has_function(btf, f)) else {
            result = Err((
                format!("fexit/{} as {}", part.funcs.join(" or "), part.prog),
                ProgramError::Btf(aya::BtfError::UnknownBtfTypeName {
                    type_name: part.funcs.join(" or "),
                }),
            ));
            break;
        };
        match load_fexit(ebpf, btf, part.prog, func) {
            Ok(id) => links.push((part.prog, id)),
            Err(e) => {
                result = Err((format!("fexit/{func} as {}", part.prog), e));
                break;
            }
        }
    }
    match result {
        Ok(()) => Ok(links),
        Err(e) => {
            for (prog, _) in &links {
                if let Some(p) = ebpf.program_mut(prog) {
                    if let Ok(p) = <&mut FExit>::try_from(p) {
                        let _ = p.unload();
                    }
                }
            }
            Err(e)
        }
    }
}

fn load_fexit(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    func: &str,
) -> Result<aya::programs::fexit::FExitLinkId, ProgramError> {
    let p: &mut FExit = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?
        .try_into()?;
    p.load(func, btf)?;
    p.attach()
}

/// The hooks that together cover every path that can change a project ID
/// on this kernel.
fn enforcement_plan(btf: &Btf) -> Vec<&'static LsmHook> {
    let compat = has_function(btf, "bpf_lsm_file_ioctl_compat");
    if has_function(btf, "bpf_lsm_inode_file_setattr") {
        if compat {
            vec![&LSM_FILEATTR, &LSM_VERSION, &LSM_VERSION_COMPAT]
        } else {
            vec![&LSM_FILEATTR, &LSM_VERSION]
        }
    } else if compat {
        vec![&LSM_IOCTL, &LSM_IOCTL_COMPAT]
    } else {
        vec![&LSM_IOCTL]
    }
}

/// Attaches every hook of the plan (each by its first variant that loads),
/// or says why enforcement is not in force; then nothing of it stays
/// attached: half a plan would leave a path open while claiming to enforce.
#[allow(clippy::type_complexity)]
fn attach_enforcement(
    ebpf: &mut Ebpf,
    btf: &Btf,
) -> Result<Vec<(&'static str, &'static str, aya::programs::lsm::LsmLinkId)>, NotEnforcing> {
    match bpf_lsm_active() {
        Ok((true, _)) => {}
        Ok((false, active)) => return Err(NotEnforcing::LsmInactive { active }),
        Err(source) => return Err(NotEnforcing::LsmUnknown { source }),
    }
    let mut attached: Vec<(&'static str, &'static str, aya::programs::lsm::LsmLinkId)> = Vec::new();
    let mut failures = Vec::new();
    for enforcer in enforcement_plan(btf) {
        let mut tried = Vec::new();
        for &(prog, section) in enforcer.variants {
            let part = format!("{section} as {prog}");
            if let Some(f) = too_old(enforcer.hook, &part) {
                tried.push(f);
                break;
            }
            match attach_lsm_or_fault(ebpf, btf, prog, enforcer.hook) {
                Ok(id) => {
                    attached.push((prog, section, id));
                    tried.clear();
                    break;
                }
                Err(e) => {
                    let (reason, detail) = classify(&e);
                    tried.push(ProgramFailure {
                        program: enforcer.hook,
                        part,
                        reason,
                        detail,
                    });
                }
            }
        }
        failures.extend(tried);
    }
    if !failures.is_empty() {
        for (prog, _, _) in &attached {
            if let Some(p) = ebpf.program_mut(prog) {
                if let Ok(p) = <&mut Lsm>::try_from(p) {
                    let _ = p.unload();
                }
            }
        }
        return Err(NotEnforcing::Program { failures });
    }
    Ok(attached)
}

/// In the fault-injection build, aborts the process (as a SIGKILL would:
/// nothing unwinds) when `PRJQUOTA_FAULT_GUARD_START` names `step`, so the
/// tests can stop a start at each step of [`Guard::load_pinned`].
fn fault_point(step: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("PRJQUOTA_FAULT_GUARD_START").is_some_and(|s| s == step) {
        eprintln!("PRJQUOTA_FAULT_GUARD_START: aborting at {step}");
        std::process::abort();
    }
    let _ = step;
}

/// [`attach_lsm`]; in the fault-injection build, with
/// `PRJQUOTA_FAULT_GUARD_LSM` set, a refusal as the verifier's: the tests
/// of a start whose enforcement fails while an earlier guard is pinned.
fn attach_lsm_or_fault(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    hook: &str,
) -> Result<aya::programs::lsm::LsmLinkId, ProgramError> {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("PRJQUOTA_FAULT_GUARD_LSM").is_some() {
        return Err(ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load (PRJQUOTA_FAULT_GUARD_LSM)",
            io_error: std::io::Error::from_raw_os_error(libc::EACCES),
        }));
    }
    attach_lsm(ebpf, btf, prog, hook)
}

fn attach_lsm(
    ebpf: &mut Ebpf,
    btf: &Btf,
    prog: &str,
    hook: &str,
) -> Result<aya::programs::lsm::LsmLinkId, ProgramError> {
    let p: &mut Lsm = ebpf
        .program_mut(prog)
        .ok_or_else(|| ProgramError::InvalidName {
            name: prog.to_string(),
        })?
        .try_into()?;
    p.load(hook, btf)?;
    p.attach()
}
