//! Per-allocation disk usage (`--nomad.alloc-dir`): each trap of Nomad's
//! allocation lifecycle, replayed with the system calls Nomad makes
//! (`prjquota_vmtests::nomad_alloc`), on XFS and ext4. Where the design
//! avoids something the kernel refuses, a negative control shows the
//! kernel refusing it.

use std::io::ErrorKind;
use std::time::Duration;

use prjquota_vmtests::attack::{
    act, assert_all_refused, chproj_as, open, Looper, Who, OWNER, RESTART_PHASES,
};
use prjquota_vmtests::dm::DmDisk;
use prjquota_vmtests::fixture::{FsCase, MIB};
use prjquota_vmtests::nomad_alloc::{
    alloc_bytes, inodes_on_mount, project_of, scrape_until, write_file, AllocNode,
};
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::watchdog::{exchange, Pause, Softdog};

on_every_fs!(
    a_started_allocation_is_accounted_and_a_waiting_one_is_left_alone,
    a_sticky_disk_moves_in_by_rename_and_is_charged_to_the_new_allocation,
    a_remote_migration_unpacked_beside_it_renames_in,
    artifacts_and_templates_rename_within_the_task_after_the_walk,
    a_hard_linked_host_file_keeps_its_project_and_a_link_after_is_refused,
    files_made_during_the_walk_all_land_in_the_project,
    a_collected_allocation_frees_its_id_only_once_its_usage_is_gone,
    a_restart_reads_the_projects_back_and_finishes_a_killed_walk,
    a_second_exporter_waits_and_takes_over_when_the_first_stops,
    a_walked_allocation_is_guarded_like_a_volume,
    an_allocation_stays_guarded_through_exporter_restarts,
    an_allocation_is_guarded_from_its_claim_through_its_walk,
    an_escape_the_guard_let_through_is_walked_back_into_the_project,
    two_exporters_with_the_guard_hand_an_allocation_over_without_a_gap,
    a_walk_killed_halfway_with_the_guard_on_stays_guarded_through_the_restart,
    a_disk_failing_mid_walk_is_reported_and_the_walk_finished_after,
    a_device_swapped_in_after_the_listing_is_never_opened_by_the_walk,
    a_file_linked_only_inside_its_allocation_is_counted,
    a_file_linked_outside_is_counted_once_its_outside_link_goes,
    a_file_written_far_below_the_walks_old_depth_is_counted,
    a_file_under_a_write_lease_is_tagged_once_the_lease_goes,
    a_start_waits_for_a_long_first_scan_before_it_takes_the_guard_over,
    a_file_outside_given_an_allocations_id_calls_for_no_walk_of_it,
);

/// The big allocation's walk, on XFS (made for many inodes): a cost test,
/// not a filesystem one.
#[test]
fn a_huge_allocation_walks_in_steps_beside_the_others() {
    huge_allocation(&prjquota_vmtests::fixture::SmallFs::xfs_for_many_files(
        "alloc-huge",
        2048 * MIB,
    ));
}

const WAIT: Duration = Duration::from_secs(60);

fn accounted(e: &prjquota_vmtests::prom::Exposition) -> f64 {
    e.get("prjquota_exporter_allocs", &[("state", "accounted")])
        .unwrap_or(-1.0)
}

fn waiting(e: &prjquota_vmtests::prom::Exposition) -> f64 {
    e.get("prjquota_exporter_allocs", &[("state", "waiting")])
        .unwrap_or(-1.0)
}

fn a_started_allocation_is_accounted_and_a_waiting_one_is_left_alone(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-start", 20);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    write_file(&a.path.join("alloc/data/before"), 64 << 10);
    scrape_until(&exp, WAIT, "the allocation seen waiting", |e| {
        waiting(e) == 1.0
    });
    // Nothing of a waiting allocation is touched.
    assert_eq!(project_of(&a.path), (0, false));
    assert_eq!(project_of(&a.path.join("alloc/data/before")).0, 0);

    // The task starts: writes right after its directory appears, before
    // any scan, must end up charged to it all the same. (Mounts first, so
    // that the walk surely meets them.)
    let task = a.build_task_mounts_first("web");
    write_file(&task.join("local/right-after"), 128 << 10);
    std::fs::write(task.join("secrets/token"), "s3cret").unwrap();
    let e = scrape_until(&exp, WAIT, "the allocation accounted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (192 << 10) as f64)
    });
    let (pid, inherit) = project_of(&a.path);
    assert!(node.ids.contains(&pid) && inherit, "{pid} {inherit}");
    let q = node.usage(pid);
    assert_eq!(alloc_bytes(&e, &a.id), Some(q.used_bytes as f64));
    assert_eq!(
        e.get("nomad_alloc_disk_used_inodes", &[("alloc_id", &a.id)]),
        Some(q.used_inodes as f64)
    );
    // Every inode on the allocation's mount is in its project; the task's
    // mounts (the shared alloc bind mount, secrets, private) were not
    // entered, and the walk says so.
    for (p, ipid, _) in inodes_on_mount(&a.path) {
        assert_eq!(ipid, pid, "{} left out of the project", p.display());
    }
    assert!(
        e.value(
            "prjquota_exporter_alloc_walk_entries_total",
            &[("outcome", "mount")]
        ) >= 3.0,
        "{}",
        e.text
    );
    assert_eq!(
        std::fs::read_to_string(task.join("secrets/token")).unwrap(),
        "s3cret"
    );
    // Nomad's alloc directory itself stays out of every project.
    assert_eq!(project_of(&node.root.path), (0, false));
    // A write after the walk is charged without another walk.
    write_file(&task.join("local/later"), 256 << 10);
    let e = scrape_until(&exp, WAIT, "the later write counted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (448 << 10) as f64)
    });
    assert_eq!(e.value("prjquota_exporter_alloc_walks_total", &[]), 1.0);
    e.assert_collectors_succeeded("accounting one allocation");
    let id = a.id.clone();
    a.destroy();
    scrape_until(&exp, WAIT, "the collected allocation gone", |e| {
        alloc_bytes(e, &id).is_none() && accounted(e) == 0.0
    });
}

fn a_sticky_disk_moves_in_by_rename_and_is_charged_to_the_new_allocation(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-sticky", 20);
    let exp = node.start_exporter(&[]);
    let mut prev = node.root.build_alloc();
    prev.build_task("db");
    scrape_until(&exp, WAIT, "the previous allocation accounted", |e| {
        accounted(e) == 1.0
    });
    write_file(&prev.path.join("alloc/data/db.bin"), 512 << 10);
    write_file(&prev.task("db").join("local/state"), 256 << 10);
    let (prev_pid, _) = project_of(&prev.path);

    // The new allocation is built and waits for the previous one, as the
    // migrate hook makes it; the exporter sees it and leaves it alone.
    let next = node.root.build_alloc();
    scrape_until(&exp, WAIT, "the new allocation seen", |e| {
        waiting(e) + accounted(e) == 2.0
    });
    next.move_from(&prev, &["db"])
        .expect("Nomad's rename of a sticky disk into a waiting allocation");
    assert_eq!(
        project_of(&next.path),
        (0, false),
        "a waiting allocation was tagged"
    );
    assert_eq!(
        std::fs::metadata(next.path.join("alloc/data/db.bin"))
            .unwrap()
            .len(),
        512 << 10
    );

    // Its task starts: the moved data is charged to it, not to the old one.
    let mut next = next;
    next.build_task("db");
    let e = scrape_until(
        &exp,
        WAIT,
        "the moved data charged to the new allocation",
        |e| alloc_bytes(e, &next.id).is_some_and(|b| b >= (768 << 10) as f64),
    );
    let (next_pid, _) = project_of(&next.path);
    assert_ne!(next_pid, prev_pid);
    assert_eq!(project_of(&next.path.join("alloc/data/db.bin")).0, next_pid);
    assert!(
        alloc_bytes(&e, &prev.id).unwrap() < (64 << 10) as f64,
        "the old allocation still charged with what moved out:\n{}",
        e.text
    );

    // Negative control: a design that tagged the new allocation before the
    // move. The kernel refuses Nomad's rename, and Nomad would start the
    // task with empty data.
    let early = node.root.build_alloc();
    prjquota_vmtests::fixture::Fixture::tag(&early.path.join("alloc"), *node.ids.end());
    let refused = std::fs::rename(
        next.path.join("alloc/data"),
        early.path.join("alloc/data-moved"),
    )
    .expect_err("a rename into a directory of another project");
    assert_eq!(refused.raw_os_error(), Some(libc::EXDEV), "{refused}");
    drop(exp);
    prjquota_vmtests::fixture::Fixture::tag(&early.path.join("alloc"), 0);
}

fn a_remote_migration_unpacked_beside_it_renames_in(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-remote", 20);
    let exp = node.start_exporter(&[]);
    let next = node.root.build_alloc();
    // The snapshot from the previous node is unpacked into a sibling
    // <alloc dir>/<previous alloc id>, built as an allocation is, holding
    // alloc/data and each task's local/ (no task directory is built: no
    // tmp). The exporter must leave it alone.
    let unpacked = node.root.build_alloc();
    write_file(&unpacked.path.join("alloc/data/blob"), 256 << 10);
    std::fs::create_dir_all(unpacked.task("app").join("local")).unwrap();
    write_file(&unpacked.task("app").join("local/cache"), 128 << 10);
    scrape_until(&exp, WAIT, "both seen", |e| {
        waiting(e) + accounted(e) == 2.0
    });
    next.move_from(&unpacked, &["app"])
        .expect("the renames from the unpacked sibling into a waiting allocation");
    assert_eq!(
        project_of(&unpacked.path).0,
        0,
        "the unpacked sibling was tagged"
    );
    unpacked.destroy();
    let mut next = next;
    next.build_task("app");
    let e = scrape_until(
        &exp,
        WAIT,
        "the migrated data charged to the new allocation",
        |e| alloc_bytes(e, &next.id).is_some_and(|b| b >= (384 << 10) as f64),
    );
    let (pid, _) = project_of(&next.path);
    assert_eq!(project_of(&next.task("app").join("local/cache")).0, pid);
    assert_eq!(waiting(&e), 0.0, "{}", e.text);
    e.assert_collectors_succeeded("a remote migration");
}

fn artifacts_and_templates_rename_within_the_task_after_the_walk(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-rename", 20);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let task = a.build_task("web");
    // Made as the task starts, before the walk: a template's temporary
    // file in its destination's directory, and an artifact downloading
    // into a directory next to the task.
    std::fs::write(task.join("local/.config.tmpl123"), "rendered").unwrap();
    std::fs::create_dir(task.join("tmp/getter456")).unwrap();
    write_file(&task.join("tmp/getter456/app.tar"), 64 << 10);
    scrape_until(&exp, WAIT, "accounted", |e| alloc_bytes(e, &a.id).is_some());
    let (pid, _) = project_of(&a.path);
    // Renamed after the walk: both in the project already, both allowed.
    std::fs::rename(
        task.join("local/.config.tmpl123"),
        task.join("local/config"),
    )
    .expect("consul-template's rename of its temporary file");
    std::fs::rename(
        task.join("tmp/getter456/app.tar"),
        task.join("local/app.tar"),
    )
    .expect("the artifact's rename into local/");
    // Log rotation and a later render: new files inherit; renames work.
    std::fs::write(task.join("local/.config.tmpl789"), "again").unwrap();
    std::fs::rename(
        task.join("local/.config.tmpl789"),
        task.join("local/config"),
    )
    .unwrap();
    for f in ["local/config", "local/app.tar"] {
        assert_eq!(project_of(&task.join(f)).0, pid, "{f}");
    }
    // A raw_exec task moving a file in from elsewhere on the filesystem
    // now meets EXDEV (docs/allocations.md says so).
    let outside = node.fixture.root.join("outside-file");
    std::fs::write(&outside, "x").unwrap();
    let e = std::fs::rename(&outside, task.join("local/outside")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    drop(exp);
}

fn a_hard_linked_host_file_keeps_its_project_and_a_link_after_is_refused(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-chroot", 20);
    // Host files on the alloc directory's mount, as /usr would be if the
    // data_dir were on the root filesystem.
    let host = node.fixture.root.join("usr-bin");
    std::fs::create_dir(&host).unwrap();
    write_file(&host.join("tool"), 64 << 10);
    write_file(&host.join("other"), 4 << 10);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    // A chroot's hard link made before the walk (here before the task's
    // tmp, so that the scan cannot come first).
    std::fs::create_dir_all(a.task("exec").join("usr/bin")).unwrap();
    std::fs::hard_link(host.join("tool"), a.task("exec").join("usr/bin/tool")).unwrap();
    let task = a.build_task("exec");
    let e = scrape_until(&exp, WAIT, "accounted", |e| alloc_bytes(e, &a.id).is_some());
    assert_eq!(
        project_of(&host.join("tool")).0,
        0,
        "a host file was re-tagged"
    );
    assert!(
        e.value(
            "prjquota_exporter_alloc_walk_entries_total",
            &[("outcome", "linked")]
        ) >= 1.0
    );
    // After the walk a link from the host into the allocation is refused:
    // Nomad falls back to a copy (why the exporter refuses an alloc
    // directory on the mount of a chroot source).
    let refused = std::fs::hard_link(host.join("other"), task.join("usr/bin/other")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EXDEV), "{refused}");
    drop(exp);

    // Named as a chroot source on the same mount, the exporter refuses to
    // account and says why.
    let exp = node.start_exporter(&["--nomad.chroot-source", &host.display().to_string()]);
    let e = scrape_until(&exp, WAIT, "the refusal", |e| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(0.0)
    });
    let log = exp.log();
    assert!(log.contains("a source of the chroots"), "{log}");
    assert!(alloc_bytes(&e, &a.id).is_none());
}

fn files_made_during_the_walk_all_land_in_the_project(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-race", 20);
    let mut a = node.root.build_alloc();
    let task = a.build_task("busy");
    // Enough to walk that the writers below run during the walk.
    for d in 0..20 {
        let dir = task.join(format!("local/d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..250 {
            std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let exdev_after = std::sync::atomic::AtomicU64::new(0);
    let exp = std::thread::scope(|s| {
        for w in 0..3 {
            let (task, stop) = (&task, &stop);
            s.spawn(move || {
                // New inodes all along, but a bounded number of them: the
                // filesystem is shared with the pass's other tests, and a
                // slow walk must not use up its inodes.
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let d = task.join(format!("local/d{}", n % 20));
                    let f = d.join(format!("w{w}-{}", n % 2000));
                    let _ = std::fs::remove_file(&f);
                    let _ = std::fs::write(&f, b"y");
                    if n % 50 == 0 {
                        let nd = task.join(format!("local/new{w}-{}", n / 50 % 40));
                        let _ = std::fs::remove_dir(&nd);
                        let _ = std::fs::create_dir(&nd);
                    }
                    n += 1;
                }
            });
        }
        let exp = node.start_exporter(&[]);
        scrape_until(&exp, WAIT, "accounted", |e| accounted(e) == 1.0);
        // After the walk, a template's write-and-rename in the same
        // directory never fails.
        for i in 0..200 {
            let tmp = task.join(format!("local/d3/.t{i}"));
            std::fs::write(&tmp, b"z").unwrap();
            if let Err(e) = std::fs::rename(&tmp, task.join("local/d3/target")) {
                assert_eq!(e.kind(), ErrorKind::CrossesDevices);
                exdev_after.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        exp
    });
    assert_eq!(exdev_after.into_inner(), 0, "renames failed after the walk");
    let (pid, _) = project_of(&a.path);
    let all = inodes_on_mount(&a.path);
    let left: Vec<_> = all.iter().filter(|(_, p, _)| *p != pid).collect();
    assert!(
        left.is_empty(),
        "{} of {} inodes left out: {:?}",
        left.len(),
        all.len(),
        &left[..left.len().min(5)]
    );
    drop(exp);
}

fn a_collected_allocation_frees_its_id_only_once_its_usage_is_gone(case: &FsCase) {
    // Two IDs: reuse is forced and visible.
    let node = AllocNode::new(case, "alloc-reuse", 2);
    let exp = node.start_exporter(&[]);
    let mut first = node.root.build_alloc();
    let task = first.build_task("t");
    scrape_until(&exp, WAIT, "first accounted", |e| accounted(e) == 1.0);
    let (id1, _) = project_of(&first.path);
    write_file(&task.join("local/held"), 64 << 10);
    let held = std::fs::File::open(task.join("local/held")).unwrap();
    first.destroy();
    scrape_until(&exp, WAIT, "first gone", |e| accounted(e) == 0.0);
    assert!(
        node.usage(id1).used_bytes > 0,
        "the open file keeps its usage"
    );

    let mut second = node.root.build_alloc();
    second.build_task("t");
    scrape_until(&exp, WAIT, "second accounted", |e| accounted(e) == 1.0);
    let (id2, _) = project_of(&second.path);
    assert_ne!(id2, id1);

    // Both IDs taken, one by a live allocation, one by the collected one's
    // open file: a third allocation waits, and says why.
    let mut third = node.root.build_alloc();
    third.build_task("t");
    let e = scrape_until(&exp, WAIT, "the third refused an ID", |e| {
        e.value("prjquota_exporter_alloc_tag_failures_total", &[]) >= 2.0
    });
    assert_eq!(waiting(&e), 1.0, "{}", e.text);
    assert_eq!(project_of(&third.path).0, 0);
    assert!(
        exp.log().contains("no free project ID left"),
        "{}",
        exp.log()
    );

    // Once the file is closed the ID is free, and the third gets it.
    drop(held);
    let e = scrape_until(&exp, WAIT, "third accounted", |e| accounted(e) == 2.0);
    assert_eq!(project_of(&third.path).0, id1);
    e.assert_collectors_succeeded("ID reuse");
}

fn a_restart_reads_the_projects_back_and_finishes_a_killed_walk(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-restart", 20);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let task = a.build_task("t");
    write_file(&task.join("local/f"), 128 << 10);
    let before = scrape_until(&exp, WAIT, "accounted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (128 << 10) as f64)
    });
    exp.stop();
    // A restarted exporter reads the project back: no walk.
    let exp = node.start_exporter(&[]);
    let after = scrape_until(&exp, WAIT, "read back", |e| accounted(e) == 1.0);
    assert_eq!(alloc_bytes(&after, &a.id), alloc_bytes(&before, &a.id));
    assert_eq!(after.value("prjquota_exporter_alloc_walks_total", &[]), 0.0);
    drop(exp);

    // What a walk killed halfway leaves: the allocation directory holds its
    // ID and PROJINHERIT, files below are still in no project, and the
    // walked mark is missing. The next start finishes the walk.
    let mut cut = node.root.build_alloc();
    let t = cut.build_task("t");
    for f in 0..50 {
        std::fs::write(t.join(format!("local/f{f}")), b"x").unwrap();
    }
    let claimed = *node.ids.end();
    prjquota_vmtests::fixture::Fixture::tag(&cut.path, claimed);
    assert_eq!(project_of(&t.join("local/f0")).0, 0);
    let exp = node.start_exporter(&[]);
    let e = scrape_until(&exp, WAIT, "both accounted", |e| accounted(e) == 2.0);
    assert_eq!(project_of(&cut.path).0, claimed, "the claimed ID is kept");
    for (p, ipid, nlink) in inodes_on_mount(&cut.path) {
        assert!(ipid == claimed || nlink > 1, "{} left out", p.display());
    }
    assert_eq!(e.value("prjquota_exporter_alloc_walks_total", &[]), 1.0);

    // And a real kill during a walk of a bigger tree: whatever step it
    // lands on, the next start leaves every inode in the project.
    let mut big = node.root.build_alloc();
    let t = big.build_task("t");
    for d in 0..10 {
        let dir = t.join(format!("local/d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..300 {
            std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
    }
    let deadline = std::time::Instant::now() + WAIT;
    while project_of(&big.path).0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the walk never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    exp.kill();
    let (pid, _) = project_of(&big.path);
    let exp = node.start_exporter(&[]);
    let e = scrape_until(&exp, WAIT, "all accounted", |e| accounted(e) == 3.0);
    assert_eq!(project_of(&big.path).0, pid, "the claimed ID is kept");
    for (p, ipid, nlink) in inodes_on_mount(&big.path) {
        assert!(ipid == pid || nlink > 1, "{} left out", p.display());
    }
    e.assert_collectors_succeeded("a restart");
}

fn a_second_exporter_waits_and_takes_over_when_the_first_stops(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-owner", 20);
    let first = node.start_exporter(&[]);
    scrape_until(&first, WAIT, "the first owns it", |e| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(1.0)
    });
    let second = node.start_exporter(&[]);
    scrape_until(&second, WAIT, "the second refused", |e| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(0.0)
    });
    assert!(
        second.log().contains("another prjquota-exporter"),
        "{}",
        second.log()
    );
    // The first still accounts.
    let mut a = node.root.build_alloc();
    a.build_task("t");
    scrape_until(&first, WAIT, "the first accounts", |e| accounted(e) == 1.0);
    // The second takes over once the first is gone, without a restart.
    drop(first);
    scrape_until(&second, WAIT, "the second takes over", |e| {
        accounted(e) == 1.0
    });
}

#[test]
fn an_alloc_dir_without_project_quota_is_refused_with_the_fix() {
    let parent =
        prjquota_vmtests::scratch_dir(&prjquota_vmtests::xfs_noquota_mount(), "alloc-noquota");
    let root = prjquota_vmtests::nomad_alloc::AllocRoot::new(&parent);
    let exp = prjquota_vmtests::prom::Exporter::start_with(
        &[&parent.join("volumes")],
        &[
            "--nomad.alloc-dir",
            &root.path.display().to_string(),
            "--guard=off",
            "--ebpf=off",
            "--nomad.alloc-scan-interval",
            "200ms",
        ],
    );
    let e = scrape_until(&exp, WAIT, "the refusal", |e| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(0.0)
    });
    // Nothing measured is published as a zero.
    assert!(
        e.get("prjquota_exporter_allocs", &[("state", "accounted")])
            .is_none(),
        "{}",
        e.text
    );
    let log = exp.log();
    assert!(
        log.contains("without project quota") && log.contains("prjquota"),
        "{log}"
    );
}

const GUARDED: &str = "prjquota_exporter_guard_alloc_roots";
const ALLOC_ATTEMPTS: &str = "nomad_alloc_projid_change_attempts_total";

/// An allocation whose task owner (uid [`OWNER`]) has a file and a
/// directory in `local/`, as a task running as a user makes them.
fn owned_task(node: &AllocNode) -> (prjquota_vmtests::nomad_alloc::Alloc, std::path::PathBuf) {
    let mut a = node.root.build_alloc();
    let task = a.build_task("t");
    let (file, dir) = (task.join("local/data"), task.join("local/dir"));
    write_file(&file, 4096);
    std::fs::create_dir(&dir).unwrap();
    for p in [&file, &dir] {
        std::os::unix::fs::chown(p, Some(OWNER), Some(OWNER)).unwrap();
    }
    (a, task)
}

fn a_walked_allocation_is_guarded_like_a_volume(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard", 20);
    let (a, task) = owned_task(&node);
    // Outside the allocation, on its filesystem: a file of the owner's.
    let outside = node.fixture.root.join("owners-file");
    write_file(&outside, 4096);
    std::os::unix::fs::chown(&outside, Some(OWNER), Some(OWNER)).unwrap();

    let exp = node.start_exporter(&["--guard=enforce"]);
    let e = scrape_until(&exp, WAIT, "the allocation in the guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    // The walk's own changes are the exporter's, made before the root
    // joined the guard: not logged one by one as privileged changes.
    assert_eq!(
        e.value("prjquota_exporter_guard_privileged_changes_total", &[]),
        0.0,
        "{}",
        e.text
    );
    let (pid, _) = project_of(&a.path);
    let file = open(&task.join("local/data"));
    let dir = open(&task.join("local/dir"));
    assert_eq!(
        chproj_as(Who::User(OWNER), &file, 0).1,
        Err(libc::EPERM),
        "{}: the task owner moved a file out of the allocation's project\n{}",
        case.name,
        exp.log()
    );
    assert_eq!(
        act(Who::User(OWNER), Some(&dir), &["xflags-clear", "200"]).1,
        Err(libc::EPERM),
        "{}: the task owner cleared PROJINHERIT in the allocation",
        case.name
    );
    assert_eq!(
        chproj_as(Who::User(OWNER), &open(&outside), pid).1,
        Err(libc::EPERM),
        "{}: a file outside took the allocation's project",
        case.name
    );
    assert_eq!(project_of(&task.join("local/data")).0, pid);
    assert_eq!(project_of(&task.join("local/dir")), (pid, true));
    // The file outside is counted apart, not against the allocation.
    let e = scrape_until(&exp, WAIT, "the attempts counted", |e| {
        e.get(ALLOC_ATTEMPTS, &[("alloc_id", &a.id), ("result", "denied")]) == Some(2.0)
            && e.get(
                "prjquota_exporter_guard_outside_attempts_total",
                &[("result", "denied")],
            ) == Some(1.0)
    });
    assert_eq!(
        e.value(
            ALLOC_ATTEMPTS,
            &[("alloc_id", &a.id), ("result", "allowed")]
        ),
        0.0
    );
    let log = exp.log_lines_with("quota escape attempt refused");
    assert!(log.contains(&format!("alloc_id={}", a.id)), "{log}");

    // Collected, the allocation leaves the guard.
    let id = a.id.clone();
    drop((file, dir));
    a.destroy();
    scrape_until(
        &exp,
        WAIT,
        "the collected allocation out of the guard",
        |e| e.get(GUARDED, &[]) == Some(0.0) && alloc_bytes(e, &id).is_none(),
    );
    drop(exp);

    // Negative control: with the guard taken away (--guard=off removes
    // the pins), the kernel lets the owner do what the guard refused.
    let (b, task) = owned_task(&node);
    let exp = node.start_exporter(&[]);
    scrape_until(&exp, WAIT, "accounted, unguarded", |e| accounted(e) == 1.0);
    assert_eq!(
        chproj_as(Who::User(OWNER), &open(&task.join("local/data")), 0).1,
        Ok(()),
        "{}: without the guard the owner's change should go through",
        case.name
    );
    assert_eq!(project_of(&task.join("local/data")).0, 0);
    drop(b);
}

fn an_allocation_stays_guarded_through_exporter_restarts(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-restart", 20);
    let (a, task) = owned_task(&node);
    let exp = node.start_exporter(&["--guard=enforce"]);
    scrape_until(&exp, WAIT, "the allocation in the guard", |e| {
        e.get(GUARDED, &[]) == Some(1.0)
    });
    let (pid, _) = project_of(&a.path);
    let looper = Looper::start(&open(&task.join("local/data")), 0, RESTART_PHASES.len());
    looper.wait_attempts(50);
    looper.enter(1);
    exp.stop_leaving_pins();
    looper.wait_attempts(200);
    let exp = node.start_exporter(&["--guard=enforce"]);
    looper.enter(2);
    looper.wait_attempts(50);
    looper.enter(3);
    let _ = exp.kill();
    looper.wait_attempts(200);
    let exp = node.start_exporter(&["--guard=enforce"]);
    looper.enter(4);
    looper.wait_attempts(50);
    assert_all_refused(&RESTART_PHASES, &looper.stop());
    assert_eq!(project_of(&task.join("local/data")).0, pid);
    let e = exp.scrape();
    assert_eq!(e.get(GUARDED, &[]), Some(1.0), "{}", e.text);
    assert_eq!(e.value("prjquota_exporter_alloc_walks_total", &[]), 0.0);
}

/// The task's owner moves its file out of the project again and again
/// while the exporter claims and walks the allocation: it joins the guard
/// before its directory takes the ID, so every try from then on is
/// refused, and the file ends in the project. The walk's own changes are
/// not the guard's business (the root's project, and PROJINHERIT): no
/// privileged change is logged.
///
/// One try may straddle the claim (the looper is one thread): judged by
/// the LSM before the allocation joined, counted at its end after. Its
/// change is a no-op unless the walk passed the file in between, which
/// the exporter mends by walking again: at most one allowed, and then a
/// second walk.
fn an_allocation_is_guarded_from_its_claim_through_its_walk(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-walk", 20);
    let (mut a, data) = restored_alloc(&node);
    // The guard attached before the owner loops: an attach under a looping
    // owner is what the attach races' one-thread guests run.
    let exp = enforcing_with_one_waiting(&node);
    let looper = Looper::start(&open(&data), 0, 2);
    looper.wait_attempts(50);
    looper.enter(1);
    a.build_task("t");
    let e = scrape_until(&exp, WAIT, "accounted and guarded", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    looper.wait_attempts(100);
    let tally = looper.stop();
    let (pid, _) = project_of(&a.path);
    let settled = std::time::Instant::now() + Duration::from_secs(10);
    while project_of(&data).0 != pid && std::time::Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        project_of(&data).0,
        pid,
        "{}: the owner moved its file out while the allocation was claimed and walked \
         (refused, went through per phase: {tally:?})\n{}",
        case.name,
        exp.log()
    );
    assert!(tally[1].0 > 0, "no try was refused: {tally:?}");
    assert_eq!(
        e.value("prjquota_exporter_guard_privileged_changes_total", &[]),
        0.0,
        "the walk's own changes were judged\n{}",
        e.text
    );
    let e = scrape_until(&exp, WAIT, "the refusals counted", |e| {
        e.get(ALLOC_ATTEMPTS, &[("alloc_id", &a.id), ("result", "denied")])
            .is_some_and(|n| n > 0.0)
    });
    let allowed = e.value(
        ALLOC_ATTEMPTS,
        &[("alloc_id", &a.id), ("result", "allowed")],
    );
    assert!(
        allowed <= 1.0,
        "{}: {allowed} tries went through after the claim; only one can straddle it\n{}",
        case.name,
        exp.log()
    );
    if allowed == 1.0 {
        scrape_until(&exp, WAIT, "the allocation walked again", |e| {
            e.value("prjquota_exporter_alloc_walks_total", &[]) >= 2.0
        });
    }
    drop(exp);
}

/// `--guard=detect` counts the owner's change and lets it through: the
/// exporter walks the allocation again at its next scan, and the file is
/// back in the project, each time. (Under enforce the same walk mends a
/// change judged before the claim and applied after the walk passed the
/// file.) Without a guard nothing counts the change, and nothing mends
/// it: the negative control of `a_walked_allocation_is_guarded_like_a_volume`.
fn an_escape_the_guard_let_through_is_walked_back_into_the_project(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-mend", 20);
    let (a, task) = owned_task(&node);
    let exp = node.start_exporter(&["--guard=detect"]);
    let e = scrape_until(&exp, WAIT, "the allocation in the guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    let walks = e.value("prjquota_exporter_alloc_walks_total", &[]);
    let (pid, _) = project_of(&a.path);
    let data = task.join("local/data");
    for round in 1..=2 {
        assert_eq!(
            chproj_as(Who::User(OWNER), &open(&data), 0).1,
            Ok(()),
            "{}: --guard=detect refused the owner's change",
            case.name
        );
        // The scan publishes its walk count after the walk: the file is
        // back first.
        scrape_until(&exp, WAIT, "the change counted, walked and mended", |e| {
            e.get(
                ALLOC_ATTEMPTS,
                &[("alloc_id", &a.id), ("result", "allowed")],
            ) == Some(f64::from(round))
                && e.value("prjquota_exporter_alloc_walks_total", &[]) >= walks + f64::from(round)
                && project_of(&data).0 == pid
        });
    }
    let log = exp.log_lines_with("walking it again");
    assert!(log.contains(&format!("alloc_id={}", a.id)), "{log}");
    assert_eq!(project_of(&task.join("local/dir")), (pid, true));
    drop(exp);
}

/// What a task's earlier life left (a restored allocation, its task not
/// started again yet): the owner's file `local/data`, then enough files
/// after it that a walk lasts.
fn restored_alloc(node: &AllocNode) -> (prjquota_vmtests::nomad_alloc::Alloc, std::path::PathBuf) {
    let a = node.root.build_alloc();
    let local = a.task("t").join("local");
    std::fs::create_dir_all(&local).unwrap();
    let data = local.join("data");
    write_file(&data, 4096);
    std::os::unix::fs::chown(&data, Some(OWNER), Some(OWNER)).unwrap();
    for d in 0..10 {
        let dir = local.join(format!("bulk{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..300 {
            std::fs::File::create(dir.join(format!("f{f}"))).unwrap();
        }
    }
    (a, data)
}

/// An exporter whose guard enforces, the node's one allocation waiting
/// for its task.
fn enforcing_with_one_waiting(node: &AllocNode) -> prjquota_vmtests::prom::Exporter {
    let exp = node.start_exporter(&["--guard=enforce"]);
    scrape_until(
        &exp,
        WAIT,
        "the guard enforcing, the allocation waiting",
        |e| e.get("prjquota_exporter_guard_enforcing", &[]) == Some(1.0) && waiting(e) == 1.0,
    );
    exp
}

const KILLED_WALK_PHASES: [&str; 4] = [
    "before the claim",
    "claimed, walked",
    "kill -9: no exporter",
    "started again",
];

/// The exporter is killed right after it claimed an allocation, its walk
/// under way, while the task's owner retries every millisecond: the claim
/// is in the pinned guard, which goes on refusing while no exporter runs;
/// the next start guards the allocation again before it finishes the
/// walk, and every inode ends in the project.
fn a_walk_killed_halfway_with_the_guard_on_stays_guarded_through_the_restart(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-kill", 20);
    let (mut a, data) = restored_alloc(&node);
    let exp = enforcing_with_one_waiting(&node);
    let looper = Looper::start(&open(&data), 0, KILLED_WALK_PHASES.len());
    looper.wait_attempts(50);
    a.build_task("t");
    let deadline = std::time::Instant::now() + WAIT;
    while project_of(&a.path).0 == 0 {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        std::thread::sleep(Duration::from_millis(1));
    }
    looper.enter(1);
    let _ = exp.kill();
    let (pid, _) = project_of(&a.path);
    looper.enter(2);
    looper.wait_attempts(200);
    let exp = node.start_exporter(&["--guard=enforce"]);
    let e = scrape_until(&exp, WAIT, "accounted and guarded again", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    looper.enter(3);
    looper.wait_attempts(100);
    let tally = looper.stop();
    // One try may straddle the claim (see the test above); none after.
    assert!(
        tally[1].1 <= 1,
        "{}: tries went through after the claim: {tally:?}",
        case.name
    );
    assert_all_refused(&KILLED_WALK_PHASES[2..], &tally[2..]);
    let settled = std::time::Instant::now() + Duration::from_secs(10);
    while project_of(&data).0 != pid && std::time::Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(project_of(&a.path).0, pid, "the claimed ID is kept");
    for (p, ipid, nlink) in inodes_on_mount(&a.path) {
        assert!(
            ipid == pid || nlink > 1,
            "{}: {} left out (tries per phase: {tally:?})\n{}",
            case.name,
            p.display(),
            exp.log()
        );
    }
    e.assert_collectors_succeeded("the restart");
    drop(exp);
}

const HANDOVER_PHASES: [&str; 4] = [
    "one exporter",
    "a second one started beside it",
    "the first stopped, the second beside its pins",
    "the service started again beside the second",
];

/// A second exporter started with the guard on beside the first (an
/// upgrade's overlap, a copy started by hand): allocations are accounted
/// by the exporter that owns the guard, so the second leaves both to the
/// first and says so. Once the first stops, its pinned guard goes on
/// enforcing and the second still accounts nothing (it does not own that
/// guard); the service started again owns both, reads the allocation back
/// (no walk), and guards the next one from its claim. The owner's tries
/// are refused throughout. (Before, the second took the allocations over
/// when the first stopped, and the restarted service, owning the guard
/// without them, took every allocation root the second wrote out of it.)
fn two_exporters_with_the_guard_hand_an_allocation_over_without_a_gap(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-two", 20);
    let (a, task) = owned_task(&node);
    let first = node.start_exporter(&["--guard=enforce"]);
    scrape_until(&first, WAIT, "the allocation in the first's guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    let (pid, _) = project_of(&a.path);
    let data = task.join("local/data");
    let looper = Looper::start(&open(&data), 0, HANDOVER_PHASES.len());
    looper.wait_attempts(50);
    looper.enter(1);
    let second = node.start_exporter(&["--guard=enforce"]);
    let refused = |e: &prjquota_vmtests::prom::Exposition| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(0.0)
    };
    scrape_until(&second, WAIT, "the second leaving the allocations", refused);
    looper.wait_attempts(100);
    looper.enter(2);
    first.stop_leaving_pins();
    looper.wait_attempts(100);
    // An allocation whose task starts now, with only the second running:
    // it is not claimed, and no root is written into the pinned guard.
    let roots_before = prjquota_vmtests::pinned::roots(&node.fixture.node.volumes_dir).len();
    let mut later = node.root.build_alloc();
    later.build_task("t");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(project_of(&later.path), (0, false), "the second claimed it");
    assert_eq!(
        prjquota_vmtests::pinned::roots(&node.fixture.node.volumes_dir).len(),
        roots_before,
        "the second wrote roots into a guard it does not own"
    );
    later.destroy();
    let e = scrape_until(&second, WAIT, "the second still leaving them", refused);
    assert!(
        second
            .log()
            .contains("allocations are accounted by the guard's owner"),
        "{}",
        second.log()
    );
    assert!(
        accounted(&e) < 0.0,
        "the second published a census:\n{}",
        e.text
    );
    // The service starts again with the second still beside it: the
    // service owns the guard, so the allocations are its own.
    looper.enter(3);
    let service = node.start_exporter(&["--guard=enforce"]);
    let e = scrape_until(&service, WAIT, "the service accounting again", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    scrape_until(&second, WAIT, "the second leaving them still", refused);
    // The pins are not the second's to take with it.
    second.stop_leaving_pins();
    // Through a few of the service's guard sync rounds.
    looper.wait_attempts(300);
    assert_all_refused(&HANDOVER_PHASES, &looper.stop());
    assert_eq!(
        e.value("prjquota_exporter_alloc_walks_total", &[]),
        0.0,
        "{}: the service walked what was accounted",
        case.name
    );
    assert_eq!(project_of(&data).0, pid);

    let (b, task_b) = owned_task(&node);
    scrape_until(&service, WAIT, "the next allocation accounted", |e| {
        accounted(e) == 2.0
    });
    assert_eq!(
        chproj_as(Who::User(OWNER), &open(&task_b.join("local/data")), 0).1,
        Err(libc::EPERM),
        "{}: the service's claim was not guarded\n{}",
        case.name,
        service.log()
    );
    assert_eq!(
        project_of(&task_b.join("local/data")).0,
        project_of(&b.path).0
    );
    drop(service);
}

/// A start whose allocations' first scan lasts (the fault build holds it
/// at the allocation's directory for longer than the ten seconds a start
/// once waited) does not take over from the pinned guard without the
/// allocation: the guard pinned before goes on refusing the owner
/// throughout, and the new one has the allocation from its swap.
fn a_start_waits_for_a_long_first_scan_before_it_takes_the_guard_over(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-guard-slow", 8);
    let (a, task) = owned_task(&node);
    let first = node.start_exporter(&["--guard=enforce"]);
    scrape_until(&first, WAIT, "the allocation in the guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    first.stop_leaving_pins();
    let data = task.join("local/data");
    let looper = Looper::start(&open(&data), 0, 2);
    looper.wait_attempts(50);
    let pause = Pause::new(
        &std::env::temp_dir().join(format!("pause-slow-{}", case.name)),
        &a.id,
    );
    // Its listener comes up only once the guard has started: in a thread.
    let next = std::thread::scope(|s| {
        let starting = s.spawn(|| paused_exporter(&node, &pause, &["--guard=enforce"]));
        pause.wait(WAIT);
        // Longer than the old wait, and through the owner's tries.
        std::thread::sleep(Duration::from_secs(12));
        looper.wait_attempts(100);
        pause.go();
        starting.join().expect("the exporter started")
    });
    looper.enter(1);
    scrape_until(&next, WAIT, "the allocation in the new guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    looper.wait_attempts(200);
    assert_all_refused(
        &["a start held in its first scan", "started"],
        &looper.stop(),
    );
    assert!(
        next.log()
            .contains("waiting for the allocations' first scan"),
        "{}",
        next.log()
    );
    drop(next);
}

/// The disk under the alloc dir fails while an allocation is walked: the
/// exporter keeps answering and says so; once the disk is back (the node
/// restarted: the exporter stopped, the task mounts gone, the filesystem
/// checked and mounted again, the allocation restored by Nomad) the next
/// exporter finishes what the disk lost of the claim and the walk (XFS
/// loses an unflushed claim with its log), every file kept and in the
/// project.
fn a_disk_failing_mid_walk_is_reported_and_the_walk_finished_after(case: &FsCase) {
    let disk = DmDisk::new(case, "alloc-fail", 512 * MIB);
    let node = AllocNode::on(disk.fixture("alloc-fail"), 8);
    assert!(node.root.path.starts_with(&disk.mount));
    std::fs::create_dir_all(&node.fixture.node.volumes_dir).unwrap();
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    // A tree whose walk lasts, made before the task starts.
    let data = a.path.join("alloc/data");
    let (dirs, files) = (20, 500);
    for d in 0..dirs {
        let dir = data.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..files {
            std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
    }
    prjquota_vmtests::sh("sync");
    a.build_task("t");
    let deadline = std::time::Instant::now() + WAIT;
    while project_of(&a.path).0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the walk never started\n{}",
            exp.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    disk.fail();

    // Loud, and in time: a scrape answers and says so. The allocations'
    // collector fails or counts a tag failure; or, where the walk finished
    // in memory before the disk's failure surfaced (ext4 until its journal
    // aborts), the filesystem is reported unhealthy (the volumes directory
    // shares it here).
    let e = scrape_until(&exp, WAIT, "the failure shown", |e| {
        e.get(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")],
        ) == Some(0.0)
            || e.get("prjquota_exporter_alloc_tag_failures_total", &[])
                .is_some_and(|n| n > 0.0)
            || e.text.lines().any(|l| {
                l.starts_with("nomad_host_volumes_filesystem_healthy{") && l.ends_with(" 0")
            })
    });
    let log = exp.log();
    assert!(
        log.contains("level=error") || log.contains("level=warn"),
        "nothing logged about the failed disk:\n{log}"
    );
    eprintln!(
        "on the failed disk: {} accounted, the allocs collector {}",
        accounted(&e),
        e.value(
            "prjquota_exporter_scrape_collector_success",
            &[("collector", "allocs")]
        )
    );
    let (_, took) = exp.scrape_text();
    assert!(took < Duration::from_secs(10), "a scrape took {took:?}");
    exp.kill();

    a.unmount();
    disk.heal_and_remount();
    // Nomad restores the allocation: its task directory is built again
    // (MkdirAll: what the disk kept stays), which starts the task anew.
    a.build_task("t");
    let exp = node.start_exporter(&[]);
    let e = scrape_until(&exp, WAIT, "accounted after the disk healed", |e| {
        accounted(e) == 1.0
    });
    let (pid, inherit) = project_of(&a.path);
    assert!(pid != 0 && inherit);
    let mut kept = 0;
    for (p, ipid, nlink) in inodes_on_mount(&a.path) {
        assert!(ipid == pid || nlink > 1, "{} left out", p.display());
        if p.extension().is_none() && p.starts_with(&data) && p.is_file() {
            assert_eq!(std::fs::read(&p).unwrap(), b"x", "{}", p.display());
            kept += 1;
        }
    }
    assert_eq!(kept, dirs * files, "every file kept");
    let usage = node.usage(pid);
    assert_eq!(alloc_bytes(&e, &a.id), Some(usage.used_bytes as f64));
    e.assert_collectors_succeeded("after the disk healed");
}

/// The fault-injection exporter for `node`, stopping right before its
/// walk opens the entry `pause` names.
fn paused_exporter(
    node: &AllocNode,
    pause: &Pause,
    extra: &[&str],
) -> prjquota_vmtests::prom::Exporter {
    let args = node.exporter_args("200ms", extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = prjquota_vmtests::prom::command_of(
        &prjquota_vmtests::fault_exporter(),
        &[&node.fixture.node.volumes_dir],
        &args,
        false,
    );
    cmd.envs(pause.env());
    prjquota_vmtests::prom::Exporter::start_command(cmd)
}

/// A task's root (Docker gives it CAP_MKNOD) swaps a file of its
/// allocation for a watchdog's device node between a walk's listing and
/// its open, every time (the fault build pauses there): the exporter, as
/// root, must never open the device. An opened watchdog stays armed.
///
/// The kernel lets two names swap in a directory that inherits a project
/// only when both inodes are in it: so on a walk made again (the guard,
/// detecting, let the task's owner change a file's project), over a file
/// and a device node made after the first walk.
fn a_device_swapped_in_after_the_listing_is_never_opened_by_the_walk(case: &FsCase) {
    let dog = Softdog::take();
    let node = AllocNode::new(case, "alloc-swap", 8);
    let pause = Pause::new(
        &std::env::temp_dir().join(format!("pause-alloc-{}", case.name)),
        "victim",
    );
    let (a, task) = owned_task(&node);
    let exp = paused_exporter(&node, &pause, &["--guard=detect"]);
    scrape_until(&exp, WAIT, "the allocation in the guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    let (pid, _) = project_of(&a.path);
    let local = task.join("local");
    write_file(&local.join("victim"), 4096);
    dog.mknod(&local.join("dog"));
    assert_eq!(project_of(&local.join("victim")).0, pid);
    // The owner's change the guard lets through calls for another walk.
    assert_eq!(
        chproj_as(Who::User(OWNER), &open(&local.join("data")), 0).1,
        Ok(()),
        "--guard=detect refused the owner's change"
    );
    // Listed as a regular file; a device by the time it is opened.
    pause.wait(WAIT);
    exchange(&local.join("victim"), &local.join("dog"));
    pause.go();
    let e = scrape_until(&exp, WAIT, "the change walked back", |e| {
        e.value("prjquota_exporter_alloc_walks_total", &[]) >= 2.0
            && project_of(&local.join("data")).0 == pid
    });
    assert!(
        !dog.armed(),
        "the walk opened the device swapped in after its listing: the watchdog is armed\n{}",
        exp.log()
    );
    assert!(
        e.value(
            "prjquota_exporter_alloc_walk_entries_total",
            &[("outcome", "special")]
        ) >= 1.0,
        "{}",
        e.text
    );
    drop(exp);
}

/// A file the task hard-linked inside its own allocation before the walk
/// is the allocation's: every link was met, so it is tagged; after its
/// second link goes, what it grows by is counted.
fn a_file_linked_only_inside_its_allocation_is_counted(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-links", 8);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let data = a.path.join("alloc/data");
    write_file(&data.join("one"), 1 << 20);
    std::fs::hard_link(data.join("one"), data.join("two")).unwrap();
    a.build_task("web");
    scrape_until(&exp, WAIT, "the allocation accounted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (1 << 20) as f64)
    });
    let (pid, _) = project_of(&a.path);
    assert_eq!(
        project_of(&data.join("one")).0,
        pid,
        "a link inside only was left out"
    );
    std::fs::remove_file(data.join("two")).unwrap();
    append(&data.join("one"), 8 << 20);
    scrape_until(&exp, WAIT, "its growth counted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (9 << 20) as f64)
    });
}

/// A file with a link outside the allocation keeps its project (it may be
/// a host file); once that link goes, it is the allocation's alone and its
/// growth is counted, without another task starting.
fn a_file_linked_outside_is_counted_once_its_outside_link_goes(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-outlink", 8);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let data = a.path.join("alloc/data");
    let outside = node
        .root
        .path
        .with_file_name(format!("outside-{}", case.name));
    write_file(&outside, 1 << 20);
    std::fs::hard_link(&outside, data.join("shared")).unwrap();
    a.build_task("web");
    let e = scrape_until(&exp, WAIT, "the allocation accounted", |e| {
        accounted(e) == 1.0
    });
    assert!(
        e.value(
            "prjquota_exporter_alloc_walk_entries_total",
            &[("outcome", "linked")]
        ) >= 1.0,
        "{}",
        e.text
    );
    assert_eq!(
        project_of(&data.join("shared")).0,
        0,
        "a shared inode was taken"
    );
    std::fs::remove_file(&outside).unwrap();
    append(&data.join("shared"), 8 << 20);
    scrape_until(
        &exp,
        WAIT,
        "the file counted once its outside link went",
        |e| alloc_bytes(e, &a.id).is_some_and(|b| b >= (9 << 20) as f64),
    );
    let (pid, _) = project_of(&a.path);
    assert_eq!(project_of(&data.join("shared")).0, pid);
}

/// A tree deeper than the 64 levels the walk once stopped at: every
/// directory in it is the allocation's, so a file written at the bottom
/// after the walk is counted.
fn a_file_written_far_below_the_walks_old_depth_is_counted(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-deep", 8);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let mut deep = a.path.join("alloc/data");
    for _ in 0..150 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    a.build_task("web");
    scrape_until(&exp, WAIT, "the allocation accounted", |e| {
        accounted(e) == 1.0
    });
    write_file(&deep.join("late"), 4 << 20);
    scrape_until(&exp, WAIT, "a file 150 levels down counted", |e| {
        alloc_bytes(e, &a.id).is_some_and(|b| b >= (4 << 20) as f64)
    });
    let (pid, _) = project_of(&a.path);
    assert_eq!(project_of(&deep), (pid, true));
}

/// A file another process holds a write lease on cannot be opened without
/// waiting for the lease: the walk goes on, says so, and tags it once the
/// lease is given up; the walk is marked done only then.
fn a_file_under_a_write_lease_is_tagged_once_the_lease_goes(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-lease", 8);
    let exp = node.start_exporter(&[]);
    let mut a = node.root.build_alloc();
    let leased = a.path.join("alloc/data/leased");
    write_file(&leased, 1 << 20);
    // The tenant's process: a write lease, its break signal ignored.
    let mut held = std::process::Command::new(prjquota_vmtests::PYTHON)
        .args([
            "-c",
            "import fcntl, os, signal, sys\n\
             signal.signal(signal.SIGIO, signal.SIG_IGN)\n\
             fd = os.open(sys.argv[1], os.O_WRONLY)\n\
             fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n\
             print('held', flush=True)\n\
             sys.stdin.read()\n",
        ])
        .arg(&leased)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(held.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held", "the lease was not taken");
    a.build_task("web");
    let e = scrape_until(&exp, WAIT, "the walk past the leased file", |e| {
        e.value(
            "prjquota_exporter_alloc_walk_entries_total",
            &[("outcome", "failed")],
        ) >= 1.0
    });
    let (pid, _) = project_of(&a.path);
    assert!(pid != 0, "{}", e.text);
    assert_eq!(project_of(&leased).0, 0, "a leased file was opened");
    assert!(
        e.value("prjquota_exporter_alloc_walk_retries", &[]) >= 1.0,
        "{}",
        e.text
    );
    assert_eq!(
        walked_mark(&a.path),
        None,
        "marked walked with a file left out"
    );
    held.kill().unwrap();
    held.wait().unwrap();
    scrape_until(&exp, WAIT, "the leased file tagged", |e| {
        e.get("prjquota_exporter_alloc_walk_retries", &[]) == Some(0.0)
            && alloc_bytes(e, &a.id).is_some_and(|b| b >= (1 << 20) as f64)
    });
    assert_eq!(project_of(&leased).0, pid);
    assert_eq!(walked_mark(&a.path), Some(pid.to_string()));
}

/// Appends `bytes` to `p`.
fn append(p: &std::path::Path, bytes: usize) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(p)
        .and_then(|mut f| f.write_all(&vec![0x5a; bytes]))
        .unwrap_or_else(|e| panic!("append to {}: {e}", p.display()));
}

/// The allocation directory's walked mark, if any.
fn walked_mark(p: &std::path::Path) -> Option<String> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(p).unwrap();
    prjquota_core::sys::fgetxattr(f.as_fd(), c"trusted.prjquota.walked")
        .unwrap()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// An allocation of `PRJQUOTA_ALLOC_DIRS` directories (20,000 in
/// `cargo xtask test`, a million in `cargo xtask stress`; half in one flat
/// directory with long names, the rest in a chain far deeper than a walk
/// once went): its walk goes in steps, so an allocation started meanwhile
/// is accounted while it runs, the exporter's memory does not follow the
/// tree, and when it ends every directory is in the project.
fn huge_allocation(small: &prjquota_vmtests::fixture::SmallFs) {
    let dirs: usize = prjquota_vmtests::vm_env("PRJQUOTA_ALLOC_DIRS")
        .parse()
        .expect("PRJQUOTA_ALLOC_DIRS: a whole number");
    let node = AllocNode::on(small.fixture("alloc-huge"), 8);
    std::fs::create_dir_all(&node.fixture.node.volumes_dir).unwrap();
    let exp = node.start_exporter(&[]);
    let hwm = |exp: &prjquota_vmtests::prom::Exporter| -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", exp.pid()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .expect("VmHWM")
    };
    let mut big = node.root.build_alloc();
    let data = big.path.join("alloc/data");
    let wide = data.join("wide");
    std::fs::create_dir(&wide).unwrap();
    let pad = "n".repeat(200);
    for i in 0..dirs / 2 {
        std::fs::create_dir(wide.join(format!("{pad}{i}"))).unwrap();
    }
    // Deeper than PATH_MAX lets a path name: made one level at a time.
    let deep = {
        use prjquota_core::sys;
        use std::os::fd::AsFd;
        std::fs::create_dir(data.join("deep")).unwrap();
        let mut fd: std::os::fd::OwnedFd = std::fs::File::open(data.join("deep")).unwrap().into();
        for _ in 0..dirs - dirs / 2 {
            sys::mkdirat(fd.as_fd(), c"d", 0o755).unwrap();
            fd = sys::openat(fd.as_fd(), c"d", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        }
        fd
    };
    prjquota_vmtests::sh("sync");
    let before = hwm(&exp);
    let started = std::time::Instant::now();
    big.build_task("t");
    let deadline = std::time::Instant::now() + WAIT;
    while project_of(&big.path).0 == 0 {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Another allocation, started while the big one is walked.
    let mut small_one = node.root.build_alloc();
    small_one.build_task("t");
    let e = scrape_until(&exp, WAIT, "the small one accounted", |e| {
        alloc_bytes(e, &small_one.id).is_some()
    });
    let big_walking = e.value("prjquota_exporter_allocs", &[("state", "walking")]);
    eprintln!(
        "MEASURE alloc_huge_small_accounted_after_seconds {:.1} big_still_walking {big_walking}",
        started.elapsed().as_secs_f64()
    );
    let within = Duration::from_secs(60 + dirs as u64 / 100);
    scrape_until(&exp, within, "the big one accounted", |e| {
        alloc_bytes(e, &big.id).is_some()
    });
    let took = started.elapsed();
    let grew = hwm(&exp).saturating_sub(before);
    eprintln!(
        "MEASURE alloc_huge_walk dirs {dirs} seconds {:.1} peak_rss_growth_kib {grew}",
        took.as_secs_f64()
    );
    let (pid, _) = project_of(&big.path);
    assert_eq!(
        prjquota_core::quota::project_of(std::os::fd::AsFd::as_fd(&deep)).unwrap(),
        (pid, true),
        "the deepest directory"
    );
    assert_eq!(
        project_of(&wide.join(format!("{pad}{}", dirs / 2 - 1))),
        (pid, true)
    );
    assert_eq!(walked_mark(&big.path), Some(pid.to_string()));
    // Names are not kept: a walk of 200-byte names holding them for a
    // flat directory of `dirs / 2` would grow by more than this.
    assert!(
        grew < 8 * 1024,
        "the exporter's peak RSS grew by {grew} KiB walking {dirs} directories"
    );
    drop(exp);
    small_one.destroy();
    // Too deep for a recursive removal's stack: the plugin's own removal.
    let parent: std::os::fd::OwnedFd = std::fs::File::open(&node.root.path).unwrap().into();
    let name = std::ffi::CString::new(big.id.clone()).unwrap();
    big.unmount();
    prjquota::remove::remove_tree(std::os::fd::AsFd::as_fd(&parent), &name).unwrap();
}

/// A file outside every allocation, given an allocation's project ID by a
/// user the guard only counts (`--guard=detect`): counted apart, as an
/// attempt outside the roots, never against the allocation it names,
/// whose walk it used to call for at every scan.
fn a_file_outside_given_an_allocations_id_calls_for_no_walk_of_it(case: &FsCase) {
    let node = AllocNode::new(case, "alloc-outside-id", 20);
    let (a, _task) = owned_task(&node);
    let exp = node.start_exporter(&["--guard=detect"]);
    let e = scrape_until(&exp, WAIT, "the allocation in the guard", |e| {
        accounted(e) == 1.0 && e.get(GUARDED, &[]) == Some(1.0)
    });
    let walks = e.value("prjquota_exporter_alloc_walks_total", &[]);
    let (pid, _) = project_of(&a.path);
    let outside = node.fixture.root.join("owners-outside-file");
    write_file(&outside, 4096);
    std::os::unix::fs::chown(&outside, Some(OWNER), Some(OWNER)).unwrap();
    for _ in 0..3 {
        assert_eq!(
            chproj_as(Who::User(OWNER), &open(&outside), pid).1,
            Ok(()),
            "--guard=detect refused"
        );
        prjquota_vmtests::attack::chproj(&open(&outside), 0).unwrap();
    }
    let e = scrape_until(&exp, WAIT, "the attempts counted apart", |e| {
        e.get(
            "prjquota_exporter_guard_outside_attempts_total",
            &[("result", "allowed")],
        ) == Some(3.0)
    });
    // A few scans later: no walk was called for.
    std::thread::sleep(Duration::from_secs(2));
    let e2 = exp.scrape();
    assert_eq!(
        e2.value("prjquota_exporter_alloc_walks_total", &[]),
        walks,
        "an outside file's changes walked the allocation again\n{}",
        exp.log_lines_with("walking it again")
    );
    assert_eq!(
        e.get(
            ALLOC_ATTEMPTS,
            &[("alloc_id", &a.id), ("result", "allowed")]
        ),
        Some(0.0),
        "{}",
        e.text
    );
    drop(exp);
}
