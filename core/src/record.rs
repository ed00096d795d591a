//! The registry record: one JSON file per volume that the plugin writes and
//! the exporter reads (`<volumes dir>/.prjquota/volumes/<volume ID>.json`).
//! Its format and its one reader live here so that the two binaries cannot
//! disagree on what a record is; the plugin's `registry` owns writing,
//! locking and the rest of the directory.
//!
//! **Compatibility.** Every record ever written must still parse; a test
//! reads each committed fixture (`core/tests/fixtures/record-v*.json`). A
//! new field is optional (`#[serde(default)]`, left out when empty), so
//! that records written before it parse, and keeps [`RECORD_VERSION`]:
//! readers ignore fields they do not know, so an older exporter still reads
//! a newer record. A change an older reader would misread (a field that
//! changes meaning or goes away) raises the version, and the new reader
//! parses every older one. Writers: the plugin's `registry` (create,
//! update, delete, `grow`, `reconcile --fix`). Readers: this module's
//! [`read_record`] and [`parse_record_bytes`], for the plugin, the
//! exporter's registry collector and the tests.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::volume_id::VolumeId;
use crate::volume_params::{Parameters, VolumeParams};

/// The registry's directory below a volumes directory.
pub const DIR_NAME: &str = ".prjquota";
/// The records' directory below [`DIR_NAME`].
pub const VOLUMES: &str = "volumes";
pub const RECORD_VERSION: u32 = 1;

/// Where a volume is in its life. A record is written before anything else
/// of a volume exists and removed after everything else is gone, so a crash
/// at any point leaves a record that says what the next call must finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The project ID is reserved; directory, limits or tag may be missing.
    Creating,
    /// Fully created and returned to Nomad.
    Ready,
    /// Delete has started; the directory may be partly removed.
    Deleting,
}

/// One volume as the plugin made it. Carries every label the exporter needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub state: State,
    pub volume_id: VolumeId,
    pub volume_name: String,
    pub namespace: String,
    pub node_pool: String,
    pub node_id: String,
    /// The plugin's file name in Nomad's plugin dir (Nomad's `plugin_id`).
    pub plugin_id: String,
    pub path: PathBuf,
    pub fstype: String,
    pub project_id: u32,
    pub capacity_min_bytes: u64,
    pub capacity_max_bytes: u64,
    /// The hard limit in force, as returned to Nomad.
    pub provisioned_bytes: u64,
    pub params: VolumeParams,
    /// The parameters exactly as the volume spec gave them.
    pub parameters: Parameters,
    pub created_unix: u64,
    pub updated_unix: u64,
    /// Set while the operator's `prjquota grow` holds the volume's limits
    /// above what Nomad's spec asks for; `provisioned_bytes` and
    /// `params.max_inodes` are then the grown limits in force, never
    /// lowered by Nomad's restore of the older spec. Cleared once a spec
    /// asks for at least as much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown: Option<Grown>,
}

/// What Nomad believes of a volume grown by the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grown {
    /// The capacity Nomad was told (the `bytes` a create returned), within
    /// its spec's `[capacity_min, capacity_max]`.
    pub nomad_bytes: u64,
    /// The inode limit the spec's parameters give (`None`: no limit).
    pub nomad_max_inodes: Option<u64>,
    /// When the operator last grew it.
    pub grown_unix: u64,
}

/// `<volumes dir>/.prjquota/volumes`: where the records live. The one place
/// that spells the path; the plugin, the exporter and the tests all use it.
pub fn records_dir(volumes_dir: &Path) -> PathBuf {
    volumes_dir.join(DIR_NAME).join(VOLUMES)
}

/// Records are a few hundred bytes; a larger file is not a record.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// The file name of volume `id`'s record in the records directory.
pub fn record_file_name(id: &VolumeId) -> String {
    format!("{id}.json")
}

/// The temp file a record of volume `id` is written to before it is
/// renamed over [`record_file_name`]: hidden, so no reader takes it for a
/// record.
pub fn temp_file_name(id: &VolumeId) -> String {
    format!(".{id}.json.tmp")
}

/// The volume ID a file of the records directory is the record of: `<ID>.json`,
/// not a temp file of a record being written (`.<ID>.json…`).
pub fn record_stem(name: &std::ffi::OsStr) -> Option<&str> {
    name.to_str()
        .and_then(|n| n.strip_suffix(".json"))
        .filter(|stem| !stem.starts_with('.'))
}

/// Whether a file of the records directory is a leftover temp file of an
/// interrupted record write ([`temp_file_name`]).
pub fn is_temp_file(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".json.tmp")
}

/// Reads one record file's content, at most [`MAX_RECORD_BYTES`] of it, and
/// checks it with [`parse_record_bytes`]. The plugin and the exporter open
/// the file each their own way (the exporter refuses FIFOs and caches per
/// file); what is a record is decided here only.
pub fn read_record(file: impl Read, expected_id: &str) -> Result<Record> {
    // Room for a whole record up front: from an empty Vec, read_to_end
    // probes with 32 bytes and doubles, seven reads for a 600-byte record.
    let mut body = Vec::with_capacity(4096);
    file.take(MAX_RECORD_BYTES + 1).read_to_end(&mut body)?;
    if body.len() as u64 > MAX_RECORD_BYTES {
        anyhow::bail!("larger than {MAX_RECORD_BYTES} bytes: not a record");
    }
    parse_record_bytes(&body, expected_id)
}

/// Parses and checks one record file's content: valid JSON of the supported
/// version whose `volume_id` matches the file name (`<id>.json`). The
/// exporter, which caches records per file, uses this directly: it is the
/// only record reader.
pub fn parse_record_bytes(body: &[u8], expected_id: &str) -> Result<Record> {
    let rec: Record = serde_json::from_slice(body).context("invalid JSON record")?;
    if rec.volume_id.as_str() != expected_id {
        anyhow::bail!(
            "the record's volume_id {} does not match its file name",
            rec.volume_id
        );
    }
    if rec.version != RECORD_VERSION {
        anyhow::bail!(
            "record version {} is not supported (this prjquota reads version {RECORD_VERSION})",
            rec.version
        );
    }
    Ok(rec)
}

#[cfg(test)]
mod record_stem_tests {
    use super::{is_temp_file, record_file_name, record_stem, temp_file_name};
    use crate::volume_id::VolumeId;
    use std::ffi::OsStr;

    #[test]
    fn records_are_id_dot_json_and_temp_files_are_not() {
        assert_eq!(record_stem(OsStr::new("a.json")), Some("a"));
        assert_eq!(record_stem(OsStr::new(".a.json")), None);
        assert_eq!(record_stem(OsStr::new("a.json.tmp")), None);
        assert_eq!(record_stem(OsStr::new("a")), None);
    }

    /// What the writer names is what the readers take, and nothing else.
    #[test]
    fn the_writers_names_are_the_readers_rule() {
        const ID: &str = "0b6f3c1e-5d2a-4f8b-9c7d-1e2f3a4b5c6d";
        let id = VolumeId::parse(ID).unwrap();
        let (rec, tmp) = (record_file_name(&id), temp_file_name(&id));
        assert_eq!(record_stem(OsStr::new(&rec)), Some(ID));
        assert_eq!(record_stem(OsStr::new(&tmp)), None);
        assert!(is_temp_file(&tmp));
        assert!(!is_temp_file(&rec));
        assert!(
            !is_temp_file(&format!("{ID}.json.tmp")),
            "not hidden: not ours"
        );
    }
}

#[cfg(test)]
mod compatibility_tests {
    use super::*;

    /// A record as the plugin wrote it before `grown` existed (0.x, record
    /// version 1): committed once, never edited.
    const V1: &str = include_str!("../tests/fixtures/record-v1.json");
    const V1_ID: &str = "0b6f3c1e-5d2a-4f8b-9c7d-1e2f3a4b5c6d";
    /// The same volume as the plugin writes it once an operator grew it
    /// (`prjquota grow`: version 1 with the optional `grown`).
    const V1_GROWN: &str = include_str!("../tests/fixtures/record-v1-grown.json");

    #[test]
    fn every_committed_record_version_parses() {
        let rec = parse_record_bytes(V1.as_bytes(), V1_ID).unwrap();
        assert_eq!(rec.provisioned_bytes, 20 << 30);
        assert_eq!(rec.params.max_inodes, Some(100_000));
        assert_eq!(rec.grown, None);
        let grown = parse_record_bytes(V1_GROWN.as_bytes(), V1_ID).unwrap();
        assert_eq!(grown.provisioned_bytes, 40 << 30);
        assert_eq!(grown.grown.map(|g| g.nomad_bytes), Some(20 << 30));
    }

    /// Every fixture in the directory parses, not only those named above:
    /// a shape committed there is one a reader must keep reading.
    #[test]
    fn every_fixture_in_the_directory_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !(name.starts_with("record-v") && name.ends_with(".json")) {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let id: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let id = id["volume_id"].as_str().unwrap().to_string();
            parse_record_bytes(&bytes, &id).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            seen += 1;
        }
        assert!(seen >= 2, "the fixtures of {} are gone", dir.display());
    }

    /// A record that was never grown is written as before (no `grown`
    /// key), and a grown one reads back whole.
    #[test]
    fn grown_is_written_only_when_set_and_reads_back() {
        let mut rec = parse_record_bytes(V1.as_bytes(), V1_ID).unwrap();
        let text = serde_json::to_string(&rec).unwrap();
        assert!(!text.contains("grown"), "{text}");
        rec.grown = Some(Grown {
            nomad_bytes: 20 << 30,
            nomad_max_inodes: Some(100_000),
            grown_unix: 1_767_300_000,
        });
        rec.provisioned_bytes = 40 << 30;
        let text = serde_json::to_vec(&rec).unwrap();
        assert_eq!(parse_record_bytes(&text, V1_ID).unwrap(), rec);
    }
}
