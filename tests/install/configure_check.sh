#!/usr/bin/env bash
# A library-only configure on a machine without GoogleTest (hidden from find_package here):
# the default configures, with tests off; asking for tests says what is missing.
# usage: configure_check.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
no_gtest=(-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DSYMPOOL_WITH_CUDA=OFF)
out=$(cmake -S "$src" -B "$work/default" "${no_gtest[@]}" 2>&1) ||
  { echo "$out"; echo "FAIL: the default configure needs GoogleTest"; exit 1; }
grep -q "tests off" <<<"$out" || { echo "$out"; echo "FAIL: no word that tests are off"; exit 1; }
if out=$(cmake -S "$src" -B "$work/on" "${no_gtest[@]}" -DSYMPOOL_BUILD_TESTS=ON 2>&1); then
  echo "FAIL: SYMPOOL_BUILD_TESTS=ON configured without GoogleTest"; exit 1
fi
grep -q "SYMPOOL_BUILD_TESTS=ON but GoogleTest was not found" <<<"$out" ||
  { echo "$out"; echo "FAIL: the error does not say GoogleTest is missing"; exit 1; }
rm -rf "$work"
echo "configure ok"
