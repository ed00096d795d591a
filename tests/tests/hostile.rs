//! Workloads are hostile too: whatever a job leaves inside its volume,
//! delete removes the volume and nothing else, without following a link.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::Path;

use prjquota_core::sys;
use prjquota_vmtests::fixture::{FsCase, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;

on_every_fs!(
    a_volume_root_replaced_by_a_symlink_is_unlinked_not_followed,
    a_tree_ten_thousand_levels_deep_is_deleted,
    hard_links_fifos_and_sockets_are_removed_and_outside_files_survive,
    a_bind_mount_inside_a_volume_is_refused_and_what_it_shows_survives,
    a_mount_on_a_volume_root_is_neither_tagged_nor_removed,
);

fn mount_cmd(args: &[&str]) {
    let out = std::process::Command::new("mount")
        .args(args)
        .output()
        .expect("run mount(8)");
    assert!(
        out.status.success(),
        "mount {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A job (or an operator) bind-mounts an outside directory into its volume:
/// delete must not descend into the mount, must say so in its JSON error and
/// its log, and must remove nothing that the mount shows.
fn a_bind_mount_inside_a_volume_is_refused_and_what_it_shows_survives(fs: &FsCase) {
    let f = fs.fixture("bind");
    let outside = outside_files(&f.root);
    let spec = Spec::new("bind", 8 * MIB as i64);
    let (path, _) = f.create(&spec);
    std::fs::create_dir_all(path.join("a/mnt")).unwrap();
    std::fs::write(path.join("a/own"), b"volume data").unwrap();
    let target = path.join("a/mnt");
    mount_cmd(&[
        "--bind",
        outside.to_str().unwrap(),
        target.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(target.join("dir/keep")).unwrap(),
        b"keep",
        "the bind mount shows the outside directory"
    );

    let out = f.node.delete(&spec);
    let msg = out.error();
    assert!(
        msg.contains("mount") && msg.contains("mnt"),
        "the refusal names the mount: {msg}"
    );
    assert!(
        out.stderr.contains("mount"),
        "the refusal is logged: {}",
        out.stderr
    );
    assert_eq!(std::fs::read(outside.join("dir/keep")).unwrap(), b"keep");
    assert_eq!(std::fs::read(target.join("dir/keep")).unwrap(), b"keep");

    // Once the mount is gone, the next delete finishes the volume.
    let out = std::process::Command::new("umount")
        .arg(&target)
        .output()
        .expect("run umount(8)");
    assert!(
        out.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    f.node.delete(&spec).ok();
    assert!(!path.exists(), "the volume is deleted after the unmount");
    assert_eq!(std::fs::read(outside.join("dir/keep")).unwrap(), b"keep");
    assert!(f.record(&spec.id).is_none(), "record removed");
}

/// A directory mounted on the volume root itself: a restore refuses to use
/// it (its files keep their project) and a delete to remove it, each naming
/// the mount; once it is unmounted, the delete finishes the volume beneath.
fn a_mount_on_a_volume_root_is_neither_tagged_nor_removed(fs: &FsCase) {
    let f = fs.fixture("rootmnt");
    let outside = outside_files(&f.root);
    let spec = Spec::new("rootmnt", 8 * MIB as i64);
    let (path, _) = f.create(&spec);
    std::fs::write(path.join("own"), b"volume data").unwrap();
    mount_cmd(&["--bind", outside.to_str().unwrap(), path.to_str().unwrap()]);
    let keep = path.join("dir/keep");
    let project_before = prjquota_vmtests::fixture::Fixture::project_of(&keep);

    let msg = f.node.create(&spec).error();
    assert!(
        msg.contains("mount point"),
        "the restore names the mount: {msg}"
    );
    let msg = f.node.delete(&spec).error();
    assert!(msg.contains("mount"), "the delete names the mount: {msg}");
    assert_eq!(std::fs::read(&keep).unwrap(), b"keep");
    assert_eq!(
        prjquota_vmtests::fixture::Fixture::project_of(&keep),
        project_before,
        "a file under the mount was given the volume's project"
    );
    assert!(f.record(&spec.id).is_some(), "the record is kept");

    let out = std::process::Command::new("umount")
        .arg(&path)
        .output()
        .expect("run umount(8)");
    assert!(
        out.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The refused delete removed nothing, and finishes now.
    assert_eq!(std::fs::read(path.join("own")).unwrap(), b"volume data");
    f.node.delete(&spec).ok();
    assert!(!path.exists(), "the volume is deleted after the unmount");
    assert_eq!(std::fs::read(outside.join("dir/keep")).unwrap(), b"keep");
}

fn outside_files(root: &Path) -> std::path::PathBuf {
    let outside = root.join("outside");
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("dir/keep"), b"keep").unwrap();
    outside
}

fn a_volume_root_replaced_by_a_symlink_is_unlinked_not_followed(fs: &FsCase) {
    let f = fs.fixture("swap");
    let outside = outside_files(&f.root);
    let spec = Spec::new("swap", 8 * MIB as i64);
    let (path, _) = f.create(&spec);
    // Between create and delete the volume root becomes a link elsewhere.
    std::fs::remove_dir(&path).unwrap();
    symlink(outside.join("dir"), &path).unwrap();
    f.node.delete(&spec).ok();
    assert!(
        std::fs::symlink_metadata(&path).is_err(),
        "the link itself is gone"
    );
    assert_eq!(std::fs::read(outside.join("dir/keep")).unwrap(), b"keep");
    assert!(f.record(&spec.id).is_none());
}

fn a_tree_ten_thousand_levels_deep_is_deleted(fs: &FsCase) {
    let f = fs.fixture("deep");
    let spec = Spec::new("deep", 64 * MIB as i64);
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    // Far deeper than PATH_MAX: built one directory at a time through
    // descriptors, as a hostile job would.
    let name = CString::new("d").unwrap();
    let mut dir: OwnedFd = std::fs::File::open(&path).unwrap().into();
    for _ in 0..10_000 {
        sys::mkdirat(dir.as_fd(), &name, 0o755).unwrap();
        dir = sys::openat(dir.as_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    }
    let leaf = CString::new("leaf").unwrap();
    drop(sys::openat(dir.as_fd(), &leaf, libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap());
    drop(dir);
    let out = f.node.delete(&spec);
    out.ok();
    eprintln!(
        "MEASURE delete_10000_levels_seconds {:.3}",
        out.elapsed.as_secs_f64()
    );
    assert!(!path.exists());
    assert!(f.quota(pid).is_unused(), "every inode of the tree is gone");
}

fn hard_links_fifos_and_sockets_are_removed_and_outside_files_survive(fs: &FsCase) {
    let f = fs.fixture("special");
    let outside = outside_files(&f.root);
    let spec = Spec::new("special", 8 * MIB as i64);
    let (path, _) = f.create(&spec);
    std::fs::write(path.join("file"), b"x").unwrap();
    std::fs::hard_link(path.join("file"), path.join("hardlink")).unwrap();
    // A hard link from outside into the project is refused by the kernel
    // (EXDEV across projects with PROJINHERIT), so a job cannot pin outside
    // data inside its volume that way.
    let err = std::fs::hard_link(outside.join("dir/keep"), path.join("in")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    assert!(std::process::Command::new("mkfifo")
        .arg(path.join("fifo"))
        .status()
        .unwrap()
        .success());
    let _sock = std::os::unix::net::UnixListener::bind(path.join("sock")).unwrap();
    symlink(outside.join("dir/keep"), path.join("link")).unwrap();
    f.node.delete(&spec).ok();
    assert!(!path.exists());
    assert_eq!(std::fs::read(outside.join("dir/keep")).unwrap(), b"keep");
}
