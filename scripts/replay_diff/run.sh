#!/bin/bash
# Differential replay: random traces (gen_trace.py) replayed by two sympool CLIs, whose
# `replay --json` (less the timing) and `replay --snapshot` (norm_snapshot.py) must agree.
# usage: run.sh REF_CLI NEW_CLI FIRST_SEED LAST_SEED [MODE] [EVENTS]
# REF_CLI: e.g. a build of the same tree with -DCMAKE_C_FLAGS=-DSP_BSET_ONE_TREE (the free set's
# one tree always, the same heap use). Against a CLI from before s28-streams, traces with
# several streams may differ where nothing is wrong: the free set orders streams by handle, a
# host stream's handle was then a heap address, and another heap use ordered them otherwise.
# A CLI built with assertions (Debug) also checks the free set after every change
# (sp__bset_check). Prints one line per seed; exit 1 when any differed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
ref=$1 new=$2 first=$3 last=$4 mode=${5:-0} events=${6:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bad=0
for ((seed = first; seed <= last; seed++)); do
    n=$events
    [ "$n" = 0 ] && n=$(((seed * 7919 % 6) * 1000 + 500))
    python3 "$here/gen_trace.py" "$seed" "$n" "$work/t.json" "$mode"
    ok=1 k=0
    while IFS='|' read -r conf cap envv; do
        k=$((k + 1))
        args=(replay "$work/t.json")
        [ -n "$conf" ] && args+=(-c "$conf")
        [ -n "$cap" ] && args+=(--capacity="$cap")
        for side in ref new; do
            bin=$ref
            [ $side = new ] && bin=$new
            env $envv "$bin" "${args[@]}" --json -s "$work/$side.json" 2>"$work/$side.err" |
                sed 's/"ns_per_event":[0-9.]*,//' >"$work/$side.out"
            echo "rc=${PIPESTATUS[0]}" >>"$work/$side.out"
        done
        why=""
        if ! cmp -s "$work/ref.out" "$work/new.out"; then
            why="replay --json differs"
        elif ! python3 "$here/norm_snapshot.py" "$work/ref.json" "$work/new.json" \
            >"$work/norm.txt" 2>&1; then
            why="snapshot: $(head -n 2 "$work/norm.txt" | tr '\n' ' ')"
        fi
        if [ -n "$why" ]; then
            echo "seed $seed mode $mode conf [$conf] capacity [$cap] env [$envv]: $why"
            ok=0 bad=1
        fi
    done <<'CONFS'
||
max_split_size_mb:20||
garbage_collection_threshold:0.5,max_split_size_mb:40|400MiB|
|300MiB|
expandable_segments:True||
expandable_segments:True|300MiB|
roundup_power2_divisions:4,max_split_size_mb:64|350MiB|
||SYMPOOL_THREAD_CACHE=1MiB
max_split_size_mb:20|300MiB|SYMPOOL_THREAD_CACHE=256KiB
CONFS
    [ $ok = 1 ] && echo "seed $seed mode $mode: same"
done
exit $bad
