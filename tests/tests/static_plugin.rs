//! The plugin operators install is the static release build of `cargo xtask
//! dist`, not the debug build the other tests run: these tests run the
//! Nomad-exact conformance tests of `plugin.rs` (every operation through
//! `nomad::run_plugin`: Nomad's argv, environment, stdin and deadline) with
//! that binary as each node's plugin.
//!
//! How: `cargo xtask test` gives the path of the compiled `plugin.rs` test
//! binary (`PRJQUOTA_PLUGIN_TESTS`) and of the static binaries
//! (`PRJQUOTA_STATIC_BIN_DIR`); this test runs the first with
//! `PRJQUOTA_BIN_DIR` pointing at a directory whose `prjquota` is the static
//! one (the helpers it also needs, such as `fill`, stay the run's own).
//! So the static plugin meets the same assertions as the debug one, in one
//! place, with no copy of them to drift.

use std::path::{Path, PathBuf};
use std::process::Command;

use prjquota_vmtests::nomad::run_plugin;
use prjquota_vmtests::{in_vm, static_bin, vm_env};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Left out of the static run, with the reason: they test scale and our
/// memory use rather than the contract, take minutes under emulation, and
/// the 40k test reads the process's RUSAGE_CHILDREN, which is only its own
/// when nextest runs it in a process of its own (here the tests share one).
/// And the ext4 half of the per-filesystem tests: the static build is the
/// same source as the debug one, whose ext4 tests run in the same pass,
/// and the whole set, one test at a time, would cost CI's 45-minute budget
/// about two more minutes; the XFS half and the filesystem-independent
/// tests hold the shipped binary to the Nomad contract.
const SKIPPED: &[&str] = &[
    "restore_storm",
    "deleting_a_directory_of_40k_entries",
    "a_volume_with_many_files_is_deleted_completely",
    "ext4::",
];

/// The fewest tests the static run must pass: plugin.rs's 20 tests on XFS
/// and its 4 others (one of them on ext4), less the skipped (2 + 1). Raise
/// it with plugin.rs.
const MIN_CONFORMANCE_TESTS: usize = 21;

fn ldd(path: &Path) -> String {
    let out = Command::new("ldd").arg(path).output().expect("run ldd");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_release_plugin_is_static_and_answers_fingerprint() {
    assert!(in_vm(), "runs in the VM: `cargo xtask test`");
    let p = static_bin("prjquota");
    let said = ldd(&p);
    assert!(
        said.contains("not a dynamic executable") || said.contains("statically linked"),
        "{} is dynamically linked (ldd: {}): it would need the client's glibc \
         (`cargo xtask dist` links with -C target-feature=+crt-static)",
        p.display(),
        said.trim()
    );
    // The debug build the other tests run is dynamic: ldd tells them apart.
    let debug = prjquota_vmtests::bin("prjquota");
    assert!(
        ldd(&debug).contains("libc.so"),
        "ldd finds no libc in the dynamic debug build {}: {}",
        debug.display(),
        ldd(&debug)
    );
    let fp = run_plugin(
        &static_bin("prjquota"),
        "fingerprint",
        &[("DHV_OPERATION", "fingerprint".into())],
        prjquota_vmtests::nomad::TEST_DEADLINE,
    );
    fp.ok();
    assert_eq!(fp.json()["version"], VERSION, "{}", fp.stdout);
}

#[test]
fn the_nomad_conformance_tests_pass_against_the_static_plugin() {
    assert!(in_vm(), "runs in the VM: `cargo xtask test`");
    let tests = PathBuf::from(vm_env("PRJQUOTA_PLUGIN_TESTS"));
    assert!(
        tests.is_file(),
        "PRJQUOTA_PLUGIN_TESTS={}: no such test binary (`cargo xtask test` sets it to the \
         compiled tests/tests/plugin.rs)",
        tests.display()
    );
    let plugin = static_bin("prjquota");
    assert!(
        ldd(&plugin).contains("not a dynamic executable")
            || ldd(&plugin).contains("statically linked"),
        "{} is not static",
        plugin.display()
    );

    // The run's binaries, with the static plugin as `prjquota`.
    let bins = PathBuf::from(format!("/tmp/prjquota-static-bin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bins);
    std::fs::create_dir_all(&bins).unwrap();
    for e in std::fs::read_dir(vm_env("PRJQUOTA_BIN_DIR"))
        .unwrap()
        .flatten()
    {
        if e.file_name() != "prjquota" {
            std::os::unix::fs::symlink(e.path(), bins.join(e.file_name())).unwrap();
        }
    }
    std::fs::copy(&plugin, bins.join("prjquota")).expect("copy the static plugin");

    // One at a time: nextest already runs this test beside another, and
    // with two threads here the full pass ran three or four tests at once
    // on the shared 512 MiB ext4, which filled (ENOSPC where the 32
    // parallel creates expect EDQUOT).
    let mut args: Vec<String> = vec!["--test-threads".into(), "1".into()];
    for s in SKIPPED {
        args.extend(["--skip".into(), s.to_string()]);
    }
    let list = Command::new(&tests)
        .args(&args)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("list plugin.rs's tests");
    let listed = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.ends_with(": test"))
        .count();
    assert!(
        listed >= MIN_CONFORMANCE_TESTS,
        "{} lists {listed} tests after the skips, fewer than {MIN_CONFORMANCE_TESTS}: \
         plugin.rs lost tests or a skip matches too much",
        tests.display()
    );

    let t = std::time::Instant::now();
    let out = Command::new(&tests)
        .args(&args)
        .env("PRJQUOTA_BIN_DIR", &bins)
        .output()
        .expect("run plugin.rs's tests");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&bins);
    eprintln!("{said}");
    eprintln!(
        "MEASURE static_plugin_conformance_seconds {:.1} tests {listed}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        out.status.success(),
        "plugin.rs's tests failed against the static release plugin {} ({}); their output \
         is above",
        plugin.display(),
        out.status
    );
    let passed = said
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect("a `test result: ok. N passed` line");
    assert_eq!(
        passed, listed,
        "{listed} tests were listed and {passed} passed against the static plugin"
    );
}
