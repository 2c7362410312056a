#!/bin/bash
# mn-run.sh: run one Open MPI job over N emulated nodes on this machine.
#
#   mn-run.sh NODES RANKS_PER_NODE [mpirun options ...] -- PROGRAM [ARGS ...]
#
# RANKS_PER_NODE is one number for every node, or a comma-separated count per node ("3,1",
# "1,2,1") for uneven nodes, as a hostfile with different slots per host gives on a cluster.
#
# Each node is a network namespace plus its own UTS (hostname) namespace, so a rank's
# gethostname() and Open MPI's idea of "the node" (one orted per node) both differ from node to
# node, and MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) splits the job by node as on a cluster.
# The nodes hang off a bridge that lives in a switch namespace made here; a head namespace runs
# mpirun. Addresses come from one private /24 that exists only inside these namespaces: nothing
# is configured in the root namespace, and no route leads anywhere else. Open MPI starts its
# daemons through an rsh agent (written next to the hostfile) that enters the node's namespaces;
# ranks talk over TCP between nodes and shared memory within a node (btl tcp,self,vader).
# Ranks yield when idle: every "node" shares this machine's cores, and Open MPI does not know
# it (each node's slots are not oversubscribed), so ranks polling their TCP and shared-memory
# queues at full speed would starve the rank they wait for.
#
# Everything made here carries the prefix "spmn-<pid of this script>-": namespaces, host names,
# /etc/netns/<ns>/ (the per-namespace hosts file `ip netns exec` mounts) and the temporary
# directory. It is removed on exit, on INT and TERM, and leftovers of a run whose script is gone
# (killed with SIGKILL, e.g. by a ctest timeout) are removed by the next run.
#
# Exit status: the job's (mpirun's), 124 when MN_TIMEOUT (seconds, default 120) ran out, and 77
# (ctest SKIP_RETURN_CODE) with "mn-run: SKIP: <reason>" when this machine cannot make the nodes
# (not root, no `ip`/`unshare`, no network namespaces, veth or bridge devices).
# MN_MPIRUN overrides the launcher (default: mpirun from PATH). MN_VERBOSE=1 traces the set-up.
# MN_PRIVATE_SHM=1 gives every node a /dev/shm of its own (a tmpfs in a mount namespace of the
# node's daemon), as separate machines have: Open MPI names its shared-memory segments after the
# rank's host name, so ranks that give several nodes one host name (tests/multinode/
# mn-same-name.sh) need it. Off by default: the CUDA/NCCL doubles join nodes through /dev/shm.
set -u

PREFIX=spmn
SUBNET=10.251.7 # /24; head .1, node i .(10+i); only inside this script's namespaces
SKIP=77

skip() {
    echo "mn-run: SKIP: $*"
    exit "$SKIP"
}
die() {
    echo "mn-run: error: $*" >&2
    exit 2
}
say() {
    if [ "${MN_VERBOSE:-0}" = 1 ]; then echo "mn-run: $*" >&2; fi
}

if [ $# -lt 4 ]; then
    sed -n '2,4p' "$0" >&2
    exit 2
fi
NODES=$1
PPN=$2
shift 2
case "$NODES" in "" | *[!0-9]*) die "NODES must be a number" ;; esac
[ "$NODES" -ge 1 ] && [ "$NODES" -le 64 ] || die "need 1..64 nodes"
# SLOTS[i]: the ranks of node i.
IFS=, read -r -a SLOTS <<<"$PPN"
if [ "${#SLOTS[@]}" = 1 ]; then
    for ((i = 1; i < NODES; i++)); do SLOTS+=("${SLOTS[0]}"); done
fi
[ "${#SLOTS[@]}" = "$NODES" ] || die "RANKS_PER_NODE '$PPN' names ${#SLOTS[@]} nodes, not $NODES"
NP=0
for n in "${SLOTS[@]}"; do
    case "$n" in "" | *[!0-9]*) die "RANKS_PER_NODE must be numbers" ;; esac
    [ "$n" -ge 1 ] || die "every node needs >= 1 rank"
    NP=$((NP + 10#$n))
done
MPIRUN_OPTS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    MPIRUN_OPTS+=("$1")
    shift
done
[ $# -ge 2 ] || die "no program after --"
shift

# ---- can this machine make nodes? -------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root (network and UTS namespaces); run as root, as CI does"
for tool in ip unshare hostname timeout; do
    command -v "$tool" >/dev/null 2>&1 || skip "'$tool' not found (packages iproute2, util-linux)"
done
MPIRUN=${MN_MPIRUN:-mpirun}
command -v "$MPIRUN" >/dev/null 2>&1 || skip "'$MPIRUN' not found"
"$MPIRUN" --version 2>/dev/null | grep -q "Open MPI" || skip "'$MPIRUN' is not Open MPI's"

RUN="$PREFIX-$$"
TMP="/tmp/$RUN"
NSS=() # every namespace this run made, removed in reverse order

ns_kill_and_delete() { # $1 = namespace; kills what runs inside (ours), then deletes it
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null)
    if [ -n "$pids" ]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null
        sleep 0.2
    fi
    ip netns delete "$1" 2>/dev/null
    rm -rf "/etc/netns/$1"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local i
    for ((i = ${#NSS[@]} - 1; i >= 0; i--)); do ns_kill_and_delete "${NSS[$i]}"; done
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Leftovers of earlier runs whose script is no longer alive (a pid reused by another program
# does not count as alive: its command line must still name this script).
alive() {
    [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "mn-run"
}
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-[0-9][0-9]*-"); do
    pid=${ns#"$PREFIX"-}
    pid=${pid%%-*}
    if ! alive "$pid"; then
        say "removing leftover namespace $ns"
        ns_kill_and_delete "$ns"
    fi
done
for d in /tmp/"$PREFIX"-* /etc/netns/"$PREFIX"-*; do
    [ -e "$d" ] || continue
    pid=${d##*/"$PREFIX"-}
    pid=${pid%%-*}
    case "$pid" in *[!0-9]* | "") continue ;; esac
    alive "$pid" || rm -rf "$d"
done

# ---- the nodes -----------------------------------------------------------------------------------
mkns() {
    ip netns add "$1" 2>/dev/null || skip "cannot create network namespace $1 (no CAP_SYS_ADMIN?)"
    NSS+=("$1")
    ip -n "$1" link set lo up || die "cannot bring loopback up in $1"
}
SW="$RUN-sw"
HEAD="$RUN-head"
node_name() { echo "$RUN-n$1"; }

mkdir -p "$TMP" || die "cannot create $TMP"
mkns "$SW"
ip -n "$SW" link add br0 type bridge 2>/dev/null || skip "cannot create a bridge device"
ip -n "$SW" link set br0 up
HOSTS="127.0.0.1 localhost"$'\n'"$SUBNET.1 $HEAD"
attach() { # $1 = namespace, $2 = host part of its address
    local port="p$2"
    ip -n "$SW" link add "$port" type veth peer name eth0 netns "$1" 2>/dev/null ||
        skip "cannot create veth pairs"
    ip -n "$SW" link set "$port" master br0 up
    ip -n "$1" addr add "$SUBNET.$2/24" dev eth0
    ip -n "$1" link set eth0 up
}
mkns "$HEAD"
attach "$HEAD" 1
for ((i = 0; i < NODES; i++)); do
    n=$(node_name "$i")
    mkns "$n"
    attach "$n" $((10 + i))
    HOSTS+=$'\n'"$SUBNET.$((10 + i)) $n"
    echo "$n slots=${SLOTS[$i]}" >>"$TMP/hostfile"
done
# Names resolve from a hosts file inside every namespace (ip netns exec mounts /etc/netns/<ns>/
# over /etc), and the resolver is pointed at loopback, so no lookup leaves the namespace.
for ns in "$HEAD" $(for ((i = 0; i < NODES; i++)); do node_name "$i"; done); do
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "$HOSTS" >"/etc/netns/$ns/hosts"
    printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
done
say "nodes: $(tr '\n' ' ' <"$TMP/hostfile")"

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...` (like ssh); it runs the daemon's
# command line in HOST's network namespace, in a new UTS namespace named HOST.
cat >"$TMP/agent" <<'EOF'
#!/bin/sh
host=$1
shift
case "$host" in
spmn-[0-9]*-n[0-9]*) ;;
*) echo "mn-run agent: refusing unknown host '$host'" >&2; exit 255 ;;
esac
if [ "${MN_PRIVATE_SHM:-0}" = 1 ]; then
    exec ip netns exec "$host" unshare --uts --mount --propagation private sh -c \
        'mount -t tmpfs -o mode=1777 spmn-shm /dev/shm && hostname "$1" && exec sh -c "$2"' \
        sh "$host" "$*"
fi
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' sh "$host" "$*"
EOF
chmod 755 "$TMP/agent"

# ---- the job ---------------------------------------------------------------------------------------
say "mpirun -np $NP over $NODES nodes"
# The head's mpirun runs no rank: only hosts in the hostfile are used, and the head is not one.
# The job runs in the background and the script waits for it: bash runs a trap only once the
# foreground command has ended, so INT and TERM would wait for the whole job, whereas `wait`
# returns at once to the trap, whose cleanup kills what runs in the namespaces.
timeout -k 5 "${MN_TIMEOUT:-120}" ip netns exec "$HEAD" unshare --uts sh -c \
    'hostname "$1" && shift && exec "$@"' sh "$HEAD" \
    "$MPIRUN" -np "$NP" --hostfile "$TMP/hostfile" --oversubscribe \
    --mca plm_rsh_agent "$TMP/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca orte_tmpdir_base "$TMP" \
    --mca btl tcp,self,vader --mca mpi_yield_when_idle 1 \
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24" \
    "${MPIRUN_OPTS[@]}" "$@" <&0 &
wait $!
rc=$?
[ "$rc" = 124 ] && echo "mn-run: the job ran past MN_TIMEOUT=${MN_TIMEOUT:-120} s" >&2
exit "$rc"
