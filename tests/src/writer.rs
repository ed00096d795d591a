//! A writer that keeps its file open across a test's steps, as a
//! database keeps its files: told to write N bytes, it writes until done
//! or refused, syncs, and says how far it got and the errno. The same
//! process writes again later, so a test sees what an application that is
//! already running sees when its volume grows.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use crate::fixture::Filled;
use crate::PYTHON;

const SCRIPT: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
buf = b"\0" * (1 << 20)
for line in sys.stdin:
    want, done, err = int(line), 0, -1
    while done < want:
        try:
            done += os.write(fd, buf[: min(len(buf), want - done)])
        except OSError as e:
            err = e.errno
            break
    if err == -1:
        try:
            os.fsync(fd)
        except OSError as e:
            err = e.errno
    print(done, err, flush=True)
"#;

pub struct HeldWriter {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl HeldWriter {
    /// Opens (creating) `file` for appending, as `uid`.
    pub fn open(file: &Path, uid: u32) -> HeldWriter {
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(SCRIPT)
            .arg(file)
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the held writer");
        let stdin = child.stdin.take().expect("stdin piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
        HeldWriter {
            child,
            stdin,
            stdout,
        }
    }

    /// Writes `bytes` more through the open file.
    pub fn write(&mut self, bytes: u64) -> Filled {
        writeln!(self.stdin, "{bytes}").expect("tell the writer");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("the writer answers");
        let mut f = line.split_whitespace().map(|w| w.parse::<i64>());
        match (f.next(), f.next()) {
            (Some(Ok(done)), Some(Ok(errno))) => Filled {
                written: done as u64,
                errno: (errno >= 0).then_some(errno as i32),
            },
            _ => panic!("the held writer said {line:?}"),
        }
    }
}

impl Drop for HeldWriter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
