#!/bin/sh
# stdin_dash.sh SYMPOOL TRACE WORKDIR: an input given as "-" is standard input, for every command
# that reads one (info, replay, summary, plot), through a pipe: the output is the file's, with
# the input named /dev/stdin instead of its path. "-" was taken for a file named "-" ("cannot
# open -"). So do the fuzzing reproducers, whatever the reader says of them.
set -u
bin=$1 trace=$2 w=$3
rm -rf "$w" && mkdir -p "$w" || exit 1
SYMPOOL_DEVICE=host
export SYMPOOL_DEVICE
fail=0
# same WHAT CMD-ARGS...: the command on the file and on "-" fed by a pipe; exit statuses and
# outputs equal once the path is named alike; timings, which differ run to run, left out.
same() {
    what=$1 skip=$2 # skip: the lines that name the input by its file name (a title)
    shift 2
    "$bin" "$@" "$trace" >"$w/file.out" 2>"$w/file.err"
    rc_file=$?
    cat "$trace" | "$bin" "$@" - >"$w/pipe.out" 2>"$w/pipe.err"
    rc_pipe=$?
    for f in file pipe; do
        sed -e "s#$trace#INPUT#g; s#/dev/stdin#INPUT#g" -e "${skip:+${skip}d}" \
            -e 's/"ns_per_event":[0-9.e+-]*//; /time per event/d' "$w/$f.out" >"$w/$f.norm"
    done
    if [ $rc_file -ne 0 ] || [ $rc_pipe -ne 0 ] || ! cmp -s "$w/file.norm" "$w/pipe.norm" ||
        ! [ -s "$w/file.norm" ]; then
        echo "FAIL $what: rc $rc_file (file) / $rc_pipe (-)"
        diff "$w/file.norm" "$w/pipe.norm" | head -20
        cat "$w/pipe.err"
        fail=1
    fi
}
same "info" "" info
same "info --json" "" info --json
same "replay --json" "" replay --json
same "replay" "" replay
same "summary" 2 summary # its title names the file
grep -q "snapshot stdin, device 0" "$w/pipe.out" || {
    echo "FAIL summary -: title $(sed -n 2p "$w/pipe.out")"
    fail=1
}
# plot: a chart from "-", with the figures it reports for the file.
"$bin" plot "$trace" -o "$w/file.svg" >"$w/plot_file.out" 2>&1
cat "$trace" | "$bin" plot - -o "$w/pipe.svg" >"$w/plot_pipe.out" 2>&1
sed "s#$w/file.svg#OUT#" "$w/plot_file.out" >"$w/plot_file.norm"
sed "s#$w/pipe.svg#OUT#" "$w/plot_pipe.out" >"$w/plot_pipe.norm"
if ! grep -q "^wrote OUT (device 0: " "$w/plot_pipe.norm" || ! [ -s "$w/pipe.svg" ] ||
    ! cmp -s "$w/plot_file.norm" "$w/plot_pipe.norm"; then
    echo "FAIL plot -: $(cat "$w/plot_pipe.out") / file: $(cat "$w/plot_file.out")"
    fail=1
fi
# Every reproducer of tests/fuzz/repro (refused or read) reads alike from a pipe: exit status,
# output and message. One whose entries the analysis must read whole (a dict handed over as a
# trace entry and used elsewhere too) was refused from a pipe ("a stream is read once").
for f in "$(dirname "$0")"/../fuzz/repro/*; do
    "$bin" replay --json "$f" >"$w/r_file.out" 2>&1
    rc_file=$?
    cat "$f" | "$bin" replay --json - >"$w/r_pipe.out" 2>&1
    rc_pipe=$?
    for g in file pipe; do
        sed -e "s#$f#INPUT#g; s#/dev/stdin#INPUT#g" -e 's/"ns_per_event":[0-9.e+-]*//' \
            -e 's/^[^ ]*:[0-9]*:[0-9]* \[/LOG [/' \
            "$w/r_$g.out" >"$w/r_$g.norm"
    done
    if [ $rc_file -ne $rc_pipe ] || ! cmp -s "$w/r_file.norm" "$w/r_pipe.norm"; then
        echo "FAIL $(basename "$f") through a pipe: rc $rc_file (file) / $rc_pipe (-)"
        diff "$w/r_file.norm" "$w/r_pipe.norm" | head -5
        fail=1
    fi
done
# A file named "-" is still reachable as ./-.
cp "$trace" "$w/-"
(cd "$w" && "$bin" info ./- >/dev/null 2>&1) || {
    echo "FAIL info ./-: a file named - is not read"
    fail=1
}
[ $fail -eq 0 ] && echo "stdin dash ok"
exit $fail
