//! The `prjquota` executable. Nomad runs it as `<plugin dir>/<plugin id> OP`
//! with only `DHV_*` variables in the environment; stdout must carry exactly
//! one JSON value, so every diagnostic goes to stderr.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use prjquota::contract::{self, Operation};
use prjquota::ops;

const VERSION: &str = env!("CARGO_PKG_VERSION");

const USAGE: &str = "\
prjquota: Nomad dynamic host volume plugin enforcing volume sizes with XFS/ext4 project quotas

Nomad runs it with one argument and DHV_* variables:
  prjquota fingerprint     print {\"version\": ...}
  prjquota create          create, restore or resize the volume DHV_VOLUME_ID
  prjquota delete          delete the volume DHV_VOLUME_ID

Options:
  -h, --help               this text
  -V, --version            the version

Install: copy this file into the Nomad client's host_volume_plugin_dir and put
host_volumes_dir on an XFS filesystem mounted with -o prjquota (see README).";

/// Prints the one JSON value Nomad reads. A failed write (closed pipe) can
/// only be reported on stderr.
fn emit(json: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{json}").and_then(|()| out.flush()) {
        eprintln!("prjquota: cannot write the result to stdout: {e}");
    }
}

/// Prints the error for Nomad (stdout, shown to the user) and for the agent's
/// log (stderr), and returns the failing exit code.
fn fail(message: &str) -> ExitCode {
    eprintln!("prjquota: error: {message}");
    emit(&contract::error_json(message));
    ExitCode::from(1)
}

/// The plugin ID is the executable's file name in Nomad's plugin dir.
fn plugin_id(argv0: Option<&OsString>) -> String {
    argv0
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prjquota".to_string())
}

fn main() -> ExitCode {
    // A bug must still give Nomad an error object rather than empty stdout
    // (which Nomad takes as an unparsable success).
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("internal error in prjquota {VERSION}: {info}; please report it");
        eprintln!("prjquota: {msg}");
        emit(&contract::error_json(&msg));
    }));

    let args: Vec<OsString> = std::env::args_os().collect();
    let op = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    match op {
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        "-V" | "--version" | "version" => {
            println!("prjquota {VERSION}");
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let Some(operation) = Operation::parse(op) else {
        eprintln!("{USAGE}");
        return fail(&format!(
            "unknown operation {op:?}: expected fingerprint, create or delete"
        ));
    };
    match operation {
        // No I/O: Nomad gives every plugin one second, all at once.
        Operation::Fingerprint => {
            emit(&contract::fingerprint_json(VERSION));
            ExitCode::SUCCESS
        }
        Operation::Create => {
            let req = match contract::parse_create(std::env::vars_os()) {
                Ok(r) => r,
                Err(e) => return fail(&e.to_string()),
            };
            match ops::create(&req, &plugin_id(args.first())) {
                Ok(c) => {
                    emit(&contract::create_response_json(&c.path, c.bytes));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&format!("volume {}: {e:#}", req.volume_id)),
            }
        }
        Operation::Delete => {
            let req = match contract::parse_delete(std::env::vars_os()) {
                Ok(r) => r,
                Err(e) => return fail(&e.to_string()),
            };
            match ops::delete(&req) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("volume {}: {e:#}", req.volume_id)),
            }
        }
    }
}
