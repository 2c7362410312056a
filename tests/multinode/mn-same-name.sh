#!/bin/sh
# mn-same-name.sh NAME PROGRAM [ARGS ...]: run PROGRAM with the host name NAME.<this node's host
# name>, in a UTS namespace of its own, so that every node's short host name (up to the first
# dot) is NAME, as on clusters whose hosts share a short name (gpu01.rack1, gpu01.rack2) or
# containers that share a host name, while MPI still sees distinct nodes. For mn-run.sh, with
# MN_PRIVATE_SHM=1 (Open MPI names its shared-memory segments after the host name). Root only,
# as mn-run.sh is.
[ $# -ge 2 ] || { echo "usage: mn-same-name.sh NAME PROGRAM [ARGS ...]" >&2; exit 2; }
name=$1
shift
exec unshare --uts sh -c 'hostname "$1.$(hostname)" && shift && exec "$@"' sh "$name" "$@"
