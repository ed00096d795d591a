//! Pinned guard maps made by hand, in the layout the exporter pins them
//! (`ebpf/src/bpf/guard_shared.h`; bpffs refuses names with a dot), so that the plugin's half of the
//! contract is tested against real kernel maps without an exporter.

use std::path::{Path, PathBuf};
use std::process::Command;

use prjquota_core::guard_contract::{escape_path, PinnedGuard, PIN_ROOT};

/// A pin directory for one volumes directory, removed on drop.
pub struct HandPins {
    pub link: PathBuf,
    pub dir: PathBuf,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mounts bpffs at /sys/fs/bpf, for root only, when it is not there yet.
pub fn ensure_bpffs() {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("read mounts");
    if !mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some("/sys/fs/bpf"))
    {
        run(Command::new("mount").args(["-t", "bpf", "-o", "mode=0700", "bpf", "/sys/fs/bpf"]));
    }
}

impl HandPins {
    /// Maps named and sized as the exporter pins them, behind the symlink
    /// the plugin opens for `volumes_dir`.
    pub fn make(volumes_dir: &Path, tag: &str) -> HandPins {
        ensure_bpffs();
        let root = Path::new(PIN_ROOT);
        std::fs::create_dir_all(root).expect("create the pin root");
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod the pin root");
        let dir = root.join(format!("hand-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("create the pin dir");
        for (name, ty, key, value) in [
            ("roots", "hash", 24, 8),
            ("devs", "hash", 8, 4),
            ("projects", "hash", 16, 4),
            ("counters", "percpu_hash", 16, 16),
        ] {
            run(Command::new("bpftool").args([
                "map",
                "create",
                dir.join(name).to_str().unwrap(),
                "type",
                ty,
                "key",
                &key.to_string(),
                "value",
                &value.to_string(),
                "entries",
                "64",
                "name",
                name,
            ]));
        }
        let canonical = prjquota_core::announce::canonical(volumes_dir);
        let link = root.join(escape_path(&canonical));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).expect("link the pins");
        HandPins { link, dir }
    }

    /// The maps, as the plugin opens them.
    pub fn open(&self, volumes_dir: &Path) -> PinnedGuard {
        PinnedGuard::open(volumes_dir)
            .expect("open the pins")
            .expect("the pins are there")
    }
}

impl Drop for HandPins {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.link);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
