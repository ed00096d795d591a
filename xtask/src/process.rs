//! Running commands: with their output streamed and kept (`run_tee`),
//! captured (`quiet`) or inherited (`run`), each shown as a shell line.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Prints a step header.
pub fn header(title: &str) {
    println!("\n==== {title}");
    let _ = std::io::stdout().flush();
}

/// Runs `f` as a step of a run: its header, then how long it took.
pub fn step(title: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    header(title);
    let t = Instant::now();
    f()?;
    println!("xtask: ok in {:.0}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// The command line of `cmd`, for messages.
pub fn display(cmd: &Command) -> String {
    let program = cmd.get_program();
    let program = if std::env::var_os("CARGO").is_some_and(|c| c == program) {
        OsStr::new("cargo")
    } else {
        program
    };
    std::iter::once(program)
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` with inherited stdio; an error if it does not exit 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    println!("$ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(cmd));
    }
    Ok(())
}

/// What [`run_tee`] saw.
pub struct Tee {
    pub status: ExitStatus,
    /// Every line, stdout and stderr interleaved as they came, colours stripped.
    pub lines: Vec<String>,
    pub timed_out: bool,
}

/// Runs `cmd`, streaming its stdout and stderr to ours line by line while
/// keeping a copy of every line. After `timeout` the process and all its
/// descendants are killed.
pub fn run_tee(cmd: &mut Command, timeout: Option<Duration>) -> Result<Tee> {
    run_tee_prefixed(cmd, timeout, "")
}

/// [`run_tee`], each streamed line starting with `prefix` (which the kept
/// lines do not): two VMs' outputs stay apart in one log.
pub fn run_tee_prefixed(cmd: &mut Command, timeout: Option<Duration>, prefix: &str) -> Result<Tee> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", display(cmd)))?;
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = timeout.map(|timeout| {
        std::thread::spawn(move || {
            if done_rx.recv_timeout(timeout) == Err(RecvTimeoutError::Timeout) {
                eprintln!(
                    "xtask: timed out after {}s: killing pid {pid} and its children",
                    timeout.as_secs()
                );
                kill_tree(pid);
                true
            } else {
                false
            }
        })
    });
    let lines = Arc::new(Mutex::new(Vec::new()));
    let t_out = tee_thread(
        child.stdout.take().expect("piped"),
        false,
        prefix.to_string(),
        lines.clone(),
    );
    let t_err = tee_thread(
        child.stderr.take().expect("piped"),
        true,
        prefix.to_string(),
        lines.clone(),
    );
    let status = child.wait()?;
    let _ = done_tx.send(());
    let timed_out = watchdog.is_some_and(|w| w.join().unwrap_or(false));
    let _ = t_out.join();
    let _ = t_err.join();
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    Ok(Tee {
        status,
        lines,
        timed_out,
    })
}

/// SIGKILLs `pid` and every process descending from it (found through /proc).
fn kill_tree(pid: u32) {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse().ok());
            if let Some(ppid) = ppid {
                parents.push((p, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    let _ = Command::new("kill")
        .arg("-KILL")
        .args(tree.iter().map(|p| p.to_string()))
        .status();
}

fn tee_thread(
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    prefix: String,
    lines: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // One write per line, prefix included, so that lines of two
            // streams never mix within a line.
            out.clear();
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&buf);
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&out)
            } else {
                let mut o = std::io::stdout().lock();
                o.write_all(&out).and_then(|_| o.flush())
            };
            let line = String::from_utf8_lossy(&buf);
            lines
                .lock()
                .unwrap()
                .push(strip_ansi(line.trim_end_matches(['\n', '\r'])));
        }
    })
}

/// `s` without ANSI escape sequences (colours), for parsing.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Single-quotes `s` for bash when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The first executable called `name` on PATH.
pub fn which(name: impl AsRef<OsStr>) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name.as_ref()))
        .find(|p| is_executable(p))
}

pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `cmd` with its output captured; an error carrying its stderr (and the
/// tail of its stdout) if it fails.
pub fn quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", display(cmd)))?;
    if out.status.success() {
        return Ok(());
    }
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    anyhow::bail!(
        "`{}` exited with {}\n--- stderr\n{}\n--- stdout (tail)\n{}",
        display(cmd),
        out.status,
        tail(&out.stderr),
        tail(&out.stdout)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("df"), "df");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn ansi() {
        assert_eq!(strip_ansi("\u{1b}[32;1m  PASS\u{1b}[0m x"), "  PASS x");
    }
}
