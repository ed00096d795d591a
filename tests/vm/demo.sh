#!/usr/bin/env bash
# The prjquota story, inside the VM that `cargo xtask demo` boots: a Nomad
# client's volumes directory on an XFS mounted with prjquota, the plugin run
# exactly as Nomad runs it, and the exporter watching.
set -euo pipefail

bin=${PRJQUOTA_BIN_DIR:?run through cargo xtask demo}
mnt=${PRJQUOTA_TEST_XFS:?run through cargo xtask demo}
plugins=$mnt/nomad/host_volume_plugins
volumes=$mnt/nomad/host_volumes
port=14646
vol_id=8c6b2f10-4f7e-4d5c-9a3b-2f1e0d9c8b7a
node_id=5d1f7a2e-9c3b-4e8d-a1f0-6b2c3d4e5f60

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

# Nomad's client runs the plugin with ONLY these variables, in this order,
# stdin /dev/null, argv [<plugin dir>/<plugin id>, op].
nomad() {
    local op=$1 max=${2:-0}
    local vars=(DHV_OPERATION="$op" DHV_VOLUMES_DIR="$volumes" DHV_PLUGIN_DIR="$plugins"
        DHV_NODE_POOL=default)
    if [[ $op == delete ]]; then
        vars+=(DHV_CREATED_PATH="$volumes/$vol_id")
    fi
    vars+=(DHV_NAMESPACE=default DHV_VOLUME_NAME=pg-data DHV_VOLUME_ID="$vol_id")
    if [[ $op == create ]]; then
        vars+=(DHV_CAPACITY_MIN_BYTES=0 DHV_CAPACITY_MAX_BYTES="$max")
    fi
    vars+=(DHV_NODE_ID="$node_id" DHV_PARAMETERS='{"mode":"0755"}')
    printf '$ env -i %s %s/prjquota %s\n' "${vars[*]}" "$plugins" "$op"
    local start end rc=0
    start=$(date +%s%N)
    env -i "${vars[@]}" "$plugins/prjquota" "$op" </dev/null || rc=$?
    end=$(date +%s%N)
    printf '\n(exit %s, %d ms under CPU emulation)\n' "$rc" $(((end - start) / 1000000))
    return "$rc"
}

scrape() {
    python3 - "$port" "$vol_id" "$@" <<'EOF'
import sys, urllib.request
port, vol = sys.argv[1], sys.argv[2]
names = sys.argv[3:]
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
for line in body.splitlines():
    if line.startswith("#") or vol not in line:
        continue
    if any(line.startswith(n + "{") for n in names):
        print("  " + line)
EOF
}

series=(nomad_host_volume_provisioned_bytes nomad_host_volume_capacity_bytes
    nomad_host_volume_used_bytes nomad_host_volume_available_bytes
    nomad_host_volume_inodes_used nomad_host_volume_quota_limit_hits_total
    nomad_host_volume_written_bytes_total nomad_host_volume_write_errors_total)

step "A Nomad client's filesystem: XFS on a loop device, mounted with prjquota"
mkdir -p "$plugins" "$volumes"
install -m 0755 "$bin/prjquota" "$plugins/prjquota"
run grep " $mnt " /proc/mounts
run df -h "$mnt"

step "Nomad fingerprints the plugin (1 second deadline, no I/O)"
nomad fingerprint

step "Is this node ready? prjquota check"
run "$plugins/prjquota" check --volumes-dir "$volumes" --plugin-dir "$plugins"

step "nomad volume create: a 64 MiB volume (capacity_max = \"64MiB\")"
nomad create $((64 << 20))
run ls -ld "$volumes/$vol_id"
run df -h "$volumes/$vol_id"

step "prjquota-exporter on :$port"
ip link set lo up 2>/dev/null || true
"$bin/prjquota-exporter" --volumes-dir "$volumes" --web.listen-address "127.0.0.1:$port" \
    --log.level warn &
exporter=$!
trap 'kill $exporter 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" \
        2>/dev/null && break
    sleep 0.2
done
echo "series for volume $vol_id before any write:"
scrape "${series[@]}"

step "A workload writes into the 64 MiB volume, 4 MiB at a time, until the kernel refuses"
(
    for i in $(seq 1 40); do
        if ! dd if=/dev/zero of="$volumes/$vol_id/data" bs=1M count=4 oflag=append conv=notrunc \
            status=none 2>/dev/null; then
            echo "  writer: refused by the kernel after $((i - 1)) chunks of 4 MiB"
            break
        fi
        sleep 1
    done
) &
writer=$!
echo "write rate from the eBPF counters while it fills:"
python3 - "$port" "$vol_id" "$writer" <<'PYEOF'
import os, sys, time, urllib.request
port, vol, writer = sys.argv[1], sys.argv[2], int(sys.argv[3])
def sample():
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith("nomad_host_volume_written_bytes_total{") and vol in line:
            return float(line.rsplit(" ", 1)[1])
    return None
prev, t0 = sample(), time.time()
if prev is None:
    print("  (no eBPF write counters on this kernel: see prjquota_exporter_ebpf_detached_reason)")
while True:
    time.sleep(1)
    alive = os.path.exists(f"/proc/{writer}")
    cur, t1 = sample(), time.time()
    if cur is not None and prev is not None:
        print(f"  written {cur / 2**20:6.1f} MiB   {(cur - prev) / (t1 - t0) / 2**20:5.1f} MiB/s")
    prev, t0 = cur, t1
    if not alive:
        break
PYEOF
wait "$writer" || true
run du -h "$volumes/$vol_id/data"
run df -h "$volumes/$vol_id"
run dd if=/dev/zero of="$volumes/$vol_id/data" bs=1M count=1 oflag=append conv=notrunc || true
sleep 1
echo "series after the fill (quota hits from the kernel's quota netlink, write errors from eBPF):"
scrape "${series[@]}"

step "nomad volume create with capacity_max = \"128MiB\": grown in place, data kept"
nomad create $((128 << 20))
run df -h "$volumes/$vol_id"
run dd if=/dev/zero of="$volumes/$vol_id/more" bs=1M count=32
run ls -l "$volumes/$vol_id"
scrape nomad_host_volume_capacity_bytes nomad_host_volume_used_bytes

step "prjquota list"
run "$plugins/prjquota" list --volumes-dir "$volumes"

step "nomad volume delete"
nomad delete
run ls -a "$volumes"
echo "series for the volume after the delete (none expected):"
scrape "${series[@]}"
echo "(none)"

step "Done: created in milliseconds, nothing pre-allocated, enforced by the kernel, grown in place."
