//! The operator commands (`prjquota grow`, `list`, `reconcile`…) run on a
//! test node as an operator runs them: the command, then the node's
//! `--volumes-dir` and `--plugin-dir`, then the rest.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use crate::fixture::Fixture;

/// What one operator command did.
#[derive(Debug)]
pub struct Ran {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// Panics unless it exited 0.
    pub fn ok(&self) -> &Ran {
        assert_eq!(self.code, Some(0), "expected success: {self:#?}");
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }
}

/// `plugin command --volumes-dir … --plugin-dir … args…`, with `env`
/// added to the environment.
pub fn run_with(
    plugin: &std::path::Path,
    f: &Fixture,
    command: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Ran {
    let out = Command::new(plugin)
        .arg(command)
        .arg("--volumes-dir")
        .arg(&f.node.volumes_dir)
        .arg("--plugin-dir")
        .arg(&f.node.plugin_dir)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", plugin.display()));
    Ran {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// [`run_with`] for the fixture's own plugin.
pub fn run(f: &Fixture, command: &str, args: &[&str]) -> Ran {
    run_with(&f.node.plugin, f, command, args, &[])
}
