//! A volume owner (or root without CAP_SYS_ADMIN) changing project IDs, as
//! the guard tests and the systemd pass stage it: `attr-act` (one change per
//! process, so that the guard's events tell it apart by pid) and
//! [`Looper`], an owner retrying a change every millisecond through a
//! transition.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The file owner of the tests: a plain user of the host.
pub const OWNER: u32 = 1000;

/// Who an acting child is.
#[derive(Clone, Copy, Debug)]
pub enum Who {
    /// A plain user (no capabilities).
    User(u32),
    /// Root with every capability but CAP_SYS_ADMIN (effective, permitted,
    /// inheritable and bounding set): like root in a Docker container
    /// without user namespaces (which has CAP_FOWNER).
    RootWithoutSysAdmin,
    /// Root with every capability: the plugin, an administrator.
    Root,
    /// A plain user as root of a user namespace of its own (`unshare
    /// --user --map-root-user`): every capability, in that namespace only
    /// (a rootless container).
    UserInUserNs(u32),
}

/// Opens `p` read-only (a directory too), as root, to hand to a child.
/// Gives the file `fd` holds project `id`, as this process (root, with
/// every capability: no guard refuses it), keeping its other attributes:
/// what a squatter did before a guard ran, or an administrator does.
pub fn chproj(fd: &OwnedFd, id: u32) -> Result<(), i32> {
    use std::os::fd::AsFd;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    let mut a = prjquota_core::sys::get_fsxattr(fd.as_fd()).map_err(errno)?;
    a.projid = id;
    prjquota_core::sys::set_fsxattr(fd.as_fd(), &a).map_err(errno)
}

pub fn open(p: &Path) -> OwnedFd {
    std::fs::File::open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
        .into()
}

/// Runs `attr-act ARGS` as `who`, with `file` (opened by this process) as
/// its standard input; returns its pid and what the kernel said
/// (`Err(errno)`).
pub fn act(who: Who, file: Option<&OwnedFd>, args: &[&str]) -> (u32, Result<(), i32>) {
    use std::os::unix::process::CommandExt;
    let exe = crate::bin("attr-act");
    let mut cmd = match who {
        Who::User(uid) => {
            let mut c = Command::new(&exe);
            // std drops the supplementary groups when root changes uid.
            c.uid(uid).gid(uid);
            c
        }
        // Out of the bounding set, so the exec'd program has it in no set.
        Who::RootWithoutSysAdmin => {
            let mut c = Command::new("capsh");
            c.args(["--drop=cap_sys_admin", "--", "-c", "exec \"$@\"", "capsh"])
                .arg(&exe);
            c
        }
        Who::Root => Command::new(&exe),
        // unshare execs attr-act in place: the child's pid is attr-act's.
        Who::UserInUserNs(uid) => {
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-root-user", "--"])
                .arg(&exe)
                .uid(uid)
                .gid(uid);
            c
        }
    };
    cmd.args(args)
        .stdin(match file {
            Some(f) => Stdio::from(f.try_clone().expect("dup the acted-on file")),
            None => Stdio::null(),
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("start attr-act");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for attr-act");
    let result = match out.status.code() {
        Some(0) => Ok(()),
        Some(code) if code < 255 => Err(code),
        _ => panic!(
            "attr-act {args:?} as {who:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    (pid, result)
}

/// `chproj ID` by `who` on `file`.
pub fn chproj_as(who: Who, file: &OwnedFd, id: u32) -> (u32, Result<(), i32>) {
    act(who, Some(file), &["chproj", &id.to_string()])
}

/// [`OWNER`] retrying one change (`attr-act loop ACTION ARG [MS]`: `chproj
/// 0`, `xflags-clear 200`) on a file every millisecond (or every MS), its
/// attempts tallied per phase of the test: (refused, went through).
pub struct Looper {
    child: std::process::Child,
    phase: Arc<AtomicUsize>,
    tally: Arc<Mutex<Vec<(u64, u64)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Looper {
    /// `chproj ID` in a loop.
    pub fn start(file: &OwnedFd, id: u32, phases: usize) -> Looper {
        Looper::start_action(file, &["chproj", &id.to_string()], phases)
    }

    /// `attr-act loop ACTION ARG [MS]` (MS: milliseconds between attempts,
    /// 1 when not given), as [`OWNER`].
    pub fn start_action(file: &OwnedFd, action: &[&str], phases: usize) -> Looper {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(crate::bin("attr-act"))
            .arg("loop")
            .args(action)
            .uid(OWNER)
            .gid(OWNER)
            .stdin(Stdio::from(file.try_clone().unwrap()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start attr-act loop");
        let mut out = child.stdout.take().unwrap();
        let phase = Arc::new(AtomicUsize::new(0));
        let tally = Arc::new(Mutex::new(vec![(0u64, 0u64); phases]));
        let (p, t) = (phase.clone(), tally.clone());
        let what = action.join(" ");
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = t.lock().unwrap();
                let slot = &mut t[p.load(Ordering::SeqCst)];
                for b in &buf[..n] {
                    match b {
                        b'.' => slot.0 += 1,
                        b'!' => slot.1 += 1,
                        other => panic!(
                            "attr-act loop {what}: unexpected outcome {:?}",
                            *other as char
                        ),
                    }
                }
            }
        });
        Looper {
            child,
            phase,
            tally,
            reader: Some(reader),
        }
    }

    /// Counts the attempts from now on in `phase`.
    pub fn enter(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
    }

    /// Until at least `n` more attempts were made in the current phase.
    pub fn wait_attempts(&self, n: u64) {
        let phase = self.phase.load(Ordering::SeqCst);
        let start = self.tally.lock().unwrap()[phase];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.tally.lock().unwrap()[phase];
            if now.0 + now.1 >= start.0 + start.1 + n {
                return;
            }
            assert!(Instant::now() < deadline, "the looping owner stalled");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the owner; per phase: (refused, went through).
    pub fn stop(mut self) -> Vec<(u64, u64)> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        self.tally.lock().unwrap().clone()
    }
}

/// The phases of an exporter's restarts under a [`Looper`]: running, a
/// SIGTERM stop and start, running again, a kill -9 and start, running.
pub const RESTART_PHASES: [&str; 5] = [
    "running",
    "SIGTERM: stopping and starting",
    "running after the restart",
    "kill -9: dead and starting",
    "running after the crash",
];

/// Every phase of `tally` ([`Looper::stop`]) had attempts, and none went
/// through.
pub fn assert_all_refused(phases: &[&str], tally: &[(u64, u64)]) {
    for (name, (refused, through)) in phases.iter().zip(tally) {
        assert_eq!(
            *through, 0,
            "{name}: changes went through ({refused} refused)"
        );
        assert!(*refused > 0, "{name}: no attempt was made");
    }
}
