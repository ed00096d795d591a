# The Nomad ACL policy of prjquota-exporter's Nomad client: what it uses,
# and nothing else (docs/nomad.md#acl-policy). Leave out the rule of what
# you do not turn on. Installed as
# /usr/share/prjquota/nomad/prjquota-exporter.policy.hcl:
#
#   nomad acl policy apply -description "prjquota-exporter" prjquota-exporter \
#     /usr/share/prjquota/nomad/prjquota-exporter.policy.hcl
#   nomad acl token create -name "prjquota-exporter $(hostname)" \
#     -policy prjquota-exporter -type client
#
# and the token's secret ID, root's, mode 600, in the file
# --nomad.token-file names.

# --nomad.enforce-ephemeral-disk: each allocation's ephemeral_disk.size,
# GET /v1/allocation/<id> (read-job in the allocation's namespace).
# prjquota reconcile --nomad: the host volumes Nomad knows,
# GET /v1/volumes?type=host and GET /v1/volume/host/<id> (host-volume-read).
namespace "*" {
  capabilities = ["read-job", "host-volume-read"]
}

# --nomad.publish-unprovisioned: the node's metadata
# unique.prjquota.unprovisioned_bytes, POST /v1/client/metadata on the
# local agent. Nomad has no narrower rule for node metadata: node write
# also lets a token drain nodes and change their eligibility.
node {
  policy = "write"
}
