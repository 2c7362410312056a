#!/bin/sh
# bench/vs_malloc_builds.sh: two builds of sympool in one session through bench_vs_malloc, the
# way bench/vs_baselines.sh measures one: callgrind's instructions per pair of sympool and
# sympool_tc (SYMPOOL_THREAD_CACHE=64KiB) on every single-threaded workload (deterministic: one
# run each per build), then RUNS processes of `bench_vs_malloc ROUNDS 1000000 256` per build,
# alternating BEFORE and AFTER run by run (the order swaps every run) so that the load of a shared
# machine hits both alike. Every line is the bench's JSON with "build", "date" and "commit" (of
# the checkout the script runs in) added; the last lines ("bench":"summary") are the medians over
# the runs of every numeric field, per build, workload and thread count.
#   bench/vs_malloc_builds.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [RUNS [ROUNDS]] > bench/results/x.jsonl
# Needs python3 for the medians; valgrind for the instruction counts (skipped without it).
set -eu
before=$1
after=$2
runs=${3:-3}
rounds=${4:-9}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
tmp=$(mktemp)
all=$(mktemp)
trap 'rm -f "$tmp" "$all"' EXIT
tag() { sed "s/^{/{\"build\":\"$1\",\"date\":\"$date\",\"commit\":\"$commit\",/"; }
export SYMPOOL_DEVICE=host
{
if command -v valgrind >/dev/null 2>&1; then
  for work in 512 65536 2097152 mix; do
    for a in sympool sympool_tc; do
      for b in before after; do
        dir=$before
        [ "$b" = after ] && dir=$after
        n=20000 warm=1
        [ "$work" = mix ] && n=50000 warm=65536 # the mix's warm-up pass runs timed_loop too
        ir=$(valgrind --tool=callgrind --toggle-collect=timed_loop --callgrind-out-file="$tmp" \
               "$dir/bench/bench_vs_malloc" one "$a" "$work" "$n" 256 2>&1 >/dev/null |
             sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
        printf '{"bench":"vs_malloc_instructions","allocator":"%s","workload":"%s","pairs":%s,"ir_per_pair":%s}\n' \
          "$a" "$work" $((n + warm)) \
          "$(awk -v t="$ir" -v n=$((n + warm)) 'BEGIN{printf "%.1f", t/n}')" | tag "$b"
      done
    done
  done
fi
i=0
while [ "$i" -lt "$runs" ]; do
  if [ $((i % 2)) -eq 0 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    dir=$before
    [ "$b" = after ] && dir=$after
    "$dir/bench/bench_vs_malloc" "$rounds" 1000000 256 | sed "s/^{/{\"run\":$((i + 1)),/" | tag "$b"
  done
  i=$((i + 1))
done
} | tee "$all"
python3 - "$all" <<'EOF'
import json, statistics, sys
groups = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("bench") != "vs_malloc":
        continue
    key = tuple((k, r[k]) for k in ("build", "date", "commit", "workload", "size", "threads")
                if k in r)
    groups.setdefault(key, []).append(r)
for key, rs in groups.items():
    out = {"bench": "summary", "of": "vs_malloc", **dict(key), "runs": len(rs)}
    for k, v in rs[0].items():
        if k not in out and k != "run" and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = round(statistics.median(r[k] for r in rs), 3)
    print(json.dumps(out, separators=(",", ":")))
EOF
