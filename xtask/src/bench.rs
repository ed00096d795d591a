//! `cargo xtask bench [--quick]`: the comparisons operators choose a plugin
//! by, measured side by side in one VM boot, written to bench/RESULTS.md.
//!
//! In the guest: the plugin comparisons (`tests/src/bin/bench.rs`: create
//! latency against capacity for prjquota, a plain-directory plugin and a
//! loopback-image plugin; restore storms; fingerprint; deletes of many
//! files) on a real virtio disk, then the measurement tests that are too
//! long for `cargo xtask test`: exporter scrape cost against the syscall
//! floor, and eBPF overhead. Release builds of the product; ratios, because
//! the guest CPU is emulated.
//!
//! Then the docs' generated blocks (the README's comparison,
//! docs/performance.md) are rendered from the new results (`crate::docs`);
//! `--render-only` renders them from the committed bench/RESULTS.md alone,
//! without a VM. `--only SECTIONS` (a comma-separated list of the plugin
//! comparisons: create, storm, fingerprint, delete, crowd) runs just those,
//! for probing a figure, and prints them without touching RESULTS.md, which
//! only a whole run writes.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::paths::cargo;
use crate::process::{header, run, shell_quote};
use crate::vm::{Fs, VmOpts};

/// The attached file as the guest sees it: vng attaches it as virtio-blk
/// (vda) when the root is shared over 9p (measured on vng 1.42).
const GUEST_DISK: &str = "/dev/vda";

/// Size of the sparse host file the guest gets as a disk: room for the
/// image plugin's 16 GiB volume twice over.
const DISK_BYTES: u64 = 40 << 30;

pub fn main(args: crate::cli::BenchArgs) -> Result<u8> {
    if args.render_only {
        return render_docs(&crate::paths::repo_root()).map(|()| 0);
    }
    let (quick, only) = (args.quick, args.only);
    let root = crate::paths::repo_root();
    let target = crate::paths::target_dir();
    header("deps");
    if crate::deps::main()? != 0 {
        bail!("`cargo xtask deps` failed");
    }
    header("build: release binaries and the bench driver");
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "prjquota",
        "-p",
        "prjquota-exporter",
        "-p",
        "prjquota-vmtests",
        "--bins",
    ]))?;
    let tests = test_binaries(&["scrape_cost", "ebpf"])?;
    // The plugin contenders are built as they ship and as their kind is
    // built: prjquota static, as `cargo xtask dist` packs it; the mkdir
    // plugin static too, as Go builds Nomad's. A dynamic build spends a
    // third of a restore's emulated time in the dynamic loader, which
    // would measure the linking and not the plugin.
    let epoch = crate::dist::source_date_epoch(&root)?;
    let static_dir = crate::dist::build_static(&root, &epoch, &["prjquota"])?;
    crate::dist::assert_static(&static_dir.join("prjquota"))?;

    let work = target.join("bench");
    let plugins = work.join("plugins");
    std::fs::create_dir_all(&plugins)?;
    crate::test::static_mkdir_plugin(&root, &plugins.join("mkdir-plugin"))?;
    for (from, to) in [
        (static_dir.join("prjquota"), "prjquota"),
        (root.join("tests/bench/image-plugin.sh"), "image-plugin.sh"),
        (
            root.join("tests/bench/guide-mkdir-plugin.sh"),
            "guide-mkdir-plugin.sh",
        ),
    ] {
        std::fs::copy(&from, plugins.join(to))
            .with_context(|| format!("copy {}", from.display()))?;
    }
    let disk = work.join("disk.img");
    let _ = std::fs::remove_file(&disk);
    std::fs::File::create(&disk)?.set_len(DISK_BYTES)?;
    let table = work.join("plugins.md");
    let _ = std::fs::remove_file(&table);

    let release = target.join("release");
    let mut script = format!(
        "set -e\nfor i in $(seq 50); do [ -b {dev} ] && break; sleep 0.2; done\n\
         {} --device {dev} --plugin-dir {} --out {}{}{}\n",
        shell_quote(&release.join("bench").to_string_lossy()),
        shell_quote(&plugins.to_string_lossy()),
        shell_quote(&table.to_string_lossy()),
        if quick { " --quick" } else { "" },
        only.as_ref()
            .map_or_else(String::new, |o| format!(" --only {}", shell_quote(o))),
        dev = GUEST_DISK,
    );
    let scrape_test = if quick {
        "scrape_cost_at_100_and_1000_volumes"
    } else {
        "scrape_cost_at_100_to_100000_volumes"
    };
    // A tenth of the size, then the size (a million files:
    // about ten minutes of the guest, four of them making the files).
    let measurement_tests = [
        (&tests[0], scrape_test),
        (&tests[0], "alloc_accounting_at_100_allocations"),
        (&tests[0], "alloc_accounting_at_1000_allocations"),
        (&tests[1], "overhead_of_the_attached_programs"),
    ];
    for (bin, test) in measurement_tests
        .iter()
        .filter(|_| only.is_none())
        .filter(|(_, t)| !(quick && *t == "alloc_accounting_at_1000_allocations"))
    {
        script += &format!(
            "{} --ignored --exact {test} --nocapture --test-threads 1\n",
            shell_quote(&bin.to_string_lossy())
        );
    }
    let script_path = work.join("guest.sh");
    std::fs::write(&script_path, script)?;

    header("bench in one VM boot");
    let opts = VmOpts {
        fs: Fs::All,
        env: vec![(
            "PRJQUOTA_BIN_DIR".into(),
            release.to_string_lossy().into_owned(),
        )],
        disks: vec![disk.clone()],
        rwdirs: vec![work.clone()],
        // A full bench run takes most of an hour under emulation.
        timeout: std::time::Duration::from_secs(2 * 3600),
        ..VmOpts::default()
    };
    let vm = crate::vm::run(
        &opts,
        &format!("bash {}", shell_quote(&script_path.to_string_lossy())),
        &root,
    );
    let _ = std::fs::remove_file(&disk);
    let vm = vm?;
    if vm.status != 0 {
        bail!("the bench failed in the VM (status {})", vm.status);
    }
    let plugins_md = std::fs::read_to_string(&table)
        .with_context(|| format!("the bench wrote no {}", table.display()))?;
    let measures: Vec<&str> = vm
        .lines
        .iter()
        .filter_map(|l| l.split_once("MEASURE ").map(|(_, m)| m.trim()))
        .collect();
    if only.is_some() {
        print!("{plugins_md}");
        for m in &measures {
            println!("MEASURE {m}");
        }
        println!("a run of some sections: bench/RESULTS.md left as it was");
        return Ok(0);
    }
    let report = render(&plugins_md, &measures, quick)?;
    let out = root.join("bench/RESULTS.md");
    std::fs::create_dir_all(out.parent().expect("has a parent"))?;
    std::fs::write(&out, &report)?;
    print!("{report}");
    println!("written to {}", out.display());
    if quick {
        // The docs quote the full run's sizes, which --quick leaves out.
        println!("the docs' generated blocks need a full run: left as they were");
    } else {
        render_docs(&root)?;
    }
    Ok(0)
}

/// Renders the docs' generated blocks from bench/RESULTS.md.
fn render_docs(root: &std::path::Path) -> Result<()> {
    let changed = crate::docs::write_blocks(root)?;
    if changed.is_empty() {
        println!(
            "the docs' generated blocks already match {}",
            crate::docs::RESULTS
        );
    }
    for doc in changed {
        println!("rendered the generated blocks of {doc}");
    }
    Ok(())
}

/// The report: when and where it ran, the plugin tables, every measure.
fn render(plugins_md: &str, measures: &[&str], quick: bool) -> Result<String> {
    let out = |c: &mut Command| -> String {
        c.output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let date = out(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC"));
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let kernel = crate::kernels::to_boot(crate::kernels::Kernel::DEFAULT)?;
    let mut s = format!(
        "# prjquota benchmark results\n\n\
         Produced by `cargo xtask bench{}` on {date}.\n\n\
         - Guest kernel: {} (Debian), QEMU without KVM: the guest CPU is emulated (TCG), so \
         absolute times are many times slower than on hardware; compare the ratios, measured \
         side by side in one boot. The guest boots with `{}`: the emulator then translates a \
         binary's code once rather than at every exec (xtask/src/vm.rs).\n\
         - Host CPU: {cpu}, {} cores.\n\
         - prjquota and the mkdir plugin: static release builds, run from the guest's disk; \
         the exporter and the tests that measure it (with their floors): release builds.\n\
         - Each plugin section starts after a sync with the guest's page cache dropped, so it \
         measures the same run alone (`--only`) as after the others.\n\n",
        if quick { " --quick" } else { "" },
        kernel.display(),
        crate::vm::EMULATOR_APPEND,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    s += plugins_md;
    s += &exporter_tables(measures);
    s += "\n## Every measure\n\n| measure | value |\n| --- | --- |\n";
    for m in measures {
        let (name, value) = m.rsplit_once(' ').unwrap_or((m, ""));
        s += &format!("| `{name}` | {value} |\n");
    }
    Ok(s)
}

/// `name{labels} value` lines as a map from `name{labels}` to the value.
fn measure_map(measures: &[&str]) -> std::collections::BTreeMap<String, f64> {
    measures
        .iter()
        .filter_map(|m| {
            let (name, value) = m.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The exporter's scrape cost and the eBPF overhead as tables, from the
/// measurement tests' `MEASURE` lines (rows whose measures are missing are
/// left out).
fn exporter_tables(measures: &[&str]) -> String {
    let m = measure_map(measures);
    let get = |k: String| m.get(&k).copied();
    let mut s = String::from(
        "\n## Exporter scrape against the syscall floor\n\n\
         The floor is a bare loop of what a scrape must do at least: statfs of every volume \
         root and one quotactl pass over the project IDs. The exporter itself statfs's no \
         root (it derives each volume's numbers from the quota pass and one statfs per \
         filesystem: docs/metrics.md), so a ratio below 1 is a scrape cheaper than that \
         floor. *Scrape* is one `GET /metrics` on a \
         new connection to the last byte; *gzip* is the same asked as Prometheus asks, with \
         `Accept-Encoding: gzip` on a connection already open. Both are wall \
         times. The exporter, the scrapes and the floor share one of the VM's CPUs: its two \
         share one emulator thread, and a thread on one would be charged the other's turns. \
         *CPU* compares what each used (the exporter's threads \
         from the start of its gzip scrape to the end of the floor pass that follows it, \
         against the floor's own thread). Scrape, gzip scrape and floor run in turn in each \
         of 9 rounds, after one warm-up round; medians.\n\n\
         | volumes | scrape | gzip | floor | scrape / floor | gzip / floor | gzip CPU / floor CPU | exposition (gzip) | RSS after scrapes |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for n in [100, 1000, 10_000, 100_000] {
        let (Some(scrape), Some(floor), Some(bytes), Some(rss)) = (
            get(format!("exporter_scrape_seconds{{volumes={n}}}")),
            get(format!("floor_statfs_quota_seconds{{volumes={n}}}")),
            get(format!("exposition_bytes{{volumes={n}}}")),
            get(format!("exporter_vmrss_kib{{volumes={n}}}")),
        ) else {
            continue;
        };
        let gzip = get(format!("exporter_scrape_gzip_seconds{{volumes={n}}}"));
        let cpu = get(format!("exporter_scrape_gzip_cpu_seconds{{volumes={n}}}"))
            .zip(get(format!("floor_cpu_seconds{{volumes={n}}}")))
            .map(|(c, f)| format!("{:.1}× ({:.1} / {:.1} ms)", c / f, c * 1e3, f * 1e3));
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "–".into());
        s += &format!(
            "| {n} | {:.1} ms | {} | {:.1} ms | {:.1}× | {} | {} | {:.1} MB ({}) | {:.1} MiB |\n",
            scrape * 1e3,
            or_dash(gzip.map(|g| format!("{:.1} ms", g * 1e3))),
            floor * 1e3,
            scrape / floor,
            or_dash(gzip.map(|g| format!("{:.1}×", g / floor))),
            or_dash(cpu),
            bytes / 1e6,
            or_dash(
                get(format!("exposition_gzip_bytes{{volumes={n}}}"))
                    .map(|z| format!("{:.0} KB", z / 1e3))
            ),
            rss / 1024.0,
        );
    }
    s += &alloc_table(&m);
    s += "\n## eBPF write telemetry overhead\n\n\
          Write throughput with the programs attached and detached, runs interleaved (ABBA) in \
          one boot; medians. The last column is the programs' own run time from the kernel's \
          BPF statistics, added to the detached time per write: free of the emulator's \
          scheduling noise that the A/B ratio carries.\n\n\
          | workload | detached | attached | attached / detached | from BPF run time |\n\
          | --- | --- | --- | --- | --- |\n";
    for (label, key) in [
        ("4 KiB buffered", "buffered_4k"),
        ("1 MiB buffered", "buffered_1m"),
        ("4 KiB O_DIRECT", "direct_4k"),
    ] {
        let (Some(off), Some(on), Some(ratio)) = (
            get(format!("ebpf_{key}_detached_mb_per_s")),
            get(format!("ebpf_{key}_attached_mb_per_s")),
            get(format!("ebpf_overhead_{key}_ratio")),
        ) else {
            continue;
        };
        let stats = get(format!("ebpf_overhead_{key}_ratio_from_bpf_stats"))
            .map_or("".to_string(), |r| format!("{r:.3}"));
        s += &format!("| {label} | {off:.1} MB/s | {on:.1} MB/s | {ratio:.3} | {stats} |\n");
    }
    s += "\n### The two builds of the programs\n\n\
          The programs' run time per write from the kernel's BPF statistics, for the build \
          that uses `bpf_get_func_ret` and task storage (chosen from Linux 5.17) and for the \
          context-read build (chosen before), both loaded on this kernel, interleaved; \
          medians.\n\n\
          | workload | helpers build | context-read build | context / helpers |\n\
          | --- | --- | --- | --- |\n";
    for (label, key) in [
        ("4 KiB buffered", "buffered_4k"),
        ("4 KiB O_DIRECT", "direct_4k"),
    ] {
        let (Some(helpers), Some(context)) = (
            get(format!("ebpf_program_ns_per_{key}_write")),
            get(format!("ebpf_context_build_ns_per_{key}_write")),
        ) else {
            continue;
        };
        s += &format!(
            "| {label} | {helpers:.0} ns | {context:.0} ns | {:.2} |\n",
            context / helpers
        );
    }
    s
}

/// Per-allocation accounting against a walk of the same trees, from
/// `alloc_scale`'s measures (empty without them).
fn alloc_table(m: &std::collections::BTreeMap<String, f64>) -> String {
    let mut rows = String::new();
    for (allocs, files) in [(100, 1000), (1000, 1000)] {
        let get = |name: &str| {
            m.get(&format!("{name}{{allocs={allocs},files={files}}}"))
                .copied()
        };
        let (Some(gzip), Some(own), Some(pass), Some(walk), Some(first), Some(restart)) = (
            get("alloc_scrape_gzip_seconds"),
            get("alloc_collector_seconds"),
            get("alloc_quota_pass_seconds"),
            get("alloc_walk_seconds"),
            get("alloc_first_accounting_seconds"),
            get("alloc_restart_accounted_seconds"),
        ) else {
            continue;
        };
        rows += &format!(
            "| {allocs} × {files} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}× | {:.2} s | {:.0}× | {:.1} s | {:.1} s |\n",
            gzip * 1e3,
            own * 1e3,
            pass * 1e3,
            own / pass,
            walk,
            walk / gzip,
            first,
            restart,
        );
    }
    if rows.is_empty() {
        return rows;
    }
    format!(
        "\n## Allocation disk usage against a walk\n\n\
         Allocation directories of many files each (one of 64 KiB, the rest empty), \
         accounted by the exporter (`--nomad.alloc-dir`, eBPF and the guard off) on an XFS of \
         their own. *gzip scrape* is the whole scrape as Prometheus asks for it; *allocs \
         collector* the allocations' share of it, as the exporter times it \
         (`prjquota_exporter_scrape_collector_duration_seconds{{collector=\"allocs\"}}`); \
         *quota pass* one quotactl pass over the allocations' project IDs, which is all the \
         scrape reads for them; *walk* a `du -x` of every tree with its inodes cached \
         (each inode once: the bind mounts inside a task directory show the same device), \
         what a tool without project quotas does for the same numbers, which the test \
         holds equal to the exporter's. Medians of 9 scrapes and quota passes, \
         and of 3 walks. *First accounting* runs from the exporter's start until it \
         publishes every allocation (one walk of each tree, which tags it); *restart* is the \
         same after a restart, which walks none.\n\n\
         | allocations × files | gzip scrape | allocs collector | quota pass | collector / quota pass | walk | walk / scrape | first accounting | restart |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n{rows}"
    )
}

/// The executables of the named integration tests of prjquota-vmtests,
/// optimised: their floors (the bare statfs and quotactl loops the
/// exporter is held against) must be the fastest code that makes those
/// calls. A debug build would add its own slowness to each floor, and
/// the exporter, a release build, would look cheaper against it than it is.
fn test_binaries(names: &[&str]) -> Result<Vec<std::path::PathBuf>> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "-p",
        "prjquota-vmtests",
        "--no-run",
        "--message-format=json",
    ]);
    for n in names {
        cmd.args(["--test", n]);
    }
    let out = cmd.output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the measurement tests failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    names
        .iter()
        .map(|n| {
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|m| {
                    m["reason"] == "compiler-artifact"
                        && m["target"]["name"] == *n
                        && m["executable"].is_string()
                })
                .and_then(|m| m["executable"].as_str().map(std::path::PathBuf::from))
                .with_context(|| format!("no executable for test {n}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_show_ratios_and_leave_out_rows_without_measures() {
        let measures = [
            "exporter_scrape_seconds{volumes=1000} 0.2000",
            "exporter_scrape_gzip_cpu_seconds{volumes=1000} 0.0600",
            "floor_cpu_seconds{volumes=1000} 0.0240",
            "floor_statfs_quota_seconds{volumes=1000} 0.0250",
            "exposition_bytes{volumes=1000} 3449869",
            "exporter_vmrss_kib{volumes=1000} 8192",
            "exporter_scrape_gzip_seconds{volumes=1000} 0.1000",
            "exposition_gzip_bytes{volumes=1000} 120000",
            "exporter_scrape_seconds{volumes=100} 0.0200",
            "ebpf_buffered_4k_detached_mb_per_s 200.00",
            "ebpf_buffered_4k_attached_mb_per_s 190.00",
            "ebpf_overhead_buffered_4k_ratio 1.053",
            "ebpf_overhead_buffered_4k_ratio_from_bpf_stats 1.0400",
            "ebpf_program_ns_per_direct_4k_write 800",
            "ebpf_context_build_ns_per_direct_4k_write 1000",
        ];
        let t = exporter_tables(&measures);
        assert!(
            t.contains(
                "| 1000 | 200.0 ms | 100.0 ms | 25.0 ms | 8.0× | 4.0× | 2.5× (60.0 / 24.0 ms) | 3.4 MB (120 KB) | 8.0 MiB |"
            ),
            "{t}"
        );
        assert!(!t.contains("| 100 |"), "{t}");
        assert!(
            t.contains("| 4 KiB buffered | 200.0 MB/s | 190.0 MB/s | 1.053 | 1.040 |"),
            "{t}"
        );
        assert!(!t.contains("1 MiB buffered |"), "{t}");
        assert!(
            t.contains("| 4 KiB O_DIRECT | 800 ns | 1000 ns | 1.25 |"),
            "{t}"
        );
        assert!(!t.contains("| 4 KiB buffered | 0"), "{t}");
        assert!(!t.contains("against a walk"), "no allocation measures: {t}");
    }

    #[test]
    fn the_allocation_table_shows_the_walk_against_the_scrape() {
        let measures = [
            "alloc_scrape_gzip_seconds{allocs=1000,files=1000} 0.0500",
            "alloc_collector_seconds{allocs=1000,files=1000} 0.0300",
            "alloc_quota_pass_seconds{allocs=1000,files=1000} 0.0250",
            "alloc_walk_seconds{allocs=1000,files=1000} 60.0000",
            "alloc_first_accounting_seconds{allocs=1000,files=1000} 300.0000",
            "alloc_restart_accounted_seconds{allocs=1000,files=1000} 2.5000",
            "alloc_scrape_gzip_seconds{allocs=100,files=1000} 0.0100",
        ];
        let t = exporter_tables(&measures);
        assert!(
            t.contains(
                "| 1000 × 1000 | 50.0 ms | 30.0 ms | 25.0 ms | 1.2× | 60.00 s | 1200× | 300.0 s | 2.5 s |"
            ),
            "{t}"
        );
        assert!(
            !t.contains("| 100 × 1000 |"),
            "a row without all its measures: {t}"
        );
    }
}
