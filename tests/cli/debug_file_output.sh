#!/bin/sh
# debug_file_output.sh SYMPOOL TRACE WORKDIR: SYMPOOL_DEBUG_FILE naming the file an output option
# writes (replay --snapshot, plot -o) is refused before anything is read or written, compared as
# the log and the writer name their files: both patterns expanded (%h, %p), and a file neither
# has created yet; with %r while the rank is not known, any rank's file. The log lines were appended to the finished snapshot (after its STOP, or
# after a JSON document's end), and a chart written over the log. And the lines the replay's
# log filter passes go to SYMPOOL_DEBUG_FILE, as the library's own do (they went to stderr).
set -u
bin=$1 trace=$2 w=$3
rm -rf "$w" && mkdir -p "$w/sub" || exit 1
fail=0
SYMPOOL_DEVICE=host SYMPOOL_DEBUG=INFO
export SYMPOOL_DEVICE SYMPOOL_DEBUG
host=$(hostname)
check() { # WHAT DEBUG_FILE RC EXPECTED_RE CMD...
    what=$1 log=$2 want=$3 want_re=$4
    shift 4
    SYMPOOL_DEBUG_FILE=$log "$@" >"$w/out" 2>"$w/err"
    rc=$?
    if [ $rc -ne "$want" ] || { [ -n "$want_re" ] && ! grep -q -- "$want_re" "$w/err"; }; then
        echo "FAIL $what: rc=$rc (want $want): $(cat "$w/out" "$w/err")"
        fail=1
    fi
}
re="names .*, the file .* writes: its log lines would be appended to it; log elsewhere"
check "replay, a new file, same name" "$w/s1.json" 2 "^sympool replay: SYMPOOL_DEBUG_FILE=$w/s1.json $re" \
    "$bin" replay "$trace" --snapshot "$w/s1.json"
[ -e "$w/s1.json" ] && { echo "FAIL replay wrote $w/s1.json"; fail=1; }
check "replay, %h in both" "$w/s2-%h.pickle" 2 "names $w/s2-$host.pickle, the file --snapshot writes" \
    "$bin" replay "$trace" --snapshot "$w/s2-%h.pickle"
check "replay, %p in both" "$w/s3-%p.pickle" 2 "the file --snapshot writes" \
    "$bin" replay "$trace" --snapshot "$w/s3-%p.pickle"
check "replay, another name of the folder" "$w/sub/../s4.pickle" 2 "the file --snapshot writes" \
    "$bin" replay "$trace" --snapshot "$w/s4.pickle"
: >"$w/c1-$host.svg"
check "plot, an existing file, %h in the output only" "$w/c1-$host.svg" 2 \
    "^sympool plot: SYMPOOL_DEBUG_FILE=$w/c1-$host.svg $re" "$bin" plot "$trace" -o "$w/c1-%h.svg"
[ -s "$w/c1-$host.svg" ] && { echo "FAIL plot wrote $w/c1-$host.svg"; fail=1; }
check "plot, %h in the log only" "$w/c2-%h.svg" 2 "the file -o writes" \
    "$bin" plot "$trace" -o "$w/c2-$host.svg"
# %r while the rank is not known (no launcher: their rank variables unset): the log opens the
# file of whatever rank comes, and sympool refuses to write any rank's file of the pattern, but
# sp_dump_snapshot did so only after the whole replay (exit 1 at the end). Refused up front as
# the others: nothing run, nothing written.
unset OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK SLURM_PROCID
check "replay, a rank's file of %r" "$w/r-%r.pickle" 2 \
    "^sympool replay: SYMPOOL_DEBUG_FILE=$w/r-%r.pickle names $w/r-3.pickle, the file --snapshot writes, for a rank not known yet" \
    "$bin" replay "$trace" --snapshot "$w/r-3.pickle"
[ -e "$w/r-3.pickle" ] && { echo "FAIL replay wrote $w/r-3.pickle"; fail=1; }
grep -q "allocator ready" "$w/err" && { echo "FAIL the replay ran: $(cat "$w/err")"; fail=1; }
check "replay, a rank's file of %r, another name of the folder" "$w/sub/../r-%r.json" 2 \
    "the file --snapshot writes, for a rank not known yet" \
    "$bin" replay "$trace" --snapshot "$w/r-0.json"
check "plot, a rank's file of %r" "$w/r-%r.svg" 2 "the file -o writes, for a rank not known yet" \
    "$bin" plot "$trace" -o "$w/r-12.svg"
[ -e "$w/r-12.svg" ] && { echo "FAIL plot wrote $w/r-12.svg"; fail=1; }
# A name the pattern makes for no rank is written.
check "replay, no rank's file of %r" "$w/r-%r.pickle" 0 "" \
    "$bin" replay "$trace" --snapshot "$w/r-x.pickle"
# Another file: written, and the log has its lines.
check "replay, another file" "$w/log-%h.txt" 0 "" "$bin" replay "$trace" --snapshot "$w/s5.json"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$w/s5.json" ||
    { echo "FAIL $w/s5.json is no JSON document"; fail=1; }
# Every line in the log, none on stderr: the replay's log filter wrote what it passed to stderr.
grep -q "SYMPOOL INFO snapshot.c.*wrote snapshot $w/s5.json" "$w/log-$host.txt" ||
    { echo "FAIL the replay's lines are not in $w/log-$host.txt"; fail=1; }
grep -q "SYMPOOL" "$w/err" && { echo "FAIL log lines on stderr: $(cat "$w/err")"; fail=1; }
check "plot, another file" "$w/c3.svg.log" 0 "" "$bin" plot "$trace" -o "$w/c3.svg"
# replay --compare: each configuration's SYMPOOL_DEBUG_FILE item is where its lines go.
check "compare, one log per configuration" "" 0 "" "$bin" replay "$trace" --compare \
    "SYMPOOL_DEBUG_FILE=$w/cmp-a.log" "SYMPOOL_DEBUG_FILE=$w/cmp-b.log"
for x in a b; do
    grep -q "SYMPOOL INFO api.c.*allocator ready" "$w/cmp-$x.log" 2>/dev/null ||
        { echo "FAIL no lines of configuration $x in $w/cmp-$x.log"; fail=1; }
done
[ $fail -eq 0 ] && echo "debug file output ok"
exit $fail
