//! The plugin's half of the pinned guard, against real kernel maps pinned
//! in bpffs (made by hand in the exporter's layout, `tests/src/pins.rs`):
//! a create puts its root into the guard before it returns, a delete takes
//! it out before its tree goes, pins a create cannot trust are refused, and
//! nothing an unprivileged neighbour does to the announce socket delays or
//! decides a create. And the exporter's half as an attacker meets it: the
//! bpffs it mounts and the pin root it accepts are root's alone, and a
//! start that dies at any step leaves the next create guarded.

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prjquota_core::guard_contract::RootKey;
use prjquota_vmtests::attack::{chproj_as, open, Who, OWNER};
use prjquota_vmtests::fixture::{fill, writable, Fixture, FsCase, MIB, XFS};
use prjquota_vmtests::nomad::{run_plugin_with, Spec, TEST_DEADLINE};
use prjquota_vmtests::pins::HandPins;
use prjquota_vmtests::prom::{command, command_of, run_to_refusal, run_to_refusal_pid, Exporter};
use prjquota_vmtests::{fault_bin, fault_exporter, on_every_fs, pinned, sh, PYTHON};

on_every_fs!(
    a_create_guards_its_root_before_it_returns,
    a_delete_keeps_the_root_guarded_until_its_tree_is_gone,
    a_new_project_is_guarded_from_its_claim,
    pins_a_create_cannot_trust_are_refused_and_leave_nothing,
    a_squatter_delays_no_create_and_decides_nothing,
    a_start_killed_at_any_step_leaves_the_next_create_guarded,
);

/// With nothing mounted at /sys/fs/bpf in a mount namespace of the
/// exporter's own (a sandbox, a container: `unshare --propagation
/// private`), a bpffs it mounted would be seen there alone, and the plugin
/// Nomad runs would find no pins to put a new volume in: it mounts none. An
/// enforcing exporter refuses to start, saying so and how to mount one on
/// the host; the default runs unpinned and says so.
#[test]
fn the_exporter_mounts_no_bpffs_the_plugin_cannot_see() {
    let f = XFS.fixture("pins-mount");
    let private = |args: &[&str]| {
        let inner = command(&[&f.node.volumes_dir], args, false);
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "while mountpoint -q /sys/fs/bpf; do umount /sys/fs/bpf || exit 97; done; exec \"$@\"",
            "sh",
        ])
        .arg(inner.get_program())
        .args(inner.get_args());
        cmd
    };
    let (status, err) = run_to_refusal(
        private(&["--guard=enforce", "--ebpf=off"]),
        "an enforcing guard with no bpffs the plugin can see",
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.lines().any(|l| l.contains("msg=exiting")
            && l.contains("seen by its own mount namespace alone")
            && l.contains("mount -t bpf -o mode=0700 bpf /sys/fs/bpf")),
        "{err}"
    );
    let e = Exporter::start_command(private(&["--ebpf=off"]));
    let m = e.scrape();
    assert_eq!(
        m.value("prjquota_exporter_guard_pinned", &[]),
        0.0,
        "{}",
        m.text
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{}/mountinfo", e.pid())).unwrap();
    assert!(
        !mountinfo
            .lines()
            .any(|l| l.split(' ').nth(4) == Some("/sys/fs/bpf")),
        "a bpffs was mounted in the exporter's own namespace:\n{mountinfo}"
    );
    e.stop();
}

/// A bpffs others may write (mode 1777: the kernel's default, which a
/// container runtime may leave): whether `nobody` made the pin root first
/// or root did (`nobody` could have replaced it), an enforcing exporter
/// refuses to start, naming the directory and the fix, and pins nothing.
#[test]
fn a_pin_root_others_could_have_made_is_refused() {
    let f = XFS.fixture("pins-1777");
    let mnt = PathBuf::from(format!("/tmp/pins-1777-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!("mount -t bpf -o mode=1777 bpf {}", mnt.display()));
    let root = mnt.join("prjquota");
    let root_arg = root.to_str().expect("a UTF-8 path");
    let st = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "mkdir"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "nobody could not squat the pin root");
    let want = format!(
        "{} is writable by users other than root (mode 1777)",
        mnt.display()
    );
    f.set_config(&format!("guard_pin_root = \"{root_arg}\"\n"));
    let plugins = f.node.plugin_dir.to_str().expect("a UTF-8 path");
    for who in ["nobody", "root"] {
        let (status, err) = run_to_refusal(
            command(
                &[&f.node.volumes_dir],
                &[
                    "--guard=enforce",
                    "--ebpf=off",
                    "--guard.pin-root",
                    root_arg,
                    "--plugin-dir",
                    plugins,
                ],
                false,
            ),
            &format!("a pin root {who} made on a 1777 bpffs"),
        );
        assert!(!status.success(), "{err}");
        assert!(
            err.lines().any(|l| l.contains("msg=exiting")
                && l.contains(&want)
                && l.contains(root_arg)
                && l.contains("chmod go-w")
                && l.contains("mode=0700")),
            "{who}: {err}"
        );
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            0,
            "{who}: pinned in a pin root refused"
        );
        std::fs::remove_dir(&root).unwrap();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .unwrap();
    }
    sh(&format!("umount {}", mnt.display()));
    std::fs::remove_dir(&mnt).unwrap();
}

/// `--guard=off` removes the pinned guard of its volumes directories. In a
/// pin root others may write (a bpffs mounted 1777, as a container runtime
/// may leave it), `nobody`'s symlinks, one named as the volumes
/// directory's link and one as a pin directory pointing at a directory of
/// root's files, would make that removal unlink those files as root: the
/// exporter trusts nothing there, removes nothing, and says why.
#[test]
fn guard_off_trusts_no_pin_root_others_may_write() {
    let f = XFS.fixture("pins-off");
    let mnt = PathBuf::from(format!("/tmp/pins-off-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!("mount -t bpf -o mode=1777 bpf {}", mnt.display()));
    let root = mnt.join("prjquota");
    let victim = f.root.join("precious");
    std::fs::create_dir_all(&victim).unwrap();
    for n in ["one", "two"] {
        std::fs::write(victim.join(n), b"keep").unwrap();
    }
    let pin_dir = root.join("@guard-1-1");
    let link = prjquota_core::guard_contract::link_of(&root, &f.node.volumes_dir);
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        let st = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "nobody: {args:?}");
    };
    as_nobody(&["mkdir".as_ref(), root.as_os_str()]);
    as_nobody(&[
        "ln".as_ref(),
        "-s".as_ref(),
        victim.as_os_str(),
        pin_dir.as_os_str(),
    ]);
    as_nobody(&[
        "ln".as_ref(),
        "-s".as_ref(),
        pin_dir.as_os_str(),
        link.as_os_str(),
    ]);
    f.set_config(&format!("guard_pin_root = \"{}\"\n", root.display()));
    let e = Exporter::start_with(
        &[&f.node.volumes_dir],
        &[
            "--guard=off",
            "--ebpf=off",
            "--guard.pin-root",
            root.to_str().unwrap(),
            "--plugin-dir",
            f.node.plugin_dir.to_str().unwrap(),
        ],
    );
    for n in ["one", "two"] {
        assert_eq!(
            std::fs::read(victim.join(n)).ok().as_deref(),
            Some(&b"keep"[..]),
            "--guard=off removed {n} through a symlink in the pin root"
        );
    }
    let log = e.log_lines_with("could not be removed");
    assert!(
        log.contains("writable by root only") || log.contains("writable by users other than root"),
        "{log}\n{}",
        e.log()
    );
    e.stop();
    sh(&format!("umount {}", mnt.display()));
    std::fs::remove_dir(&mnt).unwrap();
}

/// The plugin finds the guard where prjquota.toml's `guard_pin_root`
/// says, as the exporter pins it: a volume created under a pin root of the
/// node's own is guarded when its create returns. An exporter told to pin
/// anywhere else refuses to start, saying where the plugin looks: its
/// volumes would be guarded only from its next sync.
#[test]
fn the_plugin_finds_the_guard_where_prjquota_toml_says() {
    let f = XFS.fixture("pins-own-root");
    let root = "/sys/fs/bpf/prjquota-own-root";
    f.set_config(&format!("guard_pin_root = \"{root}\"\n"));
    let plugins = f.node.plugin_dir.to_str().unwrap();
    let (status, err) = run_to_refusal(
        command(
            &[&f.node.volumes_dir],
            &[
                "--guard=enforce",
                "--ebpf=off",
                "--guard.pin-root",
                "/sys/fs/bpf/prjquota-elsewhere",
                "--plugin-dir",
                plugins,
            ],
            false,
        ),
        "a pin root the plugin does not look in",
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("msg=exiting") && l.contains("guard_pin_root") && l.contains(root)),
        "{err}"
    );
    // Without the flag it pins where the file says; the plugin writes there.
    let exp = Exporter::start_with(
        &[&f.node.volumes_dir],
        &["--guard=enforce", "--ebpf=off", "--plugin-dir", plugins],
    );
    assert!(
        std::fs::symlink_metadata(prjquota_core::guard_contract::link_of(
            Path::new(root),
            &f.node.volumes_dir
        ))
        .is_ok(),
        "not pinned under {root}:\n{}",
        exp.log()
    );
    let owner = OWNER.to_string();
    let spec = Spec::new("own-root", 16 * MIB as i64)
        .param("uid", &owner)
        .param("gid", &owner);
    let (path, _) = f.create(&spec);
    let data = path.join("data");
    assert_eq!(fill(&data, MIB, Some(OWNER)).errno, None);
    assert_eq!(
        chproj_as(Who::User(OWNER), &open(&data), 0).1,
        Err(libc::EPERM),
        "a volume created under the node's own pin root was not guarded"
    );
    drop(exp);
}

/// The steps of a start at which `PRJQUOTA_FAULT_GUARD_START` stops the
/// fault-injection exporter, in their order (`Guard::load_pinned`).
const START_STEPS: [&str; 6] = [
    "pinned-maps",
    "filled",
    "attached",
    "links-pinned",
    "swapped",
    "refilled",
];

/// An exporter start stopped dead at each step of pinning its guard (the
/// fault-injection build aborts there, as SIGKILL would: nothing unwinds)
/// leaves a guard in force for what the plugin creates next: the new
/// volume's owner can move neither its root nor a file in it out of its
/// project.
fn a_start_killed_at_any_step_leaves_the_next_create_guarded(fs: &FsCase) {
    let f = fs.fixture("pins-k");
    let dir = f.node.volumes_dir.clone();
    let args = ["--guard=enforce", "--ebpf=off"];
    let first = Exporter::start_with(&[&dir], &args);
    let mut pids = vec![first.pid()];
    let _ = first.stop_leaving_pins();
    let owner = OWNER.to_string();
    for (i, step) in START_STEPS.iter().enumerate() {
        let mut cmd = command_of(&fault_exporter(), &[&dir], &args, false);
        cmd.env("PRJQUOTA_FAULT_GUARD_START", step);
        let (pid, status, err) =
            run_to_refusal_pid(cmd, &format!("PRJQUOTA_FAULT_GUARD_START={step}"));
        pids.push(pid);
        assert!(
            !status.success() && err.contains(&format!("aborting at {step}")),
            "{step}: the fault point was not reached\n{err}"
        );
        let spec = Spec::new(&format!("k{i}"), 8 * MIB as i64)
            .param("uid", &owner)
            .param("gid", &owner);
        let (path, _) = f.create(&spec);
        let projid = f.project_id(&spec.id);
        assert_eq!(fill(&path.join("data"), 4096, Some(OWNER)).errno, None);
        for (what, p) in [("its root", path.clone()), ("a file", path.join("data"))] {
            let (_, r) = chproj_as(Who::User(OWNER), &open(&p), 0);
            assert_eq!(
                r,
                Err(libc::EPERM),
                "a start killed at {step}: the owner moved {what} out of the new volume's project\n{err}"
            );
        }
        assert_eq!(Fixture::project_of(&path), (projid, true));
        assert_eq!(Fixture::project_of(&path.join("data")), (projid, false));
        // What the next start would remove: one guard in force per round.
        pinned::remove_dirs_of(&pids, pinned::dir_of(&dir).as_deref());
    }
    pinned::remove(std::slice::from_ref(&dir));
    pinned::remove_dirs_of(&pids, None);
}

/// A squatter on the announce name when the exporter starts keeps it from
/// listening only while it stays: the exporter binds the name once it is
/// free, without a restart.
#[test]
fn the_exporter_takes_the_name_back_when_a_squatter_leaves() {
    let f = prjquota_vmtests::fixture::XFS.fixture("pins-rebind");
    let name = prjquota_core::announce::socket_name(&f.node.volumes_dir).unwrap();
    let mut squatter = squat(Squatter::NobodyNeverAccepting, &name);
    let e = Exporter::start(&[&f.node.volumes_dir]);
    let dir = f.node.volumes_dir.display().to_string();
    let listening = |e: &Exporter| {
        e.scrape().value(
            "prjquota_exporter_announce_listening",
            &[("volumes_dir", &dir)],
        )
    };
    assert_eq!(listening(&e), 0.0, "listening while the name is squatted");
    let _ = squatter.kill();
    let _ = squatter.wait();
    e.wait_for_line("bound the announcement socket", Duration::from_secs(30));
    assert_eq!(listening(&e), 1.0);
    e.stop();
}

fn root_key(path: &Path) -> RootKey {
    let dir = std::fs::File::open(path).expect("open the root");
    RootKey::of(dir.as_fd()).expect("the root's key")
}

fn a_create_guards_its_root_before_it_returns(fs: &FsCase) {
    let f = fs.fixture("pins-c");
    let pins = HandPins::make(&f.node.volumes_dir, &format!("{}-c", fs.name));
    let g = pins.open(&f.node.volumes_dir);
    let spec = writable(Spec::new("guarded", 8 * MIB as i64));
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    let key = root_key(&path);
    assert_eq!(g.root_projid(&key).unwrap(), Some(pid), "root not guarded");
    assert!(g.knows_project(key.dev, pid).unwrap());
    // Another generation of the same inode number is not the root.
    let stale = RootKey {
        gen: key.gen.wrapping_add(1),
        ..key
    };
    assert_eq!(g.root_projid(&stale).unwrap(), None);

    assert!(f.node.delete(&spec).status.success());
    assert_eq!(g.root_projid(&key).unwrap(), None, "root left in the guard");
    assert!(
        !g.knows_project(key.dev, pid).unwrap(),
        "project left in the guard"
    );
}

/// The root leaves the guard only once its tree is gone (a reused inode
/// number comes with another generation, so the entry cannot outlive its
/// inode by matching another file); a delete stopped in between leaves the
/// entry, and the next delete finishes.
fn a_delete_keeps_the_root_guarded_until_its_tree_is_gone(fs: &FsCase) {
    let f = Fixture::with_plugin(&(fs.mount)(), &format!("{}-pins-d", fs.name), &fault_bin());
    let pins = HandPins::make(&f.node.volumes_dir, &format!("{}-d", fs.name));
    let g = pins.open(&f.node.volumes_dir);
    let spec = writable(Spec::new("unguarded", 8 * MIB as i64));
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    std::fs::write(path.join("keep"), b"data").unwrap();
    let key = root_key(&path);
    let out = run_plugin_with(
        &f.node.plugin,
        "delete",
        &f.node.delete_vars(&spec, &path),
        TEST_DEADLINE,
        &[("PRJQUOTA_FAULT", "delete:removed".into())],
    );
    assert!(!out.status.success(), "the fault point was not reached");
    assert!(!path.exists(), "the tree is removed first");
    assert_eq!(
        g.root_projid(&key).unwrap(),
        Some(pid),
        "the root left before its tree"
    );
    assert!(f.node.delete(&spec).status.success());
    assert!(!path.exists());
}

/// A create puts its project into the guard before it claims the ID on the
/// kernel: a create stopped right after its claim left the project known.
fn a_new_project_is_guarded_from_its_claim(fs: &FsCase) {
    let f = Fixture::with_plugin(&(fs.mount)(), &format!("{}-pins-p", fs.name), &fault_bin());
    let pins = HandPins::make(&f.node.volumes_dir, &format!("{}-p", fs.name));
    let g = pins.open(&f.node.volumes_dir);
    let spec = writable(Spec::new("claimed", 8 * MIB as i64));
    let out = run_plugin_with(
        &f.node.plugin,
        "create",
        &f.node.create_vars(&spec),
        TEST_DEADLINE,
        &[("PRJQUOTA_FAULT", "create:reserved".into())],
    );
    assert!(!out.status.success(), "the fault point was not reached");
    let pid = prjquota_vmtests::records::reserved_project(&f.node.volumes_dir, &spec.id)
        .expect("the stopped create reserved an ID");
    let dev = prjquota_core::guard_contract::kernel_dev(
        std::fs::metadata(&f.node.volumes_dir).unwrap().dev(),
    )
    .unwrap();
    assert!(
        g.knows_project(dev, pid).unwrap(),
        "project {pid} is claimed and unguarded"
    );
    let (path, _) = f.create(&spec);
    assert_eq!(f.project_id(&spec.id), pid);
    assert!(f.node.delete(&spec).status.success());
    assert!(!path.exists());
}

fn pins_a_create_cannot_trust_are_refused_and_leave_nothing(fs: &FsCase) {
    let f = fs.fixture("pins-r");
    let pins = HandPins::make(&f.node.volumes_dir, &format!("{}-r", fs.name));
    // A symlink root did not make: someone else chose where it leads.
    std::os::unix::fs::lchown(&pins.link, Some(65534), Some(65534)).unwrap();
    let spec = Spec::new("refused", 8 * MIB as i64);
    let msg = f.node.create(&spec).error();
    assert!(
        msg.contains("owned by uid 65534") && msg.contains(&pins.link.display().to_string()),
        "{msg}"
    );
    assert!(
        !f.node.volumes_dir.join(&spec.id).exists(),
        "directory left"
    );
    assert!(f.record(&spec.id).is_none(), "record left");
    std::os::unix::fs::lchown(&pins.link, Some(0), Some(0)).unwrap();
    f.create(&spec);
    assert!(f.node.delete(&spec).status.success());
}

/// Who squats the announce socket.
#[derive(Clone, Copy, Debug)]
enum Squatter {
    /// `nobody`, listening with a backlog of 0 and never accepting.
    NobodyNeverAccepting,
    /// Root without CAP_SYS_ADMIN (a default container with host
    /// networking), never accepting.
    RootNeverAccepting,
    /// Root without CAP_SYS_ADMIN answering `ok` to everything at once.
    RootAnsweringOk,
}

const SQUAT: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\0" + sys.argv[1].encode())
answer = sys.argv[2] == "ok"
s.listen(16 if answer else 0)
print("ready", flush=True)
while answer:
    c, _ = s.accept()
    try:
        c.recv(4096)
        c.sendall(b"ok\n")
    except OSError:
        pass  # the plugin hung up on it, as it should
    c.close()
time.sleep(600)
"#;

fn squat(who: Squatter, name: &[u8]) -> Child {
    let name = std::str::from_utf8(name).unwrap();
    let mode = match who {
        Squatter::RootAnsweringOk => "ok",
        _ => "hang",
    };
    let mut cmd = match who {
        Squatter::NobodyNeverAccepting => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", PYTHON]);
            c
        }
        Squatter::RootNeverAccepting | Squatter::RootAnsweringOk => {
            let mut c = Command::new("capsh");
            c.args([
                "--drop=cap_sys_admin",
                "--",
                "-c",
                "exec python3 \"$@\"",
                "capsh",
            ]);
            c
        }
    };
    let mut child = cmd
        .args(["-c", SQUAT, name, mode])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the squatter");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .expect("read the squatter");
    assert_eq!(line.trim(), "ready", "the squatter did not bind");
    child
}

/// Present before any create (as before the exporter starts), each
/// squatter costs a create at most the announce's wait, and never decides
/// whether the root is guarded: the plugin writes the pins itself.
fn a_squatter_delays_no_create_and_decides_nothing(fs: &FsCase) {
    for who in [
        Squatter::NobodyNeverAccepting,
        Squatter::RootNeverAccepting,
        Squatter::RootAnsweringOk,
    ] {
        let f = fs.fixture(&format!("pins-sq-{}", who as u8));
        let pins = HandPins::make(&f.node.volumes_dir, &format!("{}-sq{}", fs.name, who as u8));
        let g = pins.open(&f.node.volumes_dir);
        let name = prjquota_core::announce::socket_name(&f.node.volumes_dir).unwrap();
        let mut squatter = squat(who, &name);
        for i in 0..3 {
            let spec = writable(Spec::new(&format!("sq{i}"), 8 * MIB as i64));
            let start = Instant::now();
            let out = f.node.create(&spec);
            let took = start.elapsed();
            assert!(out.status.success(), "{who:?} create {i}: {}", out.stderr);
            // Nomad kills a create at 60 s; the announce waits at most 5.
            assert!(
                took < Duration::from_secs(10),
                "{who:?}: create {i} took {took:?}"
            );
            let path = f.node.volumes_dir.join(&spec.id);
            let pid = f.project_id(&spec.id);
            assert_eq!(
                g.root_projid(&root_key(&path)).unwrap(),
                Some(pid),
                "{who:?}: create {i} returned an unguarded root"
            );
            assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
            // Said in the log, never decided by the squatter.
            assert!(
                out.stderr.contains("could not tell prjquota-exporter"),
                "{who:?}: {}",
                out.stderr
            );
            if matches!(who, Squatter::RootAnsweringOk) {
                assert!(
                    out.stderr.contains("lacks CAP_SYS_ADMIN"),
                    "{who:?}: {}",
                    out.stderr
                );
            }
        }
        let _ = squatter.kill();
        let _ = squatter.wait();
    }
}
