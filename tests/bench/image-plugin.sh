#!/bin/bash
# Benchmark baseline: a loopback-image host volume plugin of the kind the
# Nomad plugin guide shows. create: write a zeroed image of the requested
# size, mkfs.ext4 it, loop-mount it at <volumes dir>/<volume ID>. delete:
# unmount and remove. Nomad gives no PATH, so every tool is named by path.
set -euo pipefail
op=${1:-}
dir="$DHV_VOLUMES_DIR/$DHV_VOLUME_ID"
img="$DHV_VOLUMES_DIR/$DHV_VOLUME_ID.img"
case "$op" in
fingerprint)
    echo '{"version":"0.0.1"}'
    ;;
create)
    bytes=${DHV_CAPACITY_MAX_BYTES:-0}
    [[ $bytes -gt 0 ]] || bytes=$DHV_CAPACITY_MIN_BYTES
    if ! /usr/bin/mountpoint -q "$dir"; then
        /usr/bin/mkdir -p "$dir"
        /usr/bin/dd if=/dev/zero of="$img" bs=1M count=$((bytes / 1048576)) status=none
        /usr/sbin/mkfs.ext4 -q -F "$img" >&2
        /usr/bin/mount -o loop "$img" "$dir" >&2
    fi
    printf '{"path":"%s","bytes":%s}\n' "$dir" "$bytes"
    ;;
delete)
    if /usr/bin/mountpoint -q "$dir"; then /usr/bin/umount "$dir"; fi
    /usr/bin/rm -rf "$dir" "$img"
    ;;
*)
    echo "{\"error\":\"unknown operation $op\"}"
    exit 1
    ;;
esac
