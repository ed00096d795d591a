//! Nomad's deadlines (fingerprint 1 s, create and delete 60 s, a node's
//! restore 50 s in all) checked as ratios against the plain-directory plugin
//! (`mkdir-plugin`, what Nomad's built-in `mkdir` does) measured side by side
//! in the same boot: an emulated CPU makes absolute times meaningless, but a
//! regression that makes prjquota slower than a plain mkdir by a factor shows.
//!
//! Both contenders are the debug builds the suite runs, and the tests run
//! beside the pass's other tests. Alone in their guest (tried 2026-11-23)
//! the restore of 50 volumes measured 2.01 times mkdir on XFS, over its
//! bound: load adds about the same time to both contenders and pulls the
//! ratio towards 1 (1.8 beside the other tests), and what separates them is
//! the debug build's user-space CPU (environment, parameter and record
//! parsing, some 100 ms a restore under the emulated CPU). `cargo xtask
//! bench` measures release builds at 1.27 to 1.42. The lasting fix is to
//! measure these ratios on release builds of both.

use prjquota_vmtests::fixture::{Fixture, FsCase, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::{bin, median};

on_every_fs!(
    fingerprint_and_create_are_within_3x_of_a_plain_mkdir,
    a_restore_of_50_volumes_is_within_2x_of_a_plain_mkdir,
);

const SAMPLES: usize = 9;
const RESTORED: usize = 50;

/// The prjquota node and the baseline node, on the same filesystem.
fn contenders(fs: &FsCase, tag: &str) -> [Fixture; 2] {
    [
        fs.fixture(tag),
        Fixture::with_plugin(
            &(fs.mount)(),
            &format!("{}-{tag}-mkdir", fs.name),
            &bin("mkdir-plugin"),
        ),
    ]
}

fn assert_ratio(what: &str, fs: &FsCase, ours: f64, plain: f64, bound: f64) {
    let ratio = ours / plain;
    eprintln!(
        "MEASURE {what}_{}_ratio {ratio:.2} (prjquota {ours:.4} s, mkdir {plain:.4} s)",
        fs.name
    );
    assert!(
        ratio <= bound,
        "{what} on {}: prjquota takes {ratio:.2}× the plain-directory plugin \
         ({ours:.4} s against {plain:.4} s), above the {bound}× allowed",
        fs.name
    );
}

fn fingerprint_and_create_are_within_3x_of_a_plain_mkdir(fs: &FsCase) {
    let nodes = contenders(fs, "timing");
    let mut fp = [Vec::new(), Vec::new()];
    let mut create = [Vec::new(), Vec::new()];
    // Interleaved, so that load from tests running next to this one falls
    // on both contenders alike.
    for i in 0..SAMPLES {
        for (k, f) in nodes.iter().enumerate() {
            let out = f.node.fingerprint();
            out.ok();
            fp[k].push(out.elapsed.as_secs_f64());
            let spec = Spec::new(&format!("t{i}"), 8 * MIB as i64);
            let out = f.node.create(&spec);
            out.created();
            create[k].push(out.elapsed.as_secs_f64());
            f.node.delete(&spec).ok();
        }
    }
    assert_eq!(fp[0].len(), SAMPLES, "every sample was taken");
    let [fp0, fp1] = fp;
    assert_ratio("fingerprint", fs, median(fp0), median(fp1), 3.0);
    let [c0, c1] = create;
    assert_ratio("create", fs, median(c0), median(c1), 3.0);
}

fn a_restore_of_50_volumes_is_within_2x_of_a_plain_mkdir(fs: &FsCase) {
    let nodes = contenders(fs, "restore-timing");
    let specs: Vec<Spec> = (0..RESTORED)
        .map(|i| Spec::new(&format!("r{i}"), 4 * MIB as i64))
        .collect();
    for f in &nodes {
        for s in &specs {
            f.node.create(s).created();
        }
    }
    // Nomad's restore after an agent restart: every volume's create again,
    // one after another; the two nodes take turns so that load from tests
    // running next to this one falls on both alike.
    let mut total = [0.0f64; 2];
    let mut restored = [0usize; 2];
    for s in &specs {
        for (k, f) in nodes.iter().enumerate() {
            let out = f.node.create(s);
            out.created();
            total[k] += out.elapsed.as_secs_f64();
            restored[k] += 1;
        }
    }
    assert_eq!(restored, [RESTORED; 2], "every volume was restored");
    assert_ratio("restore_50", fs, total[0], total[1], 2.0);
}
