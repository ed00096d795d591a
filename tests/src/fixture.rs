//! A Nomad client node on a test filesystem: a plugin dir holding the
//! `prjquota` executable and a node config with a project-ID range of its
//! own (tests share filesystems, and project IDs are per filesystem), and a
//! volumes dir the plugin creates on first use.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::nomad::{uuid, Node, Spec};
use crate::{bin, scratch_dir};

pub struct Fixture {
    pub root: PathBuf,
    pub node: Node,
    pub id_min: u32,
    pub id_max: u32,
}

/// A disjoint slice of project IDs for one fixture, from a random base.
fn id_range() -> (u32, u32) {
    let r = u32::from_str_radix(&uuid()[..6], 16).expect("hex");
    let base = 10_000_000 + (r % 400_000) * 1000;
    (base, base + 999)
}

/// One copy of `binary` in the guest's /tmp (memory), shared by every
/// fixture of this boot: written under a temporary name and renamed, so a
/// parallel test never executes a half-written file.
fn local_copy(binary: &Path) -> PathBuf {
    let meta = std::fs::metadata(binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    let name = binary.file_name().expect("a file name").to_string_lossy();
    let dir = Path::new("/tmp/prjquota-vm-bin");
    std::fs::create_dir_all(dir).expect("binary cache dir");
    let stamp = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let local = dir.join(format!("{name}-{}-{stamp}", meta.len()));
    if !local.exists() {
        let tmp = dir.join(format!(".{name}-{}", uuid()));
        std::fs::copy(binary, &tmp).expect("copy the binary into the guest");
        std::fs::rename(&tmp, &local).expect("publish the binary copy");
    }
    local
}

impl Fixture {
    /// A fresh node on `mount`, using the `prjquota` binary built by the runner.
    pub fn new(mount: &Path, tag: &str) -> Fixture {
        Self::with_plugin(mount, tag, &bin("prjquota"))
    }

    /// A fresh node whose plugin is `plugin` (the crash tests use a build
    /// with fault injection).
    pub fn with_plugin(mount: &Path, tag: &str, plugin: &Path) -> Fixture {
        let root = scratch_dir(mount, tag);
        let plugin_dir = root.join("plugins");
        std::fs::create_dir(&plugin_dir).expect("plugin dir");
        // Nomad runs `<plugin dir>/<plugin id>`; a link keeps argv[0] right.
        // It points at one copy of the binary in the guest's memory, not at
        // the runner's file over 9p, where each exec costs in proportion to
        // the binary's size (a 27 MiB debug build measured five times
        // slower than a 4 MiB one for the same work).
        std::os::unix::fs::symlink(local_copy(plugin), plugin_dir.join("prjquota"))
            .expect("link plugin");
        let (id_min, id_max) = id_range();
        std::fs::write(
            plugin_dir.join("prjquota.toml"),
            node_config(id_min, id_max, SHARED_FS_OVERCOMMIT),
        )
        .expect("node config");
        let node = Node::new(
            plugin_dir.join("prjquota"),
            root.join("volumes"),
            plugin_dir,
        );
        Fixture {
            root,
            node,
            id_min,
            id_max,
        }
    }

    /// Rewrites the node config with another `overcommit_ratio`, keeping
    /// the fixture's project-ID range.
    pub fn set_overcommit_ratio(&self, ratio: f64) {
        std::fs::write(
            self.node.plugin_dir.join("prjquota.toml"),
            node_config(self.id_min, self.id_max, ratio),
        )
        .expect("node config");
    }

    /// Rewrites the node config: the fixture's project-ID range and
    /// overcommit ratio, then `extra` (more `key = value` lines).
    pub fn set_config(&self, extra: &str) {
        std::fs::write(
            self.node.plugin_dir.join("prjquota.toml"),
            format!(
                "{}{extra}\n",
                node_config(self.id_min, self.id_max, SHARED_FS_OVERCOMMIT)
            ),
        )
        .expect("node config");
    }

    /// Creates a volume and returns its path and the bytes Nomad was told.
    pub fn create(&self, spec: &Spec) -> (PathBuf, i64) {
        self.node.create(spec).created()
    }

    /// The kernel's view of a project on this fixture's filesystem.
    pub fn quota(&self, project_id: u32) -> prjquota_core::quota::ProjectQuota {
        let dir = std::fs::File::open(&self.node.volumes_dir).expect("open volumes dir");
        prjquota_core::quota::get(dir.as_fd(), project_id).expect("quotactl")
    }

    /// Project ID and PROJINHERIT of a directory.
    pub fn project_of(path: &Path) -> (u32, bool) {
        let f = std::fs::File::open(path).expect("open");
        prjquota_core::quota::project_of(f.as_fd()).expect("fsgetxattr")
    }

    /// Puts a directory into project `id`, as a volume of this plugin is.
    pub fn tag(path: &Path, id: u32) {
        let f = std::fs::File::open(path).expect("open");
        prjquota_core::quota::tag(f.as_fd(), id).expect("fssetxattr");
    }

    /// Another node on the same filesystem as `self` (its own plugin dir
    /// and volumes dir) whose node config gives it the same project-ID
    /// range, as two Nomad agents configured alike would have.
    pub fn sibling(&self, mount: &Path, tag: &str, plugin: &Path) -> Fixture {
        let mut f = Fixture::with_plugin(mount, tag, plugin);
        (f.id_min, f.id_max) = (self.id_min, self.id_max);
        f.set_config("");
        f
    }

    /// The registry record of a volume, as JSON.
    pub fn record(&self, id: &str) -> Option<serde_json::Value> {
        let p = self
            .node
            .volumes_dir
            .join(".prjquota/volumes")
            .join(format!("{id}.json"));
        match std::fs::read(&p) {
            Ok(b) => Some(serde_json::from_slice(&b).expect("record is JSON")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("read {}: {e}", p.display()),
        }
    }

    pub fn project_id(&self, id: &str) -> u32 {
        self.record(id).expect("record exists")["project_id"]
            .as_u64()
            .expect("project_id") as u32
    }
}

/// Tests share the matrix's filesystems and promise more than they hold
/// (a storm of 200 × 1 GiB on 512 MiB): admission is tested by the capacity
/// tests on filesystems of their own ([`SmallFs`]).
const SHARED_FS_OVERCOMMIT: f64 = 1e6;

fn node_config(id_min: u32, id_max: u32, ratio: f64) -> String {
    format!("project_id_min = {id_min}\nproject_id_max = {id_max}\novercommit_ratio = {ratio:?}\n")
}

/// A filesystem of its own for one test, `size` bytes on a loop device,
/// mounted with project quota; unmounted and removed on drop. For tests
/// whose figures depend on everything else on the filesystem.
pub struct SmallFs {
    pub mount: PathBuf,
    img: PathBuf,
}

impl SmallFs {
    pub fn new(case: &FsCase, tag: &str, size: u64) -> SmallFs {
        let mkfs = match case.name {
            "xfs" => "mkfs.xfs -q -f",
            _ => "mkfs.ext4 -q -F -O quota,project -I 256",
        };
        Self::made_by(mkfs, case.name, tag, size)
    }

    /// XFS with room for millions of inodes (`-i maxpct=50`; the default
    /// gives a quarter of a small filesystem to them): for trees of many
    /// small files.
    pub fn xfs_for_many_files(tag: &str, size: u64) -> SmallFs {
        Self::made_by("mkfs.xfs -q -f -i maxpct=50", "xfs-inodes", tag, size)
    }

    /// ext4 without a journal (`mkfs.ext4 -O ^has_journal`), which mke2fs
    /// makes when asked and some small-device setups ask for.
    pub fn ext4_without_journal(tag: &str, size: u64) -> SmallFs {
        Self::made_by(
            "mkfs.ext4 -q -F -O quota,project,^has_journal -I 256",
            "ext4-nojournal",
            tag,
            size,
        )
    }

    /// ext4 without `metadata_csum`: what e2fsprogs before 1.43 made, what
    /// a filesystem converted from ext3 is, and the one ext4 that lets an
    /// inode's owner set its generation (`FS_IOC_SETVERSION`).
    pub fn ext4_without_metadata_csum(tag: &str, size: u64) -> SmallFs {
        Self::made_by(
            "mkfs.ext4 -q -F -O quota,project,^metadata_csum -I 256",
            "ext4-nocsum",
            tag,
            size,
        )
    }

    fn made_by(mkfs: &str, fs_name: &str, tag: &str, size: u64) -> SmallFs {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("smallfs-{fs_name}-{tag}-{}-{n}", std::process::id());
        // On the VM's scratch disk, beside the shared test filesystems (the
        // guest's /tmp is its memory, and a loop device there would sync
        // for free: not the cost a filesystem has on a disk).
        let base = crate::xfs_noquota_mount()
            .parent()
            .expect("the test mounts sit in a directory of the scratch disk")
            .to_path_buf();
        let img = base.join(format!("{name}.img"));
        let mount = base.join(name);
        std::fs::create_dir_all(&mount).expect("mount point");
        crate::sh(&format!(
            "set -e; truncate -s {size} {img}; {mkfs} {img} >/dev/null; \
             mount -o loop,prjquota {img} {mnt}",
            img = img.display(),
            mnt = mount.display()
        ));
        SmallFs { mount, img }
    }

    pub fn fixture(&self, tag: &str) -> Fixture {
        Fixture::new(&self.mount, tag)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.img);
    }
}

/// What `fill` reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    pub written: u64,
    pub errno: Option<i32>,
}

/// Writes up to `bytes` zeros to `path` in a child process running as `uid`
/// (`None`: as root) and reports how far it got.
pub fn fill(path: &Path, bytes: u64, uid: Option<u32>) -> Filled {
    run_fill(&[path.as_os_str(), bytes.to_string().as_ref()], uid)
}

/// Creates up to `count` empty files in `dir` as `uid`; `written` is the
/// number made.
pub fn make_files(dir: &Path, count: u64, uid: Option<u32>) -> Filled {
    run_fill(
        &[
            "--files".as_ref(),
            dir.as_os_str(),
            count.to_string().as_ref(),
        ],
        uid,
    )
}

fn run_fill(args: &[&std::ffi::OsStr], uid: Option<u32>) -> Filled {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin("fill"));
    cmd.args(args);
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    let out = cmd.output().expect("run fill");
    assert!(
        out.status.success(),
        "fill failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fill prints JSON");
    Filled {
        written: v["written"].as_u64().expect("written"),
        errno: v["errno"].as_i64().map(|e| e as i32),
    }
}

/// `statvfs` of a path: (size bytes, available bytes, files, free files).
pub fn statvfs(path: &Path) -> (u64, u64, u64, u64) {
    let f = std::fs::File::open(path).expect("open");
    let st = prjquota_core::sys::fstatfs(f.as_fd()).expect("statfs");
    let bs = st.f_frsize as u64;
    (
        st.f_blocks as u64 * bs,
        st.f_bavail as u64 * bs,
        st.f_files as u64,
        st.f_ffree as u64,
    )
}

pub const MIB: u64 = 1 << 20;

/// The uid tests write as: not root, because ext4 lets a writer with
/// CAP_SYS_RESOURCE ignore project quotas (XFS does not).
pub const WRITER: u32 = 65534;

/// One filesystem of the test matrix, and how it differs.
pub struct FsCase {
    pub name: &'static str,
    pub mount: fn() -> PathBuf,
    /// What a writer gets at the project's limit: XFS reports a full
    /// project as ENOSPC, ext4 as EDQUOT.
    pub full_errno: i32,
}

pub const XFS: FsCase = FsCase {
    name: "xfs",
    mount: crate::xfs_mount,
    full_errno: libc::ENOSPC,
};

pub const EXT4: FsCase = FsCase {
    name: "ext4",
    mount: crate::ext4_mount,
    full_errno: libc::EDQUOT,
};

impl FsCase {
    /// A fresh node on this filesystem.
    pub fn fixture(&self, tag: &str) -> Fixture {
        Fixture::new(&(self.mount)(), &format!("{}-{tag}", self.name))
    }
}

/// A spec whose volume root belongs to [`WRITER`], so tests can fill it
/// without root's privileges.
pub fn writable(spec: Spec) -> Spec {
    let w = WRITER.to_string();
    spec.param("uid", &w).param("gid", &w)
}

/// Declares each named `fn(&FsCase)` as a test on every filesystem of the
/// matrix: `xfs::name` and `ext4::name`.
#[macro_export]
macro_rules! on_every_fs {
    ($($name:ident),* $(,)?) => {
        mod xfs {
            $( #[test] fn $name() { super::$name(&$crate::fixture::XFS) } )*
        }
        mod ext4 {
            $( #[test] fn $name() { super::$name(&$crate::fixture::EXT4) } )*
        }
    };
}

/// fio writing `size` bytes in 4 KiB requests through `engine` (an
/// independent writer); `end_fsync` ends with an fsync. Returns the bytes
/// and 4 KiB requests written, after checking the file holds them.
pub fn fio(p: &Path, engine: &str, direct: bool, size: u64, end_fsync: bool) -> (u64, u64) {
    let out = Command::new("fio")
        .arg("--name=w")
        .arg(format!("--filename={}", p.display()))
        .args(["--rw=write", "--bs=4k", "--iodepth=8", "--fallocate=none"])
        .args(["--invalidate=0", "--minimal"])
        .arg(format!("--end_fsync={}", u8::from(end_fsync)))
        .arg(format!("--size={size}"))
        .arg(format!("--ioengine={engine}"))
        .arg(format!("--direct={}", u8::from(direct)))
        .output()
        .expect("run fio (Debian's fio at /usr/bin/fio)");
    assert!(
        out.status.success(),
        "fio {engine}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::metadata(p).unwrap().len(),
        size,
        "fio wrote the whole file"
    );
    (size, size / 4096)
}
