#!/usr/bin/env bash
# Benchmark baseline: the `custom-mkdir` example of Nomad's dynamic host
# volume plugin guide, as a new user would first write a plugin (a bash
# script that only makes and removes a directory). Kept as the guide has
# it, so the comparison is with what users start from; like the guide's,
# it reads the operation from DHV_OPERATION and relies on bash's default
# PATH (Nomad passes none).
set -eu

stderr() {
    1>&2 echo "$@"
}

get_path() {
    # delete runs `rm -rf`: make sure the path is something sensible.
    if [ -z "$DHV_VOLUMES_DIR" ]; then
        stderr "DHV_VOLUMES_DIR must not be empty"
        exit 1
    fi
    if [ -z "$DHV_VOLUME_ID" ]; then
        stderr "DHV_VOLUME_ID must not be empty"
        exit 1
    fi
    echo "$DHV_VOLUMES_DIR/$DHV_VOLUME_ID"
}

case "$DHV_OPERATION" in
"fingerprint")
    echo '{"version": "0.0.1"}'
    ;;
"create")
    path="$(get_path)"
    stderr "creating directory: $path"
    mkdir -p "$path"
    # 0 bytes: a plain directory is not any particular size.
    printf '{"path": "%s", "bytes": 0}' "$path"
    ;;
"delete")
    path="$(get_path)"
    stderr "deleting directory: $path"
    rm -rf "$path"
    ;;
*)
    echo "unknown operation: '$DHV_OPERATION'"
    exit 1
    ;;
esac
