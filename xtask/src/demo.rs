//! `cargo xtask demo`: installs what is missing, builds the binaries, boots the
//! VM with an enforcing XFS and runs `tests/vm/demo.sh` there.

use anyhow::{bail, Result};

use crate::paths::cargo;
use crate::process::{header, run};
use crate::vm::{Fs, VmOpts};

pub fn main() -> Result<u8> {
    header("deps");
    if crate::deps::main()? != 0 {
        bail!("`cargo xtask deps` failed");
    }
    header("build: cargo build --workspace --bins");
    run(cargo().args(["build", "--workspace", "--bins"]))?;

    header("demo in the VM: tests/vm/demo.sh");
    let root = crate::paths::repo_root();
    let opts = VmOpts {
        fs: Fs::Xfs,
        env: vec![(
            "PRJQUOTA_BIN_DIR".into(),
            crate::paths::target_dir()
                .join("debug")
                .to_string_lossy()
                .into_owned(),
        )],
        ..VmOpts::default()
    };
    let vm = crate::vm::run(&opts, "bash tests/vm/demo.sh", &root)?;
    Ok(u8::try_from(vm.status).unwrap_or(1))
}
