#!/bin/sh
# bench/replay_loop_builds.sh: the event loop of `sympool replay` (replay_device: every event's
# sp_malloc/sp_free and what they call) of two builds side by side, per trace:
#   - time: RUNS runs of `BIN replay TRACE --repeat REPEAT --json` per binary (the loop's median
#     time per event over the repeats, as replay reports it), BEFORE and AFTER alternating run by
#     run (the order swaps every run) so that the load of a shared machine hits both alike; one
#     "replay_loop_time" line per run, and a "replay_loop_median" line per trace with the medians
#     over the runs and their ratio;
#   - instructions: callgrind's count inside replay_device (--toggle-collect), per event, one
#     "replay_loop_instructions" line per binary (a count: the machine's load does not move it).
# The replay's figures other than its time are compared too ("same": the two --json outputs equal
# with ns_per_event taken out; both with the trace's own settings).
# Usage: bench/replay_loop_builds.sh BEFORE_BIN AFTER_BIN RUNS REPEAT TRACE... > results.jsonl
# REPLAY_ARGS (environment, optional): more arguments for every replay, e.g.
# REPLAY_ARGS="--conf expandable_segments:True"; each line's "args" says which. REPLAY_CONF=X
# (no spaces) is the same as REPLAY_ARGS="--conf X" added.
# Needs valgrind for the instruction counts (skipped without it).
set -eu
before=$1
after=$2
runs=$3
repeat=$4
shift 4
args="${REPLAY_ARGS:-}${REPLAY_CONF:+ --conf $REPLAY_CONF}"
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
ns() { # ns BIN TRACE: the replay's ns_per_event
  # shellcheck disable=SC2086 # REPLAY_ARGS is a list of words
  "$1" replay "$2" --repeat "$repeat" --json $args 2>/dev/null |
    sed -n 's/.*"ns_per_event":\([0-9.]*\).*/\1/p'
}
# shellcheck disable=SC2086
figures() { "$1" replay "$2" --json $args 2>&1 | sed 's/"ns_per_event":[0-9.e+-]*,//'; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {
  if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for trace in "$@"; do
  t=$(basename "$trace")
  # shellcheck disable=SC2086
  events=$("$after" replay "$trace" --json $args 2>/dev/null | sed -n 's/.*"events":\([0-9]*\).*/\1/p')
  same=false
  [ "$(figures "$before" "$trace")" = "$(figures "$after" "$trace")" ] && same=true
  vb="" va=""
  i=0
  while [ "$i" -lt "$runs" ]; do
    order="before after"
    [ $((i % 2)) = 1 ] && order="after before"
    for which in $order; do
      bin=$before
      [ "$which" = after ] && bin=$after
      v=$(ns "$bin" "$trace")
      printf '{"bench":"replay_loop_time","date":"%s","trace":"%s","args":"%s","build":"%s","run":%d,"repeat":%s,"ns_per_event":%s}\n' \
        "$date" "$t" "$args" "$which" "$i" "$repeat" "${v:-null}"
      if [ "$which" = before ]; then vb="$vb $v"; else va="$va $v"; fi
    done
    i=$((i + 1))
  done
  mb=$(echo "$vb" | median)
  ma=$(echo "$va" | median)
  printf '{"bench":"replay_loop_median","date":"%s","trace":"%s","args":"%s","events":%s,"runs":%s,"repeat":%s,"before_ns":%s,"after_ns":%s,"ratio":%s,"same_figures":%s}\n' \
    "$date" "$t" "$args" "${events:-null}" "$runs" "$repeat" "$mb" "$ma" \
    "$(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", a / b}')" "$same"
  if command -v valgrind >/dev/null 2>&1; then
    for which in before after; do
      bin=$before
      [ "$which" = after ] && bin=$after
      # shellcheck disable=SC2086
      ir=$(valgrind --tool=callgrind --toggle-collect=replay_device --callgrind-out-file="$tmp" \
             "$bin" replay "$trace" --json $args 2>&1 >/dev/null |
           sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
      printf '{"bench":"replay_loop_instructions","date":"%s","trace":"%s","args":"%s","build":"%s","events":%s,"ir":%s,"ir_per_event":%s}\n' \
        "$date" "$t" "$args" "$which" "${events:-0}" "${ir:-0}" \
        "$(awk -v i="${ir:-0}" -v e="${events:-1}" 'BEGIN {printf "%.1f", i / e}')"
    done
  fi
done
