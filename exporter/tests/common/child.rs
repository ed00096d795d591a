//! The `prjquota-exporter` binary as a child process, started the way an
//! operator would: its logfmt stderr read line by line, its address taken
//! from the start-up line (it binds 127.0.0.1:0).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Running {
    pub child: Child,
    pub addr: SocketAddr,
    pub lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub log: Vec<String>,
}

/// Starts the exporter on `dir` with `extra` flags; stdin and stdout are
/// closed, stderr is read by a thread.
pub fn spawn<S: AsRef<OsStr>>(dir: &Path, extra: &[S]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prjquota-exporter"))
        .arg("--volumes-dir")
        .arg(dir)
        .args(["--web.listen-address", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prjquota-exporter");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// [`spawn`], then waits (at most 60 s) for the start-up line and its
/// address. It does not wait for readiness: how to ask depends on the
/// transport.
pub fn start<S: AsRef<OsStr>>(dir: &Path, extra: &[S]) -> Running {
    let (child, lines) = spawn(dir, extra);
    let mut log = Vec::new();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no start-up line ({e}):\n{}", log.join("\n")));
        log.push(line.clone());
        if line.contains("msg=\"starting prjquota-exporter\"") {
            let addr = line
                .split(' ')
                .find_map(|f| f.strip_prefix("address="))
                .and_then(|a| a.parse().ok())
                .expect("address= in the start-up line");
            return Running {
                child,
                addr,
                lines,
                log,
            };
        }
    }
}

impl Running {
    /// Waits (at most `timeout`) for a log line containing `needle`, and
    /// returns it.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.log.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "no log line with {needle:?} within {timeout:?} ({e}):\n{}",
                    self.log.join("\n")
                )
            });
            self.log.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("signal the exporter");
    }

    /// SIGTERM; asserts a clean exit and returns the whole log.
    pub fn stop(mut self) -> String {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let st = self.child.wait().unwrap();
        // Every line up to the exit: the reader thread ends at EOF.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.log.push(l);
        }
        assert!(
            st.success(),
            "exit on SIGTERM: {st}\n{}",
            self.log.join("\n")
        );
        self.log.join("\n")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed assertion must not leave the exporter running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
