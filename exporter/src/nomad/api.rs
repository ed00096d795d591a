//! The parts of Nomad's API answers the exporter reads and the requests it
//! sends, named as on the wire: Nomad encodes its `api` package's types
//! with Go's field names (`api/allocations.go`, `api/node_meta.go`,
//! `api/host_volumes.go`; the shapes of release v2.0.5, unchanged in what
//! is read here since v1.10.0, the first with dynamic host volumes).
//! Fields not read are not declared and are ignored, so a newer Nomad's
//! additions change nothing; a field read that is missing is an error
//! that names it, never a zero.
//!
//! The endpoints, and the ACL each needs (`deploy/nomad/prjquota-exporter.policy.hcl`):
//!
//! | endpoint | request | ACL |
//! | --- | --- | --- |
//! | [`Endpoint::ClientMetadata`] | `POST /v1/client/metadata` (the agent's own node) | `node { policy = "write" }` |
//! | [`Endpoint::Allocation`] | `GET /v1/allocation/<id>` | `read-job` in the allocation's namespace |
//! | [`Endpoint::Volumes`] | `GET /v1/volumes?type=host&namespace=*&node_id=<id>` | `host-volume-read` |
//! | [`Endpoint::Volume`] | `GET /v1/volume/host/<id>?namespace=<ns>` | `host-volume-read` in its namespace |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One of the API's endpoints the exporter calls: the `endpoint` label of
/// `prjquota_exporter_nomad_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    ClientMetadata,
    Allocation,
    Volumes,
    Volume,
}

impl Endpoint {
    pub const ALL: [Endpoint; 4] = [
        Endpoint::ClientMetadata,
        Endpoint::Allocation,
        Endpoint::Volumes,
        Endpoint::Volume,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ClientMetadata => "client_metadata",
            Endpoint::Allocation => "allocation",
            Endpoint::Volumes => "volumes",
            Endpoint::Volume => "volume",
        }
    }

    /// What a token needs for this endpoint, for a refusal's message.
    pub fn needs(self) -> &'static str {
        match self {
            Endpoint::ClientMetadata => "node { policy = \"write\" }",
            Endpoint::Allocation => "the read-job capability in the allocation's namespace",
            Endpoint::Volumes | Endpoint::Volume => "the host-volume-read capability",
        }
    }
}

/// `api.NodeMetaApplyRequest`: the keys to set (a `None` value removes
/// one) on the node of the agent asked (an empty `NodeID`).
#[derive(Debug, Serialize)]
pub struct NodeMetaApplyRequest<'a> {
    #[serde(rename = "NodeID")]
    pub node_id: &'a str,
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<&'a str, Option<String>>,
}

/// `api.NodeMetaResponse`: the node's metadata after the change.
#[derive(Debug, Deserialize)]
pub struct NodeMetaResponse {
    /// Static and dynamic merged.
    #[serde(rename = "Meta")]
    pub meta: BTreeMap<String, String>,
    /// Set through the API.
    #[serde(rename = "Dynamic", default)]
    pub dynamic: BTreeMap<String, Option<String>>,
}

/// `api.Allocation`, what the ephemeral disk limit reads of it.
#[derive(Debug, Deserialize)]
pub struct Allocation {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Namespace")]
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Nil on allocations of Nomad 0.8 and older (`Resources` then holds
    /// the disk), never since.
    #[serde(rename = "AllocatedResources")]
    pub allocated_resources: Option<AllocatedResources>,
    #[serde(rename = "Resources")]
    pub resources: Option<Resources>,
}

#[derive(Debug, Deserialize)]
pub struct AllocatedResources {
    #[serde(rename = "Shared")]
    pub shared: AllocatedSharedResources,
}

/// `api.AllocatedSharedResources`: `DiskMB` is the group's
/// `ephemeral_disk.size`, in MiB (Nomad's MB: `bytesPerMegabyte = 1024 *
/// 1024` in its storage fingerprint).
#[derive(Debug, Deserialize)]
pub struct AllocatedSharedResources {
    #[serde(rename = "DiskMB")]
    pub disk_mb: i64,
}

/// `api.Resources`, its disk only.
#[derive(Debug, Deserialize)]
pub struct Resources {
    #[serde(rename = "DiskMB")]
    pub disk_mb: Option<i64>,
}

impl Allocation {
    /// The bytes Nomad reserved for the allocation's ephemeral disk, or
    /// why there is no such figure.
    pub fn reserved_disk_bytes(&self) -> Result<u64, String> {
        let mb = match (&self.allocated_resources, &self.resources) {
            (Some(a), _) => a.shared.disk_mb,
            (None, Some(Resources { disk_mb: Some(mb) })) => *mb,
            _ => {
                return Err(format!(
                "allocation {} has neither AllocatedResources.Shared.DiskMB nor Resources.DiskMB",
                self.id
            ))
            }
        };
        u64::try_from(mb)
            .ok()
            .filter(|&mb| mb > 0)
            .and_then(|mb| mb.checked_mul(1 << 20))
            .ok_or_else(|| {
                format!(
                    "allocation {} reserves {mb} MiB of disk: no size to enforce",
                    self.id
                )
            })
    }
}

/// `api.HostVolumeStub`, one entry of `/v1/volumes?type=host`.
#[derive(Debug, Deserialize, Clone)]
pub struct HostVolumeStub {
    #[serde(rename = "Namespace")]
    pub namespace: String,
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
}

/// `api.HostVolume`, what `/v1/volume/host/<id>` answers for a volume
/// Nomad knows.
#[derive(Debug, Deserialize)]
pub struct HostVolume {
    #[serde(rename = "Namespace")]
    pub namespace: String,
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
}
