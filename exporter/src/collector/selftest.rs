//! The start-up self-test of the write telemetry: "attached" must mean
//! "counting". A kernel that changes a hooked function (a new parameter, a
//! return value moved) still lets the program attach, and then it counts
//! wrong or nothing: silent zeros. So right after loading, before any
//! volume is registered, the exporter writes a known amount into a probe
//! file it owns, `<volumes dir>/.prjquota/selftest/probe`, registered as a
//! root of its own, and checks that the counters moved by exactly that.
//!
//! Which hook a write proves depends on the filesystem: buffered writes go
//! through `iomap_file_buffered_write` on XFS and `generic_perform_write`
//! on ext4, O_DIRECT through `iomap_dio_complete` on both. A hook no
//! volumes filesystem of this node exercises is not tested (no series), so
//! a 0 always means "tested and wrong", never "not tested": a probe the
//! filesystem refused (read-only, full, a sandbox without the directory)
//! tested no hook, and is logged as an error with no series.
//!
//! A node with no volume yet has no registry: the plugin makes it at the
//! first create. The exporter then makes `<volumes dir>/.prjquota` itself,
//! as the plugin would (root's, mode 0700), so that a freshly installed
//! node proves its hooks before its first volume. Only on XFS and ext4
//! (the plugin refuses any other filesystem), and only as root (the plugin
//! refuses a registry that is not root's).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use prjquota_core::fs_type::FsType;
use prjquota_ebpf::{VolumeCounters, WriteTelemetry};

/// The probe's volume index. The probe runs right after the load, before
/// any volume is registered, so no volume holds an index yet; it must be
/// a slot of the counters array (below `--ebpf.max-volumes`, at least 1),
/// and the first volume to get it starts from zero (`set_roots` zeroes an
/// index that enters the roots).
const PROBE_INDEX: u32 = 0;
/// Writes of one probe: `COUNT` requests of `BLOCK` bytes, the size
/// O_DIRECT needs aligned.
const BLOCK: usize = 4096;
const COUNT: usize = 3;
/// Probes of one hook before a short count fails it. The kernel skips a
/// hook's end for calls in flight when another program attaches to or
/// detaches from the same function, so a probe beside another exporter's
/// start or stop may count a write less; a hook that counts wrong (a
/// changed signature: wrong sizes) fails at once, and one that counts
/// nothing fails every time.
const ATTEMPTS: u32 = 3;

/// One hook's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub program: &'static str,
    pub ok: bool,
    /// What was written and what was counted, for the log.
    pub detail: String,
}

/// Runs the probes in every volumes directory that has a prjquota registry
/// (one per filesystem type is enough) and leaves the roots map empty.
pub fn run(t: &mut WriteTelemetry, volumes_dirs: &[PathBuf]) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = Vec::new();
    let attached: Vec<&str> = t
        .programs()
        .into_iter()
        .filter(|(_, a)| *a)
        .map(|(p, _)| p)
        .collect();
    for dir in volumes_dirs {
        let registry = dir.join(prjquota_core::record::DIR_NAME);
        let fs = match registry_for_probe(dir, &registry) {
            Ok(fs) => fs,
            Err(why) => {
                crate::warn!(
                    "eBPF self-test: not run in this volumes directory, its hooks are not proven by it",
                    dir = dir.display(),
                    why = why
                );
                continue;
            }
        };
        let buffered = match FsType::from_magic(fs) {
            FsType::Xfs => prjquota_ebpf::HOOK_BUFFERED_IOMAP,
            FsType::Ext4 => prjquota_ebpf::HOOK_BUFFERED_GENERIC,
            FsType::Other(_) => continue,
        };
        for (program, direct) in [(buffered, false), (prjquota_ebpf::HOOK_DIRECT, true)] {
            if !attached.contains(&program) || out.iter().any(|o| o.program == program) {
                continue;
            }
            let probe_dir = registry.join("selftest");
            let mut attempt = 1;
            let outcome = loop {
                let result = probe(t, &probe_dir, direct);
                if let Ok((before, after)) = &result {
                    let got = after.since(before);
                    if attempt < ATTEMPTS && lost_some(&got) {
                        crate::warn!(
                            "eBPF self-test: the probe's writes were counted short but right, as when another eBPF program attaches to the same kernel function meanwhile; probing again",
                            program = program,
                            attempt = attempt,
                            counted_writes = got.write_ops
                        );
                        attempt += 1;
                        continue;
                    }
                }
                break result;
            };
            let outcome = match outcome {
                Ok((before, after)) => {
                    let got = after.since(&before);
                    let want = (BLOCK * COUNT) as u64;
                    Outcome {
                        program,
                        ok: got.written_bytes == want
                            && got.write_ops == COUNT as u64
                            && got.errors_total() == 0,
                        detail: format!(
                            "wrote {want} bytes in {COUNT} writes into {}, counted {} bytes in {} writes and {} errors",
                            probe_dir.display(),
                            got.written_bytes,
                            got.write_ops,
                            got.errors_total()
                        ),
                    }
                }
                // The filesystem refused the probe: no hook was tested, and
                // a 0 would blame the kernel.
                Err(ProbeError::Fs(e)) => {
                    crate::error!(
                        "eBPF self-test: the probe could not be written, so this hook is not tested (no series); let the exporter write in the volumes directory (the unit's ReadWritePaths= follows VOLUMES_DIR after systemctl daemon-reload)",
                        program = program,
                        dir = probe_dir.display(),
                        err = e
                    );
                    continue;
                }
                Err(ProbeError::Bpf(e)) => Outcome {
                    program,
                    ok: false,
                    detail: format!("the probe in {} failed: {e}", probe_dir.display()),
                },
            };
            out.push(outcome);
        }
    }
    if let Err(e) = t.set_roots(&[]) {
        crate::warn!("eBPF self-test: cannot clear its probe root", err = e);
    }
    out
}

/// Whether `got` is what a probe gives when some of its writes went
/// uncounted and the rest were counted right: whole blocks, fewer than
/// written, no error.
fn lost_some(got: &VolumeCounters) -> bool {
    got.write_ops < COUNT as u64
        && got.written_bytes == got.write_ops * BLOCK as u64
        && got.errors_total() == 0
}

/// The filesystem magic of `registry`, the registry of volumes directory
/// `dir`, made when missing (as the plugin makes it: root's, mode 0700);
/// or why the self-test cannot write there.
fn registry_for_probe(dir: &Path, registry: &Path) -> Result<i64, String> {
    let fs = fs_magic(dir).map_err(|e| format!("cannot stat the volumes directory: {e}"))?;
    if let FsType::Other(fs) = FsType::from_magic(fs) {
        return Err(format!(
            "the volumes directory is on a filesystem of type {fs:#x}, neither XFS nor ext4"
        ));
    }
    match fs::symlink_metadata(registry) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !nix::unistd::geteuid().is_root() {
                return Err(
                    "no registry yet, and only root may make it (the plugin refuses one that is not root's): run the exporter as root, or create a volume first".into(),
                );
            }
            match fs::DirBuilder::new().mode(0o700).create(registry) {
                Ok(()) => crate::info!(
                    "eBPF self-test: made the registry directory for its probe (no volume yet)",
                    dir = registry.display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("cannot make {}: {e}", registry.display())),
            }
        }
        Err(e) => return Err(format!("cannot stat {}: {e}", registry.display())),
    }
    fs_magic(registry).map_err(|e| format!("cannot stat {}: {e}", registry.display()))
}

/// Why a probe told nothing about its hook.
enum ProbeError {
    /// The filesystem refused the probe's directory or write: no hook ran.
    Fs(std::io::Error),
    /// The eBPF side (its roots map, its counters) failed.
    Bpf(String),
}

/// Registers `dir` as the probe root, writes, and returns the probe's
/// counters before and after.
fn probe(
    t: &mut WriteTelemetry,
    dir: &Path,
    direct: bool,
) -> Result<(VolumeCounters, VolumeCounters), ProbeError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ProbeError::Fs(e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(ProbeError::Fs)?;
    if !meta.is_dir() {
        return Err(ProbeError::Fs(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        ))));
    }
    t.set_roots(&[(meta.dev(), meta.ino(), PROBE_INDEX)])
        .map_err(|e| ProbeError::Bpf(e.to_string()))?;
    let read = |t: &WriteTelemetry| {
        t.read()
            .map(|c| c.volume(PROBE_INDEX))
            .map_err(|e| ProbeError::Bpf(e.to_string()))
    };
    let before = read(t)?;
    let path = dir.join("probe");
    let _ = fs::remove_file(&path);
    write_probe(&path, direct).map_err(ProbeError::Fs)?;
    let after = read(t)?;
    fs::remove_file(&path).map_err(ProbeError::Fs)?;
    Ok((before, after))
}

fn write_probe(path: &Path, direct: bool) -> std::io::Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true).mode(0o600);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let mut f: File = opts.open(path)?;
    // O_DIRECT wants the buffer aligned like the block: carve an aligned
    // window out of a larger allocation.
    let mut raw = vec![0x5au8; BLOCK * 2];
    let offset = raw.as_ptr().align_offset(BLOCK);
    let buf = &mut raw[offset..offset + BLOCK];
    for _ in 0..COUNT {
        let n = f.write(buf)?;
        if n != BLOCK {
            return Err(std::io::Error::other(format!(
                "short write: {n} of {BLOCK}"
            )));
        }
    }
    f.sync_all()
}

/// `statfs(2)` f_type of `path`.
fn fs_magic(path: &Path) -> std::io::Result<i64> {
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    Ok(st.filesystem_type().0 as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(bytes: u64, ops: u64, errors: u64) -> VolumeCounters {
        let mut c = VolumeCounters {
            written_bytes: bytes,
            write_ops: ops,
            ..VolumeCounters::default()
        };
        c.errors[0] = errors;
        c
    }

    #[test]
    fn only_a_short_count_of_whole_blocks_is_probed_again() {
        let block = BLOCK as u64;
        // Writes lost in flight: probed again.
        assert!(lost_some(&counted(2 * block, 2, 0)));
        assert!(lost_some(&counted(0, 0, 0)));
        // Every write counted: the verdict stands.
        assert!(!lost_some(&counted(3 * block, 3, 0)));
        // Wrong sizes (a hook reading the wrong return value) or an error:
        // a broken hook, never retried into a pass.
        assert!(!lost_some(&counted(3 * block / 2, 3, 0)));
        assert!(!lost_some(&counted(block, 2, 0)));
        assert!(!lost_some(&counted(2 * block, 2, 1)));
    }
}
