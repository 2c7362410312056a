#!/usr/bin/env bash
# Fuzz the snapshot readers (tools/pickle_read.c with pickle_text.c, core/json_read.c from
# libsympool.a, and the trace loader of tools/trace.c) and the whole replay of what they load
# (tools/replay.c on the host backend, fuzz_replay.c) with libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, for a bounded time, from seeds cut out of tests/data (seeds.py). A
# crash, a sanitizer report, a leak or an input slower than 10 s fails; the failing input is left
# in OUT/ (reproduce with OUT/fuzz_pickle FILE) and belongs, once fixed, in tests/fuzz/repro/
# (test_fuzz_repro.cc replays those in every build).
#   tests/fuzz/run.sh LIB_DIR [SECONDS_PER_TARGET]
# LIB_DIR is a build directory holding libsympool.a (the readers' few library calls: errors,
# the emitter). Needs clang with its libFuzzer runtime; without it, says so and skips.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib_dir=${1:-build}
secs=${2:-20}
out=$lib_dir/fuzz
mkdir -p "$out"
cc=${SP_FUZZ_CC:-clang}
probe='int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return (int)(d && n) * 0; }'
if ! command -v "$cc" >/dev/null ||
   ! echo "$probe" | "$cc" -x c - -fsanitize=fuzzer,address -o "$out/probe" 2>/dev/null; then
  echo "fuzz: SKIPPED: $cc with its libFuzzer runtime (-fsanitize=fuzzer) is missing;" \
       "scripts/deps.sh installs it"
  exit 0
fi
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE -I. -Iinclude
  -I"$lib_dir/include")
libs=("$lib_dir/libsympool.a" -lpthread -ldl -lm)
# A library built with CUDA needs cudart (and what else sympool-static.pc names) as well.
if [ -f "$lib_dir/sympool-static.pc" ]; then
  read -r -a libs <<<"$lib_dir/libsympool.a $(sed -n 's|^Libs: ${libdir}/libsympool.a||p' \
    "$lib_dir/sympool-static.pc")"
fi
# Each source compiled once (the readers are in all three fuzzers), as many at once as there are
# cores, then the three links: the three whole builds at once compiled the readers three times,
# a third of this stage's time on two cores.
objs=$out/obj
mkdir -p "$objs"
compile_list() { # one line per object: OBJECT SOURCE [DEFINE]
  local s
  for s in tests/fuzz/fuzz_one.c tools/pickle_read.c tools/pickle_text.c tools/trace.c \
           tests/fuzz/fuzz_replay.c tools/replay.c tools/cli_util.c tools/cli_json.c; do
    echo "$(basename "$s" .c).o $s"
  done
  echo "fuzz_main_pickle.o tests/fuzz/fuzz_main.c -DSP_FUZZ_JSON=0"
  echo "fuzz_main_json.o tests/fuzz/fuzz_main.c -DSP_FUZZ_JSON=1"
}
compile() { # OBJECT SOURCE [DEFINE]
  "$cc" "${flags[@]}" ${3:+"$3"} -c "$2" -o "$objs/$1"
}
rc=0
running=0
while read -r o s d; do
  compile "$o" "$s" "$d" &
  running=$((running + 1))
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || rc=1
    running=$((running - 1))
  fi
done < <(compile_list)
while [ "$running" -gt 0 ]; do
  wait -n || rc=1
  running=$((running - 1))
done
[ $rc = 0 ] || { echo "fuzz: a fuzzer failed to build"; exit 1; }
readers=("$objs/pickle_read.o" "$objs/pickle_text.o" "$objs/trace.o")
"$cc" "${flags[@]}" "$objs/fuzz_main_pickle.o" "$objs/fuzz_one.o" "${readers[@]}" "${libs[@]}" \
  -o "$out/fuzz_pickle" &
p1=$!
"$cc" "${flags[@]}" "$objs/fuzz_main_json.o" "$objs/fuzz_one.o" "${readers[@]}" "${libs[@]}" \
  -o "$out/fuzz_json" &
p2=$!
"$cc" "${flags[@]}" "$objs/fuzz_replay.o" "$objs/replay.o" "$objs/cli_util.o" "$objs/cli_json.o" \
  "${readers[@]}" "${libs[@]}" -o "$out/fuzz_replay" &
p3=$!
for p in $p1 $p2 $p3; do wait $p || rc=1; done
[ $rc = 0 ] || { echo "fuzz: a fuzzer failed to build"; exit 1; }
python3 tests/fuzz/seeds.py tests/data "$out/seeds_pickle" "$out/seeds_json" "$out/seeds_replay"
cp tests/fuzz/repro/*.pickle "$out/seeds_pickle/" 2>/dev/null || true
cp tests/fuzz/repro/*.json "$out/seeds_json/" 2>/dev/null || true
cp tests/fuzz/repro/*.pickle tests/fuzz/repro/*.json tests/data/*.json "$out/seeds_replay/" \
  2>/dev/null || true
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fuzz_one() { # target: runs it for $run_secs, output in $out/$t.log
  local t=$1
  mkdir -p "$out/corpus_$t"
  # The first directory collects new inputs; the seeds are read only. -timeout: one input
  # slower than that is a defect (a reader must refuse quickly, not loop).
  "$out/fuzz_$t" -max_total_time="$run_secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/$t-" "$out/corpus_$t" "$out/seeds_$t" \
    >"$out/$t.log" 2>&1
}
# Each fuzzer is one process: all at once (SP_FUZZ_JOBS: fewer), each run long enough to get
# ${secs} s of a core when there are more of them than cores (three on two cores: 30 s each, where
# one after two left a core idle for the third's 20 s).
targets=(pickle json replay)
par=${SP_FUZZ_JOBS:-${#targets[@]}}
cores=$(nproc)
run_secs=$secs
[ "$par" -le "$cores" ] || run_secs=$(((secs * par + cores - 1) / cores))
failed=()
for ((i = 0; i < ${#targets[@]}; i += par)); do
  pids=()
  for t in "${targets[@]:i:par}"; do
    echo "fuzz: $t, ${run_secs} s"
    fuzz_one "$t" &
    pids+=($!)
  done
  j=0
  for t in "${targets[@]:i:par}"; do
    wait "${pids[j]}" || failed+=("$t")
    j=$((j + 1))
  done
done
for t in "${targets[@]}"; do
  if [[ " ${failed[*]} " == *" $t "* ]]; then
    tail -60 "$out/$t.log"
    echo "fuzz: $t FAILED"
    continue
  fi
  echo -n "fuzz: $t: "
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$out/$t.log" | tr '\n' ' '
  echo
done
[ ${#failed[@]} = 0 ] || exit 1
echo "fuzz: ok"
