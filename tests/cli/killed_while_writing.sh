#!/bin/sh
# killed_while_writing.sh SYMPOOL KILL_AT_SO TRACE WORKDIR: Ctrl-C, SIGTERM or SIGHUP while the
# command writes a snapshot or a chart leaves no temporary file (NAME.tmp.XXXXXX) behind, the
# previous file whole, and the command dies by that signal (the shell's status says so): the
# temporary used to stay. KILL_AT_SO (kill_at.c, preloaded) sends the signal at a fixed point of
# the write: right after the temporary is created, before its first or second write, before the
# rename; no timing is involved.
set -u
bin=$1 shim=$2 trace=$3 w=$4
rm -rf "$w" && mkdir -p "$w" || exit 1
fail=0
SYMPOOL_DEVICE=host
export SYMPOOL_DEVICE
# killed SIG AT EXPECT OUT CMD...: run CMD with the signal sent at AT; EXPECT is what OUT must
# hold afterwards: "previous" (the old file whole) or "new" (the rename had begun: the whole new
# file, which `sympool info` reads, or the chart's closing tag).
killed() {
    sig=$1 at=$2 expect=$3 out=$4
    shift 4
    printf 'previous\n' >"$out" || exit 1
    LD_PRELOAD=$shim SP_KILL_SIG=$sig SP_KILL_AT=$at ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
        "$@" >/dev/null 2>"$w/err"
    rc=$?
    what="signal $sig at $at: $*"
    [ $rc -eq $((128 + sig)) ] || { echo "FAIL $what: rc=$rc, not killed by $sig: $(cat "$w/err")"; fail=1; }
    if ls "$w" | grep -q '\.tmp\.'; then
        echo "FAIL $what: a temporary was left behind: $(ls "$w" | grep '\.tmp\.')"
        fail=1
        rm -f "$w"/*.tmp.*
    fi
    case $expect in
    previous) [ "$(cat "$out")" = previous ] || { echo "FAIL $what: $out was changed"; fail=1; } ;;
    new)
        case $out in
        *.svg) tail -c 7 "$out" | grep -q '</svg>' || { echo "FAIL $what: $out is not the chart"; fail=1; } ;;
        *) "$bin" info "$out" >/dev/null 2>&1 || { echo "FAIL $what: $out is not the snapshot"; fail=1; } ;;
        esac
        ;;
    esac
}
INT=2 HUP=1 TERM=15
for sig in $INT $TERM $HUP; do
    killed $sig write:2 previous "$w/s.pickle" "$bin" replay "$trace" --snapshot "$w/s.pickle"
    killed $sig write:1 previous "$w/c.svg" "$bin" plot "$trace" -o "$w/c.svg"
done
# The kernel's limits: SIGXCPU (RLIMIT_CPU), SIGXFSZ (a file size limit the writer could not
# foresee); numbered as on x86 and ARM Linux.
killed 24 write:2 previous "$w/s.pickle" "$bin" replay "$trace" --snapshot "$w/s.pickle"
killed 25 write:1 previous "$w/c.svg" "$bin" plot "$trace" -o "$w/c.svg"
# Between creating the temporary and its name being known to the handler; at the rename.
killed $TERM open previous "$w/s.pickle" "$bin" replay "$trace" --snapshot "$w/s.pickle"
killed $INT open previous "$w/c.svg" "$bin" plot "$trace" -o "$w/c.svg"
killed $TERM rename new "$w/s.pickle" "$bin" replay "$trace" --snapshot "$w/s.pickle"
killed $HUP rename new "$w/c.svg" "$bin" plot "$trace" -o "$w/c.svg"
# A signal the caller ignores (nohup's SIGHUP) stays ignored: the chart is written, status 0.
printf 'previous\n' >"$w/c.svg"
(trap '' HUP && LD_PRELOAD=$shim SP_KILL_SIG=$HUP SP_KILL_AT=write:1 SP_KILL_KEEP_IGNORED=1 \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" exec "$bin" plot "$trace" -o "$w/c.svg") >/dev/null 2>&1 ||
    { echo "FAIL an ignored SIGHUP stopped the chart"; fail=1; }
tail -c 7 "$w/c.svg" | grep -q '</svg>' || { echo "FAIL an ignored SIGHUP: no chart"; fail=1; }
[ $fail -eq 0 ] && echo "killed while writing ok"
