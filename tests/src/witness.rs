//! An independent witness of the kernel's project quotas: the filesystem's
//! own tools (`xfs_quota` from xfsprogs, `repquota` from quota), not
//! `prjquota_core::quota`, the code under test.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::fixture::FsCase;

/// The hard block limit in bytes of every project the tool reports on the
/// filesystem mounted at `mount`.
pub fn hard_limits(fs: &FsCase, mount: &Path) -> BTreeMap<u32, u64> {
    let (tool, args, hard_col): (&str, Vec<String>, usize) = match fs.name {
        // "#ID used soft hard warn/grace", in KiB blocks.
        "xfs" => (
            "xfs_quota",
            vec![
                "-x".into(),
                "-c".into(),
                "report -p -b -N -n".into(),
                mount.display().to_string(),
            ],
            3,
        ),
        // "#ID -- used soft hard grace files ...", in KiB blocks.
        "ext4" => (
            "repquota",
            vec!["-P".into(), "-n".into(), mount.display().to_string()],
            4,
        ),
        other => panic!("no quota witness for filesystem {other}"),
    };
    let out = Command::new(tool).args(&args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {tool} (the independent quota witness for {}): {e}: \
             install xfsprogs (xfs_quota) and quota (repquota) on the host the VM shares",
            fs.name
        )
    });
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut limits = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let Some(id) = cols
            .first()
            .and_then(|c| c.strip_prefix('#'))
            .and_then(|c| c.parse::<u32>().ok())
        else {
            continue;
        };
        let hard: u64 = cols
            .get(hard_col)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{tool}: no hard limit in {line:?}"));
        limits.insert(id, hard * 1024);
    }
    limits
}
