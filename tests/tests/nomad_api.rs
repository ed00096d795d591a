//! Nomad acting on what prjquota knows (`--nomad.*`), on real quotas, with
//! the stand-in agent of `prjquota_vmtests::nomad_api` in Nomad's place
//! (Nomad itself cannot run here; its answers are shaped as v2.0.5's API
//! types):
//!
//! - `ephemeral_disk.size` enforced: a task writing past its allocation's
//!   size is refused while another allocation on the filesystem writes on;
//!   an allocation over its size when limited keeps running and says so;
//!   with the option off nothing is limited, and limits an earlier start
//!   set are lifted;
//! - the unprovisioned bytes published as node metadata follow creates,
//!   grows and deletes within one update, and the documented constraint,
//!   evaluated as Nomad evaluates it, excludes a node that would refuse
//!   the volume and keeps one that admits it;
//! - `reconcile --nomad` reports a volume Nomad no longer lists, and
//!   `--fix` removes it with its quota, as Nomad's delete would.

use std::collections::BTreeMap;
use std::time::Duration;

use prjquota_vmtests::fixture::{fill, FsCase, SmallFs, MIB, WRITER, XFS};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::nomad_alloc::{alloc_bytes, scrape_until, write_file, AllocNode};
use prjquota_vmtests::nomad_api::{documented_constraints, feasible, Agent, Constraint};
use prjquota_vmtests::on_every_fs;
use prjquota_vmtests::operator;
use prjquota_vmtests::prom::{Exporter, Exposition};

on_every_fs!(
    a_task_past_its_ephemeral_disk_is_refused_while_another_allocation_writes_on,
    an_allocation_over_its_size_when_limited_keeps_running_and_is_reported,
);

const WAIT: Duration = Duration::from_secs(60);

/// The node metadata key the exporter publishes.
const META_KEY: &str = "unique.prjquota.unprovisioned_bytes";

fn limit(e: &Exposition, id: &str) -> Option<f64> {
    e.get("nomad_alloc_disk_limit_bytes", &[("alloc_id", id)])
}

fn reserved(e: &Exposition, id: &str) -> Option<f64> {
    e.get("nomad_alloc_disk_reserved_bytes", &[("alloc_id", id)])
}

fn limits_in(e: &Exposition, state: &str) -> f64 {
    e.get("prjquota_exporter_alloc_disk_limits", &[("state", state)])
        .unwrap_or(-1.0)
}

/// The exporter of `node`, asking `agent` for sizes and enforcing them
/// when `enforce`.
fn exporter(node: &AllocNode, agent: &Agent, enforce: bool) -> Exporter {
    let url = agent.url();
    let mut extra = vec!["--nomad.addr", &url, "--nomad.interval", "200ms"];
    if enforce {
        extra.push("--nomad.enforce-ephemeral-disk");
    }
    node.start_exporter(&extra)
}

fn a_task_past_its_ephemeral_disk_is_refused_while_another_allocation_writes_on(case: &FsCase) {
    let node = AllocNode::new(case, "eph-limit", 8);
    let agent = Agent::start("node-1");
    let mut small = node.root.build_alloc();
    let mut big = node.root.build_alloc();
    agent.add_allocation(&small.id, "default", 8);
    agent.add_allocation(&big.id, "prod", 256);
    let exp = exporter(&node, &agent, true);
    let small_task = small.build_task("web");
    let big_task = big.build_task("web");
    let e = scrape_until(&exp, WAIT, "both allocations limited at their size", |e| {
        limit(e, &small.id) == Some((8 * MIB) as f64)
            && limit(e, &big.id) == Some((256 * MIB) as f64)
    });
    assert_eq!(
        reserved(&e, &small.id),
        Some((8 * MIB) as f64),
        "{}",
        e.text
    );
    assert_eq!(limits_in(&e, "limited"), 2.0, "{}", e.text);
    let pid = prjquota_vmtests::nomad_alloc::project_of(&small.path).0;
    assert_eq!(node.usage(pid).limits.bytes_hard, 8 * MIB);
    // Each size was asked of Nomad by the allocation's own endpoint.
    for a in [&small, &big] {
        assert!(
            agent
                .requests_to(&format!("/v1/allocation/{}", a.id))
                .iter()
                .any(|r| r.method == "GET"),
            "{:#?}",
            agent.requests()
        );
    }

    // Both tasks write at once, as their owner: the small one past its
    // size, the big one well within its own.
    let (refused, wrote_on) = std::thread::scope(|s| {
        let a = s.spawn(|| fill(&small_task.join("local/fill"), 64 * MIB, Some(WRITER)));
        let b = s.spawn(|| fill(&big_task.join("local/fill"), 48 * MIB, Some(WRITER)));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(refused.errno, Some(case.full_errno), "{refused:?}");
    assert!(
        refused.written <= 8 * MIB && refused.written >= 6 * MIB,
        "{refused:?}"
    );
    assert_eq!(
        (wrote_on.errno, wrote_on.written),
        (None, 48 * MIB),
        "{wrote_on:?}"
    );
    // And after the refusal the big one still writes.
    let after = fill(&big_task.join("local/after"), 16 * MIB, Some(WRITER));
    assert_eq!((after.errno, after.written), (None, 16 * MIB), "{after:?}");
    let e = exp.scrape();
    assert!(
        alloc_bytes(&e, &big.id).is_some_and(|b| b >= (64 * MIB) as f64),
        "{}",
        e.text
    );
    e.assert_collectors_succeeded("two limited allocations");
}

fn an_allocation_over_its_size_when_limited_keeps_running_and_is_reported(case: &FsCase) {
    let node = AllocNode::new(case, "eph-over", 8);
    let agent = Agent::start("node-1");
    let mut a = node.root.build_alloc();
    // A sticky disk moved in before the task: already over the new
    // allocation's 8 MiB.
    write_file(&a.path.join("alloc/data/previous"), (24 * MIB) as usize);
    agent.add_allocation(&a.id, "default", 8);
    let exp = exporter(&node, &agent, true);
    let task = a.build_task("db");
    let e = scrape_until(&exp, WAIT, "the allocation limited above its usage", |e| {
        limit(e, &a.id).is_some()
    });
    let (lim, used) = (limit(&e, &a.id).unwrap(), alloc_bytes(&e, &a.id).unwrap());
    // What NomadAllocEphemeralDiskOverSize reads: a limit above the size.
    assert_eq!(reserved(&e, &a.id), Some((8 * MIB) as f64), "{}", e.text);
    assert!(lim >= used + (64 * MIB) as f64, "limit {lim}, used {used}");
    assert_eq!(limits_in(&e, "over"), 1.0, "{}", e.text);
    assert!(
        exp.log()
            .contains("over its ephemeral_disk.size when it was limited"),
        "{}",
        exp.log()
    );
    // The task keeps running: its next writes are taken.
    let more = fill(&task.join("local/more"), 16 * MIB, Some(WRITER));
    assert_eq!((more.errno, more.written), (None, 16 * MIB), "{more:?}");
    // Once back within its size, its limit is its size.
    std::fs::remove_file(a.path.join("alloc/data/previous")).unwrap();
    std::fs::remove_file(task.join("local/more")).unwrap();
    scrape_until(&exp, WAIT, "the limit back at the size", |e| {
        limit(e, &a.id) == Some((8 * MIB) as f64) && limits_in(e, "limited") == 1.0
    });
}

/// Off (the default), no allocation is limited; an exporter started with
/// the option on, then again without it, lifts what it set.
#[test]
fn with_the_option_off_nothing_is_limited() {
    let node = AllocNode::new(&XFS, "eph-off", 8);
    let agent = Agent::start("node-1");
    let mut a = node.root.build_alloc();
    let mut b = node.root.build_alloc();
    agent.add_allocation(&a.id, "default", 8);
    agent.add_allocation(&b.id, "default", 8);
    let task_a = a.build_task("web");
    let on = exporter(&node, &agent, true);
    scrape_until(&on, WAIT, "limited while on", |e| {
        limit(e, &a.id) == Some((8 * MIB) as f64)
    });
    drop(on);
    let off = exporter(&node, &agent, false);
    let task_b = b.build_task("web");
    let e = scrape_until(&off, WAIT, "both accounted and none limited", |e| {
        alloc_bytes(e, &b.id).is_some() && limit(e, &a.id).is_none()
    });
    assert_eq!(limit(&e, &b.id), None, "{}", e.text);
    assert_eq!(reserved(&e, &a.id), None, "sizes asked with the option off");
    for (alloc, task) in [(&a, &task_a), (&b, &task_b)] {
        let pid = prjquota_vmtests::nomad_alloc::project_of(&alloc.path).0;
        assert!(node.usage(pid).limits.is_none(), "{:?}", node.usage(pid));
        let f = fill(&task.join("local/past"), 32 * MIB, Some(WRITER));
        assert_eq!((f.errno, f.written), (None, 32 * MIB), "{f:?}");
    }
    assert!(
        off.log()
            .contains("lifted an allocation's ephemeral disk limit"),
        "{}",
        off.log()
    );
    assert!(
        agent
            .requests_to(&format!("/v1/allocation/{}", b.id))
            .is_empty(),
        "Nomad asked for sizes with the option off"
    );
}

/// The figure the agent holds for the node, once it holds one.
fn published(agent: &Agent) -> Option<u64> {
    agent
        .meta(META_KEY)
        .map(|v| v.parse().expect("a byte count"))
}

/// The next figure published after `posts` publications, within `WAIT`.
fn next_published(agent: &Agent, posts: usize, what: &str) -> u64 {
    agent.wait_for(WAIT, what, |r| {
        r.iter()
            .filter(|r| r.path() == "/v1/client/metadata")
            .count()
            > posts
    });
    let post = &agent.requests_to("/v1/client/metadata")[posts];
    let body: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    body["Meta"][META_KEY]
        .as_str()
        .expect("the figure as a string")
        .parse()
        .expect("a byte count")
}

fn posts(agent: &Agent) -> usize {
    agent.requests_to("/v1/client/metadata").len()
}

/// The documented constraint, asking for `bytes`.
fn constraint_for(bytes: u64) -> Constraint {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/nomad.md"))
        .expect("docs/nomad.md");
    let mut c = documented_constraints(&page, "<!-- the placement constraint -->").remove(0);
    c.value = bytes.to_string();
    c
}

/// Creates, a grow and a delete each move the published figure at the
/// next update by the bytes promised (and the few a record takes), and
/// the figure is exactly the exporter's own; at the edge, the constraint
/// Nomad evaluates keeps the node for a volume the plugin admits and
/// excludes it for one the plugin refuses.
#[test]
fn the_published_unprovisioned_bytes_follow_creates_grows_and_deletes() {
    let small = SmallFs::new(&XFS, "placement", 320 * MIB);
    let f = small.fixture("placement");
    f.set_overcommit_ratio(1.0);
    // Nomad's client makes its host_volumes_dir at start.
    std::fs::create_dir_all(&f.node.volumes_dir).unwrap();
    let agent = Agent::start("node-1");
    let url = agent.url();
    let plugin_dir = f.node.plugin_dir.display().to_string();
    let exp = Exporter::start_with(
        &[&f.node.volumes_dir],
        &[
            "--plugin-dir",
            &plugin_dir,
            "--guard=off",
            "--ebpf=off",
            "--nomad.addr",
            &url,
            "--nomad.publish-unprovisioned",
            "--nomad.interval",
            "200ms",
        ],
    );
    let first = next_published(&agent, 0, "the first figure");
    assert_eq!(published(&agent), Some(first));
    // A record takes a block or two outside the volumes; nothing else
    // moves on this filesystem.
    let slack = MIB;
    // The scrape applies the same rule a moment later: the blocks outside
    // the volumes (a record's, XFS's speculative preallocation given back)
    // move it by a few KiB, which the hysteresis does not publish again.
    let agrees = |published: u64, what: &str| {
        let e = exp.scrape();
        let own = e
            .get("nomad_host_volumes_unprovisioned_bytes", &[])
            .unwrap_or_else(|| panic!("{what}: no figure of its own\n{}", e.text));
        assert!(
            (own - published as f64).abs() <= slack as f64,
            "{what}: published {published}, the exporter's own {own}"
        );
    };
    agrees(first, "at start");
    let ops_moved = |before: u64, after: u64, by: u64, what: &str| {
        assert!(
            before >= after + by && before <= after + by + slack,
            "{what}: {before} -> {after}, expected {by} less"
        );
    };

    let forty = (first * 40 / 100) & !4095;
    let a = Spec::new("a", forty as i64);
    let n = posts(&agent);
    f.create(&a);
    let after_create = next_published(&agent, n, "the figure after a create");
    ops_moved(first, after_create, forty, "create");
    agrees(after_create, "after a create");

    let mut grown = a.clone();
    grown.max = (forty + 16 * MIB) as i64;
    let n = posts(&agent);
    f.create(&grown);
    let after_grow = next_published(&agent, n, "the figure after a grow");
    ops_moved(after_create, after_grow, 16 * MIB, "grow");

    let n = posts(&agent);
    f.node.delete(&a).ok();
    let after_delete = next_published(&agent, n, "the figure after a delete");
    assert!(
        after_delete + slack >= first && after_delete <= first + slack,
        "delete: {first} at first, {after_delete} after"
    );

    // The edge: a volume of what the node publishes, give or take a MiB.
    let meta: BTreeMap<String, String> = [(META_KEY.to_string(), after_delete.to_string())].into();
    let too_big = (after_delete + MIB) & !4095;
    assert!(!feasible(&constraint_for(too_big), &meta));
    let msg = f.node.create(&Spec::new("too-big", too_big as i64)).error();
    assert!(msg.contains("not enough space to promise"), "{msg}");
    let fits = (after_delete - MIB) & !4095;
    assert!(feasible(&constraint_for(fits), &meta));
    f.create(&Spec::new("fits", fits as i64));
    // A node that never published is no candidate.
    assert!(!feasible(&constraint_for(1), &BTreeMap::new()));
    exp.scrape()
        .assert_collectors_succeeded("publishing the unprovisioned bytes");
}

/// Rewrites volume `id`'s record as written `secs` seconds earlier.
fn age_record(f: &prjquota_vmtests::fixture::Fixture, id: &str, secs: u64) {
    let dir = f.node.volumes_dir.join(".prjquota/volumes");
    let mut rec = f.record(id).expect("a record");
    for k in ["created_unix", "updated_unix"] {
        rec[k] = (rec[k].as_u64().unwrap() - secs).into();
    }
    let tmp = dir.join(format!(".{id}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{id}.json"))).unwrap();
}

fn findings(ran: &operator::Ran) -> Vec<serde_json::Value> {
    ran.json()["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn finding_of<'a>(
    all: &'a [serde_json::Value],
    kind: &str,
    id: &str,
) -> Option<&'a serde_json::Value> {
    all.iter()
        .find(|f| f["kind"] == kind && f["subject"].as_str().is_some_and(|s| s.contains(id)))
}

/// A volume removed with `nomad volume delete -force` is reported, and
/// `--nomad --fix` deletes it through the plugin's delete path: its
/// directory, record and quota go; the volume Nomad lists, and one too
/// recent to tell from a create in flight, stay. Plain `--fix` never
/// deletes one; without an exporter that can ask Nomad, nothing is said
/// to be unknown.
#[test]
fn reconcile_removes_a_volume_nomad_no_longer_lists_with_its_quota() {
    let f = XFS.fixture("reconcile-nomad");
    let kept = prjquota_vmtests::fixture::writable(Spec::new("kept", (64 * MIB) as i64));
    let forgotten = prjquota_vmtests::fixture::writable(Spec::new("forgotten", (64 * MIB) as i64));
    let fresh = Spec::new("fresh", (64 * MIB) as i64);
    for s in [&kept, &forgotten, &fresh] {
        f.create(s);
    }
    let gone_path = f.node.volumes_dir.join(&forgotten.id);
    let w = fill(&gone_path.join("data"), 4 * MIB, Some(WRITER));
    assert_eq!(w.errno, None);
    let gone_pid = f.project_id(&forgotten.id);
    age_record(&f, &forgotten.id, 3600);
    age_record(&f, &kept.id, 3600);

    // No exporter yet: Nomad cannot be asked, and nothing is unknown.
    let ran = operator::run(&f, "reconcile", &["--nomad", "--json"]);
    assert_eq!(ran.code, Some(1), "{ran:#?}");
    let all = findings(&ran);
    assert!(
        all.iter().any(|x| x["kind"] == "nomad-not-asked"),
        "{all:#?}"
    );
    assert!(
        !all.iter().any(|x| x["kind"] == "unknown-to-nomad"),
        "{all:#?}"
    );

    let agent = Agent::start(&f.node.node_id);
    agent.add_volume(&kept.id, &kept.namespace, &f.node.node_id);
    let url = agent.url();
    let plugin_dir = f.node.plugin_dir.display().to_string();
    let _exp = Exporter::start_with(
        &[&f.node.volumes_dir],
        &[
            "--plugin-dir",
            &plugin_dir,
            "--guard=off",
            "--ebpf=off",
            "--nomad.addr",
            &url,
        ],
    );
    let ran = operator::run(&f, "reconcile", &["--nomad", "--json"]);
    assert_eq!(ran.code, Some(1), "{ran:#?}");
    let all = findings(&ran);
    let gone =
        finding_of(&all, "unknown-to-nomad", &forgotten.id).expect("the forgotten volume reported");
    assert!(
        gone["fix"]
            .as_str()
            .unwrap()
            .contains("nomad volume delete"),
        "{gone}"
    );
    assert_eq!(gone["fixed"], false);
    let young = finding_of(&all, "unknown-to-nomad", &fresh.id).expect("the fresh volume reported");
    assert!(
        young["fix"].is_null(),
        "a fresh volume would be deleted: {young}"
    );
    assert!(
        finding_of(&all, "unknown-to-nomad", &kept.id).is_none(),
        "{all:#?}"
    );
    // Its own endpoint was asked, in its namespace.
    assert!(agent
        .requests_to(&format!("/v1/volume/host/{}", forgotten.id))
        .iter()
        .any(|r| r.query("namespace").as_deref() == Some("default")));

    // Plain --fix repairs what loses no data: the volume stays.
    operator::run(&f, "reconcile", &["--fix", "--json"]).ok();
    assert!(gone_path.join("data").exists());

    let ran = operator::run(&f, "reconcile", &["--nomad", "--fix", "--json"]);
    let all = findings(&ran);
    assert_eq!(
        finding_of(&all, "unknown-to-nomad", &forgotten.id).map(|x| x["fixed"].clone()),
        Some(serde_json::Value::Bool(true)),
        "{ran:#?}"
    );
    assert!(!gone_path.exists(), "the directory stayed");
    assert!(f.record(&forgotten.id).is_none(), "the record stayed");
    assert!(f.quota(gone_pid).is_unused(), "{:?}", f.quota(gone_pid));
    assert!(f.node.volumes_dir.join(&kept.id).exists());
    assert!(f.node.volumes_dir.join(&fresh.id).exists());
    // Again: only the fresh one is left to report.
    let ran = operator::run(&f, "reconcile", &["--nomad", "--fix", "--json"]);
    let all = findings(&ran);
    assert!(
        finding_of(&all, "unknown-to-nomad", &forgotten.id).is_none(),
        "{all:#?}"
    );
    assert!(
        finding_of(&all, "unknown-to-nomad", &fresh.id).is_some(),
        "{all:#?}"
    );
}
