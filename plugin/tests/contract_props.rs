//! Property tests over the Nomad environment parser: whatever a volume
//! author or a broken caller puts in the environment, parsing never panics,
//! and anything it accepts satisfies the invariants create and delete rely on.

use std::path::Component;

use proptest::prelude::*;

use prjquota::contract::{parse_create, parse_delete};

/// Values biased towards the interesting: valid-looking ones, traversal,
/// control characters, numbers at the edges, JSON fragments.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("null".to_string()),
        Just("{}".to_string()),
        Just("/srv/volumes".to_string()),
        Just("/srv/volumes/../etc".to_string()),
        Just("9223372036854775807".to_string()),
        Just("9223372036854775808".to_string()),
        Just("-1".to_string()),
        Just("3f1c6a52-9c0e-4d2b-8a6f-0b1e2d3c4f5a".to_string()),
        Just("{\"mode\":\"0750\",\"mode\":\"0700\"}".to_string()),
        "[0-9]{1,25}",
        "/[a-z/.]{0,30}",
        "\\PC{0,40}",
        ".{0,40}",
        "\\{\"[a-z_]{1,10}\":(\"[0-9]{1,5}\"|[0-9]{1,5}|null|\\[\\]|\\{\\})\\}",
    ]
}

fn env() -> impl Strategy<Value = Vec<(String, String)>> {
    let keys = prop_oneof![
        Just("DHV_OPERATION"),
        Just("DHV_VOLUMES_DIR"),
        Just("DHV_PLUGIN_DIR"),
        Just("DHV_NODE_POOL"),
        Just("DHV_NAMESPACE"),
        Just("DHV_VOLUME_NAME"),
        Just("DHV_VOLUME_ID"),
        Just("DHV_CAPACITY_MIN_BYTES"),
        Just("DHV_CAPACITY_MAX_BYTES"),
        Just("DHV_NODE_ID"),
        Just("DHV_PARAMETERS"),
        Just("DHV_CREATED_PATH"),
        Just("OTHER"),
    ];
    prop::collection::vec((keys.prop_map(str::to_string), value()), 0..16)
}

/// A valid create environment with one variable replaced.
fn mutated_create() -> impl Strategy<Value = Vec<(String, String)>> {
    (0usize..11, value()).prop_map(|(i, v)| {
        let mut e: Vec<(String, String)> = [
            ("DHV_OPERATION", "create"),
            ("DHV_VOLUMES_DIR", "/srv/volumes/"),
            ("DHV_PLUGIN_DIR", "/opt/nomad/plugins"),
            ("DHV_NODE_POOL", "default"),
            ("DHV_NAMESPACE", "default"),
            ("DHV_VOLUME_NAME", "pg"),
            ("DHV_VOLUME_ID", "3f1c6a52-9c0e-4d2b-8a6f-0b1e2d3c4f5a"),
            ("DHV_CAPACITY_MIN_BYTES", "0"),
            ("DHV_CAPACITY_MAX_BYTES", "1048576"),
            ("DHV_NODE_ID", "node-1"),
            ("DHV_PARAMETERS", "null"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        e[i].1 = v;
        e
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn create_never_panics_and_accepts_only_sound_requests(e in prop_oneof![env(), mutated_create()]) {
        if let Ok(r) = parse_create(e) {
            let id = r.volume_id.as_str();
            prop_assert_eq!(id.len(), 36);
            prop_assert!(id.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
            prop_assert!(r.volumes_dir.is_absolute());
            prop_assert!(r.volumes_dir.components().all(|c| !matches!(c, Component::ParentDir | Component::CurDir)));
            prop_assert!(r.capacity_max == 0 || r.capacity_min == 0 || r.capacity_max >= r.capacity_min);
            prop_assert!(r.capacity_max <= i64::MAX as u64 && r.capacity_min <= i64::MAX as u64);
            prop_assert!(!r.volume_name.is_empty() && !r.volume_name.contains('/'));
            prop_assert!(!r.volume_name.chars().any(char::is_control));
        }
    }

    #[test]
    fn delete_never_panics_and_accepts_only_sound_requests(e in env()) {
        if let Ok(r) = parse_delete(e) {
            prop_assert_eq!(r.volume_id.as_str().len(), 36);
            prop_assert!(r.volumes_dir.is_absolute());
        }
    }
}
