#!/bin/bash
# frag_ratios.sh BASE_BIN CAND_BIN [NAME=VALUE...] -- TRACE...
#
# Peak reserved / peak allocated of `sympool replay TRACE --json --conf expandable_segments:True`
# for every trace, two `sympool` binaries side by side (the NAME=VALUE items are set in the
# candidate's environment only, e.g. SYMPOOL_EXPANDABLE_SIDE=0), then one summary line: traces
# over 1.01 (and newly over), worst, mean, better / worse (by more than 5e-7). Replay is
# deterministic: one run per binary and trace. Two replays at a time.
set -u
if [ $# -lt 4 ]; then
    sed -n '2,9p' "$0"
    exit 2
fi
BASE=$(realpath "$1")
CAND=$(realpath "$2")
shift 2
CENV=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    CENV+=("$1")
    shift
done
shift
ratio() { # BIN TRACE [NAME=VALUE...]
    local bin=$1 f=$2
    shift 2
    env "$@" "$bin" replay "$f" --json --conf expandable_segments:True 2>/dev/null |
        python3 -c 'import json, sys
j = json.loads(sys.stdin.readline())
print("%.6f" % (j["peak_reserved_bytes"] / j["peak_allocated_bytes"]))' 2>/dev/null || echo nan
}
export -f ratio
export BASE CAND
export CENV_STR="${CENV[*]:-}"
n=0
for f in "$@"; do
    n=$((n + 1))
    printf '%s\t%s\n' "$n" "$f"
done | xargs -P 2 -L 1 -d '\n' bash -c '
    IFS=$(printf "\t") read -r n f <<< "$0"
    b=$(ratio "$BASE" "$f")
    c=$(ratio "$CAND" "$f" $CENV_STR)
    echo "$n $b $c $(basename "$f")"' |
    sort -n | python3 -c '
import sys
rows = [l.split(None, 3) for l in sys.stdin if l.strip()]
# A trace that allocates nothing (an empty snapshot) has no ratio: listed, left out of the sums.
for n, b, c, name in [r for r in rows if "nan" in (r[1], r[2])]:
    print("%-3s %s %s   %s (no ratio: nothing allocated, or the replay failed)" % (n, b, c, name.strip()))
rows = [r for r in rows if "nan" not in (r[1], r[2])]
over_b = over_c = newly = better = worse = 0
worst_b = worst_c = sum_b = sum_c = 0.0
for n, b, c, name in rows:
    b, c = float(b), float(c)
    mark = "" if abs(b - c) <= 5e-7 else ("+" if c > b else "-")
    print("%-3s %.5f %.5f %1s %s" % (n, b, c, mark, name.strip()))
    over_b += b > 1.01
    over_c += c > 1.01
    newly += c > 1.01 >= b
    better += c < b - 5e-7
    worse += c > b + 5e-7
    worst_b, worst_c = max(worst_b, b), max(worst_c, c)
    sum_b += b
    sum_c += c
k = max(len(rows), 1)
print("%d traces: over 1.01 %d -> %d (newly %d), worst %.5f -> %.5f, mean %.5f -> %.5f, "
      "better %d, worse %d" % (len(rows), over_b, over_c, newly, worst_b, worst_c,
                               sum_b / k, sum_c / k, better, worse))'
