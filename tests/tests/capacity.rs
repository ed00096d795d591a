//! Sizes Nomad can trust: the bytes a create returns stay within the
//! request's `[capacity_min, capacity_max]` (Nomad's server refuses every
//! later update of a volume whose `capacity_max` is below the stored size).
//! Every create in the suite is also checked by the shared driver
//! (`nomad::assert_nomad_accepts`); these cases aim at the edges.

use prjquota_vmtests::fixture::{FsCase, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;

on_every_fs!(
    decimal_capacity_max_rounds_down_and_a_replay_returns_the_same_bytes,
    a_range_without_a_whole_block_is_refused_and_leaves_nothing,
);

fn decimal_capacity_max_rounds_down_and_a_replay_returns_the_same_bytes(fs: &FsCase) {
    let f = fs.fixture("decimal");
    // "10MB" as an HCL user writes it: not a multiple of the 4 KiB block.
    let max: i64 = 10_000_000;
    let spec = Spec::new("decimal", max);
    let first = f.node.create(&spec);
    let (_, bytes) = first.created();
    assert_eq!(bytes, max - max % 4096, "rounded down to the 4 KiB block");
    let pid = f.project_id(&spec.id);
    assert_eq!(f.quota(pid).limits.bytes_hard, bytes as u64);
    // Nomad re-submits the same spec: same answer, still within max.
    let again = f.node.create(&spec);
    assert_eq!(again.stdout, first.stdout);
    // A grow to another decimal size lands on the block below it.
    let mut grown = spec.clone();
    grown.min = 15_000_000;
    grown.max = 20_000_000;
    let (_, bytes) = f.node.create(&grown).created();
    assert_eq!(bytes, 20_000_000 - 20_000_000 % 4096);
    assert_eq!(f.quota(pid).limits.bytes_hard, bytes as u64);
}

fn a_range_without_a_whole_block_is_refused_and_leaves_nothing(fs: &FsCase) {
    let f = fs.fixture("noblock");
    let mut spec = Spec::new("tiny", 6000);
    spec.min = 5000;
    let msg = f.node.create(&spec).error();
    assert!(
        msg.contains("capacity_min") && msg.contains("capacity_max") && msg.contains("4096"),
        "the refusal names the range and the block: {msg}"
    );
    assert!(!f.node.volumes_dir.join(&spec.id).exists());
    assert!(f.record(&spec.id).is_none(), "no record after a refusal");
    // An existing volume asked to move into such a range keeps its limit.
    let ok = Spec::new("kept", 16 * MIB as i64);
    let (path, _) = f.create(&ok);
    let pid = f.project_id(&ok.id);
    let mut narrow = ok.clone();
    narrow.min = 16 * MIB as i64 + 1;
    narrow.max = 16 * MIB as i64 + 4000;
    f.node.create(&narrow).error();
    assert!(path.is_dir());
    assert_eq!(f.quota(pid).limits.bytes_hard, 16 * MIB);
}
