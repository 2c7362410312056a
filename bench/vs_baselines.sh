#!/bin/sh
# bench/vs_baselines.sh: sympool against the baselines an outside check compares it with, in one
# session: bench_vs_malloc (glibc, mimalloc, jemalloc; RUNS processes of ROUNDS interleaved
# rounds each), callgrind's instructions per pair of every allocator on every single-threaded
# workload (deterministic: one run each), and bench_vs_mpi at 2 and 4 ranks (RUNS runs each).
# Every line is the bench's JSON with "date" and "commit" added.
#   bench/vs_baselines.sh BUILD_DIR [RUNS [ROUNDS]] > bench/results/DATE-x.jsonl
# mimalloc and jemalloc are optional (Debian: apt-get install libmimalloc2.0 libjemalloc2);
# valgrind and mpirun too (their parts are skipped without them).
set -eu
build=$1
runs=${2:-3}
rounds=${3:-9}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
tmp=$(mktemp)
all=$(mktemp)
trap 'rm -f "$tmp" "$all"' EXIT
tag() { sed "s/^{/{\"date\":\"$date\",\"commit\":\"$commit\",/"; }
export SYMPOOL_DEVICE=host
{
i=0
while [ "$i" -lt "$runs" ]; do
  "$build/bench/bench_vs_malloc" "$rounds" 1000000 256 | sed "s/^{/{\"run\":$((i + 1)),/" | tag
  i=$((i + 1))
done
if command -v valgrind >/dev/null 2>&1; then
  for work in 512 65536 2097152 mix; do
    for a in sympool sympool_tc glibc mimalloc jemalloc; do
      n=20000 warm=1
      [ "$work" = mix ] && n=50000 warm=65536 # the mix's warm-up pass runs timed_loop too
      ir=$(valgrind --tool=callgrind --toggle-collect=timed_loop --callgrind-out-file="$tmp" \
             "$build/bench/bench_vs_malloc" one "$a" "$work" "$n" 256 2>&1 >/dev/null |
           sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
      [ -n "$ir" ] || continue # the allocator did not load
      printf '{"bench":"vs_malloc_instructions","allocator":"%s","workload":"%s","pairs":%s,"ir_per_pair":%s}\n' \
        "$a" "$work" $((n + warm)) "$(awk -v t="$ir" -v n=$((n + warm)) 'BEGIN{printf "%.1f", t/n}')" | tag
    done
  done
fi
if command -v mpirun >/dev/null 2>&1 && [ -x "$build/bench/bench_vs_mpi" ]; then
  for np in 2 4; do
    i=0
    while [ "$i" -lt "$runs" ]; do
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun -np "$np" --oversubscribe "$build/bench/bench_vs_mpi" 15 2>/dev/null |
        sed "s/^{/{\"run\":$((i + 1)),/" | tag
      i=$((i + 1))
    done
  done
fi
} | tee "$all"
# The medians over the runs of every numeric field, per workload (vs_malloc) and per op, ranks
# and size (vs_mpi): "bench":"summary".
python3 - "$all" <<'EOF'
import json, statistics, sys
groups = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("bench") not in ("vs_malloc", "vs_mpi") or "skipped" in r:
        continue
    key = tuple((k, r[k]) for k in ("date", "commit", "bench", "workload", "size", "live",
                                     "threads", "op", "ranks", "bytes") if k in r)
    groups.setdefault(key, []).append(r)
for key, rs in groups.items():
    out = dict(key)
    out["of"] = out.pop("bench")
    out = {"bench": "summary", **out, "runs": len(rs)}
    for k, v in rs[0].items():
        if k not in out and k != "run" and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = round(statistics.median(r[k] for r in rs), 3)
    print(json.dumps(out, separators=(",", ":")))
EOF
