//! `bench --device DEV --plugin-dir DIR --out FILE [--quick]`: the plugin
//! comparisons of `cargo xtask bench`, run inside the VM.
//!
//! Every comparison runs its contenders side by side in this one boot,
//! interleaved sample by sample, and reports ratios: the guest CPU is
//! emulated, so absolute times mean little and ratios hold. Each plugin is
//! run exactly as Nomad runs it (cleared environment, `DHV_*` in Nomad's
//! order). Contenders:
//!
//! - `prjquota`: the static release build `cargo xtask dist` ships;
//! - `mkdir`: what Nomad's built-in plugin does, as a static executable
//!   (as Go builds Nomad);
//! - `image`: a loopback-image plugin as in Nomad's plugin guide (`dd` a
//!   zeroed image of the full size, `mkfs.ext4`, loop-mount);
//! - `guide`: the guide's own `custom-mkdir` bash script, what a new user
//!   starts from (create latency only).
//!
//! DEV is a block device of its own (the VM's attached disk): it is made an
//! XFS mounted with prjquota, so the image plugin's 16 GiB files land on a
//! disk rather than in guest memory.

use std::path::{Path, PathBuf};
use std::time::Instant;

use prjquota_vmtests::nomad::{Node, Spec};
use prjquota_vmtests::{median, sh};

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

struct Args {
    device: String,
    plugin_dir: PathBuf,
    out: PathBuf,
    quick: bool,
    /// Run only these sections (a comma-separated list of create,
    /// durability, storm, fingerprint, delete, crowd): for probing a figure
    /// on the bench's own disk.
    only: Option<String>,
}

fn args() -> Args {
    let mut a = std::env::args().skip(1);
    let (mut device, mut plugin_dir, mut out, mut quick, mut only) =
        (None, None, None, false, None);
    while let Some(x) = a.next() {
        match x.as_str() {
            "--device" => device = a.next(),
            "--plugin-dir" => plugin_dir = a.next().map(PathBuf::from),
            "--out" => out = a.next().map(PathBuf::from),
            "--quick" => quick = true,
            "--only" => only = a.next(),
            other => panic!("unknown argument {other}"),
        }
    }
    Args {
        device: device.expect("--device"),
        plugin_dir: plugin_dir.expect(
            "--plugin-dir (holds prjquota, mkdir-plugin, image-plugin.sh, guide-mkdir-plugin.sh)",
        ),
        out: out.expect("--out"),
        quick,
        only,
    }
}

fn p95(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1]
}

fn ms(d: f64) -> String {
    if d >= 1.0 {
        format!("{d:.2} s")
    } else {
        format!("{:.1} ms", d * 1000.0)
    }
}

/// One contender: a node whose plugin is the given executable.
fn node(mount: &Path, plugins: &Path, name: &str, file: &str) -> Node {
    // Each contender's plugin dir, as Nomad's host_volume_plugin_dir, on the
    // bench filesystem, the executable copied in: Nomad 2.0.1+ refuses a
    // symlinked plugin, and run from the host share every run reads the
    // executable's pages through virtiofs again (measured: 230 ms a
    // prjquota restore, against 93 ms from the guest's disk).
    let dir = mount.join("plugins").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let _ = std::fs::remove_file(&exe);
    std::fs::copy(plugins.join(file), &exe)
        .unwrap_or_else(|e| panic!("copy {file} into {}: {e}", dir.display()));
    // The bench creates volumes far larger than its filesystem (create cost
    // against capacity): admission would refuse them at the default ratio.
    std::fs::write(dir.join("prjquota.toml"), "overcommit_ratio = 1000000.0\n")
        .expect("bench node config");
    let volumes = mount.join(format!("volumes-{name}"));
    Node::new(exe, volumes, dir)
}

fn timed_create(n: &Node, spec: &Spec) -> f64 {
    let out = n.create(spec);
    out.created();
    out.elapsed.as_secs_f64()
}

/// User and system CPU of this process's waited-for children: each
/// plugin run (`env` execs the plugin in place, so one child is one run).
/// A storm's wall time also holds the scheduler's and the spawner's share;
/// this is the plugin's own.
fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage(RUSAGE_CHILDREN)");
    let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    s(u.user_time()) + s(u.system_time())
}

struct Report {
    lines: Vec<String>,
}

impl Report {
    fn measure(&mut self, name: &str, value: f64) {
        println!("MEASURE {name} {value:.6}");
    }
    fn row(&mut self, cells: &[String]) {
        self.lines.push(format!("| {} |", cells.join(" | ")));
    }
    /// A section's heading and its table's header row, after a blank line
    /// unless it is the report's first.
    fn table(&mut self, heading: &str, columns: &[&str]) {
        if !self.lines.is_empty() {
            self.lines.push(String::new());
        }
        self.lines.push(format!("## {heading}"));
        self.lines.push(String::new());
        let cells: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        self.row(&cells);
        self.row(&vec!["---".to_string(); columns.len()]);
    }
}

fn main() {
    let a = args();
    prjquota_vmtests::nomad::raise_open_files_limit();
    let mount = PathBuf::from(MOUNT);
    sh(&format!(
        "mkfs.xfs -q -f {d} && mkdir -p {m} && mount -o prjquota {d} {m}",
        d = a.device,
        m = mount.display()
    ));
    let (free, _) = statvfs(&mount);
    let mut r = Report { lines: Vec::new() };
    let contenders = [
        node(&mount, &a.plugin_dir, "prjquota", "prjquota"),
        node(&mount, &a.plugin_dir, "mkdir", "mkdir-plugin"),
        node(&mount, &a.plugin_dir, "image", "image-plugin.sh"),
        node(&mount, &a.plugin_dir, "guide", "guide-mkdir-plugin.sh"),
    ];
    let sections: [(&str, Section); 8] = [
        ("create", create_latency),
        ("durability", create_durability),
        ("calls", system_calls),
        ("storm", restore_storm),
        ("fingerprint", fingerprint),
        ("delete", delete_many_files),
        ("crowd", create_among_volumes),
        ("squat", create_after_squatted_ids),
    ];
    // --only create,storm: the named sections, in the report's order.
    let only: Option<Vec<&str>> = a.only.as_deref().map(|o| o.split(',').collect());
    for o in only.iter().flatten() {
        assert!(
            sections.iter().any(|(name, _)| name == o),
            "--only takes a comma-separated list of create, durability, calls, storm, fingerprint, delete, crowd, squat (got {o})"
        );
    }
    for (name, section) in sections {
        if only.as_ref().is_none_or(|o| o.contains(&name)) {
            fresh_memory();
            section(&a, &contenders, free, &mut r);
        }
    }

    let table = r.lines.join("\n") + "\n";
    print!("{table}");
    std::fs::write(&a.out, table).expect("write --out");
    sh(&format!("umount {}", mount.display()));
}

/// Every section starts with the guest's memory in the same state, so its
/// figures do not depend on which sections ran before it (`--only` runs it
/// alone): dirty pages written back and the page cache dropped. Without
/// it the create section's image files (16 GiB through a 2 GiB guest)
/// leave the page cache full, and the next section's processes would pay
/// for reclaiming it.
fn fresh_memory() {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .expect("drop the page cache (the bench runs as root)");
}

const NAMES: [&str; 4] = ["prjquota", "mkdir", "image", "guide"];

/// Where the bench's filesystem is mounted in the guest.
const MOUNT: &str = "/tmp/bench-xfs";

/// One section of the report: its tables into `r`, its measures printed.
type Section = fn(&Args, &[Node; 4], u64, &mut Report);

/// Section 1: Create latency against capacity.
fn create_latency(a: &Args, contenders: &[Node; 4], free: u64, r: &mut Report) {
    r.table(
        "Create latency against capacity",
        &[
            "capacity",
            "prjquota median (p95)",
            "mkdir median (p95)",
            "image median (p95)",
            "guide's bash median (p95)",
            "prjquota / mkdir",
            "prjquota / guide's bash",
            "image / prjquota",
        ],
    );
    for (cap, label) in [(64 * MIB, "64 MiB"), (GIB, "1 GiB"), (16 * GIB, "16 GiB")] {
        let samples = if a.quick { 3 } else { 15 };
        let image_samples = match cap {
            c if c >= 16 * GIB => {
                if a.quick {
                    1
                } else {
                    2
                }
            }
            c if c >= GIB => {
                if a.quick {
                    1
                } else {
                    3
                }
            }
            _ => {
                if a.quick {
                    2
                } else {
                    5
                }
            }
        };
        let image_fits = (cap as u64) * 2 < free;
        let mut t: [Vec<f64>; 4] = Default::default();
        for i in 0..samples {
            for (k, n) in contenders.iter().enumerate() {
                if k == 2 && (i >= image_samples || !image_fits) {
                    continue;
                }
                let spec = Spec::new(&format!("b{i}"), cap);
                t[k].push(timed_create(n, &spec));
                n.delete(&spec).ok();
            }
        }
        let mut cell = |k: usize| -> (String, f64) {
            if t[k].is_empty() {
                return ("not run: disk too small".into(), f64::NAN);
            }
            let m = median(t[k].clone());
            let p = p95(&mut t[k]);
            r.measure(&format!("create_{}_{}_median_seconds", NAMES[k], cap), m);
            (format!("{} ({})", ms(m), ms(p)), m)
        };
        let (c0, m0) = cell(0);
        let (c1, m1) = cell(1);
        let (c2, m2) = cell(2);
        let (c3, m3) = cell(3);
        r.row(&[
            label.into(),
            c0,
            c1,
            c2,
            c3,
            format!("{:.2}×", m0 / m1),
            format!("{:.2}×", m0 / m3),
            format!("{:.0}×", m2 / m0),
        ]);
    }
}

/// Section 1b: what a create's durability costs. Each contender's
/// creates run in turn, sample by sample, once as Nomad runs them and once
/// under `strace -T`, which times each flush call from its entry to its
/// return (the wait for the disk, which tracing does not slow). The create
/// less that time is what the same create would cost with no flush: the
/// durability trade, measured on the bench's own disk.
fn create_durability(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    r.table(
        "What a create's flushes cost",
        &[
            "contender",
            "flush calls per create",
            "time in them (median)",
            "create median",
            "create less its flushes",
            "/ mkdir",
            "less its flushes / mkdir",
        ],
    );
    let samples = if a.quick { 3 } else { 15 };
    let trace = Path::new(MOUNT).join("durability.strace");
    let mut created: [Vec<f64>; 2] = Default::default();
    let mut calls: [Vec<f64>; 2] = Default::default();
    let mut flushing: [Vec<f64>; 2] = Default::default();
    for i in 0..samples {
        for (k, n) in contenders[..2].iter().enumerate() {
            let spec = Spec::new(&format!("d{i}"), GIB);
            created[k].push(timed_create(n, &spec));
            n.delete(&spec).ok();
            let spec = Spec::new(&format!("t{i}"), GIB);
            let (count, secs) = traced_flushes(n, &spec, &trace);
            n.delete(&spec).ok();
            calls[k].push(count as f64);
            flushing[k].push(secs);
        }
    }
    let mkdir = median(created[1].clone());
    for k in 0..2 {
        let (c, f, t) = (
            median(calls[k].clone()),
            median(flushing[k].clone()),
            median(created[k].clone()),
        );
        r.measure(&format!("durability_{}_flush_calls", NAMES[k]), c);
        r.measure(&format!("durability_{}_flush_seconds", NAMES[k]), f);
        r.measure(&format!("durability_{}_create_seconds", NAMES[k]), t);
        r.row(&[
            NAMES[k].into(),
            format!("{c:.0}"),
            ms(f),
            ms(t),
            ms(t - f),
            format!("{:.2}×", t / mkdir),
            format!("{:.2}×", (t - f) / mkdir),
        ]);
    }
}

/// Runs one create under `strace -f -T`, tracing the calls that wait for
/// the disk; returns how many there were and the seconds spent in them.
fn traced_flushes(n: &Node, spec: &Spec, trace: &Path) -> (usize, f64) {
    let text = traced_create(
        n,
        spec,
        trace,
        &[
            "-T",
            "-e",
            "trace=fsync,fdatasync,syncfs,sync,sync_file_range,msync",
        ],
    );
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let (_, t) = l.trim_end().rsplit_once('<')?;
            t.strip_suffix('>')?.parse::<f64>().ok()
        })
        .collect();
    (times.len(), times.iter().fold(0.0, |a, t| a + t))
}

/// Section 1c: how many system calls a create and a restore make, from
/// the plugin's exec to its exit: what each contender asks of the kernel,
/// which the emulated CPU makes dear, counted rather than timed.
fn system_calls(_a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    r.table(
        "System calls per operation",
        &[
            "contender",
            "create",
            "restore (the same create again)",
            "create / mkdir",
            "restore / mkdir",
        ],
    );
    let trace = Path::new(MOUNT).join("calls.strace");
    let counts: Vec<(usize, usize)> = contenders[..2]
        .iter()
        .map(|n| {
            // A node's first create also makes the registry: the count is
            // of a create on a node that has had one, whichever sections
            // ran before.
            let first = Spec::new("calls-first", GIB);
            n.create(&first).created();
            n.delete(&first).ok();
            let spec = Spec::new("calls", GIB);
            let create = traced_calls(n, &spec, &trace);
            let restore = traced_calls(n, &spec, &trace);
            n.delete(&spec).ok();
            (create, restore)
        })
        .collect();
    let (mkdir_create, mkdir_restore) = counts[1];
    for (k, (create, restore)) in counts.into_iter().enumerate() {
        r.measure(&format!("calls_{}_create", NAMES[k]), create as f64);
        r.measure(&format!("calls_{}_restore", NAMES[k]), restore as f64);
        r.row(&[
            NAMES[k].into(),
            create.to_string(),
            restore.to_string(),
            format!("{:.1}×", create as f64 / mkdir_create as f64),
            format!("{:.1}×", restore as f64 / mkdir_restore as f64),
        ]);
    }
}

/// Runs one create under `strace -f` and counts the system calls the
/// plugin made after its exec (the `env` that starts it is left out).
fn traced_calls(n: &Node, spec: &Spec, trace: &Path) -> usize {
    let text = traced_create(n, spec, trace, &[]);
    count_after_exec(&text, &n.plugin.to_string_lossy())
        .unwrap_or_else(|| panic!("no exec of {} in the trace:\n{text}", n.plugin.display()))
}

/// The calls `strace -f -qq` shows for the process that exec'd `exe`,
/// after that exec; `None` when the trace has no such exec.
fn count_after_exec(trace: &str, exe: &str) -> Option<usize> {
    let exec = format!("execve(\"{exe}\"");
    let mut lines = trace.lines();
    let pid = lines.by_ref().find_map(|l| {
        let (pid, call) = l.split_once(' ')?;
        call.trim_start().starts_with(&exec).then_some(pid)
    })?;
    Some(
        lines
            .filter_map(|l| l.split_once(' '))
            .filter(|(p, call)| {
                // A call resumed after a signal is the one already counted.
                *p == pid && !call.trim_start().starts_with("<...") && !call.contains("+++")
            })
            .count(),
    )
}

/// Runs one create under `strace -f -qq` with `args` added, and returns
/// the trace.
fn traced_create(n: &Node, spec: &Spec, trace: &Path, args: &[&str]) -> String {
    let _ = std::fs::remove_file(trace);
    let trace_arg = trace.to_string_lossy();
    let mut strace = vec!["/usr/bin/strace", "-f", "-qq", "-o", &trace_arg];
    strace.extend_from_slice(args);
    let out = n
        .create_command_under(&strace, spec)
        .output()
        .expect("run strace (the bench needs it in the guest)");
    assert!(
        out.status.success(),
        "a traced create of {} failed: {}{}",
        n.plugin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(trace).expect("strace's output")
}

/// Section 2: Restore storm: every volume re-created at once, as at agent start.
fn restore_storm(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    r.table(
        "Restore storm (Nomad's budget: 50 s for all volumes)",
        &[
            "volumes",
            "prjquota mean (each storm)",
            "mkdir mean (each storm)",
            "prjquota / mkdir",
            "CPU per restore, prjquota / mkdir",
            "prjquota, share of 50 s",
        ],
    );
    for n_vol in if a.quick { vec![100] } else { vec![100, 1000] } {
        let specs: Vec<Spec> = (0..n_vol)
            .map(|i| Spec::new(&format!("s{i}"), GIB))
            .collect();
        let in_chunks = |node: &Node, op: fn(&Node, &Spec)| {
            for chunk in specs.chunks(32) {
                std::thread::scope(|s| {
                    for sp in chunk {
                        s.spawn(move || op(node, sp));
                    }
                });
            }
        };
        for node in &contenders[..2] {
            in_chunks(node, |n, sp| {
                n.create(sp).created();
            });
        }
        // ABBA BAAB, each storm after a sync: neither contender inherits
        // the writeback of the other's storm or of the section before, each
        // runs as often first as last, and four storms each hold the mean
        // against one slow storm.
        let mut took: [Vec<f64>; 2] = Default::default();
        let mut cpu: [f64; 2] = [0.0; 2];
        for k in [0, 1, 1, 0, 1, 0, 0, 1] {
            nix::unistd::sync();
            let node = &contenders[k];
            let start = Instant::now();
            let cpu_before = children_cpu_seconds();
            std::thread::scope(|s| {
                for sp in &specs {
                    s.spawn(|| node.create(sp).created());
                }
            });
            took[k].push(start.elapsed().as_secs_f64());
            cpu[k] += children_cpu_seconds() - cpu_before;
        }
        for node in &contenders[..2] {
            in_chunks(node, |n, sp| {
                n.delete(sp).ok();
            });
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (p, m) = (mean(&took[0]), mean(&took[1]));
        for (k, t) in [p, m].into_iter().enumerate() {
            r.measure(&format!("restore_storm_{}_{}_seconds", NAMES[k], n_vol), t);
            let per_restore = cpu[k] / (took[k].len() * n_vol) as f64;
            r.measure(
                &format!(
                    "restore_storm_{}_{}_cpu_per_restore_seconds",
                    NAMES[k], n_vol
                ),
                per_restore,
            );
        }
        let each = |v: &[f64]| {
            let storms: Vec<String> = v.iter().map(|t| ms(*t)).collect();
            format!("{} ({})", ms(mean(v)), storms.join(", "))
        };
        r.row(&[
            n_vol.to_string(),
            each(&took[0]),
            each(&took[1]),
            format!("{:.2}×", p / m),
            format!("{:.2}×", cpu[0] / cpu[1]),
            format!("{:.1} %", p / 50.0 * 100.0),
        ]);
    }
}

/// Section 3: fingerprint against Nomad's 1 s deadline, next to the plain-directory
/// plugin's (which only prints its version: the cost of starting a process
/// the way Nomad does), interleaved.
fn fingerprint(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    let rounds = if a.quick { 5 } else { 30 };
    let mut fp: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (k, node) in contenders[..2].iter().enumerate() {
            let o = node.fingerprint();
            o.ok();
            fp[k].push(o.elapsed.as_secs_f64());
        }
    }
    let (fm, fp95) = (median(fp[0].clone()), p95(&mut fp[0]));
    let bm = median(fp[1].clone());
    r.measure("fingerprint_median_seconds", fm);
    r.measure("fingerprint_mkdir_median_seconds", bm);
    r.lines.push(String::new());
    r.lines.push(format!(
        "## fingerprint\n\nmedian {}, p95 {} (Nomad's deadline: 1 s); the plain-directory \
         plugin, which only prints its version: median {} ({:.2}×)",
        ms(fm),
        ms(fp95),
        ms(bm),
        fm / bm
    ));
}

/// Section 4: Delete of a volume full of small files, against Nomad's 60 s.
fn delete_many_files(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    r.table(
        "Delete of a volume of small files (Nomad's deadline: 60 s)",
        &[
            "files",
            "prjquota",
            "mkdir (remove_dir_all)",
            "prjquota / mkdir",
        ],
    );
    for files in if a.quick {
        vec![10_000]
    } else {
        vec![10_000, 100_000]
    } {
        let mut took = [0.0; 2];
        for (k, node) in contenders[..2].iter().enumerate() {
            let spec = Spec::new("files", 4 * GIB);
            let (path, _) = node.create(&spec).created();
            for d in 0..files / 1000 {
                let dir = path.join(format!("d{d}"));
                std::fs::create_dir(&dir).unwrap();
                for i in 0..1000 {
                    std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
                }
            }
            let out = node.delete(&spec);
            out.ok();
            took[k] = out.elapsed.as_secs_f64();
            r.measure(
                &format!("delete_{}_{}_files_seconds", NAMES[k], files),
                took[k],
            );
        }
        r.row(&[
            files.to_string(),
            ms(took[0]),
            ms(took[1]),
            format!("{:.2}×", took[0] / took[1]),
        ]);
    }
}

/// Section 5: create and restore on a node that already holds thousands of
/// volumes, next to the same on an empty node of the same filesystem,
/// interleaved sample by sample. The crowd is made the quick way (records,
/// limits and tags written directly, as the plugin leaves them), and grows
/// from one row to the next; the first create after it grew rebuilds the
/// registry's ledger once and is not a sample.
fn create_among_volumes(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    r.table(
        "Create and restore among many volumes (the same on an empty node = 1×)",
        &[
            "volumes on the node",
            "create median (empty node)",
            "create / empty",
            "restore median (empty node)",
            "restore / empty",
        ],
    );
    let empty = &contenders[0];
    let crowded = node(Path::new(MOUNT), &a.plugin_dir, "crowded", "prjquota");
    // Above the IDs the other nodes of this filesystem choose from.
    const BASE: u32 = 1_500_000_000;
    let samples = if a.quick { 5 } else { 15 };
    let mut made = 0u32;
    let steps: &[u32] = if a.quick {
        &[0, 1000]
    } else {
        &[0, 1000, 10_000, 100_000]
    };
    for &target in steps {
        prjquota_vmtests::records::add_quick_volumes(
            &crowded.volumes_dir,
            made..target,
            BASE,
            64 * MIB as u64,
            |_, _| {},
        );
        made = target;
        let mut t: [[Vec<f64>; 2]; 2] = Default::default();
        for i in 0..=samples {
            for (k, n) in [empty, &crowded].into_iter().enumerate() {
                let spec = Spec::new(&format!("crowd{target}-{i}"), 64 * MIB);
                let create = n.create(&spec);
                create.created();
                let restore = n.create(&spec);
                restore.created();
                if i > 0 {
                    t[0][k].push(create.elapsed.as_secs_f64());
                    t[1][k].push(restore.elapsed.as_secs_f64());
                } else if k == 1 {
                    // What the first create after an upgrade pays once.
                    r.measure(
                        &format!("create_rebuilding_the_ledger_seconds{{volumes={target}}}"),
                        create.elapsed.as_secs_f64(),
                    );
                }
                n.delete(&spec).ok();
            }
        }
        let mut cells = vec![target.to_string()];
        for (op, [e, c]) in ["create", "restore"].into_iter().zip(t) {
            let (e, c) = (median(e), median(c));
            r.measure(
                &format!("{op}_among_volumes_median_seconds{{volumes={target}}}"),
                c,
            );
            r.measure(
                &format!("{op}_empty_node_median_seconds{{volumes={target}}}"),
                e,
            );
            cells.push(ms(e));
            cells.push(format!("{:.2}×", c / e));
        }
        r.row(&cells);
    }
}

/// Section 8: a create after a million project IDs squatted right after
/// the last volume's, inside the volumes' range (a local user's files
/// tagged before any guard refused it: here each ID holds a limit, the
/// cheapest way to make a million dquots), against the same create on a
/// node with nothing squatted.
fn create_after_squatted_ids(a: &Args, contenders: &[Node; 4], _free: u64, r: &mut Report) {
    use std::os::fd::AsFd;
    r.table(
        "Create after project IDs squatted inside the volumes' range (an empty node = 1×)",
        &[
            "squatted IDs",
            "create median (empty node)",
            "create / empty",
        ],
    );
    let empty = &contenders[0];
    let squatted = node(Path::new(MOUNT), &a.plugin_dir, "squatted", "prjquota");
    // A range of its own, above the others' on this filesystem.
    const MIN: u32 = 1_800_000_000;
    std::fs::write(
        squatted.plugin_dir.join("prjquota.toml"),
        format!(
            "overcommit_ratio = 1000000.0\nproject_id_min = {MIN}\nproject_id_max = 1999999999\n"
        ),
    )
    .expect("the squatted node's config");
    let first = Spec::new("squat-first", 64 * MIB);
    squatted.create(&first).created();
    let n: u32 = if a.quick { 10_000 } else { 1_000_000 };
    let fs = std::fs::File::open(MOUNT).unwrap();
    let limits = prjquota_core::quota::Limits {
        bytes_hard: 4096,
        ..prjquota_core::quota::Limits::NONE
    };
    let t = std::time::Instant::now();
    for id in MIN + 1..=MIN + n {
        prjquota_core::quota::set_limits(fs.as_fd(), id, &limits).expect("squat an ID");
    }
    r.measure("squat_ids_seconds", t.elapsed().as_secs_f64());
    fresh_memory();
    let samples = if a.quick { 5 } else { 15 };
    let mut times: [Vec<f64>; 2] = Default::default();
    for i in 0..=samples {
        for (k, node) in [empty, &squatted].into_iter().enumerate() {
            let spec = Spec::new(&format!("squat-{i}"), 64 * MIB);
            let took = timed_create(node, &spec);
            if i > 0 {
                times[k].push(took);
            }
            node.delete(&spec).ok();
        }
    }
    let (e, c) = (median(times[0].clone()), median(times[1].clone()));
    r.measure(
        &format!("create_after_squatted_median_seconds{{ids={n}}}"),
        c,
    );
    r.measure(
        &format!("create_squat_empty_node_median_seconds{{ids={n}}}"),
        e,
    );
    r.row(&[n.to_string(), ms(e), format!("{:.2}×", c / e)]);
    squatted.delete(&first).ok();
    for id in MIN + 1..=MIN + n {
        let _ =
            prjquota_core::quota::set_limits(fs.as_fd(), id, &prjquota_core::quota::Limits::NONE);
    }
}

/// (free bytes, size bytes) of a filesystem.
fn statvfs(path: &Path) -> (u64, u64) {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path).unwrap();
    let st = prjquota_core::sys::fstatfs(f.as_fd()).unwrap();
    let bs = st.f_frsize as u64;
    (st.f_bavail as u64 * bs, st.f_blocks as u64 * bs)
}

#[cfg(test)]
mod tests {
    use super::count_after_exec;

    #[test]
    fn calls_are_counted_from_the_plugins_exec_and_for_its_process_only() {
        let trace = "\
41    execve(\"/usr/bin/env\", [\"/usr/bin/env\"], 0x1 /* 0 vars */) = 0
41    brk(NULL)                         = 0x5555
41    execve(\"/p/prjquota\", [\"/p/prjquota\", \"create\"], 0x2 /* 11 vars */) = 0
41    openat(AT_FDCWD, \"/v\", O_RDONLY) = 3
42    read(3, \"\", 8)                  = 0
41    flock(3, LOCK_EX <unfinished ...>
41    <... flock resumed>)               = 0
41    exit_group(0)                     = ?
41    +++ exited with 0 +++
";
        // openat, flock, exit_group: not env's brk, not the other
        // process's read, the resumed flock once.
        assert_eq!(count_after_exec(trace, "/p/prjquota"), Some(3));
        assert_eq!(count_after_exec(trace, "/p/mkdir"), None);
    }
}
