#!/bin/bash
# mn-signal.sh: mn-run.sh stopped by SIGTERM while its job runs (as ctest or a user stops it)
# must end at once and remove what it made: its namespaces, /etc/netns/<ns>/ and its temporary
# directory, with the job's processes killed. The job sleeps far longer than this test's ctest
# timeout, so a script that only cleans up once the job has ended fails by that timeout.
#
#   mn-signal.sh MN_RUN_SCRIPT
#
# Exit status: 0 with "mn-signal: ok", 1 with "mn-signal: FAIL ...", 77 when mn-run.sh skips
# (not root, no namespaces).
set -u
MN_RUN=$1
PREFIX=spmn
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

fail() {
    echo "mn-signal: FAIL $*"
    exit 1
}

# The job's ranks in node namespace $1: the pids of its sleeps.
ranks_in() {
    local p
    for p in $(ip netns pids "$1" 2>/dev/null); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^/bin/sleep 3600" && echo "$p"
    done
}

MN_TIMEOUT=3600 "$MN_RUN" 2 1 -- /bin/sleep 3600 >"$OUT" 2>&1 &
pid=$!
run="$PREFIX-$pid"
# Until a rank runs in each node (or mn-run.sh has ended: a skip, an error).
ranks=""
while kill -0 "$pid" 2>/dev/null; do
    r0=$(ranks_in "$run-n0")
    r1=$(ranks_in "$run-n1")
    if [ -n "$r0" ] && [ -n "$r1" ]; then
        ranks="$r0 $r1"
        break
    fi
    sleep 0.2
done
if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    rc=$?
    if [ "$rc" = 77 ]; then
        cat "$OUT"
        exit 77
    fi
    cat "$OUT"
    fail "mn-run.sh ended (status $rc) before its job ran"
fi
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "mn-run.sh exited with $rc after SIGTERM, want 143"
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$run-")
[ -z "$left" ] || fail "namespaces left: $left"
[ ! -e "/tmp/$run" ] || fail "/tmp/$run left"
# SIGKILL is delivered asynchronously and the killed ranks are reaped by init: give them a few
# seconds to be gone.
for p in $ranks; do
    for _ in $(seq 50); do
        [ -e "/proc/$p" ] || break
        sleep 0.2
    done
    [ -e "/proc/$p" ] && fail "rank process $p still runs ($(tr '\0' ' ' <"/proc/$p/cmdline"))"
done
for d in /etc/netns/"$run"-*; do
    [ -e "$d" ] && fail "$d left"
done
echo "mn-signal: ok"
