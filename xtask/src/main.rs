//! `cargo xtask`: the developer workflow of prjquota.
//!
//! - `deps`  installs what builds and tests need on a fresh Debian 12 (root).
//! - `vm`    boots Debian's kernel under QEMU (vng) with quota filesystems mounted.
//! - `test`  fmt, clippy, host tests, then the real-kernel tests in one VM boot.
//! - `demo`  shows a project quota being enforced, in the VM.
//! - `stress` runs the concurrency stress test for minutes instead of rounds.
//! - `dist`  builds release binaries and an installable tarball.
//! - `bench` measures prjquota against its alternatives and floors, side by side.
//! - `dashboards` renders the rules and the dashboard from a config.

mod bench;
mod completions;
mod dashboards;
mod deadline;
mod debian;
mod demo;
mod deps;
mod dist;
mod docs;
mod kernels;
mod lint;
mod notice;
mod stress;
mod systemd;
mod test;
mod vm;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  deps                       install system packages, virtme-ng and cargo-nextest (idempotent, root)
  vm [--kernel K] [--fs xfs|ext4|all] [--memory 2G] [--cpus 2] -- CMD...
                             boot Debian's kernel in QEMU, mount the quota test filesystems,
                             run CMD (bash -c) in the current directory; exits with CMD's status
  test [--host-only | --vm-only] [--kernel K|all] [--full] [--filter EXPR] [--vm-threads N]
       [--vm-lanes N] [--vm-cpus N] [--release-deb] [-- NEXTEST_ARGS...]
                             fmt, clippy, host tests, then the real-kernel tests, one VM boot per
                             kernel: the full suite on 6.1, the compatibility pass on the others
                             (--full: the full suite everywhere); EXPR is a nextest filterset
                             (passed as -E), e.g. 'test(smoke)', and replaces either selection;
                             two VMs at a time (each on one emulator thread, a core), the
                             longest first; --vm-lanes N boots N at a time, --vm-cpus N gives
                             each guest N CPUs (default 2);
                             binary(package) installs a test .deb (the static release plugin, the
                             debug exporter), --release-deb the one of `dist` (minutes to build)
  demo                       deps, build, and tell the whole story in the VM (plugin, exporter, eBPF)
  stress [--secs N] [--seed S] [--kernel K]
                             the concurrency stress test for N seconds per filesystem (default 300)
                             and the exporter's 10,000-volume churn soak; a disk stalled under
                             the exporter's scrapes for N seconds per filesystem
  bench [--quick]            plugin comparisons, exporter scrape cost and eBPF overhead in one VM
                             boot (release builds); writes bench/RESULTS.md and the docs' blocks
                             generated from it (README.md's comparison, docs/performance.md)
  bench --render-only        only render those blocks from the committed bench/RESULTS.md (no VM)
  dist                       static release binaries, the tarball, the .deb and SHA256SUMS in
                             target/dist/
  dashboards [--config FILE] [--out DIR]
                             render alerts.yaml and prjquota.json from a config (default
                             dashboards/config.toml, its fields in docs/dashboards.md) into DIR
                             (default dashboards/, the shipped files)

kernels (K): 5.10 (bullseye), 6.1 (bookworm, the default), 6.12 (trixie), 7 (sid): Debian's
  generic kernels; `deps` fetches all four.

environment:
  PRJQUOTA_VM_KERNEL         kernel image to boot, overriding --kernel
  PRJQUOTA_VM_TIMEOUT        seconds before the VM is killed (default: 35 min for a full pass,
                             20 for a compatibility pass, 45 and 20 with one CPU; 30 for `vm`)
  PRJQUOTA_VM_VERBOSE=1      pass --verbose to vng (kernel console, for boot failures)
  PRJQUOTA_VNG               the vng executable (default: target/venv/bin/vng, from `deps`)
  The tests themselves get only what xtask sets (PRJQUOTA_PROMETHEUS3 is the Prometheus 3
  binary `deps` unpacks under target/prometheus3); nothing else leaks from the caller's shell.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // `cargo xtask test --help`: the usage, whatever the command (the
    // options of all of them are on one page).
    let mut before_dashes = rest.iter().take_while(|a| a.as_str() != "--");
    if before_dashes.any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match command.as_str() {
        "deps" => deps::main(rest),
        "vm" => vm::main(rest),
        "test" => test::main(rest),
        "demo" => demo::main(rest),
        "stress" => stress::main(rest),
        "bench" => bench::main(rest),
        "dist" => dist::main(rest),
        "dashboards" => dashboards::main(rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(0)
        }
        other => {
            eprintln!("xtask: unknown command `{other}`\n\n{USAGE}");
            Ok(2)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Cargo's target directory for this workspace.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// `cargo` (the one running us, when there is one), in the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(repo_root());
    cmd
}

/// Prints a step header.
pub fn header(title: &str) {
    println!("\n==== {title}");
    let _ = std::io::stdout().flush();
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

/// Takes the value of option `name` at `args[*i]` (`--name VALUE` or
/// `--name=VALUE`), advancing `i`; `None` if `args[*i]` is another option.
pub fn take_value(args: &[String], i: &mut usize, name: &str) -> Result<Option<String>> {
    let arg = &args[*i];
    if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
        return Ok(Some(v.to_string()));
    }
    if arg != name {
        return Ok(None);
    }
    *i += 1;
    match args.get(*i) {
        Some(v) => Ok(Some(v.clone())),
        None => bail!("{name} needs a value"),
    }
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

    #[test]
    fn options() {
        let args: Vec<String> = ["--fs", "ext4", "--memory=3G", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut i = 0;
        assert_eq!(
            take_value(&args, &mut i, "--fs").unwrap().as_deref(),
            Some("ext4")
        );
        assert_eq!(i, 1);
        i = 2;
        assert_eq!(
            take_value(&args, &mut i, "--memory").unwrap().as_deref(),
            Some("3G")
        );
        i = 3;
        assert_eq!(take_value(&args, &mut i, "--fs").unwrap(), None);
    }
}
