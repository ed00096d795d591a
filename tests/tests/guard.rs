//! The quota-escape guard (`prjquota_ebpf::guard`) against Debian's kernel:
//! a file's owner, and root without CAP_SYS_ADMIN (root in a default Docker
//! container), can move a file out of its volume's project or clear
//! PROJINHERIT on a directory. In detect mode that goes through and is
//! counted as allowed; in enforce mode (BPF LSM) it fails with EPERM, is
//! counted as denied, and the volume's usage still includes the file. The
//! plugin, other attribute changes and everything outside volume roots are
//! left alone. On XFS and ext4.
//!
//! Run in the VM:
//!
//! ```sh
//! cargo xtask test --vm-only --filter 'binary(guard)'   # add --kernel 6.12|7 for another kernel
//! cargo xtask test --vm-only --kernel 5.10 --filter 'binary(guard) & test(detect)'   # no BPF LSM there
//! ```
//!
//! The acting processes are children of the test (`attr-act`, one change
//! each) started as another user, or under `capsh` without CAP_SYS_ADMIN,
//! with the file the test opened as their standard input. Their pids
//! identify their events.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{chown, MetadataExt};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use prjquota_core::sys::{
    self, FsXattr, FS_APPEND_FL, FS_NODUMP_FL, FS_PROJINHERIT_FL, FS_XFLAG_PROJINHERIT,
};
use prjquota_ebpf::guard::{
    bpf_lsm_active, root_identity, EventSource, Guard, GuardCounters, GuardEvent, GuardMode,
    Outcome, Outcomes, Place,
};
use prjquota_ebpf::Variant;
use prjquota_vmtests::attack::{
    act, assert_all_refused, chproj, chproj_as, open, Looper, Who, OWNER, RESTART_PHASES,
};
use prjquota_vmtests::dm::DmDisk;
use prjquota_vmtests::fixture::{fill, Fixture, FsCase, SmallFs, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::pinned;
use prjquota_vmtests::prom::{command, command_of, run_to_refusal, Exporter};
use prjquota_vmtests::{on_every_fs, scratch_dir, PYTHON};

on_every_fs!(
    detect_counts_escapes_as_allowed_and_the_kernel_refusals_as_denied,
    enforce_refuses_escapes_and_the_volume_keeps_the_usage,
    enforce_leaves_other_changes_outside_volumes_and_the_plugin_alone,
    the_guard_holds_through_exporter_restarts_and_crashes,
    a_reused_inode_number_does_not_inherit_a_deleted_root,
    a_file_outside_the_volumes_cannot_take_a_volume_project,
    an_id_in_prjquotas_ranges_cannot_be_squatted_outside_the_roots,
    the_sync_timer_re_tags_a_root_changed_behind_its_back,
    an_idle_sync_opens_no_root_and_the_verify_interval_finds_a_replaced_one,
    a_file_opened_by_handle_is_judged_fail_closed,
    enforce_keeps_every_root_generation_from_its_owner,
    a_record_the_exporter_cannot_read_keeps_its_volume_guarded,
    a_new_volume_project_cannot_be_taken_before_its_create_ends,
    a_volume_stays_guarded_while_its_delete_runs,
    a_second_exporter_leaves_the_owners_guard_alone,
    pins_changed_behind_the_owners_back_are_put_back,
    the_default_refuses_an_owners_project_change,
    a_change_through_an_overlay_is_judged_by_its_caller,
);

/// Another user, who does not own the files.
const STRANGER: u32 = 1001;
const FS_XFLAG_NOATIME: u32 = 0x0000_0040;

fn errno_of(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(255)
}

/// `FS_IOC_FSGETXATTR`, change, `FS_IOC_FSSETXATTR` (what `xfs_io -c
/// 'chproj ID'` and `chattr -p`/`-P` do with fsxattr).
fn set_xattr(fd: &OwnedFd, change: impl FnOnce(&mut FsXattr)) -> Result<(), i32> {
    let mut a = sys::get_fsxattr(fd.as_fd()).map_err(errno_of)?;
    change(&mut a);
    sys::set_fsxattr(fd.as_fd(), &a).map_err(errno_of)
}

/// Whether this kernel has file_setattr(2), by its release (6.17+).
fn has_file_setattr() -> bool {
    kernel_release() >= (6, 17)
}

fn kernel_release() -> (u32, u32) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// A volume made by the plugin, holding `data` (1 MiB) and `sub/` (with
/// `sub/more`, 256 KiB) written by [`OWNER`], and a guard watching it as
/// volume index 1.
struct Volume {
    f: Fixture,
    spec: Spec,
    path: PathBuf,
    projid: u32,
    /// `st_dev` of its filesystem.
    dev: u64,
}

impl Volume {
    fn new(fs: &FsCase, tag: &str) -> Volume {
        Volume::in_fixture(fs.fixture(tag), tag)
    }

    fn in_fixture(f: Fixture, tag: &str) -> Volume {
        let owner = OWNER.to_string();
        let spec = Spec::new(tag, 64 * MIB as i64)
            .param("uid", &owner)
            .param("gid", &owner);
        let (path, _) = f.create(&spec);
        let projid = f.project_id(&spec.id);
        assert_eq!(fill(&path.join("data"), MIB, Some(OWNER)).errno, None);
        let sub = path.join("sub");
        fs::create_dir(&sub).unwrap();
        chown(&sub, Some(OWNER), Some(OWNER)).unwrap();
        assert_eq!(fill(&sub.join("more"), MIB / 4, Some(OWNER)).errno, None);
        assert_eq!(Fixture::project_of(&path.join("data")), (projid, false));
        assert_eq!(Fixture::project_of(&sub), (projid, true));
        let dev = fs::metadata(&path).unwrap().dev();
        Volume {
            f,
            spec,
            path,
            projid,
            dev,
        }
    }

    /// The root as the guard keys it, with its project ID.
    fn root(&self) -> (u64, u64, u32, u32) {
        let (dev, ino, gen) = root_identity(&self.path).unwrap();
        (dev, ino, gen, self.projid)
    }

    /// The attempts counted against this volume's project.
    fn of(&self, c: &GuardCounters) -> Outcomes {
        c.project(self.dev, self.projid)
    }

    fn used(&self) -> u64 {
        self.f.quota(self.projid).used_bytes
    }
}

fn load(mode: GuardMode) -> Guard {
    let g = Guard::load(mode).unwrap_or_else(|e| panic!("Guard::load({mode}): {e}"));
    if mode == GuardMode::Enforce {
        assert!(
            g.enforcing(),
            "the VM's kernel has the BPF LSM: {:?}",
            g.not_enforcing().map(|w| w.to_string())
        );
    }
    g
}

/// The build and detect hook the guard must pick here, from the kernel
/// release (the guard itself probes instead): `bpf_loop` arrived in 5.17,
/// `vfs_fileattr_set` in 5.13.
fn expected_build() -> (Variant, &'static str) {
    let k = kernel_release();
    if k >= (5, 17) {
        (Variant::Helpers, "vfs_fileattr_set")
    } else if k >= (5, 13) {
        (Variant::Context, "vfs_fileattr_set")
    } else {
        (Variant::Context, "security_file_ioctl")
    }
}

/// The events of one child.
fn of(events: &[GuardEvent], pid: u32) -> Vec<GuardEvent> {
    events.iter().filter(|e| e.pid == pid).cloned().collect()
}

fn outcomes(allowed: u64, denied: u64) -> Outcomes {
    Outcomes { allowed, denied }
}

// ---- detect

fn detect_counts_escapes_as_allowed_and_the_kernel_refusals_as_denied(fs: &FsCase) {
    let v = Volume::new(fs, "guard-detect");
    let mut g = load(GuardMode::Detect);
    assert!(!g.enforcing());
    assert_eq!(g.mode(), GuardMode::Detect);
    assert_eq!(
        (g.variant(), g.detect_hook()),
        expected_build(),
        "the build the probes chose on {:?}",
        kernel_release()
    );
    g.set_roots(&[v.root()]).unwrap();
    let before = g.read().unwrap();
    assert_eq!(v.of(&before), outcomes(0, 0));
    let used = v.used();
    assert!(used >= MIB + MIB / 4, "{used}");

    // The owner moves its file out of the project: it works (the escape
    // the guard exists for), and the volume stops paying for it.
    let data = open(&v.path.join("data"));
    let (owner_pid, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Ok(()), "detect mode refuses nothing");
    assert_eq!(Fixture::project_of(&v.path.join("data")).0, 0);
    let after = v.used();
    eprintln!("{}: usage {used} -> {after} after chproj 0", fs.name);
    assert!(
        after + MIB <= used,
        "the file left the project: {used} -> {after}"
    );

    // Root without CAP_SYS_ADMIN clears PROJINHERIT on a directory it does
    // not own (CAP_FOWNER), through fsxattr and through SETFLAGS.
    let sub = open(&v.path.join("sub"));
    let inherit = format!("{FS_XFLAG_PROJINHERIT:x}");
    let (root_pid, r) = act(
        Who::RootWithoutSysAdmin,
        Some(&sub),
        &["xflags-clear", &inherit],
    );
    assert_eq!(r, Ok(()));
    assert_eq!(Fixture::project_of(&v.path.join("sub")), (v.projid, false));
    // Back (restoring the volume's state is no attempt), then chattr -P.
    set_xattr(&sub, |a| a.xflags |= FS_XFLAG_PROJINHERIT).unwrap();
    let inherit_fl = format!("{FS_PROJINHERIT_FL:x}");
    let (flags_pid, r) = act(
        Who::RootWithoutSysAdmin,
        Some(&sub),
        &["flags-clear", &inherit_fl],
    );
    assert_eq!(r, Ok(()));
    // Before 5.13 (vfs_fileattr_set) XFS's SETFLAGS keeps PROJINHERIT
    // whatever the flags say: no escape, and none counted.
    let old = kernel_release() < (5, 13);
    let setflags_escapes = !(old && fs.name == "xfs");
    assert_eq!(
        Fixture::project_of(&v.path.join("sub")),
        (v.projid, !setflags_escapes)
    );

    // Someone who does not own the file: the kernel refuses (EPERM; EACCES
    // from ext4 before 5.13), counted as denied.
    let refusal = if old && fs.name == "ext4" {
        libc::EACCES
    } else {
        libc::EPERM
    };
    let more = open(&v.path.join("sub/more"));
    let (stranger_pid, r) = chproj_as(Who::User(STRANGER), &more, 0);
    assert_eq!(r, Err(refusal));

    // The owner as root of its own user namespace (a rootless container):
    // the kernel forbids a project change from there (EINVAL), counted as
    // denied.
    let (userns_pid, r) = chproj_as(Who::UserInUserNs(OWNER), &more, 0);
    assert_eq!(r, Err(libc::EINVAL), "chproj from a user namespace");
    assert_eq!(Fixture::project_of(&v.path.join("sub/more")).0, v.projid);

    // The owner through the 32-bit ioctl (int $0x80): counted as the
    // native one, except before 5.13, where it goes uncounted (a gap
    // docs/kernels.md names).
    let (compat_pid, r) = act(Who::User(OWNER), Some(&more), &["chproj-compat", "0"]);
    assert_eq!(r, Ok(()), "chproj through the 32-bit ioctl");
    assert_eq!(Fixture::project_of(&v.path.join("sub/more")).0, 0);

    let c = g.read().unwrap();
    let compat_counted = !old;
    let allowed = 2 + u64::from(setflags_escapes) + u64::from(compat_counted);
    assert_eq!(
        v.of(&c).since(&v.of(&before)),
        outcomes(allowed, 2),
        "{c:?}"
    );
    assert_eq!(
        c.privileged, before.privileged,
        "restoring PROJINHERIT is no attempt"
    );
    assert_eq!(c.events_lost, 0);

    let events = g.drain_events();
    for e in &events {
        eprintln!("{}: event {e:?}", fs.name);
    }
    let e = of(&events, owner_pid);
    assert_eq!(e.len(), 1, "{events:?}");
    let e = &e[0];
    assert_eq!(
        (e.place, e.result, e.source, e.uid, e.privileged),
        (
            Place::Volume,
            Outcome::Allowed,
            EventSource::Fileattr,
            OWNER,
            false
        )
    );
    assert!(e.changes_project && !e.clears_inherit, "{e:?}");
    assert_eq!((e.projid, e.volume_projid, e.errno), (0, v.projid, None));
    assert_eq!(e.ino, fs::metadata(v.path.join("data")).unwrap().ino());
    assert_eq!(e.st_dev, fs::metadata(&v.path).unwrap().dev());
    assert_ne!(e.cgroup_id, 0);
    assert!(!e.comm.is_empty());
    let escaped: &[u32] = if setflags_escapes {
        &[root_pid, flags_pid]
    } else {
        assert!(of(&events, flags_pid).is_empty(), "{events:?}");
        &[root_pid]
    };
    for &pid in escaped {
        let e = of(&events, pid);
        assert_eq!(e.len(), 1, "{events:?}");
        assert!(e[0].clears_inherit && !e[0].changes_project, "{:?}", e[0]);
        assert_eq!(
            (e[0].result, e[0].uid, e[0].privileged),
            (Outcome::Allowed, 0, false)
        );
    }
    let e = of(&events, stranger_pid);
    assert_eq!(e.len(), 1, "{events:?}");
    assert_eq!((e[0].result, e[0].errno), (Outcome::Denied, Some(refusal)));
    let e = of(&events, userns_pid);
    assert_eq!(e.len(), 1, "{events:?}");
    assert_eq!(
        (e[0].result, e[0].errno, e[0].uid, e[0].privileged),
        (Outcome::Denied, Some(libc::EINVAL), OWNER, false)
    );
    assert!(e[0].changes_project, "{:?}", e[0]);
    let e = of(&events, compat_pid);
    assert_eq!(e.len(), usize::from(compat_counted), "{events:?}");
    if compat_counted {
        assert_eq!(
            (e[0].result, e[0].uid, e[0].changes_project),
            (Outcome::Allowed, OWNER, true)
        );
    }
    assert_eq!(
        events.len(),
        4 + usize::from(setflags_escapes) + usize::from(compat_counted),
        "{events:?}"
    );
    assert!(g.drain_events().is_empty());
}

// ---- enforce

fn enforce_refuses_escapes_and_the_volume_keeps_the_usage(fs: &FsCase) {
    let v = Volume::new(fs, "guard-enforce");
    // A file 40 directories down (deeper than the write telemetry walks).
    let mut deep = v.path.clone();
    for i in 0..40 {
        deep.push(format!("d{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    let deep_file = deep.join("f");
    fs::write(&deep_file, b"deep").unwrap();
    chown(&deep_file, Some(OWNER), Some(OWNER)).unwrap();

    let mut g = load(GuardMode::Enforce);
    eprintln!("{}: enforcing with {:?}", fs.name, g.lsm_programs());
    assert_eq!(g.mode(), GuardMode::Enforce);
    g.set_roots(&[v.root()]).unwrap();
    let used = v.used();

    let data = open(&v.path.join("data"));
    let sub = open(&v.path.join("sub"));
    let root = open(&v.path);
    let deep_fd = open(&deep_file);
    let mut refused: Vec<(&str, u32)> = Vec::new();
    for (what, who, fd, step) in [
        ("owner: chproj 0", Who::User(OWNER), &data, 0),
        (
            "owner: chproj 0 on its directory",
            Who::User(OWNER),
            &sub,
            0,
        ),
        ("owner: chproj 0 at depth 40", Who::User(OWNER), &deep_fd, 0),
        (
            "root w/o CAP_SYS_ADMIN: chproj 0",
            Who::RootWithoutSysAdmin,
            &data,
            0,
        ),
        (
            "root w/o CAP_SYS_ADMIN: chproj 4242",
            Who::RootWithoutSysAdmin,
            &data,
            1,
        ),
        (
            "root w/o CAP_SYS_ADMIN: clear PROJINHERIT (fsxattr)",
            Who::RootWithoutSysAdmin,
            &sub,
            2,
        ),
        (
            "root w/o CAP_SYS_ADMIN: chattr -P (SETFLAGS)",
            Who::RootWithoutSysAdmin,
            &sub,
            3,
        ),
        (
            "owner: chattr -P on the volume root (SETFLAGS)",
            Who::User(OWNER),
            &root,
            3,
        ),
        (
            "owner: clear PROJINHERIT on the volume root (fsxattr)",
            Who::User(OWNER),
            &root,
            2,
        ),
        (
            "owner: chproj 0 through the 32-bit ioctl (int $0x80)",
            Who::User(OWNER),
            &data,
            4,
        ),
        (
            "root w/o CAP_SYS_ADMIN: clear PROJINHERIT through the 32-bit ioctl",
            Who::RootWithoutSysAdmin,
            &sub,
            5,
        ),
    ] {
        let inherit = format!("{FS_XFLAG_PROJINHERIT:x}");
        let inherit_fl = format!("{FS_PROJINHERIT_FL:x}");
        let args: [&str; 2] = match step {
            0 => ["chproj", "0"],
            1 => ["chproj", "4242"],
            2 => ["xflags-clear", &inherit],
            4 => ["chproj-compat", "0"],
            5 => ["xflags-clear-compat", &inherit],
            _ => ["flags-clear", &inherit_fl],
        };
        let (pid, r) = act(who, Some(fd), &args);
        eprintln!("{}: {what}: {r:?}", fs.name);
        assert_eq!(r, Err(libc::EPERM), "{what}");
        refused.push((what, pid));
    }
    // file_setattr(2) (6.17+): the system call, not an ioctl.
    let data_path = v.path.join("data");
    let path_arg = data_path.to_str().expect("a UTF-8 path");
    let (pid, r) = act(Who::User(OWNER), None, &["file-setattr", path_arg, "0"]);
    eprintln!("{}: owner: file_setattr(2) project 0: {r:?}", fs.name);
    if has_file_setattr() {
        assert_eq!(r, Err(libc::EPERM), "file_setattr(2) under enforce");
        refused.push(("owner: file_setattr(2) project 0", pid));
    } else {
        assert_eq!(r, Err(libc::ENOSYS), "no file_setattr(2) before 6.17");
    }
    // Nothing moved; the volume still pays for its files.
    assert_eq!(Fixture::project_of(&v.path.join("data")), (v.projid, false));
    assert_eq!(Fixture::project_of(&v.path.join("sub")), (v.projid, true));
    assert_eq!(Fixture::project_of(&v.path), (v.projid, true));
    assert_eq!(Fixture::project_of(&deep_file).0, v.projid);
    assert_eq!(v.used(), used);
    assert!(used >= MIB + MIB / 4, "{used}");

    // An owner setting what is already there (the volume's project ID,
    // PROJINHERIT kept) is no attempt.
    let (_, r) = chproj_as(Who::User(OWNER), &data, v.projid);
    assert_eq!(r, Ok(()));

    let c = g.read().unwrap();
    assert_eq!(v.of(&c), outcomes(0, refused.len() as u64), "{c:?}");
    assert_eq!(
        (c.walk_limit.total(), c.unreadable, c.events_lost),
        (0, 0, 0)
    );
    let events = g.drain_events();
    for (what, pid) in &refused {
        let e = of(&events, *pid);
        assert_eq!(e.len(), 1, "{what}: {events:?}");
        let e = &e[0];
        eprintln!("{}: {what}: {e:?}", fs.name);
        assert_eq!(
            (e.place, e.result, e.source, e.errno, e.privileged),
            (
                Place::Volume,
                Outcome::Denied,
                EventSource::Lsm,
                Some(libc::EPERM),
                false
            ),
            "{what}"
        );
        assert!(e.changes_project || e.clears_inherit, "{what}");
    }
    assert_eq!(events.len(), refused.len(), "{events:?}");

    // The same with the usual tool, where it is at home: `xfs_io -c chproj`
    // as the owner, named in the event.
    if fs.name == "xfs" {
        let out = Command::new("setpriv")
            .args([
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "xfs_io",
                "-c",
                "chproj 0",
            ])
            .arg(v.path.join("data"))
            .output()
            .expect("setpriv xfs_io");
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("xfs: xfs_io chproj 0 as the owner: {stderr}");
        assert!(stderr.contains("Operation not permitted"), "{stderr}");
        let events = g.drain_events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!((events[0].comm.as_str(), events[0].uid), ("xfs_io", OWNER));
        refused.push(("xfs_io chproj 0", events[0].pid));
        assert_eq!(v.of(&g.read().unwrap()), outcomes(0, refused.len() as u64));
        assert_eq!(v.used(), used);
    }

    // The plugin (and anyone with CAP_SYS_ADMIN) may: this process, as a
    // root child and in place, moves a file out and back.
    let missed_before = g.read().unwrap().missed_runs;
    let (pid, r) = chproj_as(Who::Root, &data, 0);
    assert_eq!(r, Ok(()));
    assert_eq!(Fixture::project_of(&v.path.join("data")).0, 0);
    chproj(&data, v.projid).unwrap();
    assert_eq!(v.used(), used);
    let c = g.read().unwrap();
    assert_eq!(v.of(&c), outcomes(0, refused.len() as u64));
    let missed = c
        .missed_runs
        .zip(missed_before)
        .map_or(0, |(after, before)| after - before);
    if c.privileged == 0 && missed > 0 {
        // The kernel skipped the detecting program for this change (a task
        // preempted inside it on the same CPU, as other tests' loops make
        // on a preemptible kernel): unseen, but counted as missed, which
        // is what the exporter exposes and alerts on.
        eprintln!(
            "{}: the privileged change was a missed run ({missed})",
            fs.name
        );
        return;
    }
    assert_eq!(c.privileged, 1, "{c:?}");
    let events = g.drain_events();
    let e = of(&events, pid);
    assert_eq!(e.len(), 1, "{events:?}");
    assert!(
        e[0].privileged && e[0].result == Outcome::Allowed,
        "{:?}",
        e[0]
    );
    assert_eq!(
        events.len(),
        1,
        "restoring the volume's ID is no attempt: {events:?}"
    );
}

fn enforce_leaves_other_changes_outside_volumes_and_the_plugin_alone(fs: &FsCase) {
    let v = Volume::new(fs, "guard-others");
    let mut g = load(GuardMode::Enforce);
    g.set_roots(&[v.root()]).unwrap();

    // Other attributes inside the volume: the owner sets nodump on its file
    // and its directory (SETFLAGS keeps PROJINHERIT, fsxattr keeps the
    // project ID); root without CAP_SYS_ADMIN (it keeps
    // CAP_LINUX_IMMUTABLE) makes a file append-only and back.
    let data = open(&v.path.join("data"));
    let sub = open(&v.path.join("sub"));
    let steps: [(&str, Who, &OwnedFd, u8); 5] = [
        (
            "owner: chattr +d file (SETFLAGS)",
            Who::User(OWNER),
            &data,
            0,
        ),
        ("owner: chattr +d dir (SETFLAGS)", Who::User(OWNER), &sub, 0),
        (
            "owner: noatime through fsxattr on its dir",
            Who::User(OWNER),
            &sub,
            1,
        ),
        (
            "root w/o CAP_SYS_ADMIN: chattr +a",
            Who::RootWithoutSysAdmin,
            &data,
            2,
        ),
        (
            "root w/o CAP_SYS_ADMIN: chattr -a",
            Who::RootWithoutSysAdmin,
            &data,
            3,
        ),
    ];
    let (nodump, noatime, append) = (
        format!("{FS_NODUMP_FL:x}"),
        format!("{FS_XFLAG_NOATIME:x}"),
        format!("{FS_APPEND_FL:x}"),
    );
    for (what, who, fd, step) in steps {
        let args: [&str; 2] = match step {
            0 => ["flags-set", &nodump],
            1 => ["xflags-set", &noatime],
            2 => ["flags-set", &append],
            _ => ["flags-clear", &append],
        };
        let (_, r) = act(who, Some(fd), &args);
        eprintln!("{}: {what}: {r:?}", fs.name);
        assert_eq!(r, Ok(()), "{what}");
    }
    assert_eq!(Fixture::project_of(&v.path.join("sub")), (v.projid, true));
    let out = Command::new("lsattr")
        .arg("-d")
        .arg(v.path.join("sub"))
        .output()
        .unwrap();
    eprintln!(
        "{}: lsattr: {}",
        fs.name,
        String::from_utf8_lossy(&out.stdout).trim()
    );

    // Outside every volume root, on the same filesystem: an owner's project
    // change is none of the guard's business.
    let outside = scratch_dir(&(fs.mount)(), &format!("{}-guard-outside", fs.name));
    let file = outside.join("f");
    fs::write(&file, b"outside").unwrap();
    chown(&file, Some(OWNER), Some(OWNER)).unwrap();
    let fd = open(&file);
    chproj(&fd, 4242).unwrap();
    let (_, r) = chproj_as(Who::User(OWNER), &fd, 0);
    assert_eq!(r, Ok(()), "outside the volumes");
    assert_eq!(Fixture::project_of(&file).0, 0);

    // The plugin, enforcing: create, resize and delete volumes, the guard
    // watching the new one too.
    let other = Spec::new("guard-plugin", 16 * MIB as i64);
    let (path2, _) = v.f.create(&other);
    let projid2 = v.f.project_id(&other.id);
    let (dev2, ino2, gen2) = root_identity(&path2).unwrap();
    g.set_roots(&[v.root(), (dev2, ino2, gen2, projid2)])
        .unwrap();
    let mut grown = other.clone();
    grown.max = 32 * MIB as i64;
    let (p, bytes) = v.f.create(&grown);
    assert_eq!((p, bytes), (path2.clone(), 32 * MIB as i64));
    assert_eq!(Fixture::project_of(&path2), (projid2, true));
    v.f.node.delete(&grown).ok();
    assert!(!path2.exists());
    v.f.node.delete(&v.spec).ok();
    assert!(!v.path.exists());

    let c = g.read().unwrap();
    assert_eq!(
        (v.of(&c), c.project(dev2, projid2)),
        (outcomes(0, 0), outcomes(0, 0)),
        "{c:?}"
    );
    assert_eq!(c.walk_limit.total(), 0);
    let events = g.drain_events();
    assert!(
        events.iter().all(|e| e.privileged),
        "only privileged changes, if any: {events:?}"
    );
}

// ---- the inode generation

/// The four ways to set an inode's generation (`attr-act setversion`).
const SETVERSION: [&str; 4] = ["fs", "ext4", "fs-compat", "ext4-compat"];

fn generation(path: &std::path::Path) -> u32 {
    sys::inode_generation(open(path).as_fd()).unwrap()
}

fn enforce_keeps_every_root_generation_from_its_owner(fs: &FsCase) {
    root_generation_under_enforce(Volume::new(fs, "guard-gen"), fs.name, false);
}

/// Roots are keyed by `{dev, ino, generation}`; on ext4 without
/// `metadata_csum` an inode's owner may set its generation, so an owner
/// who did it to its volume root would take the volume out of the guard
/// and then move its files out of the project. Refused, in every encoding.
#[test]
fn enforce_keeps_a_root_generation_on_ext4_without_metadata_csum() {
    let small = SmallFs::ext4_without_metadata_csum("guard-gen", 64 * MIB);
    root_generation_under_enforce(
        Volume::in_fixture(small.fixture("guard-gen"), "guard-gen"),
        "ext4 without metadata_csum",
        true,
    );
}

/// `applies`: the filesystem lets an owner set a generation (the kernel,
/// without the guard, would have let the attack through).
fn root_generation_under_enforce(v: Volume, fs_name: &str, applies: bool) {
    let mut g = load(GuardMode::Enforce);
    g.set_roots(&[v.root()]).unwrap();
    let root = open(&v.path);
    let data = open(&v.path.join("data"));
    let before = generation(&v.path);
    let mut refused = Vec::new();
    for encoding in SETVERSION {
        for (who, fd, what) in [
            (Who::User(OWNER), &root, "owner, on the volume root"),
            (
                Who::RootWithoutSysAdmin,
                &root,
                "root w/o CAP_SYS_ADMIN, on the root",
            ),
            (Who::User(OWNER), &data, "owner, on a file"),
        ] {
            let (pid, r) = act(who, Some(fd), &["setversion", encoding, "4242"]);
            eprintln!("{fs_name}: setversion {encoding} by {what}: {r:?}");
            assert_eq!(r, Err(libc::EPERM), "setversion {encoding} by {what}");
            refused.push(pid);
        }
    }
    assert_eq!(generation(&v.path), before, "the root's generation");
    // The root is still the guard's: its files stay in the project.
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "chproj 0 after the generation attempts"
    );
    assert_eq!(Fixture::project_of(&v.path.join("data")).0, v.projid);

    let c = g.read().unwrap();
    assert_eq!(v.of(&c), outcomes(0, refused.len() as u64 + 1), "{c:?}");
    let events = g.drain_events();
    for pid in &refused {
        let e = of(&events, *pid);
        assert_eq!(e.len(), 1, "pid {pid}: {events:?}");
        assert_eq!(
            (
                e[0].result,
                e[0].source,
                e[0].sets_generation,
                e[0].changes_project
            ),
            (Outcome::Denied, EventSource::Lsm, true, false),
            "{:?}",
            e[0]
        );
    }

    // A privileged caller is let through to the filesystem, which applies
    // it only where the attack is real (ext4 with metadata_csum refuses
    // with EOPNOTSUPP, XFS has no such ioctl).
    let (_, r) = act(Who::Root, Some(&root), &["setversion", "fs", "4242"]);
    eprintln!("{fs_name}: setversion by root: {r:?}");
    if applies {
        assert_eq!(r, Ok(()));
        assert_eq!(generation(&v.path), 4242);
    } else {
        assert!(matches!(r, Err(e) if e != libc::EPERM), "{r:?}");
        assert_eq!(generation(&v.path), before);
    }
}

/// Detect mode on ext4 without `metadata_csum`: an owner's change of its
/// volume root's generation is counted as an allowed attempt and logged,
/// on every kernel (before 5.13 the context build judges every ioctl; from
/// 5.13, where the change never reaches `vfs_fileattr_set`, the generation
/// ioctls are judged apart). A round trip (the generation set and set back,
/// the key the same at the end) is seen by its first change: the second is
/// made on a root that is not its key's any more, which the guard cannot
/// tell from a file outside every root.
#[test]
fn detect_counts_a_root_generation_change() {
    let small = SmallFs::ext4_without_metadata_csum("guard-gen-detect", 64 * MIB);
    let v = Volume::in_fixture(small.fixture("guard-gen-detect"), "guard-gen-detect");
    let mut g = load(GuardMode::Detect);
    g.set_roots(&[v.root()]).unwrap();
    let root = open(&v.path);
    let before = generation(&v.path);
    let (pid, r) = act(Who::User(OWNER), Some(&root), &["setversion", "fs", "4242"]);
    assert_eq!(r, Ok(()), "detect refuses nothing");
    assert_eq!(generation(&v.path), 4242);
    let (back, r) = act(
        Who::User(OWNER),
        Some(&root),
        &["setversion", "fs", &before.to_string()],
    );
    assert_eq!(r, Ok(()));
    assert_eq!(generation(&v.path), before, "the round trip");
    let c = g.read().unwrap();
    assert_eq!(v.of(&c), outcomes(1, 0), "{c:?}");
    let events = g.drain_events();
    let e = of(&events, pid);
    assert_eq!(e.len(), 1, "{events:?}");
    assert!(
        e[0].sets_generation && e[0].result == Outcome::Allowed,
        "{e:?}"
    );
    assert!(of(&events, back).is_empty(), "{events:?}");
}

// ---- single tests

/// The kernel facts the guard relies on, and both modes loading.
#[test]
fn guard_loads_in_both_modes_and_says_so() {
    let (active, list) = bpf_lsm_active().expect("/sys/kernel/security/lsm");
    eprintln!("active LSMs: {list}");
    assert!(active, "Debian's kernel runs the BPF LSM: {list}");

    let g = load(GuardMode::Detect);
    assert_eq!(
        (g.mode(), g.enforcing(), g.lsm_programs().is_empty()),
        (GuardMode::Detect, false, true)
    );
    assert!(g.not_enforcing().is_none(), "detect was asked for");
    drop(g);

    let g = load(GuardMode::Enforce);
    eprintln!("enforce: {g:?}");
    assert_eq!(g.requested_mode(), GuardMode::Enforce);
    // Which variant (sleepable or not) of a hook loads is the kernel's
    // choice (6.1 has no sleepable file_ioctl_compat); the hooks are not.
    let hooks: Vec<&str> = g
        .lsm_programs()
        .iter()
        .map(|p| p.split_once('/').map_or(*p, |(_, hook)| hook))
        .collect();
    assert_eq!(
        hooks,
        expected_enforcers(),
        "the hooks that cover every path on this kernel: {:?}",
        g.lsm_programs()
    );
    assert!(g.not_enforcing().is_none());
    let c = g.read().unwrap();
    assert!(c.projects.is_empty());
}

/// What enforcement must attach here, from facts the guard does not use to
/// decide: the kernel release, and whether the kernel's BTF names the compat
/// hook at all (a string search, not a BTF parse).
fn expected_enforcers() -> Vec<&'static str> {
    if kernel_release() >= (6, 17) {
        // The generation ioctls never reach inode_file_setattr.
        return vec!["inode_file_setattr", "file_ioctl", "file_ioctl_compat"];
    }
    let btf = fs::read("/sys/kernel/btf/vmlinux").unwrap();
    let has_compat = btf
        .windows(b"bpf_lsm_file_ioctl_compat\0".len())
        .any(|w| w == b"bpf_lsm_file_ioctl_compat\0");
    if has_compat {
        vec!["file_ioctl", "file_ioctl_compat"]
    } else {
        vec!["file_ioctl"]
    }
}

/// Two guards at once (two exporters, or a test beside a running
/// exporter): each counts its own roots.
#[test]
fn two_guards_count_their_own_volumes() {
    let v = Volume::new(&prjquota_vmtests::fixture::XFS, "guard-two");
    let mut a = load(GuardMode::Enforce);
    let mut b = load(GuardMode::Detect);
    a.set_roots(&[v.root()]).unwrap();
    let data = open(&v.path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Err(libc::EPERM));
    assert_eq!(v.of(&a.read().unwrap()), outcomes(0, 1));
    assert_eq!(v.of(&b.read().unwrap()), outcomes(0, 0), "b has no roots");
    assert!(b.drain_events().is_empty());
    b.set_roots(&[v.root()]).unwrap();
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Err(libc::EPERM), "a still enforces");
    assert_eq!(v.of(&a.read().unwrap()), outcomes(0, 2));
    // Before 6.17 a's LSM refuses in the ioctl, before vfs_fileattr_set:
    // b's fexit never runs. From 6.17 a refuses inside vfs_fileattr_set,
    // and b sees the call fail: a denied attempt, as it would for the
    // kernel's own refusal.
    let seen_by_b = u64::from(kernel_release() >= (6, 17));
    assert_eq!(v.of(&b.read().unwrap()), outcomes(0, seen_by_b));
    drop(a);
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Ok(()), "no guard enforcing any more");
    assert_eq!(v.of(&b.read().unwrap()), outcomes(1, seen_by_b));
}

/// The real exporter with `--guard=enforce`: the attempt is refused,
/// counted for its volume, and logged with the process that made it.
#[test]
fn the_exporter_counts_refuses_and_logs_attempts() {
    const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";
    let v = Volume::new(&prjquota_vmtests::fixture::XFS, "guard-exporter");
    let exp = Exporter::start_with(&[&v.f.node.volumes_dir], &["--guard=enforce", "--ebpf=off"]);
    let labels = |result| {
        [
            ("namespace", v.spec.namespace.as_str()),
            ("node_pool", "default"),
            ("volume_id", v.spec.id.as_str()),
            ("result", result),
        ]
    };
    // The moment it says ready, and no later: the first attempt is refused
    // and counted for its volume at the very next scrape.
    let data = open(&v.path.join("data"));
    let (pid, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "an escape right after start-up\n{}",
        exp.log()
    );
    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_enforcing", &[]),
        1.0,
        "{}",
        exp.log()
    );
    assert_eq!(
        e.value("prjquota_exporter_guard_mode", &[("mode", "enforce")]),
        1.0
    );
    assert_eq!(e.value(ATTEMPTS, &labels("denied")), 1.0, "{}", e.text);
    assert_eq!(e.value(ATTEMPTS, &labels("allowed")), 0.0);
    // The kernels of the matrix that load the guard report skipped runs
    // (5.12+): a count, never absent.
    assert!(
        e.get("prjquota_exporter_guard_missed_runs_total", &[])
            .is_some(),
        "{}",
        e.text
    );
    let log = exp.log();
    let line = log
        .lines()
        .find(|l| l.contains("quota escape attempt refused") && l.contains(&format!("pid={pid} ")))
        .unwrap_or_else(|| panic!("no log line for pid {pid}:\n{log}"));
    eprintln!("exporter: {line}");
    assert!(
        line.contains(&v.spec.id) && line.contains("uid=1000"),
        "{line}"
    );

    // A volume created while the exporter runs is guarded the moment the
    // plugin returns (it announces the volume and waits), with no scrape in
    // between: the owner's first escape is refused too.
    let owner = OWNER.to_string();
    let spec = Spec::new("guard-exporter-new", 64 * MIB as i64)
        .param("uid", &owner)
        .param("gid", &owner);
    let (path, _) = v.f.create(&spec);
    assert_eq!(fill(&path.join("data"), MIB, Some(OWNER)).errno, None);
    let data = open(&path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "an escape right after the create returned\n{}",
        exp.log()
    );
    let e = exp.scrape();
    let new_labels = [
        ("namespace", spec.namespace.as_str()),
        ("node_pool", "default"),
        ("volume_id", spec.id.as_str()),
        ("result", "denied"),
    ];
    assert_eq!(e.value(ATTEMPTS, &new_labels), 1.0, "{}", e.text);
    assert_eq!(
        e.value(
            "prjquota_exporter_announcements_total",
            &[("result", "registered")]
        ),
        1.0,
        "{}",
        exp.log()
    );
}

/// The exporter as shipped, with no `--guard` flag, on a kernel whose BPF
/// LSM is active (every kernel of the matrix but 5.10): the owner's
/// project change is refused from the first attempt, through
/// FS_IOC_FSSETXATTR and through `chattr -p`, and the mode in force is
/// published and logged as enforce.
fn the_default_refuses_an_owners_project_change(fs: &FsCase) {
    const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";
    let v = Volume::new(fs, "guard-default");
    let exp = Exporter::start_with(&[&v.f.node.volumes_dir], &["--ebpf=off"]);
    let data = open(&v.path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "{}: the owner's FS_IOC_FSSETXATTR under the default --guard\n{}",
        fs.name,
        exp.log()
    );
    let more = v.path.join("sub").join("more");
    let out = Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "chattr",
            "-p",
            "0",
        ])
        .arg(&more)
        .output()
        .expect("run chattr through setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Operation not permitted"),
        "{}: the owner's chattr -p under the default --guard: {} {err}\n{}",
        fs.name,
        out.status,
        exp.log()
    );
    assert_eq!(Fixture::project_of(&v.path.join("data")).0, v.projid);
    assert_eq!(Fixture::project_of(&more).0, v.projid);

    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_mode", &[("mode", "enforce")]),
        1.0,
        "{}",
        e.text
    );
    assert!(
        !e.text
            .contains("prjquota_exporter_guard_not_enforcing_reason{"),
        "{}",
        e.text
    );
    let labels = [("volume_id", v.spec.id.as_str()), ("result", "denied")];
    assert_eq!(e.value(ATTEMPTS, &labels), 2.0, "{}", e.text);
    let ready = exp.wait_for_line("msg=\"ready:", Duration::from_secs(30));
    assert!(ready.contains("guard=enforce"), "{ready}");
    // prjquota check reads the same from the pins.
    let line = prjquota_vmtests::check_guard_line(&v.f.node.volumes_dir);
    assert!(
        line["ok"] == true && line.get("warning").is_none(),
        "{line:#}"
    );
    assert!(
        line["detail"].as_str().unwrap().starts_with("enforcing"),
        "{line:#}"
    );
}

// ---- the guard through a node's life (pinned, synced, no scrape)

/// The exporter with an enforcing guard (no write telemetry) on `v`'s
/// volumes directory, and no scrape: registration comes from its start-up
/// fill and its sync timer only.
fn guarding(v: &Volume, args: &[&str]) -> Exporter {
    let mut all = vec!["--guard=enforce", "--ebpf=off"];
    all.extend_from_slice(args);
    Exporter::start_with(&[&v.f.node.volumes_dir], &all)
}

/// An owner loops on `chproj 0` while the exporter stops and starts again
/// (SIGTERM, as `systemctl restart` and an upgrade do) and while it is
/// killed (kill -9) and started again: not one attempt goes through, and
/// the owner does try while no exporter runs. The pins of each start
/// replace those of the start before.
fn the_guard_holds_through_exporter_restarts_and_crashes(fs: &FsCase) {
    let v = Volume::new(fs, "guard-restarts");
    let dir = v.f.node.volumes_dir.clone();
    let exp = guarding(&v, &[]);
    let first = pinned::dir_of(&dir).expect("the exporter pinned its guard");
    let data = open(&v.path.join("data"));
    let looper = Looper::start(&data, 0, RESTART_PHASES.len());
    looper.wait_attempts(50);

    looper.enter(1);
    let log = exp.stop_leaving_pins();
    assert!(log.contains("quota-escape guard pinned"), "{log}");
    // The exporter is gone: the owner keeps trying.
    looper.wait_attempts(200);
    let exp = guarding(&v, &[]);
    looper.enter(2);
    let second = pinned::dir_of(&dir).expect("pinned again");
    assert_ne!(second, first, "a start pins a new guard");
    assert!(!first.exists(), "the start before's pins are removed");
    assert!(
        exp.log().contains("pins of an earlier start were removed"),
        "{}",
        exp.log()
    );
    looper.wait_attempts(50);

    looper.enter(3);
    let _ = exp.kill();
    looper.wait_attempts(200);
    let exp = guarding(&v, &[]);
    looper.enter(4);
    let third = pinned::dir_of(&dir).expect("pinned again");
    assert!(!second.exists() && third.exists());
    looper.wait_attempts(50);
    let tally = looper.stop();

    for (name, (refused, through)) in RESTART_PHASES.iter().zip(&tally) {
        eprintln!(
            "MEASURE guard_{}_{}: attempts {} went_through {through}",
            fs.name,
            name.split(':').next().unwrap().replace([' ', '-'], "_"),
            refused + through
        );
    }
    assert_all_refused(&RESTART_PHASES, &tally);
    assert_eq!(Fixture::project_of(&v.path.join("data")), (v.projid, false));

    // The documented way to take the guard away: an exporter started with
    // --guard=off removes the pins of its volumes directories, and is ready
    // only once the kernel has detached the programs they held.
    let _ = exp.stop_leaving_pins();
    assert!(third.exists());
    let off = Exporter::start_with(&[&dir], &["--guard=off", "--ebpf=off"]);
    assert!(
        !third.exists() && pinned::dir_of(&dir).is_none(),
        "--guard=off was ready with the pins left\n{}",
        off.log()
    );
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(
        r,
        Ok(()),
        "a guard still refused once --guard=off was ready\n{}",
        off.log()
    );
    chproj(&data, v.projid).unwrap();
    drop(off);
}

/// A deleted volume's root leaves an entry keyed by its inode number AND
/// generation: a file of another volume that gets the same inode number is
/// not taken for that root, and cannot take the deleted volume's project
/// ID. (The sync timer is slowed down so that the deleted root's entry is
/// still there, as it would be if nothing removed it.)
fn a_reused_inode_number_does_not_inherit_a_deleted_root(fs: &FsCase) {
    let gone = Volume::new(fs, "guard-reuse-gone");
    let owner = OWNER.to_string();
    let spec = Spec::new("guard-reuse-kept", 64 * MIB as i64)
        .param("uid", &owner)
        .param("gid", &owner);
    let (kept, _) = gone.f.create(&spec);
    let kept_projid = gone.f.project_id(&spec.id);
    let exp = guarding(&gone, &["--guard.sync-interval=60m"]);
    let dir = gone.f.node.volumes_dir.clone();
    let old = pinned::key_of(&gone.path);
    assert!(
        pinned::roots(&dir)
            .iter()
            .any(|(k, p)| (k.dev, k.ino, *p) == (old.dev, old.ino, gone.projid)),
        "the exporter put the root in: {:?}",
        pinned::roots(&dir)
    );
    gone.f.node.delete(&gone.spec).ok();
    assert!(!gone.path.exists());

    // New entries in the kept volume until one gets the deleted root's
    // inode number (directories and files: ext4 places them apart).
    let mut found = None;
    let mut made = 0;
    for i in 0..4000 {
        let p = kept.join(format!("n{i}"));
        if i % 2 == 0 {
            fs::create_dir(&p).unwrap();
        } else {
            fs::write(&p, b"x").unwrap();
        }
        made += 1;
        if fs::metadata(&p).unwrap().ino() == old.ino {
            found = Some(p);
            break;
        }
    }
    eprintln!(
        "{}: the deleted root's inode number {} came back: {:?} after {made} new entries",
        fs.name, old.ino, found
    );
    let target = match found {
        Some(p) => {
            let key = pinned::key_of(&p);
            assert_ne!(key.gen, old.gen, "a reused inode has a new generation");
            // Whatever removed it, the deleted root's entry is put back as
            // it was: the reused number must not match it.
            pinned::insert_root(&dir, old, gone.projid);
            p
        }
        None => {
            // Not reached within the bound: the same semantics on a file
            // whose number is in the map under another generation.
            let p = kept.join("n1");
            let key = pinned::key_of(&p);
            pinned::insert_root(
                &dir,
                prjquota_ebpf::guard::GuardRootKey {
                    gen: key.gen.wrapping_add(1),
                    ..key
                },
                gone.projid,
            );
            p
        }
    };
    chown(&target, Some(OWNER), Some(OWNER)).unwrap();
    let fd = open(&target);
    let (_, r) = chproj_as(Who::User(OWNER), &fd, gone.projid);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "{}: taking the deleted volume's project ID {} on a reused inode number",
        fs.name,
        gone.projid
    );
    assert_eq!(Fixture::project_of(&target).0, kept_projid);
    drop(exp);
}

/// Outside every volume, on the same filesystem, an unprivileged process
/// cannot give a file a volume's project ID (it would fill that volume's
/// quota): refused and counted against that volume. Root with
/// CAP_SYS_ADMIN may; another project ID is no business of the guard.
fn a_file_outside_the_volumes_cannot_take_a_volume_project(fs: &FsCase) {
    const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";
    let v = Volume::new(fs, "guard-outside");
    let exp = guarding(&v, &[]);
    let outside = scratch_dir(&(fs.mount)(), &format!("{}-guard-squat", fs.name));
    let file = outside.join("f");
    fs::write(&file, b"squatter").unwrap();
    chown(&file, Some(OWNER), Some(OWNER)).unwrap();
    let fd = open(&file);
    let (_, r) = chproj_as(Who::User(OWNER), &fd, v.projid);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "{}: owner, outside, the volume's ID",
        fs.name
    );
    let (_, r) = chproj_as(Who::RootWithoutSysAdmin, &fd, v.projid);
    assert_eq!(r, Err(libc::EPERM), "{}: root w/o CAP_SYS_ADMIN", fs.name);
    // The 32-bit ioctl with its argument in a page the owner never touched:
    // the kernel's copy faults it in, the guard's non-sleepable compat
    // program (6.1 has no sleepable one) cannot: refused unread.
    let (_, r) = act(
        Who::User(OWNER),
        Some(&fd),
        &["chproj-compat-cold", &v.projid.to_string()],
    );
    assert_eq!(r, Err(libc::EPERM), "{}: owner, 32-bit, cold page", fs.name);
    assert_eq!(Fixture::project_of(&file).0, 0);
    let (_, r) = chproj_as(Who::User(OWNER), &fd, 4242);
    assert_eq!(r, Ok(()), "another project ID outside the volumes");
    let (_, r) = chproj_as(Who::Root, &fd, v.projid);
    assert_eq!(r, Ok(()), "root with CAP_SYS_ADMIN");
    chproj(&fd, 0).unwrap();
    // Read only now: counted in the kernel, not from a scrape.
    let e = exp.scrape();
    let labels = [
        ("namespace", v.spec.namespace.as_str()),
        ("node_pool", "default"),
        ("volume_id", v.spec.id.as_str()),
        ("result", "denied"),
    ];
    // A sleepable compat program reads the cold page (faulting it in), and
    // from 6.17 inode_file_setattr judges the kernel's own copy: either
    // counts the attempt as one outside the roots. The non-sleepable compat
    // program refuses it unread, which names no ID. None is counted against
    // the volume the ID names: its owner did not make them.
    let log = exp.log();
    let read_cold =
        log.contains("lsm.s/file_ioctl_compat") || log.contains("lsm/inode_file_setattr");
    assert_eq!(
        e.value(
            "prjquota_exporter_guard_outside_attempts_total",
            &[("result", "denied")]
        ),
        if read_cold { 3.0 } else { 2.0 },
        "{}",
        e.text
    );
    assert_eq!(e.value(ATTEMPTS, &labels), 0.0, "{}", e.text);
    drop(exp);
    fs::remove_dir_all(&outside).unwrap();
}

/// Outside every root, an ID no volume holds yet but in the ranges
/// prjquota.toml gives the volumes or the allocations is refused too (and
/// counted apart): a local user who tagged its files with the IDs after
/// the last volume's made every later create step over each of them,
/// seconds per create for thousands. An ID outside the ranges is theirs.
fn an_id_in_prjquotas_ranges_cannot_be_squatted_outside_the_roots(fs: &FsCase) {
    let v = Volume::new(fs, "guard-squat-range");
    let (lo, hi) = (v.f.id_min, v.f.id_max);
    let allocs = hi + 1..=hi + 10;
    v.f.set_config(&format!(
        "alloc_project_id_min = {}\nalloc_project_id_max = {}\n",
        allocs.start(),
        allocs.end()
    ));
    let dir = v.f.node.plugin_dir.display().to_string();
    let exp = guarding(&v, &["--plugin-dir", &dir]);
    let outside = scratch_dir(&(fs.mount)(), &format!("{}-guard-squat-range", fs.name));
    let file = outside.join("f");
    fs::write(&file, b"squatter").unwrap();
    chown(&file, Some(OWNER), Some(OWNER)).unwrap();
    let fd = open(&file);
    let free_volume_id = (lo..=hi).rev().find(|&id| id != v.projid).unwrap();
    for (what, id) in [
        ("a volume ID no volume holds", free_volume_id),
        ("an allocation ID", *allocs.start()),
    ] {
        assert_eq!(
            chproj_as(Who::User(OWNER), &fd, id).1,
            Err(libc::EPERM),
            "{}: {what} ({id}) taken outside the roots",
            fs.name
        );
    }
    assert_eq!(Fixture::project_of(&file).0, 0);
    let theirs = allocs.end() + 1;
    assert_eq!(
        chproj_as(Who::User(OWNER), &fd, theirs).1,
        Ok(()),
        "{}: an ID outside prjquota's ranges",
        fs.name
    );
    chproj(&fd, 0).unwrap();
    let e = exp.scrape();
    assert_eq!(
        e.value(
            "prjquota_exporter_guard_outside_attempts_total",
            &[("result", "denied")]
        ),
        2.0,
        "{}",
        e.text
    );
    drop(exp);
    fs::remove_dir_all(&outside).unwrap();
}

/// An overlay mounted by root (as dockerd mounts a container's root) whose
/// upper layer lies in a volume, and another whose upper layer lies beside
/// the volumes on their filesystem: overlayfs passes a change of one of its
/// files down to the real inode with its mounter's credentials, so the
/// owner, and root without CAP_SYS_ADMIN, would look privileged. Their
/// project changes through either overlay are refused and the real files
/// keep their project; root with CAP_SYS_ADMIN still changes them.
fn a_change_through_an_overlay_is_judged_by_its_caller(fs: &FsCase) {
    const ATTEMPTS: &str = "nomad_host_volume_projid_change_attempts_total";
    // A filesystem of its own: the guard of a test running beside this one,
    // with roots on the shared filesystem, refuses an unreadable request
    // anywhere on it, and a BPF LSM program that refuses first keeps the
    // programs attached after it from running: they would not count it.
    let small = SmallFs::new(fs, "guard-overlay", 320 * MIB);
    let v = Volume::in_fixture(small.fixture("guard-overlay"), "guard-overlay");
    let exp = guarding(&v, &[]);
    let inside = Overlay::mount(&small.mount, &v.path, &format!("{}-ovl-in", fs.name));
    let beside = Overlay::mount(
        &small.mount,
        &scratch_dir(&small.mount, &format!("{}-ovl-beside", fs.name)),
        &format!("{}-ovl-out", fs.name),
    );

    let denied_labels = [
        ("namespace", v.spec.namespace.as_str()),
        ("node_pool", "default"),
        ("volume_id", v.spec.id.as_str()),
        ("result", "denied"),
    ];
    // Each attempt, its pid and the volume's count after it: a count that
    // comes up short names the attempt that went uncounted.
    let mut trail = Vec::new();
    for (o, id, what) in [
        (&inside, 0, "out of the volume's project"),
        (&inside, 4242, "into another project"),
        (
            &beside,
            v.projid,
            "into the volume's project from beside it",
        ),
    ] {
        let fd = open(&o.merged.join("f"));
        for who in [Who::User(OWNER), Who::RootWithoutSysAdmin] {
            let (pid, r) = chproj_as(who, &fd, id);
            assert_eq!(
                r,
                Err(libc::EPERM),
                "{}: {who:?} through an overlay, {what}",
                fs.name
            );
            let counted = exp.scrape().get(ATTEMPTS, &denied_labels);
            trail.push(format!(
                "{who:?} {what}: pid {pid}, count after {counted:?}"
            ));
        }
        assert_eq!(
            Fixture::project_of(&o.upper.join("f")).0,
            o.projid,
            "{}: the real file's project, {what}",
            fs.name
        );
    }
    let fd = open(&inside.merged.join("f"));
    assert_eq!(
        chproj_as(Who::Root, &fd, 4242).1,
        Ok(()),
        "root with CAP_SYS_ADMIN"
    );
    assert_eq!(Fixture::project_of(&inside.upper.join("f")).0, 4242);
    assert_eq!(chproj_as(Who::Root, &fd, v.projid).1, Ok(()));
    drop(fd);

    // Inside the volume each attempt counts against it. Beside it the
    // request names the volume's project where the kernel's own copy is
    // judged (inode_file_setattr, 6.17+): an attempt outside every root,
    // counted apart; before, overlayfs hands the file on without the
    // request, refused unread and named to no volume.
    let e = exp.scrape();
    let read_beside = exp.log().contains("lsm/inode_file_setattr");
    assert_eq!(
        e.value(
            "prjquota_exporter_guard_outside_attempts_total",
            &[("result", "denied")]
        ),
        if read_beside { 2.0 } else { 0.0 },
        "{}: the attempts beside the volume",
        fs.name
    );
    assert_eq!(
        e.value(ATTEMPTS, &denied_labels),
        4.0,
        "{}: the volume's attempts; missed runs {:?}, unattributed {:?}; attempt by attempt:\n{}\nits log:\n{}",
        fs.name,
        e.get("prjquota_exporter_guard_missed_runs_total", &[]),
        e.get(
            "prjquota_exporter_guard_unattributed_attempts_total",
            &[("result", "denied")]
        ),
        trail.join("\n"),
        exp.log_lines_with(&v.spec.id)
    );
    drop(exp);
}

/// An overlay of an empty lower layer and an upper layer in `upper_in`
/// holding one file `f` owned by the owner (project: the one `upper_in`
/// gives it), mounted by root under a scratch directory of `mount`;
/// unmounted (lazily) on drop.
struct Overlay {
    merged: PathBuf,
    upper: PathBuf,
    projid: u32,
}

impl Overlay {
    fn mount(mount: &std::path::Path, upper_in: &std::path::Path, tag: &str) -> Overlay {
        let base = scratch_dir(mount, tag);
        let (lower, merged) = (base.join("lower"), base.join("merged"));
        let (upper, work) = (
            upper_in.join(format!("{tag}-upper")),
            upper_in.join(format!("{tag}-work")),
        );
        for d in [&lower, &merged, &upper, &work] {
            fs::create_dir(d).unwrap();
        }
        fs::write(upper.join("f"), b"through an overlay").unwrap();
        chown(upper.join("f"), Some(OWNER), Some(OWNER)).unwrap();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount -t overlay -o {opts}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let projid = Fixture::project_of(&upper.join("f")).0;
        Overlay {
            merged,
            upper,
            projid,
        }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.merged).status();
    }
}

/// Waits up to 10 s for the sync timer to give `v`'s root its project ID
/// and PROJINHERIT back; how long it took.
fn wait_re_tagged(fs: &FsCase, v: &Volume, exp: &Exporter, what: &str) -> Duration {
    let start = Instant::now();
    while Fixture::project_of(&v.path) != (v.projid, true) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}: {what} was not re-tagged within 10 s\n{}",
            fs.name,
            exp.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// A process with CAP_SYS_ADMIN (here: the test) takes a volume root out of
/// its project and clears PROJINHERIT: the exporter's sync timer puts both
/// back within seconds, with no scrape, logs it and counts it.
fn the_sync_timer_re_tags_a_root_changed_behind_its_back(fs: &FsCase) {
    let v = Volume::new(fs, "guard-drift");
    let exp = guarding(&v, &["--guard.sync-interval=500ms"]);
    // Past the rounds the new volume's record makes full: the change must
    // be found because the guard counted it (a privileged change), not
    // because a registry moved or `--guard.verify-interval` (1 min) ran out.
    std::thread::sleep(Duration::from_millis(1500));
    let root = open(&v.path);
    set_xattr(&root, |a| {
        a.projid = 0;
        a.xflags &= !FS_XFLAG_PROJINHERIT;
    })
    .unwrap();
    assert_eq!(Fixture::project_of(&v.path), (0, false));
    let took = wait_re_tagged(fs, &v, &exp, "the root");
    eprintln!(
        "MEASURE guard_{}_drift_retag_seconds {:.3}",
        fs.name,
        took.as_secs_f64()
    );
    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_drift_total", &[]),
        1.0,
        "{}",
        e.text
    );
    assert_eq!(e.value("prjquota_exporter_guard_pinned", &[]), 1.0);
    let log = exp.log();
    assert!(
        log.lines()
            .any(|l| l.contains("re-tagged") && l.contains(&v.spec.id)),
        "{log}"
    );
    drop(exp);
}

/// At rest the sync timer's rounds open no volume root: nothing a
/// registry, the pins or the guard's counters say moved. A root replaced
/// by root (renamed away, a new directory made in its place: no change the
/// guard judges) is found by the round `--guard.verify-interval` forces,
/// re-keyed and re-tagged.
fn an_idle_sync_opens_no_root_and_the_verify_interval_finds_a_replaced_one(fs: &FsCase) {
    let v = Volume::new(fs, "guard-idle");
    let checks = |exp: &Exporter| {
        let e = exp.scrape();
        (
            e.value("prjquota_exporter_guard_syncs_total", &[("result", "ok")]),
            e.value("prjquota_exporter_guard_sync_root_checks_total", &[]),
        )
    };
    let exp = guarding(&v, &["--guard.sync-interval=200ms"]);
    // The record's directory changed just now: rounds stay full until its
    // change is a second old.
    std::thread::sleep(Duration::from_millis(1500));
    let (rounds, opened) = checks(&exp);
    assert!(opened >= 1.0, "{}: the fill opened no root", fs.name);
    std::thread::sleep(Duration::from_secs(2));
    let (rounds_after, opened_after) = checks(&exp);
    assert!(
        rounds_after - rounds >= 5.0,
        "{}: {rounds} rounds, then {rounds_after} two seconds later\n{}",
        fs.name,
        exp.log()
    );
    assert_eq!(
        opened_after,
        opened,
        "{}: quiet rounds opened roots\n{}",
        fs.name,
        exp.log()
    );
    exp.stop_leaving_pins();

    let exp = guarding(
        &v,
        &["--guard.sync-interval=200ms", "--guard.verify-interval=1s"],
    );
    // Past the first timed round (full: a new exporter's), so that only
    // the verify interval's can find the change.
    std::thread::sleep(Duration::from_millis(1500));
    let moved = v.path.with_extension("moved-test");
    fs::rename(&v.path, &moved).unwrap();
    fs::create_dir(&v.path).unwrap();
    assert_eq!(Fixture::project_of(&v.path), (0, false));
    wait_re_tagged(fs, &v, &exp, "the replaced root");
    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_drift_total", &[]),
        1.0,
        "{}",
        e.text
    );
    // The volume's own directory back in its place for its delete.
    fs::remove_dir(&v.path).unwrap();
    fs::rename(&moved, &v.path).unwrap();
    drop(exp);
}

/// A record the exporter cannot read (a newer plugin's record version, a
/// file that is no record) must not take its volume out of the guard: the
/// owner loops on `chproj 0` while the record is rewritten with the next
/// version, through a restart of the exporter with it, and while a FIFO
/// stands in the record's place. Nothing goes through.
fn a_record_the_exporter_cannot_read_keeps_its_volume_guarded(fs: &FsCase) {
    use prjquota_core::record::{record_file_name, records_dir};
    let v = Volume::new(fs, "guard-record");
    let dir = v.f.node.volumes_dir.clone();
    let record = records_dir(&dir).join(record_file_name(&v.spec.id.parse().unwrap()));
    let original = fs::read(&record).unwrap();
    let replace = |body: &[u8]| {
        let tmp = record.with_extension("tmp-test");
        fs::write(&tmp, body).unwrap();
        fs::rename(&tmp, &record).unwrap();
    };
    let exp = guarding(&v, &["--guard.sync-interval=200ms"]);
    let data = open(&v.path.join("data"));
    const NAMES: [&str; 4] = [
        "a readable record",
        "a record of the next version",
        "restarted with it",
        "a FIFO in the record's place",
    ];
    let looper = Looper::start(&data, 0, NAMES.len());
    looper.wait_attempts(50);

    looper.enter(1);
    let mut newer: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let version = newer["version"].as_u64().unwrap();
    newer["version"] = (version + 1).into();
    replace(&serde_json::to_vec(&newer).unwrap());
    // Well past the rounds that dropped the volume before.
    std::thread::sleep(Duration::from_secs(2));
    looper.wait_attempts(100);
    let first_log = exp.log();

    looper.enter(2);
    let _ = exp.stop_leaving_pins();
    let exp = guarding(&v, &["--guard.sync-interval=200ms"]);
    std::thread::sleep(Duration::from_secs(2));
    looper.wait_attempts(100);

    looper.enter(3);
    // Renamed over the record: a moment without any record would be a
    // delete as far as the exporter can tell.
    let fifo = record.with_extension("fifo-test");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    fs::rename(&fifo, &record).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    looper.wait_attempts(100);
    let tally = looper.stop();
    for (name, (refused, through)) in NAMES.iter().zip(&tally) {
        eprintln!(
            "{}: {name}: {refused} refused, {through} went through",
            fs.name
        );
        assert_eq!(
            *through,
            0,
            "{name}: changes went through ({refused} refused)\n{}",
            exp.log()
        );
        assert!(*refused > 0, "{name}: no attempt was made");
    }
    assert_eq!(Fixture::project_of(&v.path.join("data")), (v.projid, false));
    for log in [first_log, exp.log()] {
        assert!(
            log.lines()
                .any(|l| l.contains("cannot read a volume's record") && l.contains(&v.spec.id)),
            "{log}"
        );
    }
    replace(&original);
    drop(exp);
}

/// A new volume's project ID is predictable (the lowest free one). A create
/// stopped after its claim (as a crash, or a slow one, leaves it): the
/// owner of a file outside the volumes cannot give that file the claimed ID
/// (which would charge the new volume). When a privileged process does,
/// the next create refuses with the reason rather than start the volume
/// with someone else's usage, and the one after gets a fresh ID.
fn a_new_volume_project_cannot_be_taken_before_its_create_ends(fs: &FsCase) {
    use prjquota_vmtests::fault_bin;
    use prjquota_vmtests::nomad::{run_plugin_with, TEST_DEADLINE};
    let f = Fixture::with_plugin(
        &(fs.mount)(),
        &format!("{}-guard-claim", fs.name),
        &fault_bin(),
    );
    let dir = f.node.volumes_dir.clone();
    // One volume first, so the guard watches this filesystem; no sync
    // round meanwhile: only the plugin puts the new project in.
    let first = Volume::in_fixture(f, "guard-claim");
    let f = &first.f;
    let exp = Exporter::start_with(
        &[&dir],
        &["--guard=enforce", "--ebpf=off", "--guard.sync-interval=60m"],
    );
    let outside = scratch_dir(&(fs.mount)(), &format!("{}-guard-claim-squat", fs.name));
    let file = outside.join("f");
    fs::write(&file, vec![7u8; 64 << 10]).unwrap();
    chown(&file, Some(OWNER), Some(OWNER)).unwrap();
    let fd = open(&file);
    let stop_after_claim = |spec: &Spec| {
        let out = run_plugin_with(
            &f.node.plugin,
            "create",
            &f.node.create_vars(spec),
            TEST_DEADLINE,
            &[("PRJQUOTA_FAULT", "create:reserved".into())],
        );
        assert!(
            !out.status.success(),
            "the fault point was not reached: {out:?}"
        );
        prjquota_vmtests::records::reserved_project(&dir, &spec.id)
            .expect("the stopped create reserved an ID")
    };

    let spec = Spec::new("claimed", 8 * MIB as i64);
    let pid = stop_after_claim(&spec);
    let (_, r) = chproj_as(Who::User(OWNER), &fd, pid);
    assert_eq!(
        r,
        Err(libc::EPERM),
        "{}: the owner took project {pid} before its create ended",
        fs.name
    );
    assert_eq!(Fixture::project_of(&file).0, 0);
    let (path, _) = f.create(&spec);
    assert_eq!(f.project_id(&spec.id), pid);
    let q = f.quota(pid);
    assert_eq!(
        q.used_inodes, 1,
        "{}: a new volume holds its root only: {q:?}",
        fs.name
    );

    // A privileged process is let through: the create says so and leaves.
    let spec2 = Spec::new("claimed-then-taken", 8 * MIB as i64);
    let pid2 = stop_after_claim(&spec2);
    chproj(&fd, pid2).unwrap();
    let out = f.node.create(&spec2);
    assert!(
        !out.status.success(),
        "{}: created with someone else's usage: {out:?}",
        fs.name
    );
    assert!(out.stdout.contains("already charges"), "{out:?}");
    assert!(
        !out.stdout.contains("  "),
        "the error reads as one sentence: {out:?}"
    );
    assert!(
        !dir.join(&spec2.id).exists(),
        "a refused create left its directory"
    );
    chproj(&fd, 0).unwrap();
    let (_, _) = f.create(&spec2);
    let pid3 = f.project_id(&spec2.id);
    assert_ne!(pid3, pid2, "the ID that was taken is used again");
    assert_eq!(f.quota(pid3).used_inodes, 1);

    assert!(f.node.delete(&spec2).status.success());
    assert!(f.node.delete(&spec).status.success());
    assert!(!path.exists());
    drop(exp);
    fs::remove_dir_all(&outside).unwrap();
}

/// Delete removes a volume's tree before its root leaves the guard: an
/// owner who keeps a file of the volume open and loops on `chproj 0`
/// through the removal of the whole tree (a delete stopped right after it,
/// at `delete:removed`) is refused every time; the next delete finishes.
fn a_volume_stays_guarded_while_its_delete_runs(fs: &FsCase) {
    use prjquota_vmtests::fault_bin;
    use prjquota_vmtests::fixture::make_files;
    use prjquota_vmtests::nomad::{run_plugin_with, TEST_DEADLINE};
    let f = Fixture::with_plugin(
        &(fs.mount)(),
        &format!("{}-guard-delete", fs.name),
        &fault_bin(),
    );
    let v = Volume::in_fixture(f, "guard-delete");
    // Enough files for the removal to take seconds under emulation, past
    // the exporter's sync rounds.
    let many = v.path.join("many");
    fs::create_dir(&many).unwrap();
    chown(&many, Some(OWNER), Some(OWNER)).unwrap();
    make_files(&many, 3000, Some(OWNER));
    let exp = guarding(&v, &[]);
    let data = open(&v.path.join("sub/more"));
    let looper = Looper::start(&data, 0, 2);
    looper.wait_attempts(50);
    looper.enter(1);
    let started = Instant::now();
    let out = run_plugin_with(
        &v.f.node.plugin,
        "delete",
        &v.f.node.delete_vars(&v.spec, &v.path),
        TEST_DEADLINE,
        &[("PRJQUOTA_FAULT", "delete:removed".into())],
    );
    let took = started.elapsed();
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    assert!(
        !v.path.exists(),
        "the tree is removed before the fault point"
    );
    let tally = looper.stop();
    eprintln!("{}: the removal took {took:?}; attempts {tally:?}", fs.name);
    for (phase, (refused, through)) in ["before the delete", "while the tree is removed"]
        .iter()
        .zip(&tally)
    {
        assert_eq!(
            *through,
            0,
            "{}: {phase}: {through} changes went through ({refused} refused)\n{}",
            fs.name,
            exp.log()
        );
        assert!(*refused > 0, "{}: {phase}: no attempt was made", fs.name);
    }
    assert!(v.f.node.delete(&v.spec).status.success());
    drop(exp);
}

/// An operator debugging on another port starts a second exporter by hand
/// on the service's volumes directory: with default flags, with
/// `--guard=detect`, with `--guard=off`. None of them swaps, removes or
/// unpins the running service's enforcing guard: the owner's project
/// changes are refused while each runs and after it stops, each says which
/// pid owns the guard, and the service's metrics stay as they were.
fn a_second_exporter_leaves_the_owners_guard_alone(fs: &FsCase) {
    let v = Volume::new(fs, "guard-owner");
    let dir = v.f.node.volumes_dir.clone();
    let label = [("volumes_dir", dir.to_str().expect("a UTF-8 path"))];
    let exp = guarding(&v, &[]);
    let own = pinned::dir_of(&dir).expect("the service pinned its guard");
    let data = open(&v.path.join("data"));
    let seconds: [&[&str]; 3] = [&[], &["--guard=detect"], &["--guard=off"]];
    let looper = Looper::start(&data, 0, 2 * seconds.len());
    for (i, args) in seconds.iter().enumerate() {
        looper.enter(2 * i);
        let second = Exporter::start_with(&[&dir], args);
        looper.wait_attempts(50);
        let log = second.log();
        assert!(
            log.lines().any(|l| l.contains("level=error")
                && l.contains("another exporter owns the guard")
                && l.contains(&format!("owner_pid={}", exp.pid()))),
            "{args:?}: the second exporter does not say who owns the guard\n{log}"
        );
        if !args.contains(&"--guard=off") {
            let e = second.scrape();
            assert_eq!(
                e.value(
                    "prjquota_exporter_guard_off_reason",
                    &[("reason", "owned_elsewhere")]
                ),
                1.0,
                "{args:?}\n{}",
                e.text
            );
        }
        assert_eq!(pinned::dir_of(&dir).as_ref(), Some(&own), "{args:?}\n{log}");
        looper.enter(2 * i + 1);
        let log = second.stop_leaving_pins();
        looper.wait_attempts(50);
        assert_eq!(pinned::dir_of(&dir).as_ref(), Some(&own), "{args:?}\n{log}");
        assert!(own.exists(), "{args:?}: the owner's pins went\n{log}");
    }
    let tally = looper.stop();
    for (i, (refused, through)) in tally.iter().enumerate() {
        let (args, when) = (seconds[i / 2], ["running", "stopped"][i % 2]);
        assert_eq!(
            *through,
            0,
            "{}: {args:?} {when}: changes went through ({refused} refused)\n{}",
            fs.name,
            exp.log()
        );
        assert!(*refused > 0, "{args:?} {when}: no attempt was made");
    }
    assert_eq!(Fixture::project_of(&v.path.join("data")), (v.projid, false));
    let e = exp.scrape();
    for (name, labels, want) in [
        ("prjquota_exporter_guard_pinned", &[][..], 1.0),
        ("prjquota_exporter_guard_enforcing", &[][..], 1.0),
        ("prjquota_exporter_guard_pins_own", &label[..], 1.0),
        (
            "prjquota_exporter_guard_pins_restored_total",
            &label[..],
            0.0,
        ),
    ] {
        assert_eq!(e.value(name, labels), want, "{name}\n{}", e.text);
    }
    drop(exp);
}

/// Root rewrites the service's symlink to another pin directory, then
/// removes the service's pin directory: each is reported (an error line,
/// `prjquota_exporter_guard_pins_restored_total`) and put back within a
/// sync interval, the owner's changes are refused after it, and the pins
/// put back hold the guard once the service has stopped.
fn pins_changed_behind_the_owners_back_are_put_back(fs: &FsCase) {
    let v = Volume::new(fs, "guard-repin");
    let dir = v.f.node.volumes_dir.clone();
    let label = [("volumes_dir", dir.to_str().expect("a UTF-8 path"))];
    let exp = guarding(&v, &["--guard.sync-interval=500ms"]);
    let own = pinned::dir_of(&dir).expect("the service pinned its guard");
    let links: Vec<_> = fs::read_dir(&own)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("link-"))
        .collect();
    assert!(!links.is_empty(), "{}", exp.log());
    let data = open(&v.path.join("data"));
    let wait_back = |what: &str| {
        let start = Instant::now();
        while pinned::dir_of(&dir).as_ref() != Some(&own)
            || !links.iter().all(|l| own.join(l).exists())
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{}: {what}: not put back within 10 s\n{}",
                fs.name,
                exp.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "MEASURE guard_{}_pins_put_back_seconds {:.3} ({what})",
            fs.name,
            start.elapsed().as_secs_f64()
        );
    };

    // The symlink to another directory, renamed over it as a start does.
    let other = pinned::root().join(format!("@guard-1-{}", std::process::id()));
    fs::create_dir(&other).unwrap();
    let link = prjquota_ebpf::guard::pins::link_of(pinned::root(), &dir);
    let tmp = pinned::root().join(format!("swap-{}", std::process::id()));
    std::os::unix::fs::symlink(&other, &tmp).unwrap();
    fs::rename(&tmp, &link).unwrap();
    wait_back("symlink swapped");
    assert_eq!(chproj_as(Who::User(OWNER), &data, 0).1, Err(libc::EPERM));
    fs::remove_dir(&other).unwrap();

    // The service's own pins removed: its programs stay attached while it
    // runs, and it pins them again.
    fs::remove_dir_all(&own).unwrap();
    assert_eq!(chproj_as(Who::User(OWNER), &data, 0).1, Err(libc::EPERM));
    wait_back("pin directory removed");
    assert_eq!(chproj_as(Who::User(OWNER), &data, 0).1, Err(libc::EPERM));

    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_pins_restored_total", &label),
        2.0,
        "{}",
        e.text
    );
    assert_eq!(e.value("prjquota_exporter_guard_pins_own", &label), 1.0);
    assert_eq!(e.value("prjquota_exporter_guard_pinned", &[]), 1.0);
    let log = exp.stop_leaving_pins();
    for found in ["symlink to", "own pin directory removed"] {
        assert!(
            log.lines()
                .any(|l| l.contains("level=error") && l.contains("put back") && l.contains(found)),
            "{found}\n{log}"
        );
    }
    // The pins put back are the guard once the service is gone.
    assert_eq!(
        chproj_as(Who::User(OWNER), &data, 0).1,
        Err(libc::EPERM),
        "the pins put back did not hold the guard\n{log}"
    );
    pinned::remove(&[dir]);
}

/// Opens argv[1] by file handle (through the mount argv[2]) after the
/// dentry cache was dropped, so that the file's dentry is disconnected
/// (its own parent, not the filesystem's root); then, as uid argv[3] with
/// no capability, sets its project ID to argv[4]. Prints the errno (0: the
/// change went through).
const BY_HANDLE: &str = r#"
import ctypes, fcntl, os, struct, sys, time
path, mount, uid, projid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
h = Handle(bytes=128)
mount_id = ctypes.c_int()
if libc.name_to_handle_at(-100, path.encode(), ctypes.byref(h), ctypes.byref(mount_id), 0):
    sys.exit("name_to_handle_at: errno %d" % ctypes.get_errno())
mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
# Dropped dentries make the open's dentry a disconnected one, but a lookup
# by anything else on the node between the drop and the open reconnects
# it: its path then names the volume, and the attempt would not be the
# one this test is about. Tried until the open is disconnected.
for attempt in range(20):
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
    fd = libc.open_by_handle_at(mfd, ctypes.byref(h), os.O_RDONLY)
    if fd < 0:
        sys.exit("open_by_handle_at: errno %d" % ctypes.get_errno())
    if os.readlink("/proc/self/fd/%d" % fd) != path:
        break
    os.close(fd)
    time.sleep(0.2)
else:
    sys.exit("open_by_handle_at gave a connected dentry 20 times over")
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
a = bytearray(fcntl.ioctl(fd, 0x801C581F, bytes(28)))  # FS_IOC_FSGETXATTR
struct.pack_into("I", a, 12, projid)
try:
    fcntl.ioctl(fd, 0x401C5820, bytes(a))  # FS_IOC_FSSETXATTR
    print(0)
except OSError as e:
    print(e.errno)
"#;

/// A volume's file opened by handle (open_by_handle_at, as an NFS server
/// or a process with CAP_DAC_READ_SEARCH does) has a disconnected dentry:
/// the guard cannot tell its volume and refuses its owner's change as an
/// unattributed attempt, never taking the file for one outside every
/// volume (where project 0 is anyone's to set).
fn a_file_opened_by_handle_is_judged_fail_closed(fs: &FsCase) {
    // A filesystem of its own: every guard on a device counts the
    // unattributed attempts made on it, and other tests' guards on the
    // shared mounts expect none.
    let disk = DmDisk::new(fs, "guard-handle", 400 * MIB);
    let v = Volume::in_fixture(disk.fixture("guard-handle"), "guard-handle");
    let mut g = load(GuardMode::Enforce);
    g.set_roots(&[v.root()]).unwrap();
    let used = v.used();
    let data = v.path.join("data");
    let out = Command::new(PYTHON)
        .args(["-c", BY_HANDLE])
        .arg(&data)
        .arg(disk.path())
        .args([OWNER.to_string(), "0".into()])
        .output()
        .expect("run python3");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: by handle: {}{said}",
        fs.name,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        said.trim(),
        libc::EPERM.to_string(),
        "{}: the owner's chproj 0 through a file handle (0: it went through)",
        fs.name
    );
    assert_eq!(Fixture::project_of(&data), (v.projid, false));
    assert_eq!(v.used(), used);
    let c = g.read().unwrap();
    assert_eq!(c.walk_limit, outcomes(0, 1), "{}: {c:?}", fs.name);
}

/// Pins the exporter cannot make (its pin root on a filesystem that is not
/// bpffs) would cost the guard its life beyond the exporter. Under enforce
/// the exporter refuses to start, naming the pin root and the fix; under
/// detect it says so (an error line, `prjquota_exporter_guard_pinned 0`:
/// the PrjquotaExporterGuardNotPinned alert's input) and counts while it
/// runs.
#[test]
fn a_guard_that_cannot_pin_refuses_to_enforce_and_says_so() {
    let v = Volume::new(&prjquota_vmtests::fixture::XFS, "guard-unpinned");
    let not_bpffs = scratch_dir(&prjquota_vmtests::xfs_mount(), "guard-pin-root-not-bpffs");
    let pin_root = not_bpffs.join("pins");
    let pin_arg = pin_root.to_str().expect("a UTF-8 path");
    let dirs = [v.f.node.volumes_dir.as_path()];
    // Where the plugin looks too: prjquota.toml's guard_pin_root.
    v.f.set_config(&format!("guard_pin_root = \"{pin_arg}\"\n"));
    let plugins = v.f.node.plugin_dir.to_str().expect("a UTF-8 path");

    let (status, err) = run_to_refusal(
        command(
            &dirs,
            &[
                "--guard=enforce",
                "--ebpf=off",
                "--guard.pin-root",
                pin_arg,
                "--plugin-dir",
                plugins,
            ],
            false,
        ),
        "--guard=enforce and a pin root off bpffs",
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.lines().any(|l| l.contains("msg=exiting")
            && l.contains("could not be pinned")
            && l.contains(pin_arg)
            && l.contains("--guard.pin-root")),
        "{err}"
    );
    let data = open(&v.path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, v.projid);
    assert_eq!(r, Ok(()), "an owner setting the volume's own ID");

    let exp = Exporter::start_with(
        &dirs,
        &[
            "--guard=detect",
            "--ebpf=off",
            "--guard.pin-root",
            pin_arg,
            "--plugin-dir",
            plugins,
        ],
    );
    let log = exp.log();
    assert!(
        log.lines().any(|l| l.contains("level=error")
            && l.contains("could not be pinned")
            && l.contains(pin_arg)),
        "{log}"
    );
    let e = exp.scrape();
    assert_eq!(
        e.value("prjquota_exporter_guard_pinned", &[]),
        0.0,
        "{}",
        e.text
    );
    assert!(
        !pin_root.exists(),
        "nothing is made in a pin root off bpffs"
    );
    drop(exp);
    fs::remove_dir_all(&not_bpffs).unwrap();
}

/// A start whose enforcement fails (an upgrade whose LSM program the
/// kernel refuses) exits, and the guard pinned before it goes on
/// enforcing: the new start's pins are undone, not left detecting only.
#[test]
fn a_start_that_cannot_enforce_leaves_the_pinned_guard_enforcing() {
    let v = Volume::new(&prjquota_vmtests::fixture::XFS, "guard-failed-start");
    let dir = v.f.node.volumes_dir.clone();
    let _ = guarding(&v, &[]).stop_leaving_pins();
    let before = pinned::dir_of(&dir).expect("the first start's pins");

    let mut cmd = command_of(
        &prjquota_vmtests::fault_exporter(),
        &[&dir],
        &["--guard=enforce", "--ebpf=off"],
        false,
    );
    cmd.env("PRJQUOTA_FAULT_GUARD_LSM", "1");
    let (status, err) = run_to_refusal(cmd, "PRJQUOTA_FAULT_GUARD_LSM under --guard=enforce");
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("cannot enforce (--guard=enforce)")
            && err.contains("PRJQUOTA_FAULT_GUARD_LSM"),
        "{err}"
    );
    assert_eq!(
        pinned::dir_of(&dir),
        Some(before),
        "the failed start replaced the pins\n{err}"
    );
    let data = open(&v.path.join("data"));
    let (_, r) = chproj_as(Who::User(OWNER), &data, 0);
    assert_eq!(r, Err(libc::EPERM), "the earlier guard enforces\n{err}");
    pinned::remove(&[dir]);
}

/// A start that would only detect (`--guard=detect`) after the enforcing
/// exporter stopped leaves the enforcing pins in place and says so; only
/// `--guard.replace-stronger` replaces them.
#[test]
fn a_detecting_start_leaves_an_enforcing_guard_pinned() {
    let v = Volume::new(&prjquota_vmtests::fixture::XFS, "guard-stronger");
    let dir = v.f.node.volumes_dir.clone();
    let _ = guarding(&v, &[]).stop_leaving_pins();
    let enforcing = pinned::dir_of(&dir).expect("the enforcing start's pins");
    let data = open(&v.path.join("data"));

    let detect = Exporter::start_with(&[&dir], &["--guard=detect", "--ebpf=off"]);
    let log = detect.log();
    assert!(
        log.lines().any(|l| l.contains("level=error")
            && l.contains("--guard.replace-stronger")
            && l.contains(enforcing.to_str().unwrap())),
        "{log}"
    );
    let e = detect.scrape();
    assert_eq!(
        e.value(
            "prjquota_exporter_guard_off_reason",
            &[("reason", "stronger_pinned")]
        ),
        1.0,
        "{}",
        e.text
    );
    assert_eq!(pinned::dir_of(&dir).as_ref(), Some(&enforcing), "{log}");
    assert_eq!(chproj_as(Who::User(OWNER), &data, 0).1, Err(libc::EPERM));
    let log = detect.stop_leaving_pins();
    assert_eq!(pinned::dir_of(&dir).as_ref(), Some(&enforcing), "{log}");

    let replace = Exporter::start_with(
        &[&dir],
        &["--guard=detect", "--ebpf=off", "--guard.replace-stronger"],
    );
    let now = pinned::dir_of(&dir).expect("pinned");
    assert!(now != enforcing && !enforcing.exists(), "{}", replace.log());
    assert_eq!(
        chproj_as(Who::User(OWNER), &data, 0).1,
        Ok(()),
        "a detecting guard replaced the enforcing one\n{}",
        replace.log()
    );
    chproj(&data, v.projid).unwrap();
    drop(replace);
}
