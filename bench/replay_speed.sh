#!/bin/sh
# bench/replay_speed.sh: `sympool replay` time per event with the host backend's address-space
# arena (SYMPOOL_HOST_ARENA=1, replay's default) next to the old way (one mmap/munmap per segment,
# SYMPOOL_HOST_ARENA=0), in the same run, alternating, as the median of --repeat. One JSON line
# per trace and configuration. Usage: bench/replay_speed.sh SYMPOOL_BINARY [REPEAT] TRACE...
set -eu
bin=$1
shift
repeat=15
case ${1:-} in [0-9]*) repeat=$1; shift ;; esac
for trace in "$@"; do
  for conf in "" "expandable_segments:True"; do
    for arena in 0 1; do
      out=$(SYMPOOL_HOST_ARENA=$arena "$bin" replay "$trace" --json --repeat "$repeat" \
            ${conf:+--conf "$conf"} 2>/dev/null)
      ns=$(printf '%s' "$out" | sed -n 's/.*"ns_per_event":\([0-9.]*\).*/\1/p')
      printf '{"bench":"replay_speed","trace":"%s","conf":"%s","arena":%s,"repeat":%s,"ns_per_event":%s}\n' \
        "$(basename "$trace")" "$conf" "$arena" "$repeat" "${ns:-null}"
    done
  done
done
