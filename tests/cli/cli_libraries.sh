#!/bin/sh
# cli_libraries.sh SYMPOOL NO_SYMBOLS_MODULE NCCL_SONAME MPI_SONAME WORK
# The CLI links neither NCCL nor MPI (loading them cost every start of it several ms): its
# DT_NEEDED names neither, `sympool info` still gives their versions by loading them by soname,
# and where the library found by that name has no version to give, info says so (text and
# --json), exits 0, and the rest of its output stays. An empty soname: the build has no such
# library, and its checks are skipped.
set -eu
cli=$1 module=$2 nccl=$3 mpi=$4 work=$5
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work/fake"

if command -v readelf >/dev/null 2>&1; then
  readelf -d "$cli" > "$work/dynamic.txt"
  for lib in libnccl libmpi; do
    ! grep -q "NEEDED.*\[$lib[.]" "$work/dynamic.txt" || fail "the CLI links $lib: $(grep NEEDED "$work/dynamic.txt")"
  done
else
  echo "readelf missing: the DT_NEEDED check skipped"
fi

"$cli" info > "$work/info.txt"
[ -z "$nccl" ] || grep -q '^  NCCL [0-9.]* (built with [0-9.]*)$' "$work/info.txt" \
  || fail "no NCCL version: $(grep NCCL "$work/info.txt")"
[ -z "$mpi" ] || grep -q '^  MPI [0-9]*[.][0-9]* standard' "$work/info.txt" \
  || fail "no MPI version: $(grep MPI "$work/info.txt")"

for so in "$nccl" "$mpi"; do
  [ -z "$so" ] || cp "$module" "$work/fake/$so"
done
LD_LIBRARY_PATH="$work/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$cli" info > "$work/fake.txt" \
  || fail "info exits $? with libraries that have no version"
LD_LIBRARY_PATH="$work/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$cli" info --json > "$work/fake.json" \
  || fail "info --json exits $? with libraries that have no version"
# versions NAME: info --json's versions.NAME, keys sorted, on one line.
versions() {
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["versions"][sys.argv[2]], sort_keys=True))' \
    "$work/fake.json" "$1"
}
if [ -n "$nccl" ]; then
  grep -q '^  NCCL version unavailable (built with [0-9.]*)$' "$work/fake.txt" \
    || fail "NCCL without a version: $(grep NCCL "$work/fake.txt")"
  versions nccl | grep -q '^{"built_with": "[0-9.]*", "version": null}$' \
    || fail "NCCL without a version in --json: $(versions nccl)"
fi
if [ -n "$mpi" ]; then
  grep -qF "  MPI version unavailable ($mpi did not load or answer)" "$work/fake.txt" \
    || fail "MPI without a version: $(grep MPI "$work/fake.txt")"
  [ "$(versions mpi)" = '{"library": null, "standard": null}' ] \
    || fail "MPI without a version in --json: $(versions mpi)"
fi
# Everything but the versions is as before.
sed '/^versions:$/,/^options:$/d' "$work/info.txt" > "$work/a"
sed '/^versions:$/,/^options:$/d' "$work/fake.txt" > "$work/b"
cmp -s "$work/a" "$work/b" || fail "info's other lines changed: $(diff "$work/a" "$work/b" | head -5)"
rm -rf "$work"
echo "cli libraries ok"
