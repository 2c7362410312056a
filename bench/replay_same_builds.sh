#!/bin/sh
# bench/replay_same_builds.sh: do two CLIs replay alike? For every trace, `replay T --json` and
# `replay T --json --conf expandable_segments:True` of BEFORE and AFTER: stdout, stderr and the
# exit status compared byte for byte, the time (ns_per_event, which differs run to run) taken
# out. One "replay_same" line per trace and configuration, then a "replay_same_total" line.
# Usage: bench/replay_same_builds.sh BEFORE_BIN AFTER_BIN TRACE... > results.jsonl
set -eu
before=$1
after=$2
shift 2
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out() { # out BIN TRACE ARGS...: what the run said, its status last, the time out
  bin=$1
  trace=$2
  shift 2
  rc=0
  "$bin" replay "$trace" --json "$@" >"$tmp/o" 2>"$tmp/e" || rc=$?
  sed 's/"ns_per_event":[0-9.e+-]*,//' "$tmp/o" "$tmp/e"
  echo "status $rc"
}
n=0
same=0
for trace in "$@"; do
  for conf in default expandable_segments:True; do
    set --
    [ "$conf" = default ] || set -- --conf "$conf"
    out "$before" "$trace" "$@" >"$tmp/b"
    out "$after" "$trace" "$@" >"$tmp/a"
    s=false
    cmp -s "$tmp/b" "$tmp/a" && s=true
    n=$((n + 1))
    [ "$s" = true ] && same=$((same + 1))
    printf '{"bench":"replay_same","date":"%s","trace":"%s","conf":"%s","same":%s}\n' \
      "$date" "$(basename "$trace")" "$conf" "$s"
  done
done
printf '{"bench":"replay_same_total","date":"%s","runs":%d,"same":%d}\n' "$date" "$n" "$same"
