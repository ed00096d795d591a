//! Crash consistency: the plugin is killed (abort, as abrupt as `kill -9`)
//! between every two steps of create and delete, on new and on existing
//! volumes, and the next create or delete must converge: no leaked
//! directory, record, limit or project ID, and no lost data.

use prjquota_vmtests::dm::DmDisk;
use prjquota_vmtests::fixture::{fill, statvfs, writable, Fixture, FsCase, MIB, WRITER};
use prjquota_vmtests::nomad::{run_plugin_with, Spec, TEST_DEADLINE};
use prjquota_vmtests::records::assert_ledger_agrees;
use prjquota_vmtests::{bin, fault_bin, on_every_fs};
use std::os::unix::process::ExitStatusExt;

on_every_fs!(
    the_plain_build_ignores_the_fault_variable,
    a_create_killed_at_any_step_is_finished_by_the_next_create,
    a_root_reaches_its_owner_only_once_tagged,
    a_create_killed_at_any_step_is_cleaned_up_by_delete,
    a_resize_killed_at_any_step_converges_and_keeps_data,
    a_delete_killed_at_any_step_is_finished_by_the_next_delete,
    project_ids_are_never_shared_after_crashes,
    adopting_a_directory_releases_the_id_a_crashed_create_reserved,
    two_volumes_dirs_on_one_filesystem_never_share_a_project_id,
    a_power_cut_at_any_step_of_a_create_keeps_what_returned_and_converges,
    a_power_cut_at_any_step_of_a_delete_keeps_what_returned_and_converges,
);

/// A node on `fs` whose plugin aborts at the fault point it is told.
fn faulty(fs: &FsCase, tag: &str) -> Fixture {
    Fixture::with_plugin(&(fs.mount)(), &format!("{}-{tag}", fs.name), &fault_bin())
}

const CREATE_POINTS: &[&str] = &[
    "create:project-guarded",
    "create:reserved",
    "create:stored",
    "create:recorded",
    "create:limited",
    "create:mkdir",
    "create:guarded",
    "create:tagged",
    "create:attrs",
];
const DELETE_POINTS: &[&str] = &[
    "delete:marked",
    "delete:removed",
    "delete:unguarded",
    "delete:unlimited",
    "delete:unrecorded",
];

fn crash(f: &Fixture, op: &str, vars: &[(&str, String)], point: &str) {
    let out = run_plugin_with(
        &f.node.plugin,
        op,
        vars,
        TEST_DEADLINE,
        &[("PRJQUOTA_FAULT", point.to_string())],
    );
    assert!(
        !out.killed,
        "{op} at fault point {point} ran past the deadline"
    );
    // Only the abort itself counts: any other failure (a refused request, a
    // panic, an exit code) would make every point below look crash-safe.
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{op} did not abort at fault point {point} (status {:?}): the point is never reached\nstderr: {}",
        out.status,
        out.stderr
    );
    assert!(
        out.stdout.is_empty(),
        "{op} wrote a response before aborting at {point}: {:?}",
        out.stdout
    );
}

/// The release build carries no switch: with every fault point set, create
/// and delete succeed and leave nothing behind.
fn the_plain_build_ignores_the_fault_variable(fs: &FsCase) {
    let f = Fixture::with_plugin(
        &(fs.mount)(),
        &format!("{}-crash-plain", fs.name),
        &bin("prjquota"),
    );
    for point in CREATE_POINTS.iter().chain(DELETE_POINTS) {
        let spec = Spec::new(&format!("pl-{point}"), 8 * MIB as i64);
        let out = run_plugin_with(
            &f.node.plugin,
            "create",
            &f.node.create_vars(&spec),
            TEST_DEADLINE,
            &[("PRJQUOTA_FAULT", point.to_string())],
        );
        assert!(
            out.status.success() && !out.stdout.is_empty(),
            "the plain build obeyed PRJQUOTA_FAULT={point} on create: {:?}\nstderr: {}",
            out.status,
            out.stderr
        );
        let pid = f.project_id(&spec.id);
        assert_enforced(&f, &spec, 8 * MIB);
        let path = f.node.volumes_dir.join(&spec.id);
        let out = run_plugin_with(
            &f.node.plugin,
            "delete",
            &f.node.delete_vars(&spec, &path),
            TEST_DEADLINE,
            &[("PRJQUOTA_FAULT", point.to_string())],
        );
        assert!(
            out.status.success(),
            "the plain build obeyed PRJQUOTA_FAULT={point} on delete: {:?}\nstderr: {}",
            out.status,
            out.stderr
        );
        assert_clean(&f, &spec, Some(pid));
    }
}

/// Everything the plugin may have left for a volume is gone.
fn assert_clean(f: &Fixture, spec: &Spec, project_id: Option<u32>) {
    assert!(
        !f.node.volumes_dir.join(&spec.id).exists(),
        "directory leaked"
    );
    assert!(f.record(&spec.id).is_none(), "record leaked");
    let leaked = reservations(f, spec);
    assert!(
        leaked.is_empty(),
        "project ID reservation leaked: {leaked:?}"
    );
    if let Some(pid) = project_id {
        let q = f.quota(pid);
        assert!(q.is_unused(), "project {pid} leaked: {q:?}");
    }
    assert_ledger_agrees(&f.node.volumes_dir, "after the clean-up");
}

/// The volume exists, is enforced at `bytes`, and its record is ready.
fn assert_enforced(f: &Fixture, spec: &Spec, bytes: u64) {
    let path = f.node.volumes_dir.join(&spec.id);
    let rec = f.record(&spec.id).expect("record");
    assert_eq!(rec["state"], "ready");
    let pid = rec["project_id"].as_u64().unwrap() as u32;
    assert_eq!(Fixture::project_of(&path), (pid, true));
    assert_eq!(f.quota(pid).limits.bytes_hard, bytes);
    assert_eq!(statvfs(&path).0, bytes);
    assert_ledger_agrees(&f.node.volumes_dir, "after the recovery");
}

/// The project ID a crashed create reserved, if it got that far.
fn reserved(f: &Fixture, spec: &Spec) -> Option<u32> {
    f.record(&spec.id)
        .and_then(|r| r["project_id"].as_u64())
        .map(|p| p as u32)
}

fn a_create_killed_at_any_step_is_finished_by_the_next_create(fs: &FsCase) {
    let f = faulty(fs, "crash-cc");
    for point in CREATE_POINTS {
        let spec = writable(Spec::new(&format!("cc-{point}"), 8 * MIB as i64));
        crash(&f, "create", &f.node.create_vars(&spec), point);
        let (path, bytes) = f.create(&spec);
        assert_eq!(bytes, 8 * MIB as i64, "{point}");
        assert_enforced(&f, &spec, 8 * MIB);
        let r = fill(&path.join("x"), 16 * MIB, Some(WRITER));
        assert_eq!(r.errno, Some(fs.full_errno), "{point}: {r:?}");
    }
}

/// Whatever step a create stops at, a root its owner can already write is
/// tagged and inherits: no file of the owner's lands in project 0. Before
/// the tag the root is root's and 0700.
fn a_root_reaches_its_owner_only_once_tagged(fs: &FsCase) {
    use std::os::unix::fs::MetadataExt;
    let f = faulty(fs, "crash-own");
    for point in CREATE_POINTS {
        let spec = writable(Spec::new(&format!("own-{point}"), 8 * MIB as i64));
        crash(&f, "create", &f.node.create_vars(&spec), point);
        let path = f.node.volumes_dir.join(&spec.id);
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            let (projid, inherit) = Fixture::project_of(&path);
            let tagged = Some(projid) == reserved(&f, &spec) && inherit;
            if !tagged {
                assert_eq!(
                    (m.uid(), m.mode() & 0o7777),
                    (0, 0o700),
                    "{point}: the root is reachable by others before it is tagged (project {projid}, inherit {inherit})"
                );
            }
        }
        f.node.delete(&spec).ok();
    }
}

fn a_create_killed_at_any_step_is_cleaned_up_by_delete(fs: &FsCase) {
    let f = faulty(fs, "crash-cd");
    for point in CREATE_POINTS {
        let spec = Spec::new(&format!("cd-{point}"), 8 * MIB as i64);
        crash(&f, "create", &f.node.create_vars(&spec), point);
        // The reservation comes before the record; a crash before the
        // record leaves none, and the reservation alone must not leak.
        let pid = reserved(&f, &spec);
        let before_the_record = matches!(*point, "create:project-guarded" | "create:reserved");
        assert_eq!(pid.is_some(), !before_the_record, "{point}");
        f.node.delete(&spec).ok();
        assert_clean(&f, &spec, pid);
    }
}

fn a_resize_killed_at_any_step_converges_and_keeps_data(fs: &FsCase) {
    let f = faulty(fs, "crash-rs");
    for point in &["create:limited", "create:attrs", "create:tagged"] {
        let mut spec = Spec::new("rs", 8 * MIB as i64);
        let (path, _) = f.create(&spec);
        std::fs::write(path.join("keep"), b"data").unwrap();
        spec.max = 16 * MIB as i64;
        crash(&f, "create", &f.node.create_vars(&spec), point);
        assert_eq!(
            std::fs::read(path.join("keep")).unwrap(),
            b"data",
            "{point}"
        );
        f.create(&spec);
        assert_enforced(&f, &spec, 16 * MIB);
        assert_eq!(
            std::fs::read(path.join("keep")).unwrap(),
            b"data",
            "{point}"
        );
        f.node.delete(&spec).ok();
    }
}

fn a_delete_killed_at_any_step_is_finished_by_the_next_delete(fs: &FsCase) {
    let f = faulty(fs, "crash-dd");
    for point in DELETE_POINTS {
        let spec = Spec::new(&format!("dd-{point}"), 8 * MIB as i64);
        let (path, _) = f.create(&spec);
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::write(path.join("a/b/f"), vec![7u8; 1 << 20]).unwrap();
        let pid = f.project_id(&spec.id);
        crash(&f, "delete", &f.node.delete_vars(&spec, &path), point);
        if f.record(&spec.id).is_some() {
            // A restore of a half-deleted volume is refused rather than
            // resurrecting a volume whose data may be partly gone.
            let msg = f.node.create(&spec).error();
            assert!(msg.contains("being deleted"), "{point}: {msg}");
        }
        f.node.delete(&spec).ok();
        assert_clean(&f, &spec, Some(pid));
    }
}

fn project_ids_are_never_shared_after_crashes(fs: &FsCase) {
    let f = faulty(fs, "crash-ids");
    let mut seen = std::collections::BTreeMap::new();
    for point in CREATE_POINTS {
        let spec = Spec::new(&format!("ids-{point}"), 4 * MIB as i64);
        crash(&f, "create", &f.node.create_vars(&spec), point);
        let other = Spec::new("other", 4 * MIB as i64);
        f.create(&other);
        f.create(&spec);
        for s in [&spec, &other] {
            let pid = f.project_id(&s.id);
            if let Some(prev) = seen.insert(pid, s.id.clone()) {
                assert_eq!(prev, s.id, "project {pid} given to two volumes");
            }
        }
    }
}

/// The reservations (`ids/<project ID>.<volume ID>`) held for `spec`.
fn reservations(f: &Fixture, spec: &Spec) -> Vec<String> {
    let ids = f.node.volumes_dir.join(".prjquota/ids");
    let mut v: Vec<String> = std::fs::read_dir(&ids)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(&spec.id))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A create killed after reserving an ID, then a directory with another
/// project ID of the node's range where the volume goes (the registry lost
/// and restored from an older copy): the next create adopts the directory
/// and its ID, and the reservation the crashed create made is released
/// rather than kept forever, by the create and so by the delete.
fn adopting_a_directory_releases_the_id_a_crashed_create_reserved(fs: &FsCase) {
    let f = faulty(fs, "crash-adopt");
    let spec = Spec::new("adopt", 8 * MIB as i64);
    crash(&f, "create", &f.node.create_vars(&spec), "create:reserved");
    let crashed = reservations(&f, &spec);
    assert_eq!(crashed.len(), 1, "{crashed:?}");
    let path = f.node.volumes_dir.join(&spec.id);
    std::fs::create_dir(&path).unwrap();
    let adopted = f.id_max;
    Fixture::tag(&path, adopted);
    std::fs::write(path.join("data"), b"keep").unwrap();

    f.create(&spec);
    assert_eq!(f.project_id(&spec.id), adopted);
    assert_eq!(std::fs::read(path.join("data")).unwrap(), b"keep");
    assert_eq!(
        reservations(&f, &spec),
        [format!("{adopted}.{}", spec.id)],
        "the crashed create's reservation {crashed:?} leaked"
    );
    let first: u32 = crashed[0].split('.').next().unwrap().parse().unwrap();
    assert!(f.quota(first).is_unused(), "{:?}", f.quota(first));
    f.node.delete(&spec).ok();
    assert_clean(&f, &spec, Some(adopted));
}

/// Project IDs belong to the filesystem, not to a volumes directory: two
/// nodes (or one node reconfigured) with volumes directories on one
/// filesystem and the same ID range must not hand out one ID twice, even
/// when a create stops between reserving its ID and using it.
fn two_volumes_dirs_on_one_filesystem_never_share_a_project_id(fs: &FsCase) {
    let a = faulty(fs, "crash-fsw-a");
    let b = a.sibling(
        &(fs.mount)(),
        &format!("{}-crash-fsw-b", fs.name),
        &fault_bin(),
    );
    let v1 = writable(Spec::new("v1", 8 * MIB as i64));
    let v2 = writable(Spec::new("v2", 8 * MIB as i64));
    crash(&a, "create", &a.node.create_vars(&v1), "create:reserved");
    let (p2, _) = b.create(&v2);
    let (p1, _) = a.create(&v1);
    let (id1, id2) = (a.project_id(&v1.id), b.project_id(&v2.id));
    assert_ne!(
        id1, id2,
        "the volumes of two directories share project {id1}"
    );
    assert_eq!(Fixture::project_of(&p1), (id1, true));
    assert_eq!(Fixture::project_of(&p2), (id2, true));
    // Each is charged only its own writes.
    let r = fill(&p1.join("x"), 4 * MIB, Some(WRITER));
    assert_eq!(r.errno, None, "{r:?}");
    assert_eq!(statvfs(&p2).1, 8 * MIB - b.quota(id2).used_bytes);
    assert!(b.quota(id2).used_bytes < MIB, "{:?}", b.quota(id2));
    a.node.delete(&v1).ok();
    b.node.delete(&v2).ok();
    assert_clean(&a, &v1, Some(id1));
    assert_clean(&b, &v2, Some(id2));
}

/// A volume whose create returned, then the power cut at once, before
/// anything else on the node could commit the journal: it is whole, as
/// Nomad was told.
fn returned_then_power_cut(f: &Fixture, disk: &DmDisk, tag: &str) -> Spec {
    let spec = writable(Spec::new(tag, 8 * MIB as i64));
    f.create(&spec);
    disk.power_cut();
    assert_whole(
        f,
        &spec,
        &format!("a power cut right after {tag} was created"),
    );
    spec
}

fn assert_whole(f: &Fixture, spec: &Spec, when: &str) {
    assert!(
        f.record(&spec.id).is_some(),
        "{when}: the record of a volume whose create returned is gone"
    );
    assert_enforced(f, spec, 8 * MIB);
}

/// The power is cut (the filesystem shut down without writing its
/// journal, [`DmDisk::power_cut`]) right after a create stopped at each of
/// its steps: what a kill at that step left, less whatever no journal
/// commit had made durable yet. No record is left unreadable (`record`
/// parses every one), the next create finishes the volume, a delete then
/// leaves nothing, and a volume whose create returned before a cut is
/// whole.
fn a_power_cut_at_any_step_of_a_create_keeps_what_returned_and_converges(fs: &FsCase) {
    let disk = DmDisk::new(fs, "power-create", 400 * MIB);
    let f = disk.fixture_with_plugin("power-create", &fault_bin());
    for point in CREATE_POINTS {
        let kept = returned_then_power_cut(&f, &disk, &format!("kept-{point}"));
        let spec = writable(Spec::new(&format!("pc-{point}"), 8 * MIB as i64));
        crash(&f, "create", &f.node.create_vars(&spec), point);
        disk.power_cut();
        assert_whole(&f, &kept, &format!("a power cut at {point}"));
        let (path, bytes) = f.create(&spec);
        assert_eq!(bytes, 8 * MIB as i64, "{point}");
        assert_enforced(&f, &spec, 8 * MIB);
        let r = fill(&path.join("x"), 16 * MIB, Some(WRITER));
        assert_eq!(r.errno, Some(fs.full_errno), "{point}: {r:?}");
        let pid = f.project_id(&spec.id);
        f.node.delete(&spec).ok();
        assert_clean(&f, &spec, Some(pid));
    }
}

/// [`a_power_cut_at_any_step_of_a_create_keeps_what_returned_and_converges`]
/// for a delete: a volume is never half deleted and ready again, and the
/// next delete leaves nothing.
fn a_power_cut_at_any_step_of_a_delete_keeps_what_returned_and_converges(fs: &FsCase) {
    let disk = DmDisk::new(fs, "power-delete", 400 * MIB);
    let f = disk.fixture_with_plugin("power-delete", &fault_bin());
    let kept = returned_then_power_cut(&f, &disk, "kept");
    for point in DELETE_POINTS {
        let spec = Spec::new(&format!("pd-{point}"), 8 * MIB as i64);
        let (path, _) = f.create(&spec);
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::write(path.join("a/b/f"), vec![7u8; 1 << 20]).unwrap();
        // The tree is durable before the delete starts: whatever the cut
        // takes from it, the delete took.
        prjquota_vmtests::sh(&format!("sync -f {}", path.display()));
        let pid = f.project_id(&spec.id);
        crash(&f, "delete", &f.node.delete_vars(&spec, &path), point);
        disk.power_cut();
        assert_whole(&f, &kept, &format!("a power cut at {point}"));
        if let Some(rec) = f.record(&spec.id) {
            if rec["state"] == "ready" {
                // Nothing of the delete was made durable: the volume is
                // whole.
                assert_eq!(
                    std::fs::metadata(path.join("a/b/f")).map(|m| m.len()).ok(),
                    Some(1 << 20),
                    "{point}: half deleted, yet ready"
                );
            } else {
                let msg = f.node.create(&spec).error();
                assert!(msg.contains("being deleted"), "{point}: {msg}");
            }
        }
        f.node.delete(&spec).ok();
        assert_clean(&f, &spec, Some(pid));
    }
}
