#!/usr/bin/env bash
# SYMPOOL_REPORT at sp_world_finalize, written to SYMPOOL_REPORT_FILE instead of the program's
# stdout: JSON that jq reads as is, Prometheus text that promtool accepts (when promtool is
# installed: Debian's prometheus package), table_all, and an unwritable file that fails the
# report without failing or hanging the program.
# usage: reports_check.sh MPIEXEC EXAMPLE_03 WORK_DIR
set -euo pipefail
mpiexec=$1 example=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
run() { "$mpiexec" -np 2 --oversubscribe "$example" table >"$work/stdout" 2>"$work/stderr"; }

echo "== json to SYMPOOL_REPORT_FILE=report-%r-%h.json"
SYMPOOL_REPORT=json SYMPOOL_REPORT_FILE="$work/report-%r-%h.json" run
f=$(ls "$work"/report-0-*.json)
jq -e '.nranks == 2 and (.stats | length) > 100 and .stats["allocated_bytes.all.peak"].max > 0' "$f" >/dev/null ||
  { echo "FAIL: jq cannot read $f"; head -5 "$f"; exit 1; }
! grep -q '"nranks"' "$work/stdout" || { echo "FAIL: the JSON report is in stdout"; exit 1; }
[ "$(ls "$work"/report-*.json | wc -l)" = 1 ] || { echo "FAIL: ranks other than 0 wrote"; exit 1; }

echo "== table_all"
SYMPOOL_REPORT=table_all SYMPOOL_REPORT_FILE="$work/table.txt" run
grep -q "every key that is not zero everywhere" "$work/table.txt" || { echo "FAIL: table_all"; exit 1; }

echo "== unwritable SYMPOOL_REPORT_FILE: the program still ends normally"
SYMPOOL_REPORT=json SYMPOOL_REPORT_FILE="$work/no/such/dir/r.json" run ||
  { echo "FAIL: the program failed"; cat "$work/stderr"; exit 1; }
grep -q "SYMPOOL_REPORT_FILE: cannot write" "$work/stderr" || { echo "FAIL: no warning"; exit 1; }
! grep -q '"nranks"' "$work/stdout" || { echo "FAIL: fell back to stdout"; exit 1; }

echo "== prometheus"
SYMPOOL_REPORT=prometheus SYMPOOL_REPORT_FILE="$work/metrics.prom" run
grep -q '^sympool_memory_allocated_bytes_total{metric="allocated",pool="all",rank="1",node="[^"]*"} ' \
  "$work/metrics.prom" || { echo "FAIL: prometheus families"; exit 1; }
if command -v promtool >/dev/null; then
  promtool check metrics <"$work/metrics.prom" || { echo "FAIL: promtool"; exit 1; }
  echo "promtool check metrics: ok"
  echo "reports ok"
else
  echo "reports ok (promtool not installed: apt-get install prometheus to check the exposition)"
fi
