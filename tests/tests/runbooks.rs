//! The volume alerts' runbooks run as written: each mitigation's fenced
//! shell blocks, in order, on a real volume, as the operator paged at
//! night would type them (the volume's placeholders filled in, Nomad's
//! own commands shown and not run: there is no Nomad agent here). An edit
//! to a mitigation changes what runs; a command this test does not know
//! fails it, naming the block.

use prjquota_core::units;
use prjquota_vmtests::fixture::{writable, Fixture, MIB};
use prjquota_vmtests::nomad::Spec;
use prjquota_vmtests::readme::Block;
use prjquota_vmtests::runbook::mitigation;
use prjquota_vmtests::xfs_mount;

/// The alerts whose mitigation grows the volume.
const VOLUME_ALERTS: [&str; 4] = [
    "NomadHostVolumeFillingUp",
    "NomadHostVolumeInodesFillingUp",
    "NomadHostVolumeQuotaLimitHit",
    "NomadHostVolumeWriteErrors",
];

/// The runbooks' volumes directory (Nomad's default), replaced by the
/// test node's.
const DOCS_VOLUMES_DIR: &str = "/opt/nomad/data/host_volumes";

/// What a block is to this test.
#[derive(Debug, PartialEq)]
enum Step {
    /// Nomad's own commands: shown, not run.
    Nomad,
    /// The node's commands: run.
    Node,
    /// Not a shell block (a spec).
    Other,
}

fn step(alert: &str, b: &Block) -> Step {
    let commands = b.commands();
    match b.lang.as_str() {
        "sh" if commands.iter().all(|c| c.starts_with("nomad ")) => Step::Nomad,
        "sh" if commands
            .iter()
            .all(|c| c.starts_with("prjquota ") || c.starts_with("df ")) =>
        {
            Step::Node
        }
        "sh" => panic!(
            "a shell block of {alert}'s mitigation this test does not know:\n{}",
            b.text
        ),
        _ => Step::Other,
    }
}

/// The kernel's (bytes, inodes) hard limits of the volume.
fn limits(f: &Fixture, id: &str) -> (u64, u64) {
    let q = f.quota(f.project_id(id));
    (q.limits.bytes_hard, q.limits.inodes_hard)
}

/// The value after `flag` in a command.
fn flag<'a>(command: &'a str, flag: &str) -> Option<&'a str> {
    let mut words = command.split_whitespace();
    words.by_ref().find(|w| *w == flag)?;
    words.next()
}

#[test]
fn the_volume_alerts_mitigations_run_as_written() {
    let f = Fixture::new(&xfs_mount(), "runbooks");
    let spec = writable(Spec::new("orders-db", (8 * MIB) as i64)).param("max_inodes", "1000");
    f.create(&spec);
    let block = 4096;
    let mut grows = 0;
    for alert in VOLUME_ALERTS {
        let blocks = mitigation(alert);
        let mut ran = 0;
        for b in &blocks {
            match step(alert, b) {
                Step::Other => continue,
                Step::Nomad => {
                    assert!(
                        b.commands()
                            .iter()
                            .all(|c| c.starts_with("nomad volume create")),
                        "{alert}: a Nomad command other than the spec's re-submission:\n{}",
                        b.text
                    );
                    eprintln!("{alert}: Nomad's own, not run here:\n{}", b.text);
                    continue;
                }
                Step::Node => {}
            }
            for command in b.commands() {
                let (before_bytes, before_inodes) = limits(&f, &spec.id);
                let mut c = command
                    .replace("<volume_id>", &spec.id)
                    .replace("<volume_name>", &spec.name)
                    .replace("<namespace>", &spec.namespace)
                    .replace(DOCS_VOLUMES_DIR, &f.node.volumes_dir.display().to_string());
                assert!(
                    !c.contains('<'),
                    "{alert}: a placeholder this test does not fill in: {command}"
                );
                if let Some(rest) = c.strip_prefix("prjquota ") {
                    // The package's /usr/bin/prjquota finds the node's
                    // plugin directory; here it is the test node's.
                    c = format!(
                        "{} {rest} --plugin-dir {}",
                        f.node.plugin.display(),
                        f.node.plugin_dir.display()
                    );
                }
                let out = std::process::Command::new("bash")
                    .arg("-c")
                    .arg(&c)
                    .output()
                    .expect("run bash");
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                eprintln!("{alert}: {command}\n{text}");
                assert!(out.status.success(), "{alert}: `{command}` failed:\n{text}");
                ran += 1;
                if command.starts_with("prjquota list") && command.contains("--name <volume_name>")
                {
                    assert!(
                        text.contains(&spec.id),
                        "{alert}: {command} misses the volume:\n{text}"
                    );
                }
                if !command.starts_with("prjquota grow") {
                    continue;
                }
                grows += 1;
                // The grow did what its flags say, in the kernel.
                let by = flag(command, "--by").map(|s| units::parse_size(s).unwrap());
                let inodes = flag(command, "--inodes").map(|s| s.parse::<u64>().unwrap());
                let want = (
                    by.map_or(before_bytes, |b| (before_bytes + b).next_multiple_of(block)),
                    inodes.unwrap_or(before_inodes),
                );
                assert_eq!(limits(&f, &spec.id), want, "{alert}: after `{command}`");
                assert!(
                    text.contains("Nomad still believes its capacity is 8 MiB"),
                    "{alert}: the grow does not say what Nomad believes:\n{text}"
                );
            }
        }
        assert!(
            ran > 0,
            "{alert}'s mitigation ran no command: its blocks were\n{blocks:#?}"
        );
    }
    assert!(
        grows >= VOLUME_ALERTS.len(),
        "the mitigations grew the volume {grows} times"
    );
    // What they did is what the record says: nothing for reconcile.
    let r = prjquota_vmtests::operator::run(&f, "reconcile", &["--json"]);
    assert_eq!(r.json()["clean"], true, "{}", r.stdout);
    // Nomad's restore of the volume's old spec keeps all of it.
    let grown = limits(&f, &spec.id);
    let (_, told) = f.create(&spec);
    assert_eq!((told as u64, limits(&f, &spec.id)), (8 * MIB, grown));
}
