# The parts of a Nomad client's configuration prjquota needs.
client {
  enabled = true

  # On XFS mounted with -o prjquota (or ext4 with project quota).
  host_volumes_dir = "/opt/nomad/data/host_volumes"

  # Holds the `prjquota` executable and, optionally, prjquota.toml.
  host_volume_plugin_dir = "/opt/nomad/data/host_volume_plugins"
}
