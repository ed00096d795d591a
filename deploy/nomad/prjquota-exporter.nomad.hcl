# prjquota-exporter on every Nomad client, as a system job: the SECOND
# choice. The package's systemd unit (docs/install.md) is sandboxed and
# starts before Nomad, so volumes are guarded before any allocation runs;
# this job has neither.
#
# The exporter reads project quotas (CAP_SYS_ADMIN) and loads eBPF programs
# (CAP_BPF, CAP_PERFMON), so it runs with the host's privileges through the
# raw_exec driver, which must be enabled on the clients:
#   plugin "raw_exec" { config { enabled = true } }
# Enabling it lets EVERY job allowed that driver run as root on those
# clients. Keep it to an operator namespace: give tenant namespaces
#   capabilities { disabled_task_drivers = ["raw_exec"] }
# and submit this job in a namespace only operators may submit to.
# The binary is the package's /usr/bin/prjquota-exporter. Prometheus finds
# the instances through the Nomad service "prjquota-exporter" (see
# deploy/prometheus/nomad-sd.yml).
job "prjquota-exporter" {
  type      = "system"
  node_pool = "all"

  # Only clients where Nomad fingerprinted the prjquota plugin: there are
  # volumes to watch only there.
  constraint {
    attribute = "${attr.plugins.host_volume.prjquota.version}"
    operator  = "is_set"
  }

  group "exporter" {
    network {
      port "metrics" {
        static = 14646
      }
    }

    service {
      name     = "prjquota-exporter"
      provider = "nomad"
      port     = "metrics"
      tags     = ["prometheus"]

      # /healthz needs no basic auth credentials. With TLS on
      # (--web.config.file below) add: protocol = "https", and
      # tls_skip_verify = true unless the agent trusts the exporter's CA.
      check {
        type     = "http"
        path     = "/healthz"
        interval = "15s"
        timeout  = "3s"
      }
    }

    task "exporter" {
      driver = "raw_exec"

      config {
        command = "/usr/bin/prjquota-exporter"
        args = [
          "--volumes-dir", "/opt/nomad/data/host_volumes",
          "--web.listen-address", ":${NOMAD_PORT_metrics}",
          "--ebpf", "auto",
          # TLS and basic auth (README "TLS and basic auth"), a file on the
          # client in exporter-toolkit's format:
          # "--web.config.file", "/etc/prjquota/web.yml",
        ]
      }
      # After rotating its certificate on the client:
      #   nomad alloc signal -s SIGHUP <alloc> exporter
      # reloads the file (a bad one is refused and the old one kept).

      # Measured: ~37 MiB at its peak (loading the eBPF programs parses the
      # kernel's BTF), under 20 MiB afterwards at 10,000 volumes. The eBPF
      # maps are charged to this cgroup too, and their per-CPU counters grow
      # with the CPU count (~15 MiB on 64 CPUs).
      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
