#!/usr/bin/env bash
# Runs inside the VM that `cargo xtask vm|test|demo` boots with vng, as root,
# on Debian's own kernel. Prepares the test filesystems, then runs the command.
#
#   guest-init.sh FS CWD CMD
#     FS   xfs | ext4 | all      which quota filesystems to mount
#     CWD  directory to run CMD in (the host's working directory)
#     CMD  a bash command line, run with `bash -c`
#
# Exports for CMD:
#   PRJQUOTA_IN_VM=1
#   PRJQUOTA_TEST_XFS          XFS (1 GiB sparse) mounted with prjquota
#   PRJQUOTA_TEST_EXT4         ext4 -O quota,project (512 MiB) mounted with prjquota (FS=ext4|all)
#   PRJQUOTA_TEST_XFS_NOQUOTA  XFS (320 MiB) mounted WITHOUT project quotas (always)
# Guest /tmp is a tmpfs-backed overlay; the rest of the host's root is read-only.
# The images sit on a scratch disk mounted at /tmp/prjquota-vm.
#
# xtask reads the `prjquota-vm:` lines: keep their wording.
set -euo pipefail

fs=${1:?usage: guest-init.sh FS CWD CMD}
cwd=${2:?usage: guest-init.sh FS CWD CMD}
cmd=${3:?usage: guest-init.sh FS CWD CMD}

export PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH"
echo "prjquota-vm: guest up, kernel $(uname -r), root $(awk '$2 == "/" { t = $3 } END { print t }' /proc/mounts)"

fail() {
    echo "prjquota-vm: SETUP FAILED: $*" >&2
    exit 97
}
trap 'fail "line $LINENO: $BASH_COMMAND (exit $?)"' ERR

case $fs in
    xfs | ext4 | all) ;;
    *) fail "unknown FS '$fs' (want xfs, ext4 or all)" ;;
esac

base=/tmp/prjquota-vm
mkdir -p "$base"
# The images live on the scratch disk xtask attaches (label in xtask/src/vm.rs),
# not in /tmp, which is the guest's memory: a full suite filled that.
scratch=$(blkid -L prjquota-scratch) || fail "no disk labelled prjquota-scratch (xtask attaches one to every VM)"
mount -o noatime "$scratch" "$base" || fail "mount $scratch $base"

modprobe loop
modprobe xfs

# make_fs NAME SIZE MOUNT_OPTS MKFS...: sparse image on the scratch disk, mkfs, mount.
make_fs() {
    local name=$1 size=$2 opts=$3
    shift 3
    local img="$base/$name.img" mnt="$base/$name"
    truncate -s "$size" "$img"
    "$@" "$img" >/dev/null || fail "$* $img"
    mkdir -p "$mnt"
    mount -o "loop${opts:+,$opts}" "$img" "$mnt" || fail "mount -o loop${opts:+,$opts} $img $mnt"
}

# has_opt MOUNTPOINT OPT: the mount's options in /proc/mounts include OPT.
has_opt() {
    awk -v m="$1" -v o="$2" '$2 == m { n = split($4, a, ","); for (i = 1; i <= n; i++) if (a[i] == o) f = 1 } END { exit !f }' /proc/mounts
}

if [[ $fs == xfs || $fs == all ]]; then
    make_fs xfs 1G prjquota mkfs.xfs -q -f
    has_opt "$base/xfs" prjquota || fail "$base/xfs is not mounted with prjquota"
    export PRJQUOTA_TEST_XFS=$base/xfs
fi

if [[ $fs == ext4 || $fs == all ]]; then
    modprobe ext4
    modprobe quota_v2
    # One inode per 8 KiB (mke2fs gives 16): the pass's tests share this
    # filesystem, and one of them alone makes 20,000 files.
    make_fs ext4 512M prjquota mkfs.ext4 -q -F -O quota,project -I 256 -i 8192
    has_opt "$base/ext4" prjquota || fail "$base/ext4 is not mounted with prjquota"
    export PRJQUOTA_TEST_EXT4=$base/ext4
fi

make_fs xfs-noquota 320M "" mkfs.xfs -q -f
export PRJQUOTA_TEST_XFS_NOQUOTA=$base/xfs-noquota

# eBPF tests need tracefs and bpffs.
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
# bpffs for root only, as systemd mounts it: the guard refuses a pin root
# under a directory others may write (the kernel's default mode is 1777).
mountpoint -q /sys/fs/bpf || mount -t bpf -o mode=0700,nosuid,nodev,noexec bpf /sys/fs/bpf
chmod go-w /sys/fs/bpf

export PRJQUOTA_IN_VM=1
echo "prjquota-vm: ready: XFS=${PRJQUOTA_TEST_XFS:--} EXT4=${PRJQUOTA_TEST_EXT4:--} XFS_NOQUOTA=$PRJQUOTA_TEST_XFS_NOQUOTA"

trap - ERR
set +e
cd "$cwd" || fail "cannot cd to $cwd"
bash -c "$cmd"
rc=$?
# What the run left in memory and on the scratch disk: the first thing to
# read when a run ends in ENOSPC or the OOM killer.
echo "prjquota-vm: at exit: $(df -h --output=target,used,size /tmp "$base" | tail -n +2 | tr -s ' ' | paste -sd ';'); $(free -m | awk '/^Mem:/ { print "memory used " $3 " of " $2 " MiB" }')"
echo "prjquota-vm: command exited with status $rc"
exit "$rc"
