//! Runs the plugin exactly as Nomad's client does (see
//! shared/docs/nomad-dhv-contract.md): argv `[<plugin dir>/<id>, op]`, an
//! environment holding only the `DHV_*` variables in Nomad's order, stdin
//! `/dev/null`, a deadline after which the direct child is SIGKILLed, and
//! stdout parsed as exactly one JSON value.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Nomad's deadline for create and delete.
pub const NOMAD_DEADLINE: Duration = Duration::from_secs(60);

/// The deadline tests give each run. The VM emulates its CPU (no KVM here),
/// so a run can take many times what it takes on hardware; tests assert
/// behaviour and report times (`MEASURE` lines, `cargo xtask bench`), and a
/// slow machine never fails them. A hang still ends.
pub const TEST_DEADLINE: Duration = Duration::from_secs(600);

/// A client node: where its volumes and plugins live.
#[derive(Clone, Debug)]
pub struct Node {
    pub plugin: PathBuf,
    pub volumes_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub node_pool: String,
    pub node_id: String,
}

/// A volume spec as Nomad turns it into variables.
#[derive(Clone, Debug)]
pub struct Spec {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub min: i64,
    pub max: i64,
    /// `None` is sent as `null`, as Nomad does for a spec without parameters.
    pub parameters: Option<BTreeMap<String, String>>,
}

impl Spec {
    /// A spec with a fresh UUID and `capacity_max = max`.
    pub fn new(name: &str, max: i64) -> Spec {
        Spec {
            id: uuid(),
            name: name.to_string(),
            namespace: "default".into(),
            min: 0,
            max,
            parameters: None,
        }
    }

    pub fn param(mut self, k: &str, v: &str) -> Spec {
        self.parameters
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
}

/// A random RFC 4122 version-4 UUID from /dev/urandom.
pub fn uuid() -> String {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("read /dev/urandom");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// What one plugin run gave back.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub killed: bool,
}

impl Outcome {
    /// The one JSON value on stdout (whitespace allowed around it).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not exactly one JSON value ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// A successful create: exit 0, `{"path": abs, "bytes": int64}`.
    pub fn created(&self) -> (PathBuf, i64) {
        assert!(
            self.status.success(),
            "create failed: {:?}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        let v = self.json();
        let path = v["path"].as_str().expect("path is a string");
        let bytes = v["bytes"]
            .as_i64()
            .unwrap_or_else(|| panic!("bytes is not a JSON integer: {}", v["bytes"]));
        let path = PathBuf::from(path);
        assert!(path.is_absolute(), "path {path:?} is not absolute");
        (path, bytes)
    }

    /// A failure: non-zero exit and `{"error": "..."}`; returns the message.
    pub fn error(&self) -> String {
        assert!(
            !self.status.success(),
            "expected a failure, got success: {}",
            self.stdout
        );
        let v = self.json();
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error string in {}", self.stdout));
        assert!(!msg.is_empty());
        msg.to_string()
    }

    pub fn ok(&self) {
        assert!(
            self.status.success(),
            "expected success: {:?}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

impl Node {
    /// A node whose volumes dir is `volumes_dir` and whose plugin is the
    /// `prjquota` binary installed (copied) into `plugin_dir` as `prjquota`.
    pub fn new(plugin: PathBuf, volumes_dir: PathBuf, plugin_dir: PathBuf) -> Node {
        Node {
            plugin,
            volumes_dir,
            plugin_dir,
            node_pool: "default".into(),
            node_id: uuid(),
        }
    }

    /// Runs `op` with exactly these variables, in this order.
    pub fn run(&self, op: &str, vars: &[(&str, String)]) -> Outcome {
        run_plugin(&self.plugin, op, vars, TEST_DEADLINE)
    }

    fn params_json(spec: &Spec) -> String {
        match &spec.parameters {
            None => "null".into(),
            Some(m) => serde_json::to_string(m).expect("params serialise"),
        }
    }

    /// The create variables, in Nomad's order.
    pub fn create_vars(&self, spec: &Spec) -> Vec<(&'static str, String)> {
        vec![
            ("DHV_OPERATION", "create".into()),
            ("DHV_VOLUMES_DIR", self.volumes_dir.display().to_string()),
            ("DHV_PLUGIN_DIR", self.plugin_dir.display().to_string()),
            ("DHV_NODE_POOL", self.node_pool.clone()),
            ("DHV_NAMESPACE", spec.namespace.clone()),
            ("DHV_VOLUME_NAME", spec.name.clone()),
            ("DHV_VOLUME_ID", spec.id.clone()),
            ("DHV_CAPACITY_MIN_BYTES", spec.min.to_string()),
            ("DHV_CAPACITY_MAX_BYTES", spec.max.to_string()),
            ("DHV_NODE_ID", self.node_id.clone()),
            ("DHV_PARAMETERS", Self::params_json(spec)),
        ]
    }

    /// The delete variables, in Nomad's order, with `DHV_CREATED_PATH` as
    /// Nomad would have recorded it.
    pub fn delete_vars(&self, spec: &Spec, created_path: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("DHV_OPERATION", "delete".into()),
            ("DHV_VOLUMES_DIR", self.volumes_dir.display().to_string()),
            ("DHV_PLUGIN_DIR", self.plugin_dir.display().to_string()),
            ("DHV_NODE_POOL", self.node_pool.clone()),
            ("DHV_CREATED_PATH", created_path.display().to_string()),
            ("DHV_NAMESPACE", spec.namespace.clone()),
            ("DHV_VOLUME_NAME", spec.name.clone()),
            ("DHV_VOLUME_ID", spec.id.clone()),
            ("DHV_NODE_ID", self.node_id.clone()),
            ("DHV_PARAMETERS", Self::params_json(spec)),
        ]
    }

    pub fn create(&self, spec: &Spec) -> Outcome {
        self.run("create", &self.create_vars(spec))
    }

    /// Create through the plugin's own library (`prjquota::ops`), with the
    /// variables Nomad would pass, in this process: for tests that need
    /// thousands of volumes, where a process per call would take hours of
    /// emulated time. Returns the volume's root.
    pub fn create_in_process(&self, spec: &Spec) -> anyhow::Result<PathBuf> {
        let req = prjquota::contract::parse_create(self.create_vars(spec))
            .map_err(|e| anyhow::anyhow!("create {}: {e}", spec.id))?;
        let created = prjquota::ops::create(&req, "prjquota")?;
        assert_nomad_accepts(&self.create_vars(spec), created.bytes);
        Ok(created.path)
    }

    /// Delete through the plugin's own library, as [`Self::create_in_process`].
    pub fn delete_in_process(&self, spec: &Spec) -> anyhow::Result<()> {
        let path = self.volumes_dir.join(&spec.id);
        let req = prjquota::contract::parse_delete(self.delete_vars(spec, &path))
            .map_err(|e| anyhow::anyhow!("delete {}: {e}", spec.id))?;
        prjquota::ops::delete(&req)
    }

    /// Starts a create and returns at once (its output discarded): for a
    /// test that kills it as Nomad's deadline does.
    pub fn spawn_create(&self, spec: &Spec) -> std::process::Child {
        plugin_command(&self.plugin, "create", &self.create_vars(spec), &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the plugin")
    }

    /// A create as Nomad runs it, run by `wrapper` (`strace …`): the
    /// plugin is then the wrapper's child, not this process's.
    pub fn create_command_under(&self, wrapper: &[&str], spec: &Spec) -> Command {
        plugin_command_under(
            wrapper,
            &self.plugin,
            "create",
            &self.create_vars(spec),
            &[],
        )
    }

    /// Starts a delete as Nomad runs it, with `extra` variables after
    /// Nomad's (a fault build's pause), and returns at once: for a test that
    /// acts while it runs, then waits for its output.
    pub fn spawn_delete_with(&self, spec: &Spec, extra: &[(&str, String)]) -> std::process::Child {
        let path = self.volumes_dir.join(&spec.id);
        plugin_command(
            &self.plugin,
            "delete",
            &self.delete_vars(spec, &path),
            extra,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the plugin")
    }

    pub fn delete(&self, spec: &Spec) -> Outcome {
        let path = self.volumes_dir.join(&spec.id);
        self.run("delete", &self.delete_vars(spec, &path))
    }

    pub fn fingerprint(&self) -> Outcome {
        run_plugin(
            &self.plugin,
            "fingerprint",
            &[("DHV_OPERATION", "fingerprint".into())],
            TEST_DEADLINE,
        )
    }
}

/// Runs a plugin binary as Nomad does. `/usr/bin/env -i` sets exactly the
/// given variables in the given order (std's Command would sort them) and
/// then execs the plugin, so the plugin is still the direct child that a
/// timeout kills.
pub fn run_plugin(plugin: &Path, op: &str, vars: &[(&str, String)], deadline: Duration) -> Outcome {
    run_plugin_with(plugin, op, vars, deadline, &[])
}

/// Raises this process's limit of open files to at least 65,536 where
/// root may (else to its hard limit), as Nomad's agent does at start (Go's
/// runtime raises the soft limit since Go 1.19; Nomad's systemd unit sets
/// `LimitNOFILE=65536`). A restore storm runs every plugin at once, each
/// with two pipes held open here: 1,000 volumes need more than the default
/// 1,024 descriptors.
pub fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit(RLIMIT_NOFILE)");
    let want = hard.max(65_536);
    if setrlimit(Resource::RLIMIT_NOFILE, want, want).is_err() {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .expect("raise RLIMIT_NOFILE to its hard limit");
    }
}

/// As [`run_plugin`], with extra variables appended after Nomad's (the
/// crash tests use `PRJQUOTA_FAULT`).
pub fn run_plugin_with(
    plugin: &Path,
    op: &str,
    vars: &[(&str, String)],
    deadline: Duration,
    extra: &[(&str, String)],
) -> Outcome {
    let mut cmd = plugin_command(plugin, op, vars, extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn the plugin");
    let mut out = child.stdout.take().expect("stdout piped");
    let mut err = child.stderr.take().expect("stderr piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (status, killed) =
        crate::child::wait_or_kill(&mut child, deadline.saturating_sub(start.elapsed()));
    let elapsed = start.elapsed();
    let outcome = Outcome {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
        elapsed,
        killed,
    };
    if op == "create" && outcome.status.success() {
        if let Ok(v) = serde_json::from_str::<Value>(&outcome.stdout) {
            if let Some(bytes) = v["bytes"].as_u64() {
                assert_nomad_accepts(vars, bytes);
            }
        }
    }
    outcome
}

/// The plugin's command line as Nomad runs it: `/usr/bin/env -i` sets
/// exactly `vars` then `extra`, in this order (std's Command would sort
/// them), and execs the plugin, so the plugin is still the direct child.
fn plugin_command(
    plugin: &Path,
    op: &str,
    vars: &[(&str, String)],
    extra: &[(&str, String)],
) -> Command {
    plugin_command_under(&[], plugin, op, vars, extra)
}

/// [`plugin_command`], started by the command `wrapper` names, if any.
fn plugin_command_under(
    wrapper: &[&str],
    plugin: &Path,
    op: &str,
    vars: &[(&str, String)],
    extra: &[(&str, String)],
) -> Command {
    let mut cmd = match wrapper {
        [] => Command::new("/usr/bin/env"),
        [first, rest @ ..] => {
            let mut c = Command::new(first);
            c.args(rest).arg("/usr/bin/env");
            c
        }
    };
    cmd.arg("-i");
    for (k, v) in vars.iter().chain(extra) {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(plugin)
        .arg(op)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null());
    cmd
}

/// Nomad's rule for the size a create returns, applied to every create and
/// resize the suite makes: the server refuses every later update of a
/// volume whose `capacity_max` is below the stored size
/// (`structs.HostVolume.ValidateUpdate`: "capacity_max (%d) cannot be less
/// than existing provisioned capacity (%d)"), and a size below
/// `capacity_min` is not what was asked for.
pub fn assert_nomad_accepts(vars: &[(&str, String)], bytes: u64) {
    let var = |k: &str| -> u64 {
        vars.iter()
            .find(|(n, _)| *n == k)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    let (min, max) = (var("DHV_CAPACITY_MIN_BYTES"), var("DHV_CAPACITY_MAX_BYTES"));
    assert!(
        bytes >= min && (max == 0 || bytes <= max),
        "create returned {bytes} bytes, outside [capacity_min {min}, capacity_max {max}]: \
         Nomad would refuse every later update of this volume"
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::{assert_nomad_accepts, run_plugin};

    fn vars(min: u64, max: u64) -> Vec<(&'static str, String)> {
        vec![
            ("DHV_CAPACITY_MIN_BYTES", min.to_string()),
            ("DHV_CAPACITY_MAX_BYTES", max.to_string()),
        ]
    }

    #[test]
    fn sizes_within_the_range_pass() {
        assert_nomad_accepts(&vars(0, 10_000_000_000), 9_999_998_976);
        assert_nomad_accepts(&vars(5000, 0), 8192);
    }

    #[test]
    #[should_panic(expected = "Nomad would refuse every later update")]
    fn a_size_above_capacity_max_fails() {
        // What rounding capacity_max = "10GB" up to 4 KiB used to return.
        assert_nomad_accepts(&vars(0, 10_000_000_000), 10_000_007_168);
    }

    #[test]
    #[should_panic(expected = "outside [capacity_min 5000")]
    fn a_size_below_capacity_min_fails() {
        assert_nomad_accepts(&vars(5000, 0), 4096);
    }

    #[test]
    fn a_plugin_past_its_deadline_is_killed_and_a_quick_one_is_not() {
        let quick = run_plugin(Path::new("/bin/echo"), "done", &[], Duration::from_secs(30));
        assert!(quick.status.success() && !quick.killed, "{quick:?}");
        assert_eq!(quick.stdout, "done\n");
        // Returned as soon as it exited, not at the deadline.
        assert!(quick.elapsed < Duration::from_secs(10), "{quick:?}");

        let slow = run_plugin(
            Path::new("/bin/sleep"),
            "30",
            &[],
            Duration::from_millis(300),
        );
        assert!(slow.killed && !slow.status.success(), "{slow:?}");
        assert!(slow.elapsed >= Duration::from_millis(300), "{slow:?}");
        assert!(slow.elapsed < Duration::from_secs(10), "{slow:?}");
    }
}
