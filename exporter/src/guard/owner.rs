//! One owner for each volumes directory's pinned guard.
//!
//! The exporter that pins the guard of a volumes directory holds its owner
//! lock (`prjquota_ebpf::guard::pins::claim`) for as long as it runs. Another
//! exporter started on the same directory (an operator debugging on
//! another port) finds the lock held and leaves those pins alone: it does
//! not swap the symlink, remove the pins, or with `--guard=off` unpin
//! anything; it runs without the guard for that directory and says which
//! pid owns it. It does not refuse to start: the metrics it serves are
//! what the operator started it for, and the owner's guard goes on.
//!
//! A start that owns a directory whose pinned guard enforces, and that
//! would itself only detect (`--guard=detect`), leaves that guard in place
//! unless `--guard.replace-stronger` says to replace it.
//!
//! While it runs, the owner checks on every sync round that each symlink
//! still points at its own pin directory and that the directory still
//! holds its pins ([`Keeper::check`]); when not, it logs what it found,
//! pins again what is missing from what it still holds, points the symlink
//! back, and counts it (`prjquota_exporter_guard_pins_restored_total`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::exposition::Family;
use prjquota_ebpf::guard::pins::{self, Claim, Current, OwnerLock};
use prjquota_ebpf::guard::{Guard, GuardMode};

/// Why a volumes directory's guard is not this exporter's (the
/// `prjquota_exporter_guard_off_reason` label when none is).
pub const OWNED_ELSEWHERE: &str = "owned_elsewhere";
pub const STRONGER_PINNED: &str = "stronger_pinned";

/// Volumes directories whose guard is not this exporter's, and why.
pub type Skipped = Vec<(PathBuf, &'static str)>;

/// What the claims at start-up gave.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The volumes directories this exporter owns the guard of.
    pub dirs: Vec<PathBuf>,
    /// Their locks, held as long as the guard is loaded.
    pub locks: Vec<OwnerLock>,
    /// The others, and why.
    pub skipped: Skipped,
}

/// Claims the guard of every volumes directory under `root`. `enforcing`:
/// this start asks for a guard that refuses changes; `replace_stronger`:
/// `--guard.replace-stronger`. A pin root that cannot be made is the
/// pinning's to report: every directory is claimed then, with no lock
/// (nothing can be pinned, so nothing is replaced).
pub fn claim(root: &Path, dirs: &[PathBuf], mode: GuardMode, replace_stronger: bool) -> Claimed {
    let mut out = Claimed::default();
    if pins::ensure_root(root).is_err() {
        out.dirs = dirs.to_vec();
        return out;
    }
    for d in dirs {
        match pins::claim(root, d) {
            Ok(Claim::Owned(lock)) => {
                let pinned = pins::current(root, d).ok().flatten();
                match pinned {
                    Some(c) if c.enforces() && mode != GuardMode::Enforce && !replace_stronger => {
                        crate::error!(
                            "quota-escape guard: the pinned guard of this volumes directory enforces and this start would only detect, so it is left in place and this exporter does not guard the directory; pass --guard.replace-stronger to replace it, or run with --guard=enforce",
                            volumes_dir = d.display(),
                            pin_dir = c.dir.display(),
                            requested = mode
                        );
                        out.skipped.push((d.clone(), STRONGER_PINNED));
                    }
                    _ => {
                        out.locks.push(lock);
                        out.dirs.push(d.clone());
                    }
                }
            }
            Ok(Claim::Held { pid }) => {
                crate::error!(
                    "quota-escape guard: another exporter owns the guard of this volumes directory and runs; this one leaves its pins alone and does not guard the directory",
                    volumes_dir = d.display(),
                    owner_pid = pid.map_or("unknown".to_string(), |p| p.to_string())
                );
                out.skipped.push((d.clone(), OWNED_ELSEWHERE));
            }
            Err(e) => {
                crate::error!(
                    "quota-escape guard: cannot tell whether another exporter owns the guard of this volumes directory, so this one leaves its pins alone and does not guard it",
                    volumes_dir = d.display(),
                    err = e
                );
                out.skipped.push((d.clone(), OWNED_ELSEWHERE));
            }
        }
    }
    out
}

/// Per volumes directory: whether its pins are this exporter's, and how
/// often they were put back.
#[derive(Debug)]
struct Kept {
    volumes_dir: PathBuf,
    own: AtomicBool,
    restored: AtomicU64,
}

/// Checks and puts back this exporter's pins.
#[derive(Debug)]
pub struct Keeper {
    root: PathBuf,
    /// The own pin directory and the programs whose links are pinned
    /// there; `None` when the guard is not pinned (nothing to keep).
    pins: Option<(PathBuf, Vec<&'static str>)>,
    kept: Vec<Kept>,
    /// Volumes directories another exporter's guard covers.
    skipped: Skipped,
}

impl Keeper {
    pub fn new(
        root: &Path,
        pins: Option<(PathBuf, Vec<&'static str>)>,
        dirs: &[PathBuf],
        skipped: Skipped,
    ) -> Keeper {
        let own = pins.is_some();
        Keeper {
            root: root.to_path_buf(),
            pins,
            kept: dirs
                .iter()
                .map(|d| Kept {
                    volumes_dir: d.clone(),
                    own: AtomicBool::new(own),
                    restored: AtomicU64::new(0),
                })
                .collect(),
            skipped,
        }
    }

    /// Whether every owned volumes directory's symlink points at this
    /// exporter's pins, as the last check found (or put back).
    pub fn all_own(&self) -> bool {
        self.kept.iter().all(|k| k.own.load(Ordering::Relaxed))
    }

    /// One check (blocking: on the sync's blocking task); whether it put
    /// any pins back.
    pub fn check(&self, guard: &Mutex<Guard>) -> bool {
        let Some((dir, links)) = &self.pins else {
            return false;
        };
        let mut restored = false;
        for k in &self.kept {
            let found = pins::current(&self.root, &k.volumes_dir);
            if matches!(&found, Ok(Some(c)) if c.is(dir, links)) {
                k.own.store(true, Ordering::Relaxed);
                continue;
            }
            let found = describe(&found, dir);
            match self.restore(guard, dir, links, &k.volumes_dir) {
                Ok(repinned) => {
                    restored = true;
                    k.restored.fetch_add(1, Ordering::Relaxed);
                    k.own.store(true, Ordering::Relaxed);
                    crate::error!(
                        "quota-escape guard: this volumes directory's pins were no longer this exporter's (someone with root changed them); put back",
                        volumes_dir = k.volumes_dir.display(),
                        found = found,
                        pin_dir = dir.display(),
                        repinned = if repinned.is_empty() { "-".to_string() } else { repinned.join(",") }
                    );
                }
                Err(e) => {
                    // Said once per loss, not every round.
                    if k.own.swap(false, Ordering::Relaxed) {
                        crate::error!(
                            "quota-escape guard: this volumes directory's pins are no longer this exporter's and cannot be put back; the guard attached to this process still refuses changes while it runs, and nothing does once it stops: restart the exporter",
                            volumes_dir = k.volumes_dir.display(),
                            found = found,
                            pin_dir = dir.display(),
                            err = e
                        );
                    }
                }
            }
        }
        restored
    }

    fn restore(
        &self,
        guard: &Mutex<Guard>,
        dir: &Path,
        links: &[&'static str],
        volumes_dir: &Path,
    ) -> Result<Vec<String>, String> {
        let held = pins::held(dir).map_err(|e| e.to_string())?;
        let repinned = if held.is(dir, links) {
            Vec::new()
        } else {
            guard.lock().unwrap_or_else(|e| e.into_inner()).repin(dir)?
        };
        pins::repoint(&self.root, volumes_dir, dir).map_err(|e| e.to_string())?;
        Ok(repinned)
    }

    /// `…_guard_pins_own{volumes_dir}` and `…_guard_pins_restored_total`.
    pub fn families(&self) -> Vec<Family> {
        let mut own = own_family();
        let mut restored = Family::counter(
            "prjquota_exporter_guard_pins_restored_total",
            "Times the sync found the volumes directory's pins changed behind this exporter's back (symlink pointing elsewhere, pins removed) and put them back.",
        );
        for k in &self.kept {
            let d = k.volumes_dir.display().to_string();
            let is = self.pins.is_some() && k.own.load(Ordering::Relaxed);
            own.labelled(vec![("volumes_dir", d.clone())], if is { 1.0 } else { 0.0 });
            restored.labelled(
                vec![("volumes_dir", d)],
                k.restored.load(Ordering::Relaxed) as f64,
            );
        }
        for (d, _) in &self.skipped {
            own.labelled(vec![("volumes_dir", d.display().to_string())], 0.0);
        }
        vec![own, restored]
    }
}

fn own_family() -> Family {
    Family::gauge(
        "prjquota_exporter_guard_pins_own",
        "Whether the pinned quota-escape guard of the volumes directory is this exporter's (1): its symlink points at this exporter's pin directory, which holds its pins. 0: another exporter that runs owns it, a guard that enforces was left in place (--guard.replace-stronger), or this exporter's pins were changed and could not be put back (the log says which).",
    )
}

/// `…_guard_pins_own 0` for each volumes directory an off guard left to
/// another's (none when it is off for another reason).
pub fn not_own_family(skipped: &Skipped) -> Vec<Family> {
    if skipped.is_empty() {
        return Vec::new();
    }
    let mut own = own_family();
    for (d, _) in skipped {
        own.labelled(vec![("volumes_dir", d.display().to_string())], 0.0);
    }
    vec![own]
}

/// What a symlink was found pointing at, for the log.
fn describe(found: &std::io::Result<Option<Current>>, own: &Path) -> String {
    match found {
        Err(e) => format!("unreadable: {e}"),
        Ok(None) => "no symlink".to_string(),
        Ok(Some(c)) if c.dir != own => format!(
            "symlink to {}{}",
            c.dir.display(),
            if c.exists { "" } else { " (missing)" }
        ),
        Ok(Some(c)) if !c.exists => "own pin directory removed".to_string(),
        Ok(Some(c)) => format!(
            "own pin directory holding only links [{}] and maps [{}]",
            c.links.join(","),
            c.maps.join(",")
        ),
    }
}
