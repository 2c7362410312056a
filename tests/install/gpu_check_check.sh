#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU: its plan fits one device call (budgets add up to no more
# than the overall deadline, which is at most 540 s, and the expandable-segment step is in it),
# the no-GPU run writes its report (JSON + Markdown, two files, complete) to --out, a failing
# step's log is inside the report, and the deadline stops steps that would run past it.
# usage: gpu_check_check.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
gc=$src/scripts/gpu-check.sh
export SYMPOOL_GPU_CHECK_NO_GPU=1 SYMPOOL_GPU_CHECK_BUILD=$work/build
# Each run keeps its logs in a folder of its own under $TMPDIR: here, not in /tmp, where every CI
# run left three.
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"

bash "$gc" --plan >"$work/plan.txt"
python3 - "$work/plan.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
gpu = text.split("gpu-check plan, without a GPU:")[0]
total = int(re.search(r"\(sum of budgets\)\s+(\d+)", gpu).group(1))
deadline = int(re.search(r"\(overall deadline\)\s+(\d+)", gpu).group(1))
steps = re.findall(r"^(\w+)\s+(\d+)$", gpu, re.M)
assert deadline <= 540, f"deadline {deadline} s does not fit one device call"
assert sum(int(b) for _, b in steps) == total <= deadline, (total, deadline)
names = [n for n, _ in steps]
for need in ("build", "suite_cuda", "nccl_window_np1", "expandable_cuda", "train_mempool",
             "hit_cost"):
    assert need in names, f"{need} missing from the plan: {names}"
assert any(n.startswith("replay_sympool_expandable_") for n in names), names
print(f"plan ok: {len(steps)} steps, {total} s of budgets, deadline {deadline} s")
PY

# --steps: the GPU plan keeps the build and the steps named; a regular expression grep cannot
# read, or one that names no step, is refused (it left the build alone to run, and pass).
bash "$gc" --plan --steps '^hit_cost$' >"$work/plan_steps.txt"
kept=$(awk '/without a GPU/ { exit } $1 ~ /^[a-z]/ && $2 ~ /^[0-9]+$/ { printf "%s ", $1 }' \
  "$work/plan_steps.txt")
[ "$kept" = "scripts_parse build hit_cost " ] ||
  { cat "$work/plan_steps.txt"; echo "FAIL: --steps kept other steps"; exit 1; }
for re in '(' 'no_such_step'; do
  if bash "$gc" --plan --steps "$re" >"$work/steps_bad.txt" 2>&1; then
    cat "$work/steps_bad.txt"; echo "FAIL: --steps '$re' was taken"; exit 1
  fi
  grep -q -- "--steps" "$work/steps_bad.txt" || { cat "$work/steps_bad.txt"; echo "FAIL: no reason"; exit 1; }
done

# bench/gpu/probe.py, a step of the GPU plan: where its parts cannot run (no GPU here) it must
# fail, with every part's error in its output (it exited 0 and the step passed).
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  if python3 "$src/bench/gpu/probe.py" --out "$work/probe.json" >"$work/probe.log" 2>&1; then
    echo "FAIL: probe.py passed with no part run"; exit 1
  fi
  python3 - "$work/probe.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for part in ("context", "bus_id", "reserve", "torch", "history"):
    assert "error" in r[part], (part, r[part])
print("probe failure ok")
PY
fi

bash "$gc" --out "$work/ok" >"$work/ok.log" 2>&1 || { cat "$work/ok.log"; echo "FAIL: no-GPU run failed"; exit 1; }
compgen -G "$TMPDIR/sympool-gpu-check.*/steps.tsv" >/dev/null ||
  { echo "FAIL: the run kept its logs outside TMPDIR ($TMPDIR)"; exit 1; }
n=$(ls "$work/ok" | wc -l)
[ "$n" = 2 ] || { ls "$work/ok"; echo "FAIL: $n report files, expected 2"; exit 1; }
python3 - "$work/ok"/*.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["complete"] and r["ok"], r
assert [s["step"] for s in r["steps"]] == ["scripts_parse", "configure_no_gpu"], r["steps"]
print("no-GPU report ok")
PY
grep -q "Overall: PASS" "$work/ok"/*.md

if SYMPOOL_GPU_CHECK_BUILD=$work/build-bad \
    SYMPOOL_GPU_CHECK_CMAKE_ARGS=-DCMAKE_TOOLCHAIN_FILE=/nonexistent/toolchain.cmake \
    bash "$gc" --out "$work/bad" >"$work/bad.log" 2>&1; then
  echo "FAIL: a failing configure step did not fail the run"; exit 1
fi
python3 - "$work/bad"/*.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
step = [s for s in r["steps"] if s["step"] == "configure_no_gpu"][0]
assert step["status"] == "FAIL" and "toolchain" in step["log"], step
assert r["complete"] and not r["ok"]
print("failed step log in the report ok")
PY
grep -q "### configure_no_gpu" "$work/bad"/*.md

if SYMPOOL_GPU_CHECK_DEADLINE=7 bash "$gc" --out "$work/late" >"$work/late.log" 2>&1; then
  echo "FAIL: steps cut by the deadline did not fail the run"; exit 1
fi
grep -q "overall deadline" "$work/late"/*.json || { cat "$work/late"/*.md; echo "FAIL: no deadline"; exit 1; }
echo "gpu-check ok"
