//! A Nomad client's alloc directory, driven with the system calls Nomad
//! itself makes (client/allocdir, client/allocwatcher, the task runner's
//! hooks), so that the allocation-accounting tests replay what a node
//! does: `mkdir(2)` with Nomad's modes, `rename(2)` for sticky and
//! migrated disks (`std::fs::rename` is the bare system call, with no copy
//! fallback, as Go's `os.Rename`), `link(2)` for chroots, bind and tmpfs
//! mounts inside task directories, and garbage collection's unmount and
//! removal.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::nomad::uuid;

/// `<data_dir>/alloc`.
pub struct AllocRoot {
    pub path: PathBuf,
}

/// One allocation directory, `<data_dir>/alloc/<alloc id>`.
pub struct Alloc {
    pub id: String,
    pub path: PathBuf,
    mounts: Vec<PathBuf>,
}

fn mkdir(p: &Path, mode: u32) {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(p)
        .unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    // Go's MkdirAll is subject to the umask; Nomad then chmods the shared
    // directories (dropDirPermissions): the result is the mode asked.
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

impl AllocRoot {
    /// `<parent>/alloc`, as the client makes it at start (mode 0711).
    pub fn new(parent: &Path) -> AllocRoot {
        let path = parent.join("alloc");
        mkdir(&path, 0o711);
        AllocRoot { path }
    }

    /// AllocDir.Build: the allocation's directory and its shared `alloc/`
    /// with `data`, `logs` and `tmp`. Task directories come later, one per
    /// task, when its runner starts ([`Alloc::build_task`]).
    pub fn build_alloc(&self) -> Alloc {
        let id = uuid();
        let path = self.path.join(&id);
        mkdir(&path, 0o755);
        mkdir(&path.join("alloc"), 0o755);
        for shared in ["logs", "tmp", "data"] {
            mkdir(&path.join("alloc").join(shared), 0o777);
        }
        Alloc {
            id,
            path,
            mounts: Vec::new(),
        }
    }
}

impl Alloc {
    pub fn task(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// TaskDir.Build for a task with chroot isolation (exec, java), in
    /// Nomad's order: the task directory, `local`, `tmp` (the sign that
    /// the task starts), then the shared alloc directory bind-mounted at
    /// `<task>/alloc`, and `secrets` and `private` as small tmpfs mounts.
    /// Directories the task dir already holds (a migrated `local`, or
    /// what a restored allocation kept) are kept, as MkdirAll keeps them.
    pub fn build_task(&mut self, name: &str) -> PathBuf {
        self.task_dirs(name, &["", "local", "tmp"]);
        self.task_mounts(name);
        self.task(name)
    }

    /// [`Alloc::build_task`] with the mounts made before `tmp`, so that
    /// the exporter's walk, which `tmp` sets off, surely meets them.
    pub fn build_task_mounts_first(&mut self, name: &str) -> PathBuf {
        self.task_dirs(name, &["", "local"]);
        self.task_mounts(name);
        self.task_dirs(name, &["tmp"]);
        self.task(name)
    }

    fn task_dirs(&self, name: &str, subs: &[&str]) {
        let dir = self.task(name);
        for sub in subs {
            let (p, mode) = match *sub {
                "" => (dir.clone(), 0o777),
                "tmp" => (dir.join(sub), 0o1777),
                _ => (dir.join(sub), 0o777),
            };
            if !p.exists() {
                mkdir(&p, mode);
            }
        }
    }

    fn task_mounts(&mut self, name: &str) {
        let dir = self.task(name);
        let shared = dir.join("alloc");
        if !shared.exists() {
            mkdir(&shared, 0o777);
        }
        mount(
            Some(&self.path.join("alloc")),
            &shared,
            None,
            MsFlags::MS_BIND,
            None,
        );
        self.mounts.push(shared);
        for tmpfs in ["secrets", "private"] {
            let p = dir.join(tmpfs);
            if !p.exists() {
                mkdir(&p, 0o777);
            }
            mount(
                Some(Path::new("tmpfs")),
                &p,
                Some("tmpfs"),
                MsFlags::MS_NOEXEC,
                Some("size=1m"),
            );
            self.mounts.push(p);
        }
    }

    /// AllocDir.Move: a sticky or migrating ephemeral disk comes from the
    /// previous allocation: its `alloc/data` and each task's `local`,
    /// renamed (no copy fallback), after removing the empty ones Build
    /// made. Runs before the new allocation's task directories are built.
    pub fn move_from(&self, prev: &Alloc, tasks: &[&str]) -> std::io::Result<()> {
        let data = self.path.join("alloc/data");
        let _ = std::fs::remove_dir(&data);
        std::fs::rename(prev.path.join("alloc/data"), &data)?;
        for task in tasks {
            let from = prev.task(task).join("local");
            if !from.exists() {
                continue;
            }
            let dir = self.task(task);
            if !dir.exists() {
                mkdir(&dir, 0o777);
            }
            let local = dir.join("local");
            let _ = std::fs::remove_dir(&local);
            std::fs::rename(&from, &local)?;
        }
        Ok(())
    }

    /// The task mounts come off, the tree stays: what a node going down
    /// leaves of a running allocation.
    pub fn unmount(&mut self) {
        for m in self.mounts.drain(..).rev() {
            unmount(&m);
        }
    }

    /// Garbage collection: the task mounts come off, then the tree goes.
    pub fn destroy(mut self) {
        for m in self.mounts.drain(..).rev() {
            unmount(&m);
        }
        std::fs::remove_dir_all(&self.path)
            .unwrap_or_else(|e| panic!("remove {}: {e}", self.path.display()));
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        for m in self.mounts.drain(..).rev() {
            let _ = nix::mount::umount(&m);
        }
    }
}

/// mount(2), as Nomad's client calls it (no mount(8): it reads every mount
/// of the node for each one made).
fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) {
    nix::mount::mount(src, target, fstype, flags, data)
        .unwrap_or_else(|e| panic!("mount {src:?} on {}: {e}", target.display()));
}

fn unmount(target: &Path) {
    nix::mount::umount(target).unwrap_or_else(|e| panic!("umount {}: {e}", target.display()));
}

/// Writes `bytes` (a multiple of 4096) of data to `p`.
pub fn write_file(p: &Path, bytes: usize) {
    std::fs::write(p, vec![0x5au8; bytes]).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// A Nomad client for the accounting tests: a fixture (its plugin dir's
/// prjquota.toml), an alloc directory on the same filesystem, and a slice
/// of project IDs for allocations of its own (tests share filesystems).
pub struct AllocNode {
    pub fixture: crate::fixture::Fixture,
    pub root: AllocRoot,
    pub ids: std::ops::RangeInclusive<u32>,
}

impl Drop for AllocNode {
    /// The suite's filesystems are small and shared by every test of a
    /// pass: a node's trees go with it, or the tests after it run out of
    /// inodes. Its allocations, declared after it, are gone already, and
    /// their mounts with them.
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root.path) {
            eprintln!("cannot remove {}: {e}", self.root.path.display());
        }
    }
}

impl AllocNode {
    /// A node on `case`'s filesystem whose allocations get `ids` IDs of
    /// their own (the volumes keep the rest of the fixture's range).
    pub fn new(case: &crate::fixture::FsCase, tag: &str, ids: u32) -> AllocNode {
        Self::on(case.fixture(tag), ids)
    }

    /// A node on `fixture`'s filesystem (one of a test's own) whose
    /// allocations get `ids` IDs of their own: the top of the fixture's
    /// range while that leaves the volumes at least as many, else the
    /// `ids` above it (the fixture's filesystem must then be the test's
    /// alone: the IDs above are another fixture's).
    pub fn on(mut fixture: crate::fixture::Fixture, ids: u32) -> AllocNode {
        let width = fixture.id_max - fixture.id_min + 1;
        let range = if ids <= width / 2 {
            let alloc_min = fixture.id_max - ids + 1;
            let range = alloc_min..=fixture.id_max;
            fixture.id_max = alloc_min - 1;
            range
        } else {
            fixture.id_max + 1..=fixture.id_max + ids
        };
        fixture.set_config(&format!(
            "alloc_project_id_min = {}\nalloc_project_id_max = {}\n",
            range.start(),
            range.end()
        ));
        // Beside the volumes directory, on its filesystem, as a Nomad
        // client's data_dir holds both (a DmDisk's fixture keeps its
        // plugin directory elsewhere).
        let data_dir = fixture
            .node
            .volumes_dir
            .parent()
            .expect("the volumes directory has a parent")
            .to_path_buf();
        let root = AllocRoot::new(&data_dir);
        AllocNode {
            fixture,
            root,
            ids: range,
        }
    }

    /// The exporter's flags for this node's allocations, scanning every
    /// `scan` (`200ms` keeps the tests short), the guard and eBPF off
    /// unless `extra` says otherwise.
    pub fn exporter_args(&self, scan: &str, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--nomad.alloc-dir".into(),
            self.root.path.display().to_string(),
            "--plugin-dir".into(),
            self.fixture.node.plugin_dir.display().to_string(),
            "--nomad.alloc-scan-interval".into(),
            scan.into(),
        ];
        if !extra.iter().any(|e| e.starts_with("--guard")) {
            a.push("--guard=off".into());
        }
        if !extra.iter().any(|e| e.starts_with("--ebpf")) {
            a.push("--ebpf=off".into());
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    pub fn start_exporter(&self, extra: &[&str]) -> crate::prom::Exporter {
        let args = self.exporter_args("200ms", extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::prom::Exporter::start_with(&[&self.fixture.node.volumes_dir], &args)
    }

    /// The kernel's usage of project `id` on this node's filesystem.
    pub fn usage(&self, id: u32) -> prjquota_core::quota::ProjectQuota {
        use std::os::fd::AsFd;
        let dir = std::fs::File::open(&self.root.path).expect("open the alloc dir");
        prjquota_core::quota::get(dir.as_fd(), id).expect("quotactl")
    }
}

/// Project ID and PROJINHERIT of a path (not following a symlink's target
/// is not needed: the tests ask about directories and regular files).
pub fn project_of(p: &Path) -> (u32, bool) {
    crate::fixture::Fixture::project_of(p)
}

/// Scrapes until `pred` holds on a scrape, or panics after `within` with
/// the last scrape and the exporter's log.
pub fn scrape_until(
    exp: &crate::prom::Exporter,
    within: std::time::Duration,
    what: &str,
    pred: impl Fn(&crate::prom::Exposition) -> bool,
) -> crate::prom::Exposition {
    let deadline = std::time::Instant::now() + within;
    loop {
        let e = exp.scrape();
        if pred(&e) {
            return e;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{what}: not within {within:?}; last scrape:\n{}\nlog:\n{}",
                e.text,
                exp.log()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// An allocation's published usage, if any.
pub fn alloc_bytes(e: &crate::prom::Exposition, id: &str) -> Option<f64> {
    e.get("nomad_alloc_disk_used_bytes", &[("alloc_id", id)])
}

/// Every inode beneath `dir` on its mount (directories included, mount
/// points' contents not), with its project ID, link count and path: what
/// the tests hold against the walk.
pub fn inodes_on_mount(dir: &Path) -> Vec<(PathBuf, u32, u64)> {
    let mut out = Vec::new();
    walk_on_mount(dir, |p, m| {
        use std::os::unix::fs::MetadataExt;
        if m.file_type().is_symlink() || !(m.is_dir() || m.is_file()) {
            return;
        }
        if let Ok((pid, _)) = std::fs::File::open(p).map(|f| {
            use std::os::fd::AsFd;
            prjquota_core::quota::project_of(f.as_fd()).unwrap()
        }) {
            out.push((p.to_path_buf(), pid, m.nlink()));
        }
    });
    out
}

/// Calls `each` with the path and `lstat` of every entry beneath `dir` on
/// its mount: entries of another device and directories that are mount
/// points (the only kind Nomad makes in an allocation; a bind mount of the
/// same filesystem shows its device, its mount ID tells it) are left out,
/// with what they hold; symlinks are not followed. An `lstat` per entry
/// and a `statx` per directory, whatever the number of mounts on the node.
pub fn walk_on_mount(dir: &Path, mut each: impl FnMut(&Path, &std::fs::Metadata)) {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::symlink_metadata(dir).unwrap().dev();
    let mount = prjquota_core::sys::mount_id(std::fs::File::open(dir).unwrap().as_fd()).unwrap();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let (Ok(rd), Ok(fd)) = (std::fs::read_dir(&d), std::fs::File::open(&d)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                let name = std::ffi::CString::new(e.file_name().as_bytes()).unwrap();
                if prjquota_core::sys::mount_id_at(fd.as_fd(), &name).ok() != Some(mount) {
                    continue;
                }
            }
            each(&p, &m);
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
}
