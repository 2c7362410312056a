#!/bin/sh
# bench/replay_instructions.sh: where a whole `sympool replay TRACE --json` process spends its
# instructions, by callgrind (a count, not a time: the load of a shared machine does not move
# it, so two builds compare without alternating). One JSON line per binary and trace: the
# process's instructions, those beyond the start-up trace's (a trace of a few entries: process
# start, library loading, options), per trace entry, and per entry for each phase beyond what
# it costs on the start-up trace, from the inclusive counts of the CLI's functions (Release
# builds keep their names):
#   parse     pk_parse_records (the pickle reader with the trace-entry hook)
#   analysis  from_doc (events, seeds, starting state and PyTorch's timeline, from the records)
#   load_rest tr_load_opts less those two (mapping the file, the entries' array)
#   start     replay_once less replay_device (rebuilding the starting state through the
#             allocator, the address-slot plan, reading the stats)
#   loop      replay_device (the timed event loop; also per event)
#   rest      what is beyond start-up and in none of those (the heap's preparation, exit)
# and, across the phases, str_ops: libc's memset/memcpy/memmove beyond start-up. Callgrind counts
# their `rep stosb`/`rep movsb` (glibc's choice from a few KB up) one step per byte: those counts
# are bytes, not instructions (a 1 MB memset reads as 1,000,016 "instructions"; the CPU clears
# tens of bytes a cycle), and tell how much of a figure is not work of the kind it counts.
# Usage: bench/replay_instructions.sh STARTUP_TRACE "BIN [BIN2 ...]" TRACE...
set -eu
startup=$1
bins=$2
shift 2
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.txt"' EXIT
run() { # run BIN TRACE: callgrind's profile of one replay into $tmp.txt, its total printed
  valgrind --tool=callgrind --callgrind-out-file="$tmp" "$1" replay "$2" --json >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --threshold=100 "$tmp" 2>/dev/null >"$tmp.txt"
  sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' "$tmp.txt" | tr -d ,
}
strops() { # libc's memset/memcpy/memmove in $tmp.txt (leaves: inclusive = their own)
  awk '/libc\.so/ && /:__(memset|memcpy|memmove|mempcpy)/ {gsub(",", "", $1); s += $1}
       END {printf "%d\n", s}' "$tmp.txt"
}
fn() { # fn NAME: the inclusive count of function NAME in $tmp.txt (0 when absent)
  awk -v f="$1" '{for (i = 2; i <= NF; i++) if ($i ~ (":" f "$")) {gsub(",", "", $1); print $1; exit}}
                 END {}' "$tmp.txt" | sed -n '1p' | grep . || echo 0
}
phases() { # the five phases' and str_ops' counts of the last run, less the start-up trace's
  echo "$(($(fn pk_parse_records) - ${s_parse:-0})) $(($(fn from_doc) - ${s_an:-0}))" \
    "$(($(fn tr_load_opts) - ${s_load:-0})) $(($(fn replay_once) - ${s_once:-0}))" \
    "$(($(fn replay_device) - ${s_loop:-0})) $(($(strops) - ${s_str:-0}))"
}
for bin in $bins; do
  s_parse=0 s_an=0 s_load=0 s_once=0 s_loop=0 s_str=0
  st=$(run "$bin" "$startup")
  # shellcheck disable=SC2046 # six numbers
  set -- $(phases) "$@"
  s_parse=$1 s_an=$2 s_load=$3 s_once=$4 s_loop=$5 s_str=$6
  shift 6
  printf '{"bench":"replay_instructions","binary":"%s","trace":"%s","ir":%s}\n' "$bin" \
    "$(basename "$startup")" "$st"
  for trace in "$@"; do
    ir=$(run "$bin" "$trace")
    # shellcheck disable=SC2046 # six numbers
    set -- $(phases) "$@"
    parse=$1 analysis=$2 load=$3 once=$4 loop=$5 str=$6
    shift 6
    out=$("$bin" replay "$trace" --json 2>/dev/null)
    entries=$(printf '%s' "$out" | sed -n 's/.*"trace_entries":\([0-9]*\).*/\1/p')
    events=$(printf '%s' "$out" | sed -n 's/.*"events":\([0-9]*\).*/\1/p')
    awk -v b="$bin" -v t="$(basename "$trace")" -v ir="$ir" -v st="$st" -v n="${entries:-0}" \
      -v ev="${events:-0}" -v parse="$parse" -v an="$analysis" -v load="$load" -v once="$once" \
      -v loop="$loop" -v str="$str" 'BEGIN {
        beyond = ir - st; m = n > 0 ? n : 1
        rest = beyond - load - once
        printf "{\"bench\":\"replay_instructions\",\"binary\":\"%s\",\"trace\":\"%s\",", b, t
        printf "\"entries\":%d,\"events\":%d,\"ir\":%d,\"ir_beyond_startup\":%d,", n, ev, ir, beyond
        printf "\"per_entry\":{\"beyond_startup\":%.0f,\"parse\":%.0f,\"analysis\":%.0f,", \
          beyond / m, parse / m, an / m
        printf "\"load_rest\":%.0f,\"start\":%.0f,\"loop\":%.0f,\"rest\":%.0f,", \
          (load - parse - an) / m, (once - loop) / m, loop / m, rest / m
        printf "\"str_ops\":%.0f},", str / m
        printf "\"loop_per_event\":%.0f}\n", (ev > 0 ? loop / ev : 0) }'
  done
done
