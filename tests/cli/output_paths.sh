#!/bin/sh
# output_paths.sh SYMPOOL TRACE WORKDIR: an output path the writer would refuse at the end is
# refused before any input is read, with its reason: a name longer than the file system takes
# (the whole replay ran first, then its message, the path written twice, was cut before the
# reason), a symbolic link to nothing (the replay ran first), a folder that is a loop of links
# (said to be "not a folder"), a folder or file this user may not write. An input the command cannot give the missing.pickle shows the
# order: the output's error comes first. And an input larger than the reader's 4 GiB limit is
# refused from its size, not after reading 4 GiB of it (tens of seconds, 4 GiB resident, or
# "out of memory" under a memory limit).
set -u
bin=$1 trace=$2 w=$3
rm -rf "$w" && mkdir -p "$w" || exit 1
fail=0
SYMPOOL_DEVICE=host
export SYMPOOL_DEVICE
check() { # WHAT RC EXPECTED_RE CMD...
    what=$1 want=$2 re=$3
    shift 3
    "$@" >"$w/out" 2>"$w/err"
    rc=$?
    if [ $rc -ne "$want" ] || ! grep -q -- "$re" "$w/err" || [ -s "$w/out" ]; then
        echo "FAIL $what: rc=$rc (want $want): $(cat "$w/out" "$w/err")"
        fail=1
    fi
}
long=$(printf '%0300d' 0)
check "replay, a name too long" 1 "^sympool replay: --snapshot $w/$long.pickle: File name too long" \
    "$bin" replay "$trace" --snapshot "$w/$long.pickle"
check "plot, a name too long, before the input" 1 "File name too long" \
    "$bin" plot "$w/missing.pickle" -o "$w/$long.svg"
ln -s nowhere "$w/dangling.pickle" && ln -s nowhere "$w/dangling.svg" || exit 1
check "replay, a dangling link, before the input" 1 "dangling.pickle is a symbolic link to nothing" \
    "$bin" replay "$w/missing.pickle" --snapshot "$w/dangling.pickle"
check "plot, a dangling link, before the input" 1 "dangling.svg is a symbolic link to nothing" \
    "$bin" plot "$w/missing.pickle" -o "$w/dangling.svg"
[ -L "$w/dangling.pickle" ] && [ -L "$w/dangling.svg" ] || { echo "FAIL a link was replaced"; fail=1; }
ln -s loop2 "$w/loop1" && ln -s loop1 "$w/loop2" || exit 1
check "replay, a folder that loops" 1 "Too many levels of symbolic links" \
    "$bin" replay "$trace" --snapshot "$w/loop1/x.pickle"
check "replay, a folder that is a file" 1 "its folder .* is not a folder" \
    "$bin" replay "$trace" --snapshot "$trace/x.pickle"
ls "$w" | grep -q '\.tmp\.' && { echo "FAIL a temporary was left behind"; fail=1; }
# A pattern longer than 4 KiB whose expansion fits ("%%" is one "%"): the whole pattern names
# the file. plot cut it at 4 KiB and wrote its chart to what that named (here "abc", a file it
# was never given), clobbering it. Relative to $w/pct, so that the cut falls where it does
# whatever $w is.
case $trace in /*) abs_trace=$trace ;; *) abs_trace=$PWD/$trace ;; esac
deep="e/$(printf '%%/%.0s' $(seq 1363))"
mkdir -p "$w/pct/$deep" && printf 'previous\n' >"$w/pct/${deep}abc" || exit 1
pattern="e/$(printf '%%%%/%.0s' $(seq 1363))abcd%r.svg"
(cd "$w/pct" && exec "$bin" plot "$abs_trace" -o "$pattern") >"$w/out" 2>"$w/err"
rc=$?
if [ $rc -ne 0 ] || [ "$(cat "$w/pct/${deep}abc")" != previous ] || ! [ -s "$w/pct/${deep}abcd0.svg" ]; then
    echo "FAIL plot, a 4 KiB pattern: rc=$rc, abc: $(head -c 40 "$w/pct/${deep}abc"), $(cat "$w/err")"
    fail=1
fi
rm -rf "$w/pct"
# A folder this user may not write in, a file it may not replace: refused before the input too
# (they failed after the whole run). Root writes anywhere: as root the commands run as nobody.
mkdir -m 555 "$w/ro" && mkdir -m 777 "$w/rw" && printf 'previous\n' >"$w/rw/mine.pickle" &&
    chmod 444 "$w/rw/mine.pickle" || exit 1
as_user=""
if [ "$(id -u)" -eq 0 ]; then
    command -v setpriv >/dev/null && as_user="setpriv --reuid=65534 --regid=65534 --clear-groups"
fi
if [ "$(id -u)" -ne 0 ] || [ -n "$as_user" ]; then
    check "replay, a read-only folder, before the input" 1 "cannot create files in its folder .*/ro: Permission denied" \
        $as_user "$bin" replay "$w/missing.pickle" --snapshot "$w/ro/x.pickle"
    check "plot, a read-only folder, before the input" 1 "cannot create files in its folder .*/ro: Permission denied" \
        $as_user "$bin" plot "$w/missing.pickle" -o "$w/ro/x.svg"
    check "replay, a file it may not replace, before the input" 1 "mine.pickle: Permission denied" \
        $as_user "$bin" replay "$w/missing.pickle" --snapshot "$w/rw/mine.pickle"
    [ "$(cat "$w/rw/mine.pickle")" = previous ] || { echo "FAIL mine.pickle was changed"; fail=1; }
fi
# A sparse 6 GiB file that starts as the trace does.
cp "$trace" "$w/huge.pickle" && truncate -s 6G "$w/huge.pickle" || exit 1
for cmd in info summary; do
    check "$cmd of a 6 GiB file" 1 "huge.pickle is larger than 4294967296 bytes" "$bin" $cmd "$w/huge.pickle"
done
# ... also under a memory limit (where reading it first ended as "out of memory"); skipped for a
# build that cannot start under one (AddressSanitizer reserves terabytes of address space).
if sh -c 'ulimit -v 2000000 && "$0" --version; exit $?' "$bin" >/dev/null 2>&1; then
    check "info of a 6 GiB file, ulimit -v" 1 "huge.pickle is larger than 4294967296 bytes" \
        sh -c 'ulimit -v 2000000 && exec "$0" info "$1"' "$bin" "$w/huge.pickle"
fi
rm -f "$w/huge.pickle"
[ $fail -eq 0 ] && echo "output paths ok"
