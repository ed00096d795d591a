//! `prjquota grow`: a volume grown while its writer uses it, against a
//! real kernel on XFS and ext4, and Nomad's restore, reconcile and the
//! exporter afterwards; a grow that does not fit, a grow killed at each of
//! its steps, and grows racing Nomad's restores.

use prjquota_vmtests::fault_bin;
use prjquota_vmtests::fixture::{writable, Fixture, FsCase, MIB, WRITER};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::operator::{run, run_with, Ran};
use prjquota_vmtests::prom::Exporter;
use prjquota_vmtests::records::assert_ledger_agrees;
use prjquota_vmtests::writer::HeldWriter;

on_every_fs!(
    a_volume_in_use_grows_live_and_nomads_restore_keeps_it,
    a_grow_that_does_not_fit_changes_nothing,
    a_grow_killed_at_each_step_is_finished_by_the_next_call,
    grows_racing_nomads_restores_keep_the_grown_size,
);

/// The kernel's hard limits of a volume: (bytes, inodes).
fn limits(f: &Fixture, id: &str) -> (u64, u64) {
    let q = f.quota(f.project_id(id));
    (q.limits.bytes_hard, q.limits.inodes_hard)
}

fn record_bytes(f: &Fixture, id: &str) -> (u64, Option<u64>) {
    let r = f.record(id).expect("a record");
    (
        r["provisioned_bytes"].as_u64().unwrap(),
        r["grown"]["nomad_bytes"].as_u64(),
    )
}

fn grow(f: &Fixture, id: &str, args: &[&str]) -> Ran {
    let mut a = vec![id];
    a.extend_from_slice(args);
    run(f, "grow", &a)
}

fn a_volume_in_use_grows_live_and_nomads_restore_keeps_it(fs: &FsCase) {
    let f = fs.fixture("grow-live");
    let spec = writable(Spec::new("db", (8 * MIB) as i64)).param("max_inodes", "64");
    let (root, told) = f.create(&spec);
    assert_eq!(told as u64, 8 * MIB);
    let exp = Exporter::start_with(&[&f.node.volumes_dir], &["--guard=off", "--ebpf=off"]);
    let labels = [("volume_id", spec.id.as_str())];
    let capacity = |e: &prjquota_vmtests::prom::Exposition| {
        (
            e.value("nomad_host_volume_capacity_bytes", &labels) as u64,
            e.value("nomad_host_volume_provisioned_bytes", &labels) as u64,
        )
    };
    assert_eq!(capacity(&exp.scrape()), (8 * MIB, 8 * MIB));

    // The application writes until its volume is full, and stays up.
    let mut writer = HeldWriter::open(&root.join("data"), WRITER);
    let full = writer.write(16 * MIB);
    assert_eq!(full.errno, Some(fs.full_errno), "{full:?}");
    assert!(full.written <= 8 * MIB, "{full:?}");

    // The in-incident fix: grown by name, in place.
    let out = grow(&f, "db", &["--to", "24MiB", "--inodes", "128"]);
    out.ok();
    for said in [
        "from 8 MiB to 24 MiB, inodes from 64 to 128",
        "Nomad still believes its capacity is 8 MiB",
        &format!(
            "capacity_max = \"24MiB\" and the parameter max_inodes = \"128\" and id = \"{}\"",
            spec.id
        ),
        "nomad volume create -namespace default",
    ] {
        assert!(
            out.stdout.contains(said),
            "{said:?} not in:\n{}",
            out.stdout
        );
    }
    assert_eq!(limits(&f, &spec.id), (24 * MIB, 128));
    // The same writer's next write goes through.
    let more = writer.write(8 * MIB);
    assert_eq!(
        more,
        prjquota_vmtests::fixture::Filled {
            written: 8 * MIB,
            errno: None
        }
    );
    // The exporter's first scrape after the grow shows it, and still what
    // Nomad's spec asked for.
    let e = exp.scrape();
    assert_eq!(capacity(&e), (24 * MIB, 24 * MIB));
    assert_eq!(
        e.value("nomad_host_volume_quota_hard_limit_inodes", &labels),
        128.0
    );
    assert_eq!(
        e.value("nomad_host_volume_requested_max_bytes", &labels) as u64,
        8 * MIB
    );

    // Nomad's restore at agent start replays the old spec: the volume
    // keeps its grown limits, and Nomad is told what its spec allows.
    let (_, told) = f.create(&spec);
    assert_eq!(told as u64, 8 * MIB, "bytes outside Nomad's [min, max]");
    assert_eq!(limits(&f, &spec.id), (24 * MIB, 128));
    assert_eq!(record_bytes(&f, &spec.id), (24 * MIB, Some(8 * MIB)));
    assert_eq!(writer.write(2 * MIB).errno, None);

    // Nothing for reconcile to fix, and --fix leaves the grown limits.
    let r = run(&f, "reconcile", &["--json"]);
    r.ok();
    assert_eq!(r.json()["clean"], true, "{}", r.stdout);
    run(&f, "reconcile", &["--fix"]).ok();
    assert_eq!(limits(&f, &spec.id), (24 * MIB, 128));
    let l = run(&f, "list", &["--json", "--name", "db"]).json();
    assert_eq!(l["volumes"][0]["size_bytes"], 24 * MIB);
    assert_eq!(l["volumes"][0]["nomad_bytes"], 8 * MIB);
    assert_ledger_agrees(&f.node.volumes_dir, "after the grow and a restore");

    // Repeating the grow changes nothing.
    let again = grow(&f, &spec.id, &["--to", "24MiB"]);
    again.ok();
    assert!(again.stdout.contains("already"), "{}", again.stdout);

    // Once free, Nomad's update to what the grow printed makes the volume
    // Nomad's again, and a later, larger one still works.
    let aligned = Spec {
        max: (24 * MIB) as i64,
        ..spec.clone()
    }
    .param("max_inodes", "128");
    let (_, told) = f.create(&aligned);
    assert_eq!(told as u64, 24 * MIB);
    assert_eq!(record_bytes(&f, &spec.id), (24 * MIB, None));
    let larger = Spec {
        max: (32 * MIB) as i64,
        ..aligned
    };
    let (_, told) = f.create(&larger);
    assert_eq!(told as u64, 32 * MIB);
    assert_eq!(limits(&f, &spec.id), (32 * MIB, 128));
    assert_eq!(capacity(&exp.scrape()), (32 * MIB, 32 * MIB));
    exp.stop();
}

fn a_grow_that_does_not_fit_changes_nothing(fs: &FsCase) {
    let f = fs.fixture("grow-refused");
    f.set_overcommit_ratio(1.0);
    let spec = Spec::new("small", (4 * MIB) as i64).param("max_inodes", "50");
    f.create(&spec);
    let record = f.record(&spec.id);
    let ledger = std::fs::read(f.node.volumes_dir.join(".prjquota/ledger")).ok();
    for (args, said) in [
        // More than the filesystem holds.
        (&["--to", "1PiB"][..], "not enough space to promise"),
        (&["--by", "1PiB"], "not enough space to promise"),
        // Grow never shrinks, nor sets a limit it calls a raise.
        (&["--to", "2MiB"], "never shrinks"),
        (&["--inodes", "10"], "never lowers"),
    ] {
        let out = grow(&f, &spec.id, args);
        assert_eq!(out.code, Some(1), "{args:?}: {out:#?}");
        assert!(
            out.stderr.contains(said),
            "{args:?}: {said:?} not in {}",
            out.stderr
        );
        assert_eq!(f.record(&spec.id), record, "{args:?} changed the record");
        assert_eq!(
            limits(&f, &spec.id),
            (4 * MIB, 50),
            "{args:?} changed the kernel"
        );
        assert_eq!(
            std::fs::read(f.node.volumes_dir.join(".prjquota/ledger")).ok(),
            ledger,
            "{args:?} changed the ledger"
        );
    }
    // The refusal gives the numbers.
    let out = grow(&f, &spec.id, &["--to", "1PiB"]);
    assert!(
        out.stderr.contains("1 PiB") || out.stderr.contains("1125899906842624"),
        "{}",
        out.stderr
    );
    let unknown = grow(&f, "no-such-volume", &["--to", "8MiB"]);
    assert_eq!(unknown.code, Some(1));
    assert!(
        unknown
            .stderr
            .contains("no volume named \"no-such-volume\""),
        "{}",
        unknown.stderr
    );
    // A mistyped flag is a usage error (2), with a suggestion.
    let typo = grow(&f, &spec.id, &["--too", "8MiB"]);
    assert_eq!(typo.code, Some(2));
    assert!(typo.stderr.contains("--to"), "{}", typo.stderr);
    assert_ledger_agrees(&f.node.volumes_dir, "after refused grows");
}

const GROW_POINTS: &[&str] = &["grow:recorded", "grow:limited"];

fn a_grow_killed_at_each_step_is_finished_by_the_next_call(fs: &FsCase) {
    let f = Fixture::with_plugin(
        &(fs.mount)(),
        &format!("{}-grow-crash", fs.name),
        &fault_bin(),
    );
    for point in GROW_POINTS {
        // Finished by the same grow again, by Nomad's restore, or by
        // reconcile --fix: each is what an operator or Nomad does next.
        for next in ["grow", "restore", "reconcile"] {
            let spec = Spec::new(&format!("{point}-{next}"), (4 * MIB) as i64);
            f.create(&spec);
            let killed = run_with(
                &f.node.plugin,
                &f,
                "grow",
                &[&spec.id, "--to", "12MiB"],
                &[("PRJQUOTA_FAULT", point)],
            );
            assert_eq!(
                killed.signal,
                Some(libc::SIGABRT),
                "grow did not abort at {point}: the point is never reached: {killed:#?}"
            );
            match next {
                "grow" => {
                    let out = grow(&f, &spec.id, &["--to", "12MiB"]);
                    out.ok();
                }
                "restore" => {
                    let (_, told) = f.create(&spec);
                    assert_eq!(told as u64, 4 * MIB);
                }
                _ => {
                    run(&f, "reconcile", &["--fix"]);
                }
            }
            assert_eq!(limits(&f, &spec.id).0, 12 * MIB, "{point}, then {next}");
            assert_eq!(
                record_bytes(&f, &spec.id),
                (12 * MIB, Some(4 * MIB)),
                "{point}, then {next}"
            );
            let r = run(&f, "reconcile", &["--json"]);
            assert_eq!(
                r.json()["clean"],
                true,
                "{point}, then {next}: {}",
                r.stdout
            );
            // The ledger a killed grow dropped is rebuilt by the next
            // create, which must count the grown size.
            f.create(&Spec::new("after", MIB as i64));
            assert_ledger_agrees(&f.node.volumes_dir, &format!("{point}, then {next}"));
        }
    }
}

fn grows_racing_nomads_restores_keep_the_grown_size(fs: &FsCase) {
    let f = fs.fixture("grow-race");
    let spec = Spec::new("raced", (4 * MIB) as i64);
    f.create(&spec);
    for round in 1..=4u64 {
        let to = format!("{}MiB", 4 + 4 * round);
        std::thread::scope(|s| {
            let restores = s.spawn(|| {
                for _ in 0..3 {
                    let (_, told) = f.create(&spec);
                    assert_eq!(told as u64, 4 * MIB, "round {round}");
                }
            });
            grow(&f, &spec.id, &["--to", &to]).ok();
            restores.join().expect("the restores");
        });
        let want = (4 + 4 * round) * MIB;
        assert_eq!(limits(&f, &spec.id).0, want, "round {round}");
        assert_eq!(
            record_bytes(&f, &spec.id),
            (want, Some(4 * MIB)),
            "round {round}"
        );
    }
    assert_ledger_agrees(&f.node.volumes_dir, "after the race");
}
