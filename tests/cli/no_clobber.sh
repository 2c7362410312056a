#!/bin/sh
# no_clobber.sh SYMPOOL TRACE WORKDIR: an output that names the input (the same path, a link to
# it, or a hard link) is refused before anything is written, and the input is left byte for byte:
# `replay T --snapshot T` replaced the user's recorded trace with the replay's snapshot, and
# `plot T.svg -o T.svg` a snapshot saved under an .svg name with the chart; SYMPOOL_DEBUG_FILE
# naming one of them would have the log appended to it. The rest of what an
# atomic writer refuses (a directory, a FIFO) is checked in plot_output.sh.
set -u
bin=$1 trace=$2 w=$3
rm -rf "$w" && mkdir -p "$w" || exit 1
cp "$trace" "$w/t.pickle" && ln -s t.pickle "$w/link.pickle" && ln "$w/t.pickle" "$w/hard.pickle" &&
    cp "$trace" "$w/t.svg" || exit 1
fail=0
check() { # WHAT EXPECTED_RE CMD...
    what=$1 re=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- "$re"; then
        echo "FAIL $what: rc=$rc: $out"
        fail=1
    fi
}
SYMPOOL_DEVICE=host
export SYMPOOL_DEVICE
check "replay onto itself" "is the trace being replayed" "$bin" replay "$w/t.pickle" --snapshot "$w/t.pickle"
check "replay onto a link to it" "is the trace being replayed" "$bin" replay "$w/t.pickle" --snapshot "$w/link.pickle"
# ... also when OUT names it through %r (rank 0 here, outside a launcher), %h or %p, which
# sp_dump_snapshot expands: the check looked at the pattern, and the trace was replaced.
cp "$trace" "$w/t-0.pickle" || exit 1
check "replay onto itself through %r" "is the trace being replayed" "$bin" replay "$w/t-0.pickle" --snapshot "$w/t-%r.pickle"
check "replay onto a hard link" "is the trace being replayed" "$bin" replay "$w/hard.pickle" --snapshot "$w/t.pickle"
check "plot onto its snapshot" "is the snapshot" "$bin" plot "$w/t.svg" -o "$w/t.svg"
check "plot onto one of its snapshots" "is the snapshot" "$bin" plot "$trace" "$w/t.svg" -o "$w/t.svg"
# ... also through %r, which plot -o expands as replay --snapshot does.
cp "$trace" "$w/t-0.svg" || exit 1
check "plot onto its snapshot through %r" "is the snapshot" "$bin" plot "$w/t-0.svg" -o "$w/t-%r.svg"
# SYMPOOL_DEBUG_FILE naming the trace (or the snapshot to write): log lines would be appended.
check "debug file is the trace" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE="$w/t.pickle" "$bin" replay "$w/t.pickle"
check "debug file is a link to the trace" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE="$w/link.pickle" "$bin" info "$w/t.pickle"
# ... also when the output is given as --opt=FILE or -oFILE (only separate words were looked at).
check "debug file is the chart, --output=" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG_FILE="$w/t.svg" "$bin" plot "$trace" --output="$w/t.svg"
check "debug file is the chart, -oFILE" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG_FILE="$w/t.svg" "$bin" plot "$trace" -o"$w/t.svg"
check "debug file is the snapshot, --snapshot=" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG_FILE="$w/t.pickle" "$bin" replay "$trace" --snapshot="$w/t.pickle"
check "debug file is the snapshot read" "SYMPOOL_DEBUG_FILE" env SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE="$w/t.svg" "$bin" summary "$w/t.svg"
# ... also when a file named like an option is given whole: after "--", or as an option's
# separate value (only the part after "-x" was looked at, and the trace had the log appended).
cp "$trace" "$w/-d.pickle" && cp "$trace" "$w/-d.svg" || exit 1
check "debug file is a trace given after --" "SYMPOOL_DEBUG_FILE" sh -c \
    'cd "$1" && SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE=-d.pickle exec "$2" replay -- -d.pickle' \
    sh "$w" "$bin"
check "debug file is a snapshot given after --" "SYMPOOL_DEBUG_FILE" sh -c \
    'cd "$1" && SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE=-d.pickle exec "$2" summary -- -d.pickle' \
    sh "$w" "$bin"
check "debug file is the chart given as -o -FILE" "SYMPOOL_DEBUG_FILE" sh -c \
    'cd "$1" && SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE=-d.svg exec "$2" plot "$3" -o -d.svg' \
    sh "$w" "$bin" "$trace"
# ... also when the trace is "-" and standard input is the debug file: the check stat'ed "-",
# found nothing, and the log lines went to the end of the trace being read.
cp "$trace" "$w/in.pickle" || exit 1
for cmd in "replay -" "summary -" "info -" "plot - -o $w/in.svg"; do
    # shellcheck disable=SC2086 # the command's words
    check "debug file is standard input, $cmd" "names the standard input this command reads" \
        sh -c 'SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE="$1" exec "$2" '"$cmd"' <"$1"' sh \
        "$w/in.pickle" "$bin"
done
[ -e "$w/in.svg" ] && { echo "FAIL plot wrote $w/in.svg"; fail=1; }
for f in t.pickle t.svg t-0.pickle t-0.svg -d.pickle -d.svg in.pickle; do
    cmp -s "$trace" "$w/$f" || { echo "FAIL $f was changed"; fail=1; }
done
[ -L "$w/link.pickle" ] || { echo "FAIL the link was replaced"; fail=1; }
# A snapshot that cannot be written (a full disk: RLIMIT_FSIZE of one block, SIGXFSZ ignored so
# write() fails with EFBIG) fails the replay, leaves the previous file whole and no temporary,
# and is said once: sympool's WARN line of the same failure came before the command's error.
printf 'previous snapshot\n' >"$w/full.pickle"
(ulimit -f 1 && trap '' XFSZ && exec "$bin" replay "$trace" --snapshot "$w/full.pickle") \
    >/dev/null 2>"$w/err"
rc=$?
if [ $rc -ne 1 ] || [ "$(wc -l <"$w/err")" -ne 1 ] ||
    ! grep -q '^sympool replay: sp_dump_snapshot(.*full.pickle): ' "$w/err"; then
    echo "FAIL full disk: rc=$rc: $(cat "$w/err")"
    fail=1
fi
[ "$(cat "$w/full.pickle")" = "previous snapshot" ] || { echo "FAIL full.pickle was changed"; fail=1; }
ls "$w" | grep -q '\.tmp\.' && { echo "FAIL a temporary file was left behind"; fail=1; }
# ... also with SIGXFSZ left as it is (ulimit -f in a shell or a batch job; the default action
# ends the process): the write past the limit killed the replay, and the half-written temporary
# was left next to the snapshot. The writer fails before that write; the chart's writer as well.
rm -f "$w/err"
for cmd in "replay $trace --snapshot $w/full.pickle" "plot $trace -o $w/full.svg"; do
    printf 'previous\n' >"$w/full.pickle" && printf 'previous\n' >"$w/full.svg" || exit 1
    # shellcheck disable=SC2086 # cmd is split into words on purpose (no spaces in the paths)
    (ulimit -f 1 && exec "$bin" $cmd) >/dev/null 2>"$w/err"
    rc=$?
    if [ $rc -ne 1 ] || [ "$(wc -l <"$w/err")" -ne 1 ] || ! grep -q 'ulimit -f' "$w/err"; then
        echo "FAIL file size limit ($cmd): rc=$rc: $(cat "$w/err")"
        fail=1
    fi
    [ "$(cat "$w/full.pickle")" = previous ] && [ "$(cat "$w/full.svg")" = previous ] ||
        { echo "FAIL file size limit ($cmd): the previous file was changed"; fail=1; }
    ls "$w" | grep -q '\.tmp\.' && { echo "FAIL file size limit ($cmd): a temporary was left"; fail=1; }
done
# A snapshot elsewhere is still written.
"$bin" replay "$w/t.pickle" --snapshot "$w/out.pickle" >/dev/null 2>&1 && [ -s "$w/out.pickle" ] ||
    { echo "FAIL no snapshot written elsewhere"; fail=1; }
[ $fail -eq 0 ] && echo "no clobber ok"
