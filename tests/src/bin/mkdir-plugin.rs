//! Benchmark baseline: what Nomad's built-in `mkdir` host volume plugin does,
//! as an external executable run exactly like prjquota. `create` makes
//! `<volumes dir>/<volume ID>` with mode 0700 (parameters ignored) and returns
//! `bytes: 0` (no size is enforced); `delete` removes the tree.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn main() {
    let op = std::env::args().nth(1).unwrap_or_default();
    let path = PathBuf::from(var("DHV_VOLUMES_DIR")).join(var("DHV_VOLUME_ID"));
    match op.as_str() {
        "fingerprint" => println!("{{\"version\":\"0.0.1\"}}"),
        "create" => {
            if !path.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&path)
                    .unwrap_or_else(|e| fail(&e.to_string()));
            }
            println!("{{\"path\":{:?},\"bytes\":0}}", path.display().to_string());
        }
        "delete" => {
            if path.exists() {
                std::fs::remove_dir_all(&path).unwrap_or_else(|e| fail(&e.to_string()));
            }
        }
        other => fail(&format!("unknown operation {other:?}")),
    }
}

fn fail(msg: &str) -> ! {
    println!("{{\"error\":{msg:?}}}");
    std::process::exit(1)
}
