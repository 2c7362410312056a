#!/bin/sh
# bench/seg_churn_builds.sh: bench_seg_churn (segments made and released: what the process keeps)
# on two builds of the library, BEFORE and AFTER, in alternation (the order swaps every run), for
# 20,000, 100,000 and 200,000 rounds of 1 MiB (small pool) and 20,000 of 12 MiB (large pool).
# Every line is the bench's JSON with "build", "date" and "commit" (of this checkout) added.
#   bench/seg_churn_builds.sh BENCH_BINARY BEFORE_LIB AFTER_LIB [RUNS] > bench/results/x.jsonl
# e.g. build-r/bench/bench_seg_churn /work/rel-s26/libsympool.so.0.1.0 build-r/libsympool.so 3
set -eu
bench=$1
before=$2
after=$3
runs=${4:-3}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
tag() { sed "s/^{/{\"build\":\"$1\",\"date\":\"$date\",\"commit\":\"$commit\",/"; }
export SYMPOOL_DEVICE=host
run=0
while [ "$run" -lt "$runs" ]; do
  order="before after"
  [ $((run % 2)) -eq 1 ] && order="after before"
  for work in "20000 1048576" "100000 1048576" "200000 1048576" "20000 12582912"; do
    for b in $order; do
      lib=$before
      [ "$b" = after ] && lib=$after
      # shellcheck disable=SC2086 # work is "ROUNDS SIZE"
      "$bench" "$lib" $work | tag "$b"
    done
  done
  run=$((run + 1))
done
