//! The plugin against a kernel that enforces project quotas, run exactly as
//! Nomad runs it. Each test builds its own node (plugin dir, node config,
//! project-ID range, volumes dir) on the VM's test filesystems.

use std::collections::BTreeSet;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{
    fill, make_files, statvfs, writable, Fixture, FsCase, SmallFs, EXT4, MIB, WRITER, XFS,
};
use prjquota_vmtests::nomad::{run_plugin, Spec};
use prjquota_vmtests::{bin, on_every_fs, sh, xfs_noquota_mount};

on_every_fs!(
    fingerprint_prints_the_crate_version_as_a_json_string,
    create_enforces_the_limit_and_statfs_reports_it,
    capacity_rounds_up_to_the_block_and_min_alone_is_the_limit,
    restore_is_idempotent_writes_nothing_and_keeps_content,
    restore_under_a_changed_config_keeps_what_the_volume_was_given,
    grow_in_place_lets_writes_continue,
    shrink_is_refused_above_usage_and_applied_below,
    parameters_set_mode_and_owner_of_the_root_only,
    default_mode_is_0700_and_unknown_parameters_are_refused,
    max_inodes_limits_the_number_of_files,
    thirty_two_parallel_creates_get_distinct_enforced_project_ids,
    parallel_creates_in_two_volumes_dirs_of_one_filesystem_get_distinct_ids,
    a_restore_storm_restores_every_volume,
    delete_removes_everything_and_never_follows_symlinks,
    nomads_auto_delete_with_the_whole_volumes_dir_deletes_only_that_volume,
    delete_twice_and_delete_of_an_unknown_volume_succeed,
    bad_input_changes_nothing_on_disk,
    a_volume_with_many_files_is_deleted_completely,
    delete_clears_immutable_and_append_only_flags,
    delete_under_an_append_only_root_passes_every_kind_of_file,
    delete_never_opens_a_device_swapped_in_after_the_listing,
    a_create_after_squatted_ids_reads_a_bounded_number_of_quotas,
    a_plugin_run_without_any_environment_fails_cleanly,
    create_and_delete_sync_only_where_the_journal_needs_it,
);

fn fingerprint_prints_the_crate_version_as_a_json_string(fs: &FsCase) {
    let f = fs.fixture("fp");
    let out = f.node.fingerprint();
    out.ok();
    let v = out.json();
    let version = v["version"].as_str().expect("version is a string");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    // Nomad allows one second; under emulation that is not a fair test, so
    // the time is reported (and benchmarked by `cargo xtask bench`).
    eprintln!(
        "MEASURE fingerprint_seconds {:.4}",
        out.elapsed.as_secs_f64()
    );
}

fn create_enforces_the_limit_and_statfs_reports_it(fs: &FsCase) {
    let f = fs.fixture("enforce");
    let spec = writable(Spec::new("pg-data", 16 * MIB as i64));
    let (path, bytes) = f.create(&spec);
    assert_eq!(path, f.node.volumes_dir.join(&spec.id));
    assert_eq!(bytes, 16 * MIB as i64);
    let (pid, inherit) = Fixture::project_of(&path);
    assert!(inherit, "PROJINHERIT must be set on the volume root");
    assert!(
        (f.id_min..=f.id_max).contains(&pid),
        "project ID {pid} outside the node's range"
    );
    assert_eq!(f.project_id(&spec.id), pid);

    let (size, avail, _, _) = statvfs(&path);
    assert_eq!(size, 16 * MIB, "statvfs on the volume reports the limit");
    assert!(avail <= 16 * MIB);

    let r = fill(&path.join("blob"), 32 * MIB, Some(WRITER));
    assert_eq!(r.errno, Some(fs.full_errno), "{r:?}");
    assert!(
        r.written <= 16 * MIB && r.written >= 15 * MIB,
        "the kernel stopped the write at {} bytes, not about 16 MiB",
        r.written
    );
    let q = f.quota(pid);
    assert!(
        q.used_bytes <= 16 * MIB && q.used_bytes >= 15 * MIB,
        "{q:?}"
    );
    assert_eq!(q.limits.bytes_hard, 16 * MIB);
    // statfs agrees with the quota, and what is left is less than the
    // write the kernel refused (fill writes 1 MiB at a time). Linux 7.x's
    // ext4 refuses the last whole 1 MiB write, whose reservation includes
    // extent metadata, and leaves 1 MiB less a block; older kernels wrote it
    // in part and left nothing.
    let left = statvfs(&path).1;
    assert_eq!(
        left,
        16 * MIB - q.used_bytes,
        "statfs and the quota disagree"
    );
    assert!(left < MIB, "{left} bytes left after the fill");
}

fn capacity_rounds_up_to_the_block_and_min_alone_is_the_limit(fs: &FsCase) {
    let f = fs.fixture("round");
    let mut spec = Spec::new("odd", 0);
    spec.min = 10 * MIB as i64 + 1;
    let (_, bytes) = f.create(&spec);
    assert_eq!(
        bytes,
        10 * MIB as i64 + 4096,
        "rounded up to the 4 KiB block"
    );
    let pid = f.project_id(&spec.id);
    assert_eq!(f.quota(pid).limits.bytes_hard, 10 * MIB + 4096);
}

fn restore_is_idempotent_writes_nothing_and_keeps_content(fs: &FsCase) {
    let f = fs.fixture("restore");
    let spec = Spec::new("keep", 16 * MIB as i64).param("mode", "0750");
    let first = f.node.create(&spec);
    let (path, _) = first.created();
    std::fs::write(path.join("data"), b"precious").unwrap();
    let rec_path = f
        .node
        .volumes_dir
        .join(".prjquota/volumes")
        .join(format!("{}.json", spec.id));
    let before = std::fs::metadata(&rec_path).unwrap();
    for _ in 0..3 {
        let again = f.node.create(&spec);
        again.created();
        assert_eq!(again.stdout, first.stdout, "identical output on restore");
    }
    let after = std::fs::metadata(&rec_path).unwrap();
    assert_eq!(
        before.ino(),
        after.ino(),
        "a restore with nothing changed writes nothing"
    );
    assert_eq!(before.mtime_nsec(), after.mtime_nsec());
    assert_eq!(std::fs::read(path.join("data")).unwrap(), b"precious");
}

/// Mode, size and owner of a volume as the kernel has them.
fn volume_state(f: &Fixture, spec: &Spec) -> (u32, u32, u32, u64) {
    let path = f.node.volumes_dir.join(&spec.id);
    let m = std::fs::metadata(&path).unwrap();
    let limit = f.quota(f.project_id(&spec.id)).limits.bytes_hard;
    (m.permissions().mode() & 0o7777, m.uid(), m.gid(), limit)
}

/// Defaults belong to a volume from its creation: Nomad replays the last
/// create of every volume at each agent start, and a node config changed
/// since (default_mode, default_capacity, allowed_parameters) must not
/// chmod, shrink or break a volume whose spec did not change.
fn restore_under_a_changed_config_keeps_what_the_volume_was_given(fs: &FsCase) {
    let f = fs.fixture("reconf");
    f.set_config("default_mode = \"0750\"\ndefault_capacity = \"16MiB\"");
    // No size and no mode: both from the node's defaults.
    let sized_by_default = Spec::new("defaults", 0);
    // An owner and an inode limit, parameters the new config will forbid.
    let with_params = writable(Spec::new("params", 12 * MIB as i64)).param("max_inodes", "100");
    let mut before = Vec::new();
    for spec in [&sized_by_default, &with_params] {
        let out = f.node.create(spec);
        out.created();
        before.push((out.stdout.clone(), volume_state(&f, spec)));
    }
    assert_eq!(before[0].1, (0o750, 0, 0, 16 * MIB));
    assert_eq!(before[1].1, (0o750, WRITER, WRITER, 12 * MIB));

    for config in [
        "default_mode = \"0700\"\ndefault_capacity = \"8MiB\"\nallowed_parameters = [\"mode\"]",
        // No default size at all: a new volume without one is refused, a
        // volume that was given one keeps it.
        "default_mode = \"0777\"\nallowed_parameters = []",
    ] {
        f.set_config(config);
        for (spec, (stdout, state)) in [&sized_by_default, &with_params].into_iter().zip(&before) {
            let out = f.node.create(spec);
            out.created();
            assert_eq!(
                &out.stdout, stdout,
                "{config}: the replay returns what the create did"
            );
            assert_eq!(&volume_state(&f, spec), state, "{config}: {}", spec.name);
        }
    }
    let pid = f.project_id(&with_params.id);
    assert_eq!(f.quota(pid).limits.inodes_hard, 100);

    // The new config is for new volumes, and for an explicit update.
    f.set_config(
        "default_mode = \"0711\"\ndefault_capacity = \"8MiB\"\nallowed_parameters = [\"mode\"]",
    );
    let new = Spec::new("new", 0);
    f.create(&new);
    assert_eq!(volume_state(&f, &new), (0o711, 0, 0, 8 * MIB));
    let msg = f
        .node
        .create(&Spec::new("forbidden", 0).param("uid", "1"))
        .error();
    assert!(msg.contains("uid"), "{msg}");
    let updated = sized_by_default.clone().param("mode", "0755");
    f.create(&updated);
    assert_eq!(volume_state(&f, &updated), (0o755, 0, 0, 16 * MIB));
}

fn grow_in_place_lets_writes_continue(fs: &FsCase) {
    let f = fs.fixture("grow");
    let mut spec = writable(Spec::new("grow", 16 * MIB as i64));
    let (path, _) = f.create(&spec);
    std::fs::write(path.join("keep"), b"x").unwrap();
    let r = fill(&path.join("a"), 32 * MIB, Some(WRITER));
    assert_eq!(r.errno, Some(fs.full_errno));
    spec.max = 32 * MIB as i64;
    let (path2, bytes) = f.create(&spec);
    assert_eq!(path2, path);
    assert_eq!(bytes, 32 * MIB as i64);
    assert_eq!(statvfs(&path).0, 32 * MIB);
    let r2 = fill(&path.join("b"), 8 * MIB, Some(WRITER));
    assert_eq!(r2.errno, None, "writes succeed after growing: {r2:?}");
    assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"x");
    assert_eq!(f.record(&spec.id).unwrap()["provisioned_bytes"], 32 * MIB);
}

fn shrink_is_refused_above_usage_and_applied_below(fs: &FsCase) {
    let f = fs.fixture("shrink");
    let mut spec = Spec::new("shrink", 32 * MIB as i64);
    let (path, _) = f.create(&spec);
    assert_eq!(fill(&path.join("a"), 12 * MIB, None).errno, None);
    spec.max = 8 * MIB as i64;
    let out = f.node.create(&spec);
    let msg = out.error();
    assert!(msg.contains("12"), "the error names the usage: {msg}");
    assert!(
        msg.contains("8 MiB"),
        "the error names the requested size: {msg}"
    );
    assert_eq!(
        statvfs(&path).0,
        32 * MIB,
        "a refused shrink changes nothing"
    );
    assert_eq!(f.record(&spec.id).unwrap()["provisioned_bytes"], 32 * MIB);

    spec.max = 16 * MIB as i64;
    let (_, bytes) = f.create(&spec);
    assert_eq!(bytes, 16 * MIB as i64);
    assert_eq!(statvfs(&path).0, 16 * MIB);
    assert_eq!(std::fs::metadata(path.join("a")).unwrap().len(), 12 * MIB);
}

fn parameters_set_mode_and_owner_of_the_root_only(fs: &FsCase) {
    let f = fs.fixture("params");
    let mut spec = Spec::new("params", 16 * MIB as i64)
        .param("mode", "0750")
        .param("uid", "1000")
        .param("gid", "1001");
    let (path, _) = f.create(&spec);
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o750);
    assert_eq!((m.uid(), m.gid()), (1000, 1001));
    std::fs::create_dir(path.join("child")).unwrap();
    std::fs::set_permissions(path.join("child"), std::fs::Permissions::from_mode(0o700)).unwrap();

    spec = spec.param("mode", "0775");
    f.create(&spec);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        0o775
    );
    let child = std::fs::metadata(path.join("child")).unwrap();
    assert_eq!(
        child.permissions().mode() & 0o7777,
        0o700,
        "content is never touched"
    );
    assert_eq!(child.uid(), 0);
}

fn default_mode_is_0700_and_unknown_parameters_are_refused(fs: &FsCase) {
    let f = fs.fixture("defmode");
    let spec = Spec::new("m", 16 * MIB as i64);
    let (path, _) = f.create(&spec);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        0o700
    );

    let bad = Spec::new("bad", 16 * MIB as i64).param("size", "10G");
    let msg = f.node.create(&bad).error();
    assert!(msg.contains("size") && msg.contains("mode"), "{msg}");
    assert!(!f.node.volumes_dir.join(&bad.id).exists());
    assert!(f.record(&bad.id).is_none());
}

fn max_inodes_limits_the_number_of_files(fs: &FsCase) {
    let f = fs.fixture("inodes");
    let spec = writable(Spec::new("inodes", 16 * MIB as i64)).param("max_inodes", "10");
    let (path, _) = f.create(&spec);
    let r = make_files(&path, 50, Some(WRITER));
    // The root directory is the project's first inode.
    assert_eq!(r.written, 9, "files created under a 10-inode limit");
    assert_eq!(r.errno, Some(fs.full_errno));
    let pid = f.project_id(&spec.id);
    assert_eq!(f.quota(pid).limits.inodes_hard, 10);
    assert_eq!(statvfs(&path).2, 10, "statvfs reports the inode limit");
}

fn thirty_two_parallel_creates_get_distinct_enforced_project_ids(fs: &FsCase) {
    let f = fs.fixture("parallel");
    let specs: Vec<Spec> = (0..32)
        .map(|i| writable(Spec::new(&format!("v{i}"), 4 * MIB as i64)))
        .collect();
    let outs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = specs
            .iter()
            .map(|sp| s.spawn(|| f.node.create(sp)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids = BTreeSet::new();
    for (spec, out) in specs.iter().zip(&outs) {
        let (path, _) = out.created();
        let (pid, inherit) = Fixture::project_of(&path);
        assert!(inherit);
        assert_eq!(pid, f.project_id(&spec.id));
        ids.insert(pid);
    }
    assert_eq!(ids.len(), 32, "every volume has its own project ID");
    // Every one of them is enforced.
    std::thread::scope(|s| {
        for spec in &specs {
            let p = f.node.volumes_dir.join(&spec.id).join("blob");
            s.spawn(move || {
                let r = fill(&p, 8 * MIB, Some(WRITER));
                assert_eq!(r.errno, Some(fs.full_errno), "{r:?}");
                assert!(r.written <= 4 * MIB);
            });
        }
    });
}

/// Creates racing in two volumes directories of one filesystem with one
/// project-ID range get distinct IDs: the ID is chosen and claimed under a
/// lock the two directories share.
fn parallel_creates_in_two_volumes_dirs_of_one_filesystem_get_distinct_ids(fs: &FsCase) {
    let a = fs.fixture("race-a");
    let b = a.sibling(
        &(fs.mount)(),
        &format!("{}-race-b", fs.name),
        &bin("prjquota"),
    );
    let specs: Vec<(&Fixture, Spec)> = (0..16)
        .map(|i| {
            let f = if i % 2 == 0 { &a } else { &b };
            (f, Spec::new(&format!("r{i}"), 4 * MIB as i64))
        })
        .collect();
    std::thread::scope(|s| {
        for (f, spec) in &specs {
            s.spawn(move || f.create(spec));
        }
    });
    let ids: BTreeSet<u32> = specs
        .iter()
        .map(|(f, spec)| f.project_id(&spec.id))
        .collect();
    assert_eq!(ids.len(), specs.len(), "shared project IDs: {ids:?}");
}

/// Volumes of the restore storm: `PRJQUOTA_STORM_VOLUMES`, which xtask sets
/// (100 in `cargo xtask test`, 1,000 in `cargo xtask stress`).
fn storm_volumes() -> usize {
    let n: usize = prjquota_vmtests::vm_env("PRJQUOTA_STORM_VOLUMES")
        .parse()
        .expect("PRJQUOTA_STORM_VOLUMES: a whole number");
    assert!(n >= 2, "a storm of {n} volumes is no storm");
    n
}

fn a_restore_storm_restores_every_volume(fs: &FsCase) {
    let f = fs.fixture("storm");
    let n = storm_volumes();
    let specs: Vec<Spec> = (0..n)
        .map(|i| Spec::new(&format!("s{i}"), 1 << 30))
        .collect();
    for chunk in specs.chunks(16) {
        std::thread::scope(|s| {
            for sp in chunk {
                s.spawn(|| f.create(sp));
            }
        });
    }
    // Nomad replays every create at once at agent start.
    let start = Instant::now();
    let outs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = specs
            .iter()
            .map(|sp| s.spawn(|| f.node.create(sp)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = start.elapsed();
    assert_eq!(outs.len(), n, "every volume was replayed");
    for (sp, o) in specs.iter().zip(&outs) {
        assert_eq!(o.created().0, f.node.volumes_dir.join(&sp.id));
    }
    eprintln!(
        "MEASURE restore_storm_{n}_volumes_seconds {:.3}",
        took.as_secs_f64()
    );
}

fn delete_removes_everything_and_never_follows_symlinks(fs: &FsCase) {
    let f = fs.fixture("symlinks");
    let outside = f.root.join("outside");
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("file"), b"keep").unwrap();
    std::fs::write(outside.join("dir/inner"), b"keep").unwrap();
    let spec = Spec::new("hostile", 16 * MIB as i64);
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    std::fs::create_dir_all(path.join("a/b")).unwrap();
    std::fs::write(path.join("a/b/f"), vec![1u8; 1 << 20]).unwrap();
    symlink(outside.join("file"), path.join("link-to-file")).unwrap();
    symlink(outside.join("dir"), path.join("a/link-to-dir")).unwrap();
    symlink(&f.node.volumes_dir, path.join("a/b/link-to-volumes")).unwrap();
    symlink("/", path.join("link-to-root")).unwrap();

    f.node.delete(&spec).ok();
    assert!(!path.exists());
    assert_eq!(std::fs::read(outside.join("file")).unwrap(), b"keep");
    assert_eq!(std::fs::read(outside.join("dir/inner")).unwrap(), b"keep");
    assert!(f.node.volumes_dir.is_dir());
    assert!(f.record(&spec.id).is_none(), "record removed");
    let q = f.quota(pid);
    assert!(q.is_unused(), "limits cleared and usage gone: {q:?}");
}

fn nomads_auto_delete_with_the_whole_volumes_dir_deletes_only_that_volume(fs: &FsCase) {
    let f = fs.fixture("trap");
    let keep = Spec::new("keep", 16 * MIB as i64);
    let (keep_path, _) = f.create(&keep);
    std::fs::write(keep_path.join("data"), b"keep").unwrap();
    let victim = Spec::new("victim", 16 * MIB as i64);
    let (victim_path, _) = f.create(&victim);

    // What Nomad sends after failing to save its state: the whole volumes dir
    // as DHV_CREATED_PATH, empty name and namespace.
    let mut trap = victim.clone();
    trap.name = String::new();
    trap.namespace = String::new();
    let vars = f.node.delete_vars(&trap, &f.node.volumes_dir);
    f.node.run("delete", &vars).ok();
    assert!(!victim_path.exists());
    assert_eq!(std::fs::read(keep_path.join("data")).unwrap(), b"keep");
    assert!(f.record(&keep.id).is_some());
}

fn delete_twice_and_delete_of_an_unknown_volume_succeed(fs: &FsCase) {
    let f = fs.fixture("double");
    let spec = Spec::new("twice", 16 * MIB as i64);
    f.create(&spec);
    f.node.delete(&spec).ok();
    f.node.delete(&spec).ok();
    let never = Spec::new("never", 16 * MIB as i64);
    f.node.delete(&never).ok();
}

#[test]
fn a_filesystem_without_prjquota_is_refused_and_nothing_is_created() {
    let f = Fixture::new(&xfs_noquota_mount(), "noquota");
    let spec = Spec::new("nq", 16 * MIB as i64);
    let msg = f.node.create(&spec).error();
    assert!(msg.contains("prjquota"), "the error names the fix: {msg}");
    assert!(msg.contains("XFS"), "the error names the filesystem: {msg}");
    assert!(
        !f.node.volumes_dir.exists(),
        "nothing is created on a filesystem that cannot enforce the size"
    );
}

fn bad_input_changes_nothing_on_disk(fs: &FsCase) {
    let f = fs.fixture("badinput");
    let good = Spec::new("good", 16 * MIB as i64);
    f.create(&good);
    let snapshot = || {
        let mut v: Vec<_> = walk(&f.node.volumes_dir);
        v.sort();
        v
    };
    let before = snapshot();
    let mut cases: Vec<Vec<(&str, String)>> = Vec::new();
    let base = f.node.create_vars(&Spec::new("x", 16 * MIB as i64));
    let with = |k: &str, v: &str| -> Vec<(&str, String)> {
        base.iter()
            .map(|(n, old)| (*n, if *n == k { v.to_string() } else { old.clone() }))
            .collect()
    };
    cases.push(with("DHV_VOLUME_ID", "../../etc"));
    cases.push(with("DHV_VOLUME_ID", &format!("{}/x", good.id)));
    cases.push(with("DHV_CAPACITY_MAX_BYTES", "-1"));
    cases.push(with("DHV_CAPACITY_MAX_BYTES", "99999999999999999999"));
    cases.push(with("DHV_CAPACITY_MIN_BYTES", &(64 * MIB).to_string()));
    cases.push(with("DHV_VOLUMES_DIR", "relative/dir"));
    cases.push(with("DHV_PARAMETERS", "{\"mode\":0750}"));
    cases.push(with(
        "DHV_PARAMETERS",
        "{\"mode\":\"0750\",\"mode\":\"0777\"}",
    ));
    cases.push(with("DHV_PARAMETERS", "{\"uid\":\"root\"}"));
    cases.push(with("DHV_VOLUME_NAME", "a\nb"));
    cases.push(with("DHV_CAPACITY_MAX_BYTES", "0"));
    for vars in &cases {
        let out = f.node.run("create", vars);
        out.error();
        assert_eq!(
            snapshot(),
            before,
            "a refused create left something behind: {vars:?}"
        );
    }
}

/// Every path below `dir` (not following links).
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            out.push(e.path().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Fills a volume with `dirs` × `per_dir` empty files.
fn populate(path: &Path, dirs: usize, per_dir: usize) {
    for d in 0..dirs {
        let dir = path.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for i in 0..per_dir {
            std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
        }
    }
}

fn a_volume_with_many_files_is_deleted_completely(fs: &FsCase) {
    // 20k files keep the suite short under emulation; the 100k-file figure
    // against Nomad's 60 s is measured by `cargo xtask bench`.
    let f = fs.fixture("manyfiles");
    let spec = Spec::new("many", 1 << 30);
    let (path, _) = f.create(&spec);
    populate(&path, 20, 1000);
    let pid = f.project_id(&spec.id);
    assert!(f.quota(pid).used_inodes > 20_000);
    let out = f.node.delete(&spec);
    out.ok();
    eprintln!(
        "MEASURE delete_20k_files_seconds {:.3}",
        out.elapsed.as_secs_f64()
    );
    assert!(!path.exists());
    assert!(f.quota(pid).is_unused());
}

/// A workload with CAP_LINUX_IMMUTABLE can mark what it wrote immutable or
/// append-only; the volume must still be deletable.
fn delete_clears_immutable_and_append_only_flags(fs: &FsCase) {
    let f = fs.fixture("chattr");
    let spec = Spec::new("chattr", 16 * MIB as i64);
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    for d in ["idir", "adir", "plain"] {
        std::fs::create_dir(path.join(d)).unwrap();
        std::fs::write(path.join(d).join("inner"), b"x").unwrap();
    }
    std::fs::write(path.join("ifile"), b"x").unwrap();
    std::fs::write(path.join("afile"), b"x").unwrap();
    std::fs::write(path.join("plain/ifile"), b"x").unwrap();
    let p = |n: &str| path.join(n).display().to_string();
    sh(&format!(
        "chattr +i {} {} {} && chattr +a {} {} && chattr +i {}",
        p("ifile"),
        p("idir/inner"),
        p("idir"),
        p("afile"),
        p("adir"),
        p("plain/ifile"),
    ));
    // A FIFO: chattr(1) skips special files, but the ioctl reaches them
    // from 5.13 on (generic fileattr); before, it cannot be set at all.
    let fifo = path.join("ififo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let set = prjquota_core::sys::get_fsxattr(f.as_fd()).and_then(|mut a| {
            a.xflags |= prjquota_core::sys::FS_XFLAG_IMMUTABLE;
            prjquota_core::sys::set_fsxattr(f.as_fd(), &a)
        });
        match set {
            Ok(()) => assert!(
                std::fs::remove_file(&fifo).is_err(),
                "the FIFO's +i took no effect"
            ),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}"),
        }
    }
    // The volume root too: its owner may be the workload.
    sh(&format!("chattr +a {}", path.display()));
    assert!(
        std::fs::remove_file(path.join("ifile")).is_err(),
        "chattr +i took effect"
    );

    let out = f.node.delete(&spec);
    out.ok();
    assert!(!path.exists(), "{}", out.stderr);
    assert!(f.record(&spec.id).is_none());
    assert!(f.quota(pid).is_unused());
}

/// Under an append-only root, the first entry the delete meets is refused
/// for the root's flag, not its own; whatever kind of file it is, the
/// delete clears the root and goes on. A directory's listing order is the
/// filesystem's (ext4 hashes names), so each kind is the only entry once.
/// A workload that made a directory append-only (so that the delete must
/// clear flags entry by entry) swaps a file the delete listed for a
/// watchdog's device node right before the delete opens it to clear its
/// flags, every time (the fault build pauses there): the plugin, as root,
/// must never open the device. An opened watchdog stays armed.
fn delete_never_opens_a_device_swapped_in_after_the_listing(fs: &FsCase) {
    use prjquota_vmtests::watchdog::{exchange, Pause, Softdog};
    let dog = Softdog::take();
    let f = Fixture::with_plugin(
        &(fs.mount)(),
        &format!("{}-swap", fs.name),
        &prjquota_vmtests::fault_bin(),
    );
    let spec = Spec::new("swap", 16 * MIB as i64);
    let (path, _) = f.create(&spec);
    let pid = f.project_id(&spec.id);
    // The one entry of an append-only directory: the first unlink there is
    // refused, and the delete clears the directory's flag, then opens the
    // entry to clear its own.
    let dir = path.join("box");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("victim"), b"x").unwrap();
    sh(&format!("chattr +a {}", dir.display()));
    let pause = Pause::new(
        &std::env::temp_dir().join(format!("pause-{}", spec.id)),
        "victim",
    );
    let child = f.node.spawn_delete_with(&spec, &pause.env());
    pause.wait(Duration::from_secs(60));
    // Made now, in the volume's project, as the task would, and swapped in.
    dog.mknod(&dir.join("dog"));
    exchange(&dir.join("victim"), &dir.join("dog"));
    pause.go();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "delete: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        !dog.armed(),
        "the delete opened the device swapped in after its listing: the watchdog is armed"
    );
    assert!(!path.exists());
    assert!(f.quota(pid).is_unused());
}

/// The quota reads (`quotactl`, `quotactl_fd`) of one create, traced.
fn quota_reads_of_a_create(f: &Fixture, spec: &Spec) -> usize {
    let trace = std::env::temp_dir().join(format!("quota-reads-{}", spec.id));
    let trace_arg = trace.display().to_string();
    let out = f
        .node
        .create_command_under(
            &[
                "/usr/bin/strace",
                "-f",
                "-qq",
                "-e",
                "trace=quotactl,quotactl_fd",
                "-o",
                &trace_arg,
            ],
            spec,
        )
        .output()
        .expect("strace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let n = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|l| l.contains("quotactl"))
        .count();
    let _ = std::fs::remove_file(&trace);
    n
}

/// A local user tagged its own files with the project IDs after the last
/// volume's (before the guard refused it): a create used to read each of
/// them, one `quotactl` under the filesystem-wide allocation lock (20,000
/// made one take seconds, a million past Nomad's deadline). It reads at
/// most a bounded number more than a create on an empty node, whatever
/// was squatted.
fn a_create_after_squatted_ids_reads_a_bounded_number_of_quotas(fs: &FsCase) {
    const SQUATTED: u32 = 3000;
    let small = prjquota_vmtests::fixture::SmallFs::new(fs, "squat", 512 * MIB);
    let f = small.fixture("squat");
    std::fs::write(
        f.node.plugin_dir.join("prjquota.toml"),
        "project_id_min = 1000\nproject_id_max = 1999999999\n",
    )
    .unwrap();
    let first = Spec::new("first", MIB as i64);
    let empty_node = quota_reads_of_a_create(&f, &first);
    let last = f.project_id(&first.id);
    let squat = small.mount.join("squat");
    std::fs::create_dir(&squat).unwrap();
    for id in last + 1..=last + SQUATTED {
        let p = squat.join(id.to_string());
        std::fs::write(&p, b"").unwrap();
        prjquota_vmtests::attack::chproj(&prjquota_vmtests::attack::open(&p), id)
            .expect("a squatter's chproj, before any guard");
    }
    let next = Spec::new("next", MIB as i64);
    let squatted = quota_reads_of_a_create(&f, &next);
    eprintln!(
        "MEASURE create_quota_reads empty_node {empty_node} after_{SQUATTED}_squatted {squatted}"
    );
    let bound = (prjquota_core::project_ids::STEPS + prjquota_core::project_ids::PROBES) as usize;
    assert!(
        squatted <= empty_node + bound,
        "{}: a create after {SQUATTED} squatted IDs read {squatted} quotas, an empty node's {empty_node}",
        fs.name
    );
    let got = f.project_id(&next.id);
    assert!(
        !(last + 1..=last + SQUATTED).contains(&got),
        "{}: a squatted ID {got} was given",
        fs.name
    );
}

fn delete_under_an_append_only_root_passes_every_kind_of_file(fs: &FsCase) {
    let f = fs.fixture("aroot");
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let make = |kind: &str, p: &Path| match kind {
        "file" => std::fs::write(p, b"x").unwrap(),
        "dir" => std::fs::create_dir(p).unwrap(),
        "fifo" => nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o600)).unwrap(),
        "socket" => drop(std::os::unix::net::UnixListener::bind(p).unwrap()),
        "chardev" => mknod(
            p,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 3),
        )
        .unwrap(),
        _ => unreachable!("{kind}"),
    };
    for kind in ["file", "dir", "fifo", "socket", "chardev"] {
        let spec = Spec::new(&format!("aroot-{kind}"), 16 * MIB as i64);
        let (path, _) = f.create(&spec);
        let pid = f.project_id(&spec.id);
        make(kind, &path.join(kind));
        sh(&format!("chattr +a {}", path.display()));
        let out = f.node.delete(&spec);
        assert!(
            out.status.success(),
            "deleting a volume whose append-only root holds only a {kind}: {}",
            out.stderr
        );
        assert!(!path.exists(), "{kind}: {}", out.stderr);
        assert!(f.quota(pid).is_unused(), "{kind}");
    }
}

/// The peak resident memory of the largest child this test process has
/// waited for, in KiB (nextest runs every test in a process of its own).
fn children_peak_rss_kib() -> i64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage")
        .max_rss()
}

/// A directory of 40,000 entries is deleted with the memory of a small
/// one: its listing is streamed in batches, not read whole.
#[test]
fn deleting_a_directory_of_40k_entries_streams_its_listing() {
    let f = XFS.fixture("stream");
    let small = Spec::new("small", 1 << 30);
    let (path, _) = f.create(&small);
    populate(&path, 1, 100);
    f.node.delete(&small).ok();
    let baseline = children_peak_rss_kib();

    let big = Spec::new("big", 1 << 30);
    let (path, _) = f.create(&big);
    let dir = path.join("d");
    std::fs::create_dir(&dir).unwrap();
    // Names near NAME_MAX make a whole listing in memory easy to see
    // (~10 MiB) with fewer entries to make under emulation.
    let pad = "n".repeat(240);
    for i in 0..40_000 {
        std::fs::File::create(dir.join(format!("{pad}{i}"))).unwrap();
    }
    let out = f.node.delete(&big);
    out.ok();
    assert!(!path.exists());
    let peak = children_peak_rss_kib();
    eprintln!(
        "MEASURE delete_40k_entries_peak_rss_kib {peak} baseline_kib {baseline} seconds {:.3}",
        out.elapsed.as_secs_f64()
    );
    assert!(
        peak <= baseline + 4096,
        "deleting 40,000 entries peaked at {peak} KiB, more than 4 MiB above the {baseline} KiB \
         of deleting 100: the listing is held in memory"
    );
}

fn a_plugin_run_without_any_environment_fails_cleanly(fs: &FsCase) {
    let f = fs.fixture("noenv");
    let out = run_plugin(&f.node.plugin, "create", &[], Duration::from_secs(60));
    let msg = out.error();
    assert!(msg.contains("DHV_"), "{msg}");
}

/// The two kernels differ here, and the tests pin it: XFS enforces project
/// quotas against root, ext4 lets CAP_SYS_RESOURCE ignore them (docs/security.md
/// says so).
#[test]
fn xfs_limits_root_too() {
    let f = XFS.fixture("root");
    let spec = Spec::new("root", 8 * MIB as i64);
    let (path, _) = f.create(&spec);
    let r = fill(&path.join("blob"), 16 * MIB, None);
    assert_eq!(r.errno, Some(libc::ENOSPC), "{r:?}");
    assert!(r.written <= 8 * MIB);
}

#[test]
fn ext4_lets_cap_sys_resource_past_the_limit_but_not_other_writers() {
    let f = EXT4.fixture("root");
    let spec = writable(Spec::new("root", 8 * MIB as i64));
    let (path, _) = f.create(&spec);
    let r = fill(&path.join("root-blob"), 12 * MIB, None);
    assert_eq!(r.errno, None, "root passes the ext4 limit: {r:?}");
    let r = fill(&path.join("user-blob"), MIB, Some(WRITER));
    assert_eq!(r.errno, Some(libc::EDQUOT), "{r:?}");
}

/// The plugin run under `strace -c`, counting the calls that wait for the
/// disk: a wrapper script to hand to a fixture as its plugin, and the file
/// its counts land in (rewritten at each run).
struct SyncCounter {
    wrapper: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl SyncCounter {
    fn new(tag: &str) -> SyncCounter {
        let dir = std::env::temp_dir().join(format!("syncs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (wrapper, log) = (dir.join("prjquota"), dir.join("strace.txt"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec /usr/bin/strace -f -qq -c -o {} -e trace=fsync,fdatasync,syncfs,sync,sync_file_range {} \"$@\"\n",
                log.display(),
                bin("prjquota").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        SyncCounter { wrapper, log }
    }

    /// fsync-like calls of the last run, by name.
    fn last_run(&self) -> std::collections::BTreeMap<String, u64> {
        let text = std::fs::read_to_string(&self.log).expect("strace -c wrote its table");
        text.lines()
            .filter_map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                let calls = cols.get(3)?.parse().ok()?;
                let name = cols.last()?;
                (*name != "total").then(|| (name.to_string(), calls))
            })
            .collect()
    }
}

/// What `SyncCounter::last_run` shows for a run that called fsync `n` times
/// and no other syncing call.
fn fsyncs(n: u64) -> std::collections::BTreeMap<String, u64> {
    [("fsync".to_string(), n)].into()
}

/// A run that called fsync (a journal commit) `commits` times and wrote
/// `data` files' content without a commit of their own.
fn commits_and_data_writes(commits: u64, data: u64) -> std::collections::BTreeMap<String, u64> {
    [
        ("fsync".to_string(), commits),
        ("sync_file_range".to_string(), data),
    ]
    .into()
}

/// Each fsync waits for a journal commit, behind whatever else the
/// filesystem is writing (beside other tests, that is most of a create's
/// time). Where the journal commits metadata in order (XFS, ext4 with a
/// journal), the steps in between need no commit of their own: the last
/// one commits them first, and a record's content is only written to the
/// device before its rename. A create commits once (the registry directory,
/// after its `ready` record), writing the `creating` and the `ready`
/// record's content; a delete commits once (the directory, once the record
/// is gone), writing its `deleting` record's content. The power-cut tests
/// (`crash.rs`) show that this is enough.
fn create_and_delete_sync_only_where_the_journal_needs_it(fs: &FsCase) {
    let syncs = SyncCounter::new(fs.name);
    let f = Fixture::with_plugin(&(fs.mount)(), &format!("{}-syncs", fs.name), &syncs.wrapper);
    let spec = Spec::new("synced", 8 * MIB as i64);
    f.node.create(&spec).created();
    assert_eq!(
        syncs.last_run(),
        commits_and_data_writes(1, 2),
        "create on {}",
        fs.name
    );
    f.node.create(&spec).created();
    assert_eq!(
        syncs.last_run(),
        Default::default(),
        "a restore writes nothing"
    );
    f.node.delete(&spec).ok();
    assert_eq!(
        syncs.last_run(),
        commits_and_data_writes(1, 1),
        "delete on {}",
        fs.name
    );
}

/// Without a journal nothing orders one change before the next on disk, so
/// every registry write is synced on its own, as before.
#[test]
fn without_a_journal_every_registry_write_is_synced() {
    let small = SmallFs::ext4_without_journal("syncs", 64 * MIB);
    let syncs = SyncCounter::new("nojournal");
    let f = Fixture::with_plugin(&small.mount, "syncs", &syncs.wrapper);
    let spec = Spec::new("synced", 8 * MIB as i64);
    f.node.create(&spec).created();
    assert_eq!(syncs.last_run(), fsyncs(5), "create");
    f.node.delete(&spec).ok();
    assert_eq!(syncs.last_run(), fsyncs(3), "delete");
}
