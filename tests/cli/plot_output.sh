#!/bin/sh
# plot_output.sh SYMPOOL TRACE DIR: `sympool plot -o OUT` must never leave OUT half-written or
# block on it. A full disk (RLIMIT_FSIZE of one 512-byte block, SIGXFSZ ignored so write() fails
# with EFBIG) must fail and leave the previous OUT whole; a FIFO or a directory at OUT must be
# refused at once, untouched.
set -u
cli=$1 trace=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail=0
printf 'previous chart\n' >"$dir/full.svg"
if (ulimit -f 1 && trap '' XFSZ && "$cli" plot "$trace" -o "$dir/full.svg" 2>"$dir/err"); then
    echo "FAIL: plot succeeded on a full disk"; fail=1
fi
# ... saying so once: sympool's WARN line of the same failure came before the command's.
if [ "$(wc -l <"$dir/err")" -ne 1 ] || ! grep -q '^sympool plot: .*full.svg is unchanged' "$dir/err"; then
    echo "FAIL: not one line for the full disk:"; cat "$dir/err"; fail=1
fi
if [ "$(cat "$dir/full.svg")" != "previous chart" ]; then
    echo "FAIL: the previous full.svg was clobbered:"; head -c 80 "$dir/full.svg"; echo; fail=1
fi
ls "$dir" | grep -q '\.tmp\.' && { echo "FAIL: a temporary file was left behind"; fail=1; }
mkfifo "$dir/fifo.svg" && mkdir "$dir/dir.svg" || exit 1
for out in fifo.svg dir.svg; do
    # Without a reader the FIFO would block forever: timeout turns that into a failure.
    timeout 20 "$cli" plot "$trace" -o "$dir/$out" 2>"$dir/err"
    rc=$?
    if [ $rc -ne 1 ]; then echo "FAIL: plot -o $out gave rc=$rc (want 1)"; fail=1; fi
    grep -q "not a regular file" "$dir/err" || { echo "FAIL: no reason for $out:"; cat "$dir/err"; fail=1; }
done
[ -p "$dir/fifo.svg" ] && [ -d "$dir/dir.svg" ] || { echo "FAIL: a target was replaced"; fail=1; }
"$cli" plot "$trace" -o "$dir/full.svg" >/dev/null || { echo "FAIL: a normal plot failed"; fail=1; }
head -c 4 "$dir/full.svg" | grep -q '<svg' || { echo "FAIL: the normal plot wrote no SVG"; fail=1; }
[ $fail -eq 0 ] && echo "plot output ok"
exit $fail
