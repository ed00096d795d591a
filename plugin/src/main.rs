//! The `prjquota` executable. Nomad runs it as `<plugin dir>/<plugin id> OP`
//! with only `DHV_*` variables in the environment; stdout must carry exactly
//! one JSON value, so every diagnostic goes to stderr.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use prjquota::admin;
use prjquota::contract::{self, Operation};
use prjquota::ops;

const VERSION: &str = env!("CARGO_PKG_VERSION");

const USAGE: &str = "\
prjquota: Nomad dynamic host volume plugin enforcing volume sizes with XFS/ext4 project quotas

Nomad runs it with one argument and DHV_* variables:
  prjquota fingerprint     print {\"version\": ...}
  prjquota create          create, restore or resize the volume DHV_VOLUME_ID
  prjquota delete          delete the volume DHV_VOLUME_ID

Operator commands (Nomad never runs these):
  prjquota check [--volumes-dir DIR] [--plugin-dir DIR] [--json]
        is this node ready for a volume? one line per requirement, with fixes
  prjquota list [--volumes-dir DIR] [--json] [--bytes]
        the volumes on this node, fullest first
  prjquota reconcile [--volumes-dir DIR] [--plugin-dir DIR] [--fix] [--json]
        compare records, directories and quotas; --fix repairs what loses no data
  prjquota install --plugin-dir DIR
        put this executable into DIR as prjquota, replacing the old one in one
        step (what the packages run; DIR: Nomad's host_volume_plugin_dir)
  prjquota dashboards render [--config FILE] --out DIR
        write the Prometheus rules (alerts.yaml) and the Grafana dashboard
        (prjquota.json) rendered from FILE, a copy of
        /usr/share/prjquota/dashboards/config.toml (the default) with the
        fields you change (see docs/dashboards.md#customising)

  --volumes-dir defaults to /opt/nomad/data/host_volumes; --plugin-dir to the
  directory of this executable (where prjquota.toml is looked up).

Options:
  -h, --help               this text
  -V, --version            the version

Install: `prjquota install --plugin-dir` Nomad's host_volume_plugin_dir, and put
host_volumes_dir on an XFS filesystem mounted with -o prjquota (see docs/install.md).";

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

/// The operator commands. Their output is for people (or `--json`), not
/// for Nomad, so errors are plain text on stderr with exit status 2.
fn admin(op: &str, booleans: &[&str], args: &[OsString]) -> ExitCode {
    let args: Vec<String> = match args.iter().map(|a| a.clone().into_string()).collect() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("prjquota {op}: arguments must be UTF-8");
            return ExitCode::from(2);
        }
    };
    let flags = match admin::parse_flags(&args, booleans) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("prjquota {op}: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let ok = match op {
        "check" => admin::check::print(&admin::check::run(&flags), flags.json),
        "list" => match admin::list::rows(&flags) {
            Ok(rows) if rows.is_empty() && !flags.json => {
                eprintln!("no volumes in {}", flags.volumes_dir().display());
                true
            }
            Ok(rows) => {
                print!("{}", admin::list::render(&rows, flags.json, flags.bytes));
                true
            }
            Err(e) => {
                eprintln!("prjquota list: {e:#}");
                return ExitCode::from(2);
            }
        },
        _ => match admin::reconcile::run(&flags) {
            Ok(findings) => admin::reconcile::print(&findings, flags.json, flags.fix),
            Err(e) => {
                eprintln!("prjquota reconcile: {e:#}");
                return ExitCode::from(2);
            }
        },
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `prjquota install --plugin-dir DIR`: this executable into Nomad's
/// plugin directory (`admin::install`).
fn install(args: &[OsString]) -> ExitCode {
    let dir = match args {
        [flag, dir] if flag == "--plugin-dir" => Path::new(dir).to_path_buf(),
        [flag]
            if flag
                .to_str()
                .is_some_and(|f| f.starts_with("--plugin-dir=")) =>
        {
            Path::new(&flag.to_str().unwrap()["--plugin-dir=".len()..]).to_path_buf()
        }
        _ => {
            eprintln!("prjquota install: expected --plugin-dir DIR\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let installed = std::env::current_exe()
        .context("find this executable (/proc/self/exe)")
        .and_then(|src| admin::install::install(&src, &dir));
    match installed {
        Ok(path) => {
            println!(
                "prjquota: installed the plugin as {} (prjquota {VERSION})",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("prjquota install: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `prjquota dashboards render [--config FILE] --out DIR`
/// (`admin::dashboards`).
fn dashboards(args: &[OsString]) -> ExitCode {
    let args: Vec<String> = match args.iter().map(|a| a.clone().into_string()).collect() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("prjquota dashboards: arguments must be UTF-8");
            return ExitCode::from(2);
        }
    };
    let render = match admin::dashboards::parse(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("prjquota dashboards: {e}");
            return ExitCode::from(2);
        }
    };
    match admin::dashboards::run(&render) {
        Ok(written) => {
            for p in written {
                println!("wrote {} (from {})", p.display(), render.config.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("prjquota dashboards render: {e:#}");
            ExitCode::from(1)
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
    if op == "install" {
        return install(&args[2..]);
    }
    if op == "dashboards" {
        return dashboards(&args[2..]);
    }
    if let Some(booleans) = admin::booleans(op) {
        return admin(op, booleans, &args[2..]);
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
