#!/usr/bin/env bash
# README's two commands in README's order: run-main.sh configures build/ with tests off, then
# test.sh configures the same folder. Check, on a scratch folder with the scripts' own options,
# that the second configuration has tests again, that an empty run fails with the flag test.sh
# uses, and that every ctest call in test.sh carries that flag.
# usage: scripts_check.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
line() { grep -E "^$1=\(" "$2" | head -1; }
eval "$(line main_opts "$src/scripts/run-main.sh")"
eval "$(line plain_opts "$src/scripts/test.sh")"
[ ${#main_opts[@]} -gt 0 ] && [ ${#plain_opts[@]} -gt 0 ] || { echo "FAIL: options not found"; exit 1; }

cmake -S "$src" -B "$work" "${main_opts[@]}" >/dev/null
if ctest --test-dir "$work" --no-tests=error >/dev/null 2>&1; then
  echo "FAIL: an empty test run passed with --no-tests=error"; exit 1
fi
cmake -S "$src" -B "$work" "${plain_opts[@]}" >/dev/null
n=$(ctest --test-dir "$work" -N | sed -n 's/^Total Tests: //p')
[ "${n:-0}" -gt 0 ] || { echo "FAIL: no tests after test.sh's configuration"; exit 1; }
echo "tests after run-main.sh then test.sh's options: $n"

total=$(grep -cE '^\s*ctest ' "$src/scripts/test.sh")
flagged=$(grep -E '^\s*ctest ' "$src/scripts/test.sh" | grep -c -- '--no-tests=error')
[ "$total" -gt 0 ] && [ "$total" = "$flagged" ] ||
  { echo "FAIL: $flagged of $total ctest calls in test.sh have --no-tests=error"; exit 1; }
rm -rf "$work"
echo "scripts ok"
