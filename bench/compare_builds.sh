#!/bin/sh
# bench/compare_builds.sh: two builds of sympool side by side in one run: bench_alloc_scale,
# bench_small_calls (2 ranks) and callgrind's instructions per cached 512 B pair, alternating
# BEFORE and AFTER run by run (the order swaps every run) so that the load of a shared machine hits
# both alike. Every output line is the bench's own JSON with "build" and "date" added; the last
# lines ("bench":"compare") are the medians over the runs of every numeric field, per build.
#   bench/compare_builds.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [RUNS] > bench/results/DATE-x.jsonl
# Needs python3 for the medians, valgrind for the instruction count (skipped without it), and
# mpirun for bench_small_calls (skipped without it, or with COMPARE_MPI=0: the allocator alone).
set -eu
before=$1
after=$2
runs=${3:-5}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.cg"' EXIT
tag() { sed "s/^{/{\"build\":\"$1\",\"date\":\"$date\",/"; }
instructions() { # instructions BUILD DIR THREADS CASE: callgrind's count per cached 512 B pair
  n=200000
  ir=$(SYMPOOL_DEVICE=host valgrind --tool=callgrind --toggle-collect=sp_malloc \
         --toggle-collect=sp_free --callgrind-out-file="$tmp.cg" \
         "$2/bench/bench_alloc" $n 512 "$3" 2>&1 >/dev/null |
       sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  # n timed pairs plus the warm-up pair, inside sp_malloc and sp_free only
  printf '{"bench":"instructions",%s"size":512,"pairs":%s,"ir_per_pair":%s}\n' "$4" \
    $((n + 1)) "$(awk -v t="$ir" -v n=$((n + 1)) 'BEGIN{printf "%.1f", t/n}')" | tag "$1"
}
one() { # one() BUILD DIR: one run of every bench of that build
  SYMPOOL_DEVICE=host "$2/bench/bench_alloc_scale" 3 1000000 500000 | tag "$1"
  if [ "${COMPARE_MPI:-1}" != 0 ] && command -v mpirun >/dev/null 2>&1; then
    SYMPOOL_DEVICE=host OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -np 2 "$2/bench/bench_small_calls" 2000 15 2>/dev/null | tag "$1"
  fi
  if command -v valgrind >/dev/null 2>&1; then
    instructions "$1" "$2" 1 ''
    # The same in the main thread of a single-threaded process, where the build's bench_alloc
    # has that case (threads 0; older ones run a thread instead and are not counted here).
    if SYMPOOL_DEVICE=host "$2/bench/bench_alloc" 1 512 0 2>/dev/null | grep -q '"threads":0'; then
      instructions "$1" "$2" 0 '"case":"single_threaded_process",'
    fi
    # And in the main thread while another thread waits (an mpirun rank's main thread).
    if SYMPOOL_DEVICE=host "$2/bench/bench_alloc" 1 512 m 2>/dev/null | grep -q '"main_of_multi'; then
      instructions "$1" "$2" m '"case":"main_thread_multi_threaded_process",'
    fi
    # And in a second thread after the main thread took the lock (the CAS path).
    if SYMPOOL_DEVICE=host "$2/bench/bench_alloc" 1 512 r 2>/dev/null | grep -q '"after_the_main'; then
      instructions "$1" "$2" r '"case":"second_thread_after_main",'
    fi
  fi
}
i=0
while [ "$i" -lt "$runs" ]; do
  if [ $((i % 2)) -eq 0 ]; then
    one before "$before"; one after "$after"
  else
    one after "$after"; one before "$before"
  fi
  i=$((i + 1))
done | tee "$tmp"
python3 - "$tmp" "$date" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
groups = {}
for r in rows:
    key = (r["build"], r["bench"], r.get("case", ""))
    groups.setdefault(key, []).append(r)
for (build, bench, case), rs in sorted(groups.items()):
    out = {"bench": "compare", "build": build, "date": sys.argv[2], "of": bench, "runs": len(rs)}
    if case:
        out["case"] = case
    for k, v in rs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = round(statistics.median(r[k] for r in rs), 3)
    print(json.dumps(out))
EOF
