# The parts of a Nomad client's configuration prjquota needs.
client {
  enabled = true

  # On XFS mounted with -o prjquota (or ext4 with project quota).
  host_volumes_dir = "/opt/nomad/data/host_volumes"

  # Holds the `prjquota` executable and, optionally, prjquota.toml.
  host_volume_plugin_dir = "/opt/nomad/data/host_volume_plugins"
}

# Only for the exporter's system job (deploy/nomad/prjquota-exporter.nomad.hcl),
# the second choice after the package's systemd unit. Every job allowed this
# driver runs as root on this client: see docs/install.md ("The Nomad job").
plugin "raw_exec" {
  config {
    enabled = true
  }
}
