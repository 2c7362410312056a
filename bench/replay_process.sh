#!/bin/sh
# bench/replay_process.sh: what a whole `sympool replay TRACE` process costs per trace entry beyond
# its start-up, for one or two binaries (e.g. a baseline and a candidate) measured alternately in
# the same run. CPU time (perf stat task-clock; wall time where perf is missing), median of REPEAT.
# Start-up is the same binary on STARTUP_TRACE (a trace of a few entries). One JSON line per trace
# and binary. Usage: bench/replay_process.sh REPEAT STARTUP_TRACE "BIN [BIN2]" TRACE...
set -eu
repeat=$1
startup=$2
bins=$3
shift 3
cpu_ms() { # BIN TRACE: one run's CPU milliseconds
  if command -v perf >/dev/null 2>&1; then
    perf stat -x, -e task-clock "$1" replay "$2" --json 2>&1 >/dev/null | sed -n 's/^\([0-9.]*\),.*task-clock.*/\1/p'
  else
    s=$(date +%s%N); "$1" replay "$2" --json >/dev/null 2>&1; e=$(date +%s%N)
    echo "$(( (e - s) / 1000 ))" | awk '{print $1 / 1000}'
  fi
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# Per-binary files and start-up figures go by the binary's place in BINS, not its name: a
# baseline and a candidate are often both called `sympool`.
for trace in "$startup" "$@"; do
  k=0
  for bin in $bins; do k=$((k + 1)); : > "/tmp/sp_rp_$$_$k"; done
  i=0
  while [ "$i" -lt "$repeat" ]; do
    k=0
    for bin in $bins; do k=$((k + 1)); cpu_ms "$bin" "$trace" >> "/tmp/sp_rp_$$_$k"; done
    i=$((i + 1))
  done
  k=0
  for bin in $bins; do
    k=$((k + 1))
    f="/tmp/sp_rp_$$_$k"
    ms=$(median < "$f")
    rm -f "$f"
    entries=$("$bin" replay "$trace" --json 2>/dev/null | sed -n 's/.*"trace_entries":\([0-9]*\).*/\1/p')
    if [ "$trace" = "$startup" ]; then
      eval "start_$k=$ms"
      printf '{"bench":"replay_process","binary":"%s","trace":"%s","startup_ms":%s}\n' "$bin" "$(basename "$trace")" "$ms"
    else
      st=$(eval "echo \$start_$k")
      printf '{"bench":"replay_process","binary":"%s","trace":"%s","entries":%s,"ms":%s,"ns_per_entry_beyond_startup":%s}\n' \
        "$bin" "$(basename "$trace")" "${entries:-0}" "$ms" \
        "$(awk -v m="$ms" -v s="$st" -v n="${entries:-1}" 'BEGIN {printf "%.0f", (m - s) * 1e6 / n}')"
    fi
  done
done
