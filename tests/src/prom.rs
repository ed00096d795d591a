//! Prometheus in the tests: a parser for the text
//! exposition format, the `prjquota-exporter` binary run as a guarded child
//! process, `promtool`, and a real Prometheus server (`/usr/bin/prometheus`,
//! Debian 12 ships 2.42) scraping test targets, queried through its HTTP API.
//!
//! ```ignore
//! let exporter = Exporter::start(&[&fixture.node.volumes_dir]);
//! let scrape: Exposition = exporter.scrape();
//! let prom = Prometheus::start(&[("prjquota", exporter.addr)], &[rules_file]);
//! let result = prom.query_until("up == 1", |r| !vector(r).is_empty());
//! let alerts = prom.alerts();
//! // dropped: Prometheus and the exporter are stopped, Prometheus's data removed
//! ```
//!
//! Everything here is bounded in time but asserts no timing: the VM emulates
//! its CPU, so waits are generous and only report how long they took.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{asking_gzip, get_head_keep_alive, http_get, url_encode, KeepAlive};

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

/// Prometheus 3 (`PRJQUOTA_PROMETHEUS3`, which `cargo xtask test` sets to
/// the binary `cargo xtask deps` unpacks under target/prometheus3; the
/// systemd pass installs it in its root as /usr/bin/prometheus).
pub fn prometheus3() -> Option<PathBuf> {
    std::env::var_os("PRJQUOTA_PROMETHEUS3").map(PathBuf::from)
}

/// The guest boots with only a loopback interface, possibly down; bring it
/// up once per process (best effort: outside a fresh VM it is up already).
pub fn ensure_loopback() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if TcpListener::bind("127.0.0.1:0").is_err() {
            let _ = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
                .status();
        }
    });
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for programs that
/// cannot report the port they bound to `:0`).
pub fn free_port() -> u16 {
    ensure_loopback();
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

// ---------------------------------------------------------------------------
// The text exposition format

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }

    /// True when every `(name, value)` of `want` is among the labels.
    pub fn has(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// A parsed scrape: samples in order, and the `# TYPE` and `# HELP` of each
/// family.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, String>,
    pub helps: BTreeMap<String, String>,
    pub text: String,
}

impl Exposition {
    /// Parses the Prometheus text format (0.0.4). Panics, quoting the line,
    /// on anything malformed: the exporter must never produce it.
    pub fn parse(text: &str) -> Exposition {
        let mut e = Exposition {
            text: text.to_string(),
            ..Exposition::default()
        };
        for (n, line) in text.lines().enumerate() {
            let fail = |why: &str| -> ! { panic!("line {}: {why}: {line:?}", n + 1) };
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut parts = rest.splitn(3, ' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("TYPE"), Some(name), Some(t)) => {
                        let previous = e.types.insert(name.into(), t.into());
                        assert!(
                            previous.is_none(),
                            "line {}: a second TYPE: {line:?}",
                            n + 1
                        );
                    }
                    (Some("HELP"), Some(name), Some(h)) => {
                        e.helps.insert(name.into(), h.into());
                    }
                    _ => {}
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (name, rest) = match line.find(['{', ' ']) {
                Some(i) => line.split_at(i),
                None => fail("no value"),
            };
            let mut labels = BTreeMap::new();
            let rest = if let Some(mut r) = rest.strip_prefix('{') {
                loop {
                    r = r.trim_start_matches(',');
                    if let Some(after) = r.strip_prefix('}') {
                        break after;
                    }
                    let eq = r.find('=').unwrap_or_else(|| fail("a label without ="));
                    let key = r[..eq].to_string();
                    let mut chars = r[eq + 1..].char_indices();
                    if chars.next().map(|c| c.1) != Some('"') {
                        fail("an unquoted label value");
                    }
                    let mut value = String::new();
                    let mut end = None;
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => match chars.next().map(|c| c.1) {
                                Some('n') => value.push('\n'),
                                Some('\\') => value.push('\\'),
                                Some('"') => value.push('"'),
                                _ => fail("a bad escape in a label value"),
                            },
                            '"' => {
                                end = Some(eq + 1 + i + 1);
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    let end = end.unwrap_or_else(|| fail("an unterminated label value"));
                    if labels.insert(key, value).is_some() {
                        fail("a repeated label");
                    }
                    r = &r[end..];
                }
            } else {
                rest
            };
            let mut fields = rest.split_whitespace();
            let value = match fields.next() {
                Some("NaN") => f64::NAN,
                Some("+Inf") => f64::INFINITY,
                Some("-Inf") => f64::NEG_INFINITY,
                Some(v) => v
                    .parse()
                    .unwrap_or_else(|_| fail("a value that is not a number")),
                None => fail("no value"),
            };
            e.samples.push(Sample {
                name: name.to_string(),
                labels,
                value,
            });
        }
        e
    }

    /// Samples of metric `name` carrying all of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && s.has(labels))
    }

    /// The value of the one sample of `name` with `labels`; `None` if there
    /// is none, a panic if there are several.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.find(name, labels).collect();
        match found.as_slice() {
            [] => None,
            [s] => Some(s.value),
            _ => panic!(
                "{} samples of {name} with {labels:?}: {found:?}",
                found.len()
            ),
        }
    }

    /// `prjquota_exporter_scrape_collector_success` by collector.
    pub fn collector_successes(&self) -> BTreeMap<String, f64> {
        self.find("prjquota_exporter_scrape_collector_success", &[])
            .map(|s| (s.label("collector").unwrap_or("").to_string(), s.value))
            .collect()
    }

    /// Panics, with `context` (the exporter's log, a moment), unless the
    /// scrape lists collectors and every one succeeded.
    pub fn assert_collectors_succeeded(&self, context: &str) {
        let ok = self.collector_successes();
        assert!(!ok.is_empty(), "no collector in the scrape:\n{}", self.text);
        for (c, v) in ok {
            assert_eq!(v, 1.0, "collector {c} failed: {context}");
        }
    }

    /// As [`Exposition::get`], panicking (with the exposition) when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {name} with {labels:?} in\n{}", self.text))
    }
}

// ---------------------------------------------------------------------------
// A running prjquota-exporter

/// The exporter's command line, on 127.0.0.1 with a port the kernel picks.
/// `without_bpf_caps` runs it under `capsh` with CAP_BPF, CAP_PERFMON and
/// CAP_SYS_ADMIN dropped from its bounding set, so the kernel refuses to
/// load eBPF programs even though it runs as root.
pub fn command(volumes_dirs: &[&Path], args: &[&str], without_bpf_caps: bool) -> Command {
    command_of(
        &crate::bin("prjquota-exporter"),
        volumes_dirs,
        args,
        without_bpf_caps,
    )
}

/// [`command`] for a given build of the exporter.
pub fn command_of(
    exe: &Path,
    volumes_dirs: &[&Path],
    args: &[&str],
    without_bpf_caps: bool,
) -> Command {
    let mut cmd = if without_bpf_caps {
        let mut c = Command::new("capsh");
        c.args([
            "--drop=cap_bpf,cap_perfmon,cap_sys_admin",
            "--",
            "-c",
            "exec \"$@\"",
            "capsh",
        ])
        .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    for d in volumes_dirs {
        cmd.arg("--volumes-dir").arg(d);
    }
    cmd.args(args);
    cmd.args([
        "--web.listen-address",
        "127.0.0.1:0",
        "--log.level",
        "debug",
    ]);
    cmd
}

/// Runs an exporter command that must refuse to start to its exit (within
/// 120 s); returns the exit status and its stderr. `what` says in a failure
/// what should have made it refuse.
pub fn run_to_refusal(cmd: Command, what: &str) -> (std::process::ExitStatus, String) {
    let (_, status, err) = run_to_refusal_pid(cmd, what);
    (status, err)
}

/// [`run_to_refusal`], and the exporter's pid (which names its pins).
pub fn run_to_refusal_pid(mut cmd: Command, what: &str) -> (u32, std::process::ExitStatus, String) {
    ensure_loopback();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prjquota-exporter");
    let pid = child.id();
    let (status, killed) = crate::child::wait_or_kill(&mut child, Duration::from_secs(120));
    assert!(
        !killed,
        "the exporter with {what} is still running after 120 s: it did not refuse to start"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr piped"), &mut err)
        .expect("read the exporter's stderr");
    (pid, status, err)
}

/// The exporter binary, running until dropped.
pub struct Exporter {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
    /// The thread copying stderr into `log`: joined once the exporter has
    /// exited, so that the log is whole.
    reader: Option<std::thread::JoinHandle<()>>,
    /// How the exporter ended, once [`Exporter::terminate`] or the wait for
    /// readiness has seen it end (`Some(None)`: it had to be killed).
    stopped: Option<Option<std::process::ExitStatus>>,
    /// Its volumes directories, whose pinned guard is removed when it is
    /// dropped (unless [`Exporter::stop_leaving_pins`] or
    /// [`Exporter::kill`] ended it): a test's guard must not outlive it.
    volumes_dirs: Vec<PathBuf>,
    remove_pins: bool,
}

/// The flags of an exporter in a test of what the quota-escape guard does
/// not touch (metrics, write telemetry, TLS): loading, attaching and
/// pinning the guard's programs is most of an exporter's start on the
/// VM's emulated CPU. The guard's own tests, and those of the defaults,
/// start it as shipped.
pub const UNGUARDED: [&str; 1] = ["--guard=off"];

impl Exporter {
    /// Starts `prjquota-exporter --volumes-dir D…` on 127.0.0.1 with a port
    /// the kernel picks, and returns once it listens.
    pub fn start(volumes_dirs: &[&Path]) -> Exporter {
        Self::start_with(volumes_dirs, &[])
    }

    /// [`Exporter::start`] with further flags (e.g. `--ebpf=required`).
    pub fn start_with(volumes_dirs: &[&Path], args: &[&str]) -> Exporter {
        Self::start_binary(&crate::bin("prjquota-exporter"), volumes_dirs, args)
    }

    /// [`Exporter::start_with`] for another build of the exporter (the
    /// fault-injection one).
    pub fn start_binary(binary: &Path, volumes_dirs: &[&Path], args: &[&str]) -> Exporter {
        Self::start_command(command_of(binary, volumes_dirs, args, false))
    }

    /// [`Exporter::start_with`] without the capabilities that loading eBPF
    /// needs (see [`command`]).
    pub fn start_without_bpf_caps(volumes_dirs: &[&Path], args: &[&str]) -> Exporter {
        Self::start_command(command(volumes_dirs, args, true))
    }

    /// [`Exporter::start_with`] for an exporter that serves TLS only
    /// (`--web.config.file`), which the tests' plain HTTP client cannot
    /// ask: ready is its `ready:` log line rather than `/healthz`.
    pub fn start_tls(volumes_dirs: &[&Path], args: &[&str]) -> Exporter {
        Self::start_command_logged(command_of(
            &crate::bin("prjquota-exporter"),
            volumes_dirs,
            args,
            false,
        ))
    }

    /// [`Exporter::start_command`] for an exporter that serves TLS only:
    /// returns at its `ready:` log line.
    pub fn start_command_logged(cmd: Command) -> Exporter {
        Self::spawn_probed(cmd, false)
    }

    /// Starts an exporter from its command line ([`command_of`]) and
    /// returns once it is ready.
    pub fn start_command(cmd: Command) -> Exporter {
        Self::spawn_probed(cmd, true)
    }

    fn spawn_probed(mut cmd: Command, plain_http: bool) -> Exporter {
        ensure_loopback();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut volumes_dirs = Vec::new();
        let mut args = cmd.get_args();
        while let Some(a) = args.next() {
            if a == "--volumes-dir" {
                if let Some(d) = args.next() {
                    volumes_dirs.push(PathBuf::from(d));
                }
            }
        }
        let mut child = cmd.spawn().expect("start prjquota-exporter");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("msg=\"starting prjquota-exporter\"") {
                    let addr = line
                        .split(' ')
                        .find_map(|f| f.strip_prefix("addresses="))
                        .and_then(|a| a.split(',').next())
                        .and_then(|a| a.parse::<SocketAddr>().ok());
                    let _ = tx.send(addr);
                }
                let mut l = log2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let started = Instant::now();
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Some(a)) => a,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the exporter did not report its address ({other:?}):\n{}",
                    log.lock().unwrap()
                );
            }
        };
        eprintln!(
            "MEASURE exporter_start_seconds {:.3}",
            started.elapsed().as_secs_f64()
        );
        let mut exporter = Exporter {
            child,
            addr,
            log,
            reader: Some(reader),
            stopped: None,
            volumes_dirs,
            remove_pins: true,
        };
        if plain_http {
            exporter.wait_ready(started);
        } else {
            exporter.wait_ready_logged(started);
        }
        exporter
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many generic netlink sockets (the quota warnings' family) the
    /// exporter holds open: its fds' socket inodes found in
    /// `/proc/net/netlink` with protocol 16 (`NETLINK_GENERIC`).
    pub fn generic_netlink_sockets(&self) -> usize {
        const NETLINK_GENERIC: &str = "16";
        let fd_dir = format!("/proc/{}/fd", self.pid());
        let mine: std::collections::BTreeSet<String> = std::fs::read_dir(&fd_dir)
            .unwrap_or_else(|e| panic!("{fd_dir}: {e}"))
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        let table = std::fs::read_to_string("/proc/net/netlink").expect("/proc/net/netlink");
        // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
        table
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() >= 10 && f[1] == NETLINK_GENERIC && mine.contains(f[9]))
            .count()
    }

    /// Sends `sig` to the exporter (SIGHUP: reload its web config).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        // Our own child, not reaped while `self` lives: the pid is its own.
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .unwrap_or_else(|e| panic!("signal {sig} to the exporter: {e}"));
    }

    /// Waits (at most `timeout`) until the log has a line containing
    /// `needle`, and returns the first such line.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.log().lines().find(|l| l.contains(needle)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls /healthz until 200 (the programs are loaded and every volume
    /// registered: /metrics answers 503 before). A test writes right after
    /// this returns: that is the moment users meet first.
    fn wait_ready(&mut self, started: Instant) {
        self.wait_until_ready(started, |e| {
            match http_get(e.addr, "/healthz", Duration::from_secs(60)) {
                Ok(r) if r.status == 200 => true,
                Ok(r) => {
                    assert_eq!(r.status, 503, "/healthz while starting: {}", r.body);
                    false
                }
                Err(err) => panic!("GET /healthz: {err}\n{}", e.log()),
            }
        });
    }

    /// Waits for the `ready:` log line (eBPF loaded, every volume
    /// registered), for an exporter whose /healthz needs TLS.
    fn wait_ready_logged(&mut self, started: Instant) {
        self.wait_until_ready(started, |e| e.log().contains("msg=\"ready:"));
    }

    /// Polls `ready` until it says so, for at most 300 s; panics with the
    /// log if the exporter exits first.
    fn wait_until_ready(&mut self, started: Instant, mut ready: impl FnMut(&Self) -> bool) {
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.stopped = Some(Some(status));
                panic!(
                    "the exporter exited ({status}) before it was ready:\n{}",
                    self.log()
                );
            }
            if ready(self) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "the exporter is not ready after 300 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "MEASURE exporter_ready_seconds {:.3}",
            started.elapsed().as_secs_f64()
        );
    }

    /// GET /metrics: asserts 200 and the text format, returns the body and
    /// the time the request took (connect to last byte).
    pub fn scrape_text(&self) -> (String, Duration) {
        let start = Instant::now();
        let r = http_get(self.addr, "/metrics", Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("GET /metrics: {e}\n{}", self.log()));
        let took = start.elapsed();
        assert_eq!(r.status, 200, "GET /metrics: {}\n{}", r.body, self.log());
        let ct = r.header("content-type").unwrap_or_default();
        assert!(
            ct.starts_with("text/plain") && ct.contains("version=0.0.4"),
            "content-type {ct:?}"
        );
        (r.body, took)
    }

    /// A connection to the exporter kept open between requests, as
    /// Prometheus keeps its scrape connections.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::connect(self.addr, Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", self.addr, self.log()))
    }

    /// GET /metrics as Prometheus asks for it (`Accept-Encoding: gzip`, on
    /// a connection it keeps open): asserts a 200 in gzip, returns the body
    /// decoded (which checks the gzip trailer's CRC and length), the bytes
    /// sent and the time taken.
    pub fn scrape_gzip(&self, conn: &mut KeepAlive) -> (String, usize, Duration) {
        let head = asking_gzip(&get_head_keep_alive(self.addr, "/metrics"));
        let start = Instant::now();
        let r = conn
            .request(&head)
            .unwrap_or_else(|e| panic!("GET /metrics with gzip: {e}\n{}", self.log()));
        let took = start.elapsed();
        assert_eq!(r.status, 200, "GET /metrics with gzip\n{}", self.log());
        assert_eq!(r.header("content-encoding"), Some("gzip"));
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut text)
            .expect("a whole gzip member of UTF-8 text");
        (text, r.body.len(), took)
    }

    pub fn scrape(&self) -> Exposition {
        Exposition::parse(&self.scrape_text().0)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log lines that mention `needle` (a volume ID, say): what a
    /// failed count is explained by, where the whole log and exposition
    /// would be cut short in a CI report.
    pub fn log_lines_with(&self, needle: &str) -> String {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// CPU time the exporter has used so far, every thread's, the ended
    /// ones' included, to the nanosecond: its process CPU-time clock
    /// (`clock_getcpuclockid`). A sum over live threads can go down when
    /// one ends (Tokio's blocking threads end when idle), and mixing it
    /// with `/proc/PID/stat`'s clock ticks made readings go down too.
    pub fn cpu_time(&self) -> Duration {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let clock = nix::time::clock_getcpuclockid(pid)
            .unwrap_or_else(|e| panic!("the exporter's CPU-time clock (pid {pid}): {e}"));
        let t = nix::time::clock_gettime(clock)
            .unwrap_or_else(|e| panic!("reading the exporter's CPU-time clock: {e}"));
        Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
    }

    /// (VmHWM, VmRSS) in KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        };
        (field("VmHWM:"), field("VmRSS:"))
    }
}

impl Exporter {
    /// Stops the exporter with SIGTERM, as systemd and Nomad do, and
    /// returns its whole log; panics unless it exits cleanly.
    pub fn stop(mut self) -> String {
        let status = self.terminate();
        assert!(
            status.is_some_and(|s| s.success()),
            "the exporter did not stop cleanly on SIGTERM: {status:?}\n{}",
            self.log()
        );
        self.log()
    }

    /// [`Exporter::stop`] as in a restart or an upgrade: the guard it
    /// pinned stays (the next exporter replaces it).
    pub fn stop_leaving_pins(mut self) -> String {
        self.remove_pins = false;
        self.stop()
    }

    /// SIGKILL, as a crash or the OOM killer: returns the log; the guard it
    /// pinned stays.
    pub fn kill(mut self) -> String {
        self.remove_pins = false;
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stopped = Some(status);
        self.log()
    }

    /// SIGTERM, then up to 30 s for the exit (SIGKILL after that: `None`).
    /// Runs once; later calls return the first outcome.
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        if let Some(outcome) = self.stopped {
            return outcome;
        }
        let status = crate::child::terminate(&mut self.child, Duration::from_secs(30));
        // The exporter has exited: its stderr is closed and the reader ends.
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.stopped = Some(status);
        status
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let already = self.stopped.is_some();
        let status = self.terminate();
        if self.remove_pins {
            crate::pinned::remove(&self.volumes_dirs);
        }
        if std::thread::panicking() {
            eprintln!("--- exporter log (exit {status:?}) ---\n{}", self.log());
        } else if !already {
            assert!(
                status.is_some_and(|s| s.success()),
                "the exporter did not stop cleanly on SIGTERM: {status:?}\n{}",
                self.log()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// promtool

/// What `promtool check metrics` said about an exposition.
#[derive(Debug)]
pub struct Lint {
    pub code: Option<i32>,
    pub output: String,
}

/// Runs `cmd` with `text` on its stdin (written beside the read, so that
/// neither pipe fills up) and returns what it printed; `what` names it in
/// a panic when it cannot be run.
fn piped(mut cmd: Command, text: &str, what: &str) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    let mut stdin = child.stdin.take().expect("stdin piped");
    let owned = text.to_string();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(owned.as_bytes());
    });
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for {what}: {e}"));
    writer.join().expect("stdin writer");
    out
}

/// Pipes `text` to `promtool check metrics`.
pub fn promtool_check_metrics(text: &str) -> Lint {
    let mut cmd = Command::new(PROMTOOL);
    cmd.args(["check", "metrics"]);
    let out = piped(cmd, text, PROMTOOL);
    Lint {
        code: out.status.code(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The OpenMetrics parser of the Python client library (Debian's
/// python3-prometheus-client, which `cargo xtask deps` installs): strict
/// about `# EOF`, `_created` and `_total` placement, family grouping,
/// escaping and the `info` type, which promtool's `check metrics` (text
/// 0.0.4 only) does not look at.
const OPENMETRICS_PARSER: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = sys.stdin.read()
out = []
for f in text_string_to_metric_families(text):
    out.append({"name": f.name, "type": f.type, "samples": [
        {"name": s.name, "labels": s.labels, "value": repr(float(s.value))} for s in f.samples]})
print(json.dumps(out))
"#;

/// One family as the OpenMetrics parser read it.
#[derive(Debug, Clone)]
pub struct OmFamily {
    pub name: String,
    pub kind: String,
    /// (sample name, labels, value).
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

/// `text` parsed by a real OpenMetrics parser; `Err` with its complaint if
/// it is not valid OpenMetrics. Panics if the parser cannot be run: a
/// missing tool fails the test, it never skips it.
pub fn openmetrics_parse(text: &str) -> Result<Vec<OmFamily>, String> {
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", OPENMETRICS_PARSER]);
    let out = piped(
        cmd,
        text,
        "/usr/bin/python3 (`cargo xtask deps` installs it)",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'prometheus_client'"),
        "python3 has no prometheus_client: `cargo xtask deps` installs python3-prometheus-client"
    );
    if !out.status.success() {
        return Err(stderr.into_owned());
    }
    let v: Value = serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    Ok(v.as_array()
        .expect("a list")
        .iter()
        .map(|f| OmFamily {
            name: f["name"].as_str().unwrap_or_default().to_string(),
            kind: f["type"].as_str().unwrap_or_default().to_string(),
            samples: f["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .map(|s| {
                    let labels = s["labels"]
                        .as_object()
                        .expect("labels")
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect();
                    (
                        s["name"].as_str().unwrap_or_default().to_string(),
                        labels,
                        s["value"]
                            .as_str()
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(f64::NAN),
                    )
                })
                .collect(),
        })
        .collect())
}

/// Runs `promtool ARGS…` and returns (exit code, stdout+stderr).
pub fn promtool(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(PROMTOOL)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {PROMTOOL}: {e}"));
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Alert rules whose every `for:` is 1s, in a directory of their own
/// (removed on drop): a test then sees an alert fire within seconds of its
/// condition, everything else as shipped.
pub struct ShortRules {
    _dir: crate::temp::TempDir,
    pub file: PathBuf,
}

/// `text` (a rule file, `for:` on lines of their own as the rendered
/// rules have it) with every `for:` set to 1s, checked by promtool.
pub fn rules_with_short_for(text: &str) -> ShortRules {
    let mut n = 0;
    let rewritten: Vec<String> = text
        .lines()
        .map(|l| {
            let body = l.trim_start();
            if body.starts_with("for:") {
                n += 1;
                format!("{}for: 1s", &l[..l.len() - body.len()])
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(n >= 5, "only {n} `for:` lines in the rules");
    let dir = crate::temp::TempDir::new(&std::env::temp_dir(), "prjquota", "short-rules");
    let file = dir.join("alerts.yaml");
    std::fs::write(&file, rewritten.join("\n") + "\n").expect("write the rules' copy");
    let (code, out) = promtool(&["check", "rules", file.to_str().expect("UTF-8")]);
    assert_eq!(code, Some(0), "the rewritten rules:\n{out}");
    ShortRules { _dir: dir, file }
}

/// `data.alerts` of `/api/v1/alerts` firing, as their label sets.
pub fn firing(alerts: &Value) -> Vec<BTreeMap<String, String>> {
    alerts
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing")
        .map(|a| {
            a["labels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A Prometheus server

/// How long to wait for Prometheus to become ready: generous, since the VM
/// emulates its CPU (reported, never asserted).
pub const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// Default bound of [`Prometheus::query_until`].
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(180);

/// A running Prometheus with its own config and storage in a temp dir;
/// stopped (SIGTERM, then SIGKILL) and removed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
}

/// A fresh private directory under the temp dir (guest /tmp is writable),
/// which [`Prometheus`]'s drop removes.
fn temp_dir(tag: &str) -> PathBuf {
    crate::temp::TempDir::new(&std::env::temp_dir(), "prjquota", tag).keep()
}

/// The Prometheus configuration: every target its own job (`job_name`),
/// scraped every second; rule files evaluated every second.
pub fn config_yaml(targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> String {
    let mut y = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
    );
    if !rule_files.is_empty() {
        y.push_str("rule_files:\n");
        for f in rule_files {
            y.push_str(&format!(
                "  - {}\n",
                serde_json::json!(f.display().to_string())
            ));
        }
    }
    y.push_str("scrape_configs:\n");
    for (job, addr) in targets {
        y.push_str(&format!(
            "  - job_name: {}\n    static_configs:\n      - targets: [{}]\n",
            serde_json::json!(job),
            serde_json::json!(addr.to_string())
        ));
    }
    y
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (job name, address) every
    /// second with `rule_files` loaded, and waits until `/-/ready` answers.
    pub fn start(targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> Prometheus {
        Self::start_config(
            Path::new(PROMETHEUS),
            &config_yaml(targets, rule_files),
            rule_files,
        )
    }

    /// Starts `binary` (another Prometheus release) with the whole
    /// configuration `yaml` (e.g. scrape configs with TLS and basic auth),
    /// whose rule files are `rule_files`.
    pub fn start_config(binary: &Path, yaml: &str, rule_files: &[PathBuf]) -> Prometheus {
        Self::start_config_with(binary, yaml, rule_files, &[])
    }

    /// [`Prometheus::start_config`] with more flags (`--enable-feature=…`).
    pub fn start_config_with(
        binary: &Path,
        yaml: &str,
        rule_files: &[PathBuf],
        flags: &[&str],
    ) -> Prometheus {
        ensure_loopback();
        let dir = temp_dir("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, yaml).expect("write prometheus.yml");
        // The release's own promtool where it ships one: a newer config
        // (`scrape_protocols`) is checked by the promtool that knows it.
        let beside = binary.with_file_name("promtool");
        let (code, out) = if beside.exists() {
            let out = Command::new(&beside)
                .args(["check", "config", config.to_str().expect("UTF-8 path")])
                .output()
                .unwrap_or_else(|e| panic!("run {}: {e}", beside.display()));
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        } else {
            promtool(&["check", "config", config.to_str().expect("UTF-8 path")])
        };
        assert_eq!(code, Some(0), "promtool check config:\n{out}");
        for f in rule_files {
            let (code, out) = promtool(&["check", "rules", f.to_str().expect("UTF-8 path")]);
            assert_eq!(
                code,
                Some(0),
                "promtool check rules {}:\n{out}",
                f.display()
            );
        }
        let started = Instant::now();
        // The port is chosen free, then bound by Prometheus: retry if another
        // process took it in between.
        for attempt in 0..3 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
            let child = Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .args(flags)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("dup log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
            let mut p = Prometheus {
                child,
                addr,
                dir: dir.clone(),
                config: config.clone(),
            };
            match p.wait_ready() {
                Ok(()) => {
                    eprintln!(
                        "MEASURE prometheus_ready_seconds {:.2}",
                        started.elapsed().as_secs_f64()
                    );
                    return p;
                }
                Err(why) if attempt < 2 && why.contains("exited") => {
                    eprintln!("prometheus on {addr} {why}; retrying on another port");
                    // Keep the directory for the next attempt.
                    p.dir = PathBuf::new();
                }
                Err(why) => panic!("prometheus {why}\n{}", p.log()),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("exited with {st} before it was ready"));
            }
            if let Ok(r) = http_get(self.addr, "/-/ready", Duration::from_secs(10)) {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {}s", READY_TIMEOUT.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Prometheus's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; panics unless Prometheus answers `status: success`.
    /// Returns the `data` member.
    pub fn api(&self, path_and_query: &str) -> Value {
        let r = http_get(self.addr, path_and_query, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}\n{}", self.log()));
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("GET {path_and_query}: not JSON ({e}): {}", r.body));
        assert_eq!(
            v["status"], "success",
            "GET {path_and_query}: HTTP {}: {v}",
            r.status
        );
        v["data"].clone()
    }

    /// An instant query; returns `data.result` (for a vector: an array of
    /// `{"metric": {labels}, "value": [ts, "v"]}`).
    pub fn query(&self, promql: &str) -> Value {
        self.api(&format!("/api/v1/query?query={}", url_encode(promql)))["result"].clone()
    }

    /// A range query from `start` to `end` (Unix seconds) every `step`
    /// seconds, as Grafana runs a time series panel's; returns
    /// `data.result` (a matrix: `{"metric": {labels}, "values": [...]}`).
    pub fn query_range(&self, promql: &str, start: f64, end: f64, step: f64) -> Value {
        self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            url_encode(promql)
        ))["result"]
            .clone()
    }

    /// Repeats [`Prometheus::query`] (every 500 ms, up to `QUERY_TIMEOUT`)
    /// until `done` accepts the result, and returns it; panics with the last
    /// result otherwise.
    pub fn query_until(&self, promql: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.query_until_for(promql, QUERY_TIMEOUT, done)
    }

    pub fn query_until_for(
        &self,
        promql: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        match self.query_within(promql, timeout, done) {
            Ok(r) => {
                eprintln!(
                    "MEASURE prometheus_query_wait_seconds{{query={promql:?}}} {:.2}",
                    start.elapsed().as_secs_f64()
                );
                r
            }
            Err(r) => panic!(
                "{promql}: no acceptable result within {}s; last: {r}\ntargets: {}\n{}",
                timeout.as_secs(),
                self.api("/api/v1/targets"),
                self.log()
            ),
        }
    }

    /// Repeats [`Prometheus::query`] every 500 ms until `done` accepts the
    /// result (`Ok`) or `timeout` has passed (`Err` with the last result).
    pub fn query_within(
        &self,
        promql: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, Value> {
        let start = Instant::now();
        loop {
            let r = self.query(promql);
            if done(&r) {
                return Ok(r);
            }
            if start.elapsed() > timeout {
                return Err(r);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Loads `yaml` in place of the configuration (SIGHUP, as an operator
    /// reloads), keeping the data; returns once Prometheus runs it (its
    /// active targets are those `yaml` names: `targets`).
    pub fn reload(&self, yaml: &str, targets: usize) {
        std::fs::write(&self.config, yaml).expect("write prometheus.yml");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .expect("SIGHUP prometheus");
        let start = Instant::now();
        while self.targets().as_array().map_or(0, Vec::len) != targets {
            assert!(
                start.elapsed() < QUERY_TIMEOUT,
                "prometheus did not reload within {}s:\n{}",
                QUERY_TIMEOUT.as_secs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `data.alerts` of `/api/v1/alerts`: every pending or firing alert.
    pub fn alerts(&self) -> Value {
        self.api("/api/v1/alerts")["alerts"].clone()
    }

    /// `data.groups` of `/api/v1/rules`.
    pub fn rules(&self) -> Value {
        self.api("/api/v1/rules")["groups"].clone()
    }

    /// `data.groups` of `/api/v1/rules` once every rule was evaluated
    /// `evaluations` more times (counted by each group's `lastEvaluation`)
    /// and none failed; panics naming a rule whose health is not `ok`.
    pub fn rules_evaluated(&self, evaluations: usize) -> Value {
        let stamps = |g: &Value| -> Vec<String> {
            g.as_array()
                .map(|a| {
                    a.iter()
                        .map(|g| g["lastEvaluation"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let start = Instant::now();
        let mut seen = stamps(&self.rules());
        let mut left = evaluations;
        loop {
            let groups = self.rules();
            let now = stamps(&groups);
            if now.len() == seen.len() && now.iter().zip(&seen).all(|(a, b)| a != b) {
                left -= 1;
                seen = now;
            }
            for g in groups.as_array().into_iter().flatten() {
                for r in g["rules"].as_array().into_iter().flatten() {
                    let health = r["health"].as_str().unwrap_or("");
                    assert!(
                        health == "ok" || (health == "unknown" && left > 0),
                        "rule {} of group {} is {health}: {}\n{}",
                        r["name"],
                        g["name"],
                        r["lastError"],
                        self.log()
                    );
                }
            }
            if left == 0 {
                eprintln!(
                    "MEASURE prometheus_rules_evaluated_seconds {:.2}",
                    start.elapsed().as_secs_f64()
                );
                return groups;
            }
            assert!(
                start.elapsed() < QUERY_TIMEOUT,
                "the rule groups were not evaluated {evaluations} times in {}s: {groups}\n{}",
                QUERY_TIMEOUT.as_secs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `data.activeTargets` of `/api/v1/targets`.
    pub fn targets(&self) -> Value {
        self.api("/api/v1/targets")["activeTargets"].clone()
    }
}

/// The samples of a vector result as (labels, value).
pub fn vector(result: &Value) -> Vec<(BTreeMap<String, String>, f64)> {
    result
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let labels = s["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                                .collect()
                        })
                        .unwrap_or_default();
                    let v = s["value"][1]
                        .as_str()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(f64::NAN);
                    (labels, v)
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = crate::child::terminate(&mut self.child, Duration::from_secs(30));
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log());
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
