//! Waiting for the processes the tests start (plugins, exporters,
//! Prometheus), with deadlines and without polling.

use std::process::{Child, ExitStatus};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

/// Waits for `child` for at most `within`, and kills it then: its status,
/// and whether it was killed. It blocks in the kernel, as Nomad's agent
/// does: a poll every few milliseconds, with a storm's hundreds of plugin
/// runs in flight, took the emulated CPU from the plugins under test in
/// proportion to how long each ran.
pub fn wait_or_kill(child: &mut Child, within: Duration) -> (ExitStatus, bool) {
    // Already reaped (std keeps the status): its pid may be reused.
    if let Ok(Some(st)) = child.try_wait() {
        return (st, false);
    }
    let pid = Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // WNOWAIT leaves the exited child unreaped: its pid stays this
        // process's own until `child.wait()` below, so the kill cannot reach
        // a reused pid.
        let exited = loop {
            match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(Errno::EINTR) => continue,
                other => break other.map(|_| ()),
            }
        };
        let _ = tx.send(exited);
    });
    let killed = match rx.recv_timeout(within) {
        Ok(Ok(())) => false,
        Ok(Err(e)) => panic!("waitid for pid {pid}: {e}"),
        Err(_) => {
            let _ = child.kill();
            true
        }
    };
    (child.wait().expect("wait for the child"), killed)
}

/// SIGTERM, then [`wait_or_kill`] within `grace`: the status, or `None`
/// when it had to be killed.
pub fn terminate(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    // Our own child, not reaped yet: the pid cannot have been reused.
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    match wait_or_kill(child, grace) {
        (st, false) => Some(st),
        (_, true) => None,
    }
}

/// What each thread of process `pid` is doing, one line per thread: its
/// name, state, CPU ticks (user+system), the kernel function it sleeps in
/// and its kernel stack. For a test's failure message when a daemon stops
/// answering: which thread is stuck, and where.
pub fn threads(pid: u32) -> String {
    let tasks = match procfs::process::Process::new(pid as i32).and_then(|p| p.tasks()) {
        Ok(t) => t,
        Err(e) => return format!("process {pid}: {e}"),
    };
    // wchan and the kernel stack: read by path, procfs's Task has neither.
    let read = |tid: i32, f: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("({f}: {e})"))
    };
    let mut lines: Vec<(i32, String)> = tasks
        .filter_map(Result::ok)
        .map(|t| {
            let about = match t.stat() {
                Ok(st) => format!(
                    "{} state {} ticks {}+{}",
                    st.comm, st.state, st.utime, st.stime
                ),
                Err(e) => format!("(stat: {e})"),
            };
            let line = format!(
                "{} {about} wchan {}\n  {}",
                t.tid,
                read(t.tid, "wchan"),
                read(t.tid, "stack").replace('\n', "\n  ")
            );
            (t.tid, line)
        })
        .collect();
    lines.sort();
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::{terminate, threads, wait_or_kill};

    #[test]
    fn a_child_past_its_time_is_killed_and_a_quick_one_is_not() {
        let mut quick = Command::new("true").spawn().unwrap();
        let start = Instant::now();
        let (st, killed) = wait_or_kill(&mut quick, Duration::from_secs(30));
        assert!(st.success() && !killed);
        assert!(start.elapsed() < Duration::from_secs(10));

        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let (st, killed) = wait_or_kill(&mut slow, Duration::from_millis(300));
        assert!(killed && st.signal() == Some(9), "{st:?}");
    }

    #[test]
    fn terminate_kills_only_what_ignores_sigterm() {
        let mut polite = Command::new("sleep").arg("30").spawn().unwrap();
        let st = terminate(&mut polite, Duration::from_secs(30)).expect("exits on SIGTERM");
        assert_eq!(st.signal(), Some(15));

        // Says so once SIGTERM is ignored: a fixed wait raced the shell's
        // start on a loaded machine, and SIGTERM killed it first.
        let mut deaf = Command::new("sh")
            .args([
                "-c",
                "trap '' TERM; echo ignoring; while :; do sleep 0.1; done",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(deaf.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "ignoring\n");
        assert_eq!(terminate(&mut deaf, Duration::from_millis(300)), None);
    }

    #[test]
    fn threads_names_each_thread_with_its_state_and_stack() {
        let here = threads(std::process::id());
        let mine = nix::unistd::gettid();
        let line = here
            .lines()
            .find(|l| l.starts_with(&format!("{mine} ")))
            .unwrap_or_else(|| panic!("no line for thread {mine}:\n{here}"));
        // This thread is running while it reads its own state.
        assert!(line.contains(" state R ticks "), "{line}");
        assert!(line.contains(" wchan "), "{line}");
    }
}
