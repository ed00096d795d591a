//! The `prjquota` executable. Nomad runs it as `<plugin dir>/<plugin id> OP`
//! with only `DHV_*` variables in the environment; stdout must carry exactly
//! one JSON value, so every diagnostic goes to stderr. The operator
//! commands are parsed by [`prjquota::cli`], their one definition.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use prjquota::admin;
use prjquota::cli::Command;
use prjquota::contract::{self, Operation};
use prjquota::ops;

const VERSION: &str = env!("CARGO_PKG_VERSION");

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

/// The outcome of an operator command that reports clean or not (check:
/// ready; reconcile: nothing left unrepaired): 0 or 1.
fn status(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// An operator command's failure: plain text on stderr.
fn refused(command: &str, e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("prjquota {command}: {e:#}");
    ExitCode::from(code)
}

/// The operator commands, parsed by `cli`. Their output is for people (or
/// `--json`), not for Nomad.
fn operator(command: Command, argv0: Option<&OsString>) -> ExitCode {
    match command {
        // main dispatches Nomad's own form first; these take no arguments,
        // so the parser yields them only for that form, spelled otherwise.
        Command::Fingerprint => nomad("fingerprint", argv0),
        Command::Create => nomad("create", argv0),
        Command::Delete => nomad("delete", argv0),
        Command::Check { node, json } => {
            status(admin::check::print(&admin::check::run(&node.flags()), json))
        }
        Command::List(args) => {
            let flags = args.node.flags();
            match admin::list::rows(&flags, &args.filter()) {
                Ok(rows) if rows.is_empty() && !args.json => {
                    eprintln!(
                        "no volumes in {} (with these filters)",
                        flags.volumes_dir().display()
                    );
                    ExitCode::SUCCESS
                }
                Ok(rows) => {
                    print!("{}", admin::list::render(&rows, args.json, args.bytes));
                    ExitCode::SUCCESS
                }
                Err(e) => refused("list", &e, 2),
            }
        }
        Command::Grow(args) => {
            let size = match (args.to, args.by) {
                (Some(n), _) => Some(ops::Size::To(n)),
                (_, Some(n)) => Some(ops::Size::By(n)),
                _ => None,
            };
            let flags = args.node.flags();
            let req = ops::GrowRequest {
                volumes_dir: flags.volumes_dir(),
                plugin_dir: flags.plugin_dir,
                volume: ops::VolumeRef::parse(&args.volume, &args.namespace),
                size,
                max_inodes: args.inodes,
            };
            match ops::grow(&req) {
                Ok(g) if args.json => {
                    print!("{}", admin::grow::render_json(&g));
                    ExitCode::SUCCESS
                }
                Ok(g) => {
                    print!("{}", admin::grow::render(&g));
                    ExitCode::SUCCESS
                }
                Err(e) => refused("grow", &e, 1),
            }
        }
        Command::Reconcile {
            node,
            fix,
            nomad,
            json,
        } => {
            let flags = admin::Flags {
                fix,
                nomad,
                ..node.flags()
            };
            match admin::reconcile::run(&flags) {
                Ok(findings) => status(admin::reconcile::print(&findings, json, fix)),
                Err(e) => refused("reconcile", &e, 2),
            }
        }
        Command::Install { plugin_dir } => install(&plugin_dir),
    }
}

/// `prjquota install --plugin-dir DIR`: this executable into Nomad's
/// plugin directory (`admin::install`).
fn install(dir: &Path) -> ExitCode {
    let installed = std::env::current_exe()
        .context("find this executable (/proc/self/exe)")
        .and_then(|src| admin::install::install(&src, dir));
    match installed {
        Ok(path) => {
            println!(
                "prjquota: installed the plugin as {} (prjquota {VERSION})",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => refused("install", &e, 1),
    }
}

/// Nomad's operations: `op` alone on the command line.
fn nomad(op: &str, argv0: Option<&OsString>) -> ExitCode {
    let Some(operation) = Operation::parse(op) else {
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
            match ops::create(&req, &plugin_id(argv0)) {
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

fn main() -> ExitCode {
    // A bug must still give Nomad an error object rather than empty stdout
    // (which Nomad takes as an unparsable success).
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("internal error in prjquota {VERSION}: {info}; please report it");
        eprintln!("prjquota: {msg}");
        emit(&contract::error_json(&msg));
    }));

    let args: Vec<OsString> = std::env::args_os().collect();
    // Nomad's form, `[path, op]`, before the parser is built: a restore
    // storm runs this once per volume. An unknown op from Nomad (its
    // DHV_OPERATION set) still gets Nomad's JSON error.
    if let [argv0, op] = args.as_slice() {
        let op = op.to_str().unwrap_or("");
        if Operation::parse(op).is_some() || std::env::var_os("DHV_OPERATION").is_some() {
            return nomad(op, Some(argv0));
        }
    }
    match prjquota::cli::parse_from(&args) {
        Ok(cli) => operator(cli.command, args.first()),
        Err(e) => {
            // --help and --version print and exit 0; a mistake exits 2
            // with clap's message and, for a typo, its suggestion.
            let _ = e.print();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    }
}
