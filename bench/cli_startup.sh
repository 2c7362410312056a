#!/bin/sh
# bench/cli_startup.sh REPEAT "BIN [BIN2]" [TRACE]: what a CLI process costs to start (--version,
# info, and replay of a trace of a few entries), and what each shared library the first binary
# needs adds to an empty program's start. CPU milliseconds (perf stat task-clock; wall time where
# perf is missing), median of REPEAT, the binaries (and the empty programs) alternated run by
# run. One JSON line per figure.
set -eu
repeat=$1
bins=$2
trace=${3:-$(dirname "$0")/../tests/data/trace-small-p4.pickle}
cpu_ms() { # COMMAND...: one run's CPU milliseconds
  if command -v perf >/dev/null 2>&1; then
    perf stat -x, -e task-clock "$@" 2>&1 >/dev/null | sed -n 's/^\([0-9.]*\),.*task-clock.*/\1/p'
  else
    s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N)
    echo "$(( (e - s) / 1000 ))" | awk '{print $1 / 1000}'
  fi
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Files go by the binary's place in BINS: a baseline and a candidate are often both `sympool`.
for what in version info replay; do
  i=0
  while [ "$i" -lt "$repeat" ]; do
    k=0
    for bin in $bins; do
      k=$((k + 1))
      case $what in
        version) cpu_ms "$bin" --version ;;
        info) cpu_ms "$bin" info ;;
        replay) cpu_ms "$bin" replay "$trace" --json ;;
      esac >> "$tmp/$what.$k"
    done
    i=$((i + 1))
  done
  k=0
  for bin in $bins; do
    k=$((k + 1))
    printf '{"bench":"cli_startup","binary":"%s","command":"%s","cpu_ms":%s,"repeat":%s}\n' \
      "$bin" "$what" "$(median < "$tmp/$what.$k")" "$repeat"
  done
done

# The empty programs: one linked with nothing, one per library the first binary needs (less
# libc, libm and the loader, which every program has).
echo 'int main(void) { return 0; }' > "$tmp/empty.c"
cc "$tmp/empty.c" -o "$tmp/none"
progs="none"
for lib in $(ldd "${bins%% *}" | awk '$3 ~ /^\// {print $3}'); do
  name=$(basename "$lib")
  case $name in libc.so* | libm.so* | ld-linux*) continue ;; esac
  cc "$tmp/empty.c" -o "$tmp/$name" -Wl,--no-as-needed "$lib" -Wl,-rpath,"$(dirname "$lib")"
  progs="$progs $name"
done
i=0
while [ "$i" -lt "$repeat" ]; do
  for p in $progs; do cpu_ms "$tmp/$p" >> "$tmp/p_$p"; done
  i=$((i + 1))
done
base=$(median < "$tmp/p_none")
for p in $progs; do
  m=$(median < "$tmp/p_$p")
  printf '{"bench":"cli_startup","empty_program_linked_with":"%s","cpu_ms":%s,"over_none_ms":%s,"repeat":%s}\n' \
    "$p" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.2f", a - b}')" "$repeat"
done
