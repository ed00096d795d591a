//! What a create asks for once checked, and what it returns to Nomad.

use std::path::PathBuf;

use crate::contract::CreateRequest;
use crate::fs::VolumesFs;
use crate::registry::{self, Record, State};
use prjquota_core::record::Grown;
use prjquota_core::volume_params::VolumeParams;

/// What `create` returns to Nomad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub path: PathBuf,
    pub bytes: u64,
}

/// What a create asks for, once checked: the request, the parameters it
/// resolves to and the size that fits. Both a new volume and an update are
/// made from it.
#[derive(Debug)]
pub(crate) struct Desired<'a> {
    pub(crate) req: &'a CreateRequest,
    pub(crate) plugin_id: &'a str,
    /// The parameters in force (an operator's grown inode limit included).
    pub(crate) params: VolumeParams,
    /// The hard limit in force.
    pub(crate) bytes: u64,
    /// What Nomad is told: the spec's size, which is `bytes` unless the
    /// operator grew the volume beyond it (`grown`).
    pub(crate) nomad_bytes: u64,
    pub(crate) grown: Option<Grown>,
}

impl<'a> Desired<'a> {
    pub(crate) fn new(
        req: &'a CreateRequest,
        plugin_id: &'a str,
        params: VolumeParams,
        bytes: u64,
    ) -> Desired<'a> {
        Desired {
            req,
            plugin_id,
            params,
            bytes,
            nomad_bytes: bytes,
            grown: None,
        }
    }

    /// This request for a volume the operator grew beyond it: `bytes` and
    /// `params` in force, Nomad told `grown.nomad_bytes`.
    pub(crate) fn with_grown(mut self, grown: Option<Grown>) -> Desired<'a> {
        self.nomad_bytes = grown.as_ref().map_or(self.bytes, |g| g.nomad_bytes);
        self.grown = grown;
        self
    }

    /// The record of a new volume with `project_id`, in state Creating.
    pub(crate) fn record(&self, vfs: &VolumesFs, project_id: u32) -> Record {
        self.record_at(
            vfs.path.join(self.req.volume_id.as_str()),
            vfs.fstype.name(),
            project_id,
        )
    }

    pub(crate) fn record_at(&self, path: PathBuf, fstype: &str, project_id: u32) -> Record {
        let now = registry::now_unix();
        let req = self.req;
        Record {
            version: registry::RECORD_VERSION,
            state: State::Creating,
            volume_id: req.volume_id.clone(),
            volume_name: req.volume_name.clone(),
            namespace: req.namespace.clone(),
            node_pool: req.node_pool.clone(),
            node_id: req.node_id.clone(),
            plugin_id: self.plugin_id.to_string(),
            path,
            fstype: fstype.to_string(),
            project_id,
            capacity_min_bytes: req.capacity_min,
            capacity_max_bytes: req.capacity_max,
            provisioned_bytes: self.bytes,
            params: self.params.clone(),
            parameters: req.parameters.clone(),
            created_unix: now,
            updated_unix: now,
            grown: self.grown.clone(),
        }
    }

    /// Whether `rec` already says everything this request says.
    pub(crate) fn recorded_in(&self, rec: &Record) -> bool {
        let req = self.req;
        rec.volume_name == req.volume_name
            && rec.namespace == req.namespace
            && rec.node_pool == req.node_pool
            && rec.node_id == req.node_id
            && rec.plugin_id == self.plugin_id
            && rec.capacity_min_bytes == req.capacity_min
            && rec.capacity_max_bytes == req.capacity_max
            && rec.provisioned_bytes == self.bytes
            && rec.params == self.params
            && rec.parameters == req.parameters
            && rec.grown == self.grown
    }

    /// Writes this request into an existing volume's record, found at
    /// `path` on a filesystem of type `fstype`.
    pub(crate) fn apply_to(&self, rec: &mut Record, path: PathBuf, fstype: &str) {
        let req = self.req;
        rec.state = State::Ready;
        rec.volume_name = req.volume_name.clone();
        rec.namespace = req.namespace.clone();
        rec.node_pool = req.node_pool.clone();
        rec.node_id = req.node_id.clone();
        rec.plugin_id = self.plugin_id.to_string();
        rec.capacity_min_bytes = req.capacity_min;
        rec.capacity_max_bytes = req.capacity_max;
        rec.provisioned_bytes = self.bytes;
        rec.params = self.params.clone();
        rec.parameters = req.parameters.clone();
        rec.grown = self.grown.clone();
        rec.fstype = fstype.to_string();
        rec.path = path;
        rec.updated_unix = registry::now_unix();
    }

    /// Whether applying this request lowers a limit the volume's usage
    /// must then fit under (bytes, or inodes newly limited or lowered).
    pub(crate) fn shrinks(&self, rec: &Record) -> bool {
        self.bytes < rec.provisioned_bytes
            || match (self.params.max_inodes, rec.params.max_inodes) {
                (Some(new), Some(old)) => new < old,
                (Some(_), None) => true,
                _ => false,
            }
    }
}
