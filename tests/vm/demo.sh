#!/usr/bin/env bash
# The demo `cargo xtask demo` runs inside the VM (see tests/vm/guest-init.sh
# for what the guest has: $PRJQUOTA_TEST_XFS is an XFS mounted with prjquota,
# $PRJQUOTA_BIN_DIR holds the workspace binaries).
set -euo pipefail

step() { printf '\n---- %s\n' "$*"; }

mnt=${PRJQUOTA_TEST_XFS:?run me through cargo xtask demo}
vol=$mnt/demo-volume
id=4242

step "An XFS mounted with project quotas"
grep " $mnt " /proc/mounts
xfs_quota -x -c 'state -p' "$mnt"

step "Create a volume directory, tag it with project $id and a 64 MiB hard limit"
mkdir -p "$vol"
xfs_io -c "chproj -R $id" -c 'chattr +P' "$vol"
xfs_quota -x -c "limit -p bhard=64m $id" "$mnt"
xfs_io -c 'lsproj' -c 'lsattr' "$vol"

step "df on the volume shows the limit, not the filesystem"
df -h "$vol"

step "Write 100 MiB into the volume: the kernel refuses past 64 MiB"
if dd if=/dev/zero of="$vol/fill" bs=1M count=100 status=none; then
    echo "UNEXPECTED: dd wrote 100 MiB past a 64 MiB limit" >&2
    exit 1
else
    echo "dd was refused, as it should be"
fi
ls -l "$vol/fill"

step "Usage as the kernel counts it"
xfs_quota -x -c "report -p -h" "$mnt"
df -h "$vol"
