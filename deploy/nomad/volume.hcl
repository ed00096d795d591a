# A 20 GiB volume made by prjquota: `nomad volume create deploy/nomad/volume.hcl`.
type      = "host"
name      = "pg-data"
plugin_id = "prjquota"
node_pool = "default"

capacity_min = "10GiB"
capacity_max = "20GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

parameters {
  mode       = "0750"
  uid        = "1000"
  gid        = "1000"
  max_inodes = "1000000"
}
