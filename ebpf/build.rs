//! Compiles the CO-RE C programs in `src/bpf/*.c` with clang into OUT_DIR,
//! where `src/lib.rs` embeds them.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = manifest.join("src/bpf");
    let clang = env::var_os("CLANG").unwrap_or_else(|| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_FAULT_INJECTION");
    println!("cargo:rerun-if-changed={}", src.display());

    // The uapi headers (<linux/types.h> needs <asm/types.h>) live under the
    // multiarch include directory of the *target*.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    let (multiarch, target_arch) = match arch.as_str() {
        "x86_64" => ("x86_64-linux-gnu", "x86"),
        "aarch64" => ("aarch64-linux-gnu", "arm64"),
        other => panic!("prjquota-ebpf: no BPF build settings for target arch {other}"),
    };

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("read {}: {e}", src.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    for entry in std::fs::read_dir(&src).expect("read src/bpf").flatten() {
        println!("cargo:rerun-if-changed={}", entry.path().display());
    }

    for c in &sources {
        let obj = out
            .join(c.file_stem().expect("file stem"))
            .with_extension("o");
        compile(&clang, c, &obj, &src, multiarch, target_arch, None);
    }
    // The context builds, for kernels before 5.17: the write telemetry
    // without bpf_get_func_ret (each return value read from the program's
    // context), the guard without bpf_loop (a bounded loop walks up) and
    // with a detect hook for kernels without vfs_fileattr_set (vfs_ioctl).
    for stem in ["write_telemetry", "guard"] {
        let c = src.join(format!("{stem}.c"));
        let obj = out.join(format!("{stem}_compat.o"));
        compile(
            &clang,
            &c,
            &obj,
            &src,
            multiarch,
            target_arch,
            Some("-DPRJQUOTA_COMPAT"),
        );
    }
}

fn compile(
    clang: &std::ffi::OsStr,
    c: &Path,
    obj: &Path,
    include: &Path,
    multiarch: &str,
    target_arch: &str,
    define: Option<&str>,
) {
    let status = Command::new(clang)
        .args(["-target", "bpf", "-mcpu=v3", "-O2", "-g", "-c"])
        .arg(format!("-D__TARGET_ARCH_{target_arch}"))
        .args(["-Wall", "-Werror"])
        .args(env::var_os("CARGO_FEATURE_FAULT_INJECTION").map(|_| "-DPRJQUOTA_FAULT_WRONG_RET"))
        .args(define)
        // The object's BTF names its source file and build directory; without
        // the map those carry the checkout's path and two checkouts of one
        // commit would ship different exporters (`cargo xtask dist` promises
        // the same SHA256SUMS).
        .arg(format!(
            "-ffile-prefix-map={}=/build/prjquota/ebpf",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg("-I")
        .arg(include)
        .arg(format!("-I/usr/include/{multiarch}"))
        .arg(c)
        .arg("-o")
        .arg(obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "prjquota-ebpf: `{} -target bpf … {}` failed ({s}); the C programs need clang \
             and libbpf's headers (/usr/include/bpf): run `cargo xtask deps`",
            clang.to_string_lossy(),
            c.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "prjquota-ebpf: clang not found ({}): it compiles the eBPF programs; \
             run `cargo xtask deps` (or set CLANG=/path/to/clang)",
            clang.to_string_lossy()
        ),
        Err(e) => panic!("prjquota-ebpf: cannot run {}: {e}", clang.to_string_lossy()),
    }
}
