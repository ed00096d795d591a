//! `prjquota grow VOLUME --to SIZE | --by SIZE [--inodes N]`: what the
//! operator reads after `ops::grow`, above all what Nomad still believes
//! and how to bring its view in line once the volume is free.

use serde::Serialize;

use crate::ops::Grew;
use prjquota_core::units;

/// A size as a volume spec's `capacity_max` takes it, exactly: the largest
/// IEC unit that divides it, else bytes.
pub fn spec_size(bytes: u64) -> String {
    for (unit, name) in [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    bytes.to_string()
}

fn inodes(n: Option<u64>) -> String {
    n.map_or_else(|| "no limit".into(), |n| n.to_string())
}

/// The text for people.
pub fn render(g: &Grew) -> String {
    let mut out = String::new();
    let what = format!(
        "volume {:?} ({}, namespace {})",
        g.volume_name, g.volume_id, g.namespace
    );
    let inodes_changed = g.from_max_inodes != g.to_max_inodes;
    if g.changed {
        out.push_str(&format!(
            "grew {what} from {} to {}",
            units::human(g.from_bytes),
            units::human(g.to_bytes)
        ));
        if inodes_changed {
            out.push_str(&format!(
                ", inodes from {} to {}",
                inodes(g.from_max_inodes),
                inodes(g.to_max_inodes)
            ));
        }
        out.push_str(": in force now, nothing restarted\n");
    } else {
        out.push_str(&format!(
            "{what} is {} ({} inodes) already: its limits are in force\n",
            units::human(g.to_bytes),
            inodes(g.to_max_inodes)
        ));
    }
    if g.nomad_bytes == g.to_bytes && g.nomad_max_inodes == g.to_max_inodes {
        out.push_str("Nomad's spec asks for these limits: nothing more to do\n");
        return out;
    }
    out.push_str(&format!(
        "Nomad still believes its capacity is {} ({} inodes); this node keeps {} ({} inodes) \
         at every restore of the older spec.\n",
        units::human(g.nomad_bytes),
        inodes(g.nomad_max_inodes),
        units::human(g.to_bytes),
        inodes(g.to_max_inodes),
    ));
    let mut spec = format!("capacity_max = \"{}\"", spec_size(g.to_bytes));
    if g.nomad_max_inodes != g.to_max_inodes {
        if let Some(n) = g.to_max_inodes {
            spec.push_str(&format!(" and the parameter max_inodes = \"{n}\""));
        }
    }
    out.push_str(&format!(
        "Once no allocation claims it, bring Nomad's view in line: in its spec set {spec} \
         and id = \"{}\", then run\n    nomad volume create -namespace {} <spec file>\n",
        g.volume_id, g.namespace
    ));
    out
}

/// `--json`: the same facts for a script.
#[derive(Serialize)]
struct Json<'a> {
    volume_id: &'a str,
    volume_name: &'a str,
    namespace: &'a str,
    changed: bool,
    from_bytes: u64,
    to_bytes: u64,
    from_max_inodes: Option<u64>,
    to_max_inodes: Option<u64>,
    nomad_bytes: u64,
    nomad_max_inodes: Option<u64>,
    /// The spec's `capacity_max` that matches the record.
    spec_capacity_max: String,
}

pub fn render_json(g: &Grew) -> String {
    serde_json::to_string_pretty(&Json {
        volume_id: g.volume_id.as_str(),
        volume_name: &g.volume_name,
        namespace: &g.namespace,
        changed: g.changed,
        from_bytes: g.from_bytes,
        to_bytes: g.to_bytes,
        from_max_inodes: g.from_max_inodes,
        to_max_inodes: g.to_max_inodes,
        nomad_bytes: g.nomad_bytes,
        nomad_max_inodes: g.nomad_max_inodes,
        spec_capacity_max: spec_size(g.to_bytes),
    })
    .expect("serialisable")
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::VolumeId;

    fn grew(changed: bool) -> Grew {
        Grew {
            volume_id: VolumeId::parse("0b6f3c1e-5d2a-4f8b-9c7d-1e2f3a4b5c6d").unwrap(),
            volume_name: "db".into(),
            namespace: "prod".into(),
            from_bytes: 20 << 30,
            to_bytes: 40 << 30,
            from_max_inodes: Some(1000),
            to_max_inodes: Some(5000),
            nomad_bytes: 20 << 30,
            nomad_max_inodes: Some(1000),
            changed,
        }
    }

    #[test]
    fn spec_sizes_are_exact() {
        assert_eq!(spec_size(40 << 30), "40GiB");
        assert_eq!(spec_size((1 << 30) + (512 << 20)), "1536MiB");
        assert_eq!(spec_size(4096), "4KiB");
        assert_eq!(spec_size(1000), "1000");
        assert_eq!(spec_size(2 << 40), "2TiB");
    }

    #[test]
    fn it_says_what_nomad_believes_and_the_command_that_aligns_it() {
        let t = render(&grew(true));
        assert!(t.starts_with("grew volume \"db\""), "{t}");
        assert!(
            t.contains("from 20 GiB to 40 GiB, inodes from 1000 to 5000"),
            "{t}"
        );
        assert!(
            t.contains("Nomad still believes its capacity is 20 GiB"),
            "{t}"
        );
        assert!(
            t.contains("capacity_max = \"40GiB\" and the parameter max_inodes = \"5000\""),
            "{t}"
        );
        assert!(t.contains("nomad volume create -namespace prod"), "{t}");
        let t = render(&grew(false));
        assert!(t.contains("is 40 GiB (5000 inodes) already"), "{t}");
        let mut aligned = grew(true);
        aligned.nomad_bytes = 40 << 30;
        aligned.nomad_max_inodes = Some(5000);
        assert!(render(&aligned).contains("nothing more to do"));
        let j: serde_json::Value = serde_json::from_str(&render_json(&grew(true))).unwrap();
        assert_eq!(j["spec_capacity_max"], "40GiB");
        assert_eq!(j["nomad_bytes"], 20u64 << 30);
    }
}
