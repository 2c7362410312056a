#!/usr/bin/env python3
"""report.py WORKDIR OUTBASE [--final] [--no-gpu]: gathers the GPU check's step results
(WORKDIR/steps.tsv: name, status, seconds, detail; WORKDIR/*.json from the Python steps) into
OUTBASE.json and OUTBASE.md, with the last lines of each failed step's log (WORKDIR/NAME.log)
inside both, and checks the training runs against the native one. gpu-check.sh calls it after
every step, so the report on disk is always current (a run cut off still leaves one); --final
marks it complete and exits 1 if any step or check failed. The versions are read once
(WORKDIR/versions.cache)."""

import glob
import json
import math
import os
import subprocess
import sys


FENCE = "`" * 3  # a Markdown code fence


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except Exception as e:  # noqa: BLE001 - a missing tool is reported, not fatal
        return f"unavailable ({e})"


def versions():
    v = {"gpu": sh("nvidia-smi --query-gpu=name --format=csv,noheader | head -1"),
         "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1"),
         "nvcc": sh("nvcc --version | tail -2 | head -1")}
    try:
        import torch

        v["torch"] = torch.__version__
        v["torch_cuda"] = torch.version.cuda
        try:
            v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001
            v["nccl"] = f"unknown ({e})"
    except ImportError:
        v["torch"] = None
    try:
        import cupy

        v["cupy"] = cupy.__version__
    except ImportError:
        v["cupy"] = None
    return v


def cached_versions(work, no_gpu):
    path = os.path.join(work, "versions.cache")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    v = {"gpu": None} if no_gpu else versions()
    with open(path, "w") as f:
        json.dump(v, f)
    return v


def log_tail(work, name, lines=80):
    try:
        with open(os.path.join(work, name + ".log"), errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def train_checks(results):
    """Each sympool training mode against native: same losses and parameters. A mode whose run
    has no result is left out: its own step says why (failed, skipped, or not run yet)."""
    native = results.get("train_native")
    out = []
    for mode in ("train_pluggable", "train_mempool"):
        r = results.get(mode)
        if not native or not r:
            continue
        diffs = [abs(a - b) for a, b in zip(native["losses"], r["losses"])]
        worst = max(diffs) if diffs else math.inf
        dparam = abs(native["param_checksum"] - r["param_checksum"])
        ok = (len(r["losses"]) == len(native["losses"]) and worst <= 1e-5
              and dparam <= 1e-3 * max(1.0, abs(native["param_checksum"])))
        out.append((mode, ok, f"max abs loss diff {worst:.3g}, abs param checksum diff {dparam:.3g}"))
    return out


def main():
    work, outbase = sys.argv[1], sys.argv[2]
    final = "--final" in sys.argv[3:]
    no_gpu = "--no-gpu" in sys.argv[3:]
    steps = []
    with open(os.path.join(work, "steps.tsv")) as f:
        for line in f:
            name, status, secs, detail = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "status": status, "seconds": float(secs or 0),
                          "detail": detail})
            if status == "FAIL":
                steps[-1]["log"] = log_tail(work, name)
    results = {}
    for path in glob.glob(os.path.join(work, "*.json")):
        try:
            with open(path) as f:
                results[os.path.basename(path)[:-5]] = json.load(f)
        except (OSError, ValueError) as e:
            steps.append({"step": os.path.basename(path), "status": "FAIL", "seconds": 0,
                          "detail": f"unreadable result: {e}"})
    checks = train_checks(results)
    for mode, ok, detail in checks:
        steps.append({"step": f"compare {mode} vs train_native", "status": "PASS" if ok else "FAIL",
                      "seconds": 0, "detail": detail})
    failed = [s for s in steps if s["status"] == "FAIL"]
    report = {"versions": cached_versions(work, no_gpu), "steps": steps, "results": results,
              "complete": final, "ok": not failed}
    write_atomic(outbase + ".json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    md = [f"# sympool GPU check: {report['versions'].get('gpu') or 'no GPU'}", ""]
    if not final:
        md += ["**In progress** (written after each step; the run has not finished).", ""]
    md += [f"- {k}: {v}" for k, v in report["versions"].items()]
    md += ["", "| step | status | seconds | detail |", "|---|---|---|---|"]
    md += [f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {s['detail']} |" for s in steps]
    tr = [(k, v) for k, v in sorted(results.items()) if k.startswith("train_")]
    if tr:
        md += ["", "| training mode | ms/step | peak reserved (bytes) | final loss |",
               "|---|---|---|---|"]
        for k, v in tr:
            peak = v.get("peak_reserved_bytes", v.get("sympool_peak_reserved_bytes",
                                                      v.get("torch_peak_reserved_bytes")))
            md.append(f"| {v['mode']} | {v['ms_per_step']:.2f} | {peak} | {v['losses'][-1]:.6f} |")
    rp = [(k, v) for k, v in sorted(results.items()) if k.startswith("replay_")]
    if rp:
        md += ["", "| trace | allocator | ops | ns/op (Python per call) | peak reserved (bytes) |",
               "|---|---|---|---|---|"]
        for k, v in rp:
            md.append(f"| {v['trace']} | {v['allocator']} | {v['ops']} | {v['ns_per_op']:.0f} | "
                      f"{v['peak_reserved_bytes']} |")
    hc = results.get("hit_cost")
    if hc:
        md += ["", "| size (bytes) | allocator | ns per cached malloc+free |", "|---|---|---|"]
        for size, row in hc["ns_per_pair"].items():
            for name, ns in row.items():
                md.append(f"| {size} | {name} | {'n/a' if ns is None else f'{ns:.1f}'} |")
    logged = [st for st in steps if st.get("log")]
    if logged:
        md += ["", "## Logs of failed steps (last lines)"]
        for st in logged:
            md += ["", f"### {st['step']}", "", FENCE, st["log"].rstrip("\n").replace(FENCE, "~~~"),
                   FENCE]
    state = ("PASS" if report["ok"] else "FAIL") if final else "in progress"
    md += ["", f"Overall: {state}", ""]
    write_atomic(outbase + ".md", "\n".join(md))
    if not final:
        return 0
    print("\n".join(md))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
