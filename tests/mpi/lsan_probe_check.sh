#!/bin/sh
# lsan_probe_check.sh MPIEXEC PROBE: two ranks of tests/mpi/lsan_probe.c under the environment
# every MPI test of the ASan+UBSan build gets. Each rank must report exactly its one 4096-byte
# leak, named by lsan_probe_leak: a leak of ours in an MPI process is seen (the fast unwinder
# and the suppressions hide none of our frames), and Open MPI's are hidden (no other bytes).
out=$("$1" -n 2 --oversubscribe "$2" 2>&1)
echo "$out"
fail() { echo "lsan-probe-check: FAIL: $*"; exit 1; }
[ "$(printf '%s\n' "$out" | grep -c '^lsan-probe: leaked rank')" = 2 ] || fail "the ranks did not both finish"
[ "$(printf '%s\n' "$out" | grep -c 'SUMMARY: AddressSanitizer: 4096 byte(s) leaked in 1 allocation(s)')" = 2 ] ||
  fail "not one 4096-byte leak a rank"
[ "$(printf '%s\n' "$out" | grep -c '^SUMMARY: ')" = 2 ] || fail "other reports"
[ "$(printf '%s\n' "$out" | grep -c ' in lsan_probe_leak ')" = 2 ] || fail "the leak's stack does not name lsan_probe_leak"
echo "lsan-probe-check: ok"
