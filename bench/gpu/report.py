#!/usr/bin/env python3
"""report.py WORKDIR OUTBASE: gathers the GPU check's step results (WORKDIR/steps.tsv: name,
status, seconds, detail; WORKDIR/*.json from the Python steps) into OUTBASE.json and OUTBASE.md,
checks the training runs against the native one, and exits 1 if any step or check failed."""

import glob
import json
import math
import os
import subprocess
import sys


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


def train_checks(results):
    """Each sympool training mode against native: same losses and parameters."""
    native = results.get("train_native")
    out = []
    for mode in ("train_pluggable", "train_mempool"):
        r = results.get(mode)
        if not native or not r:
            out.append((mode, False, "missing result"))
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
    steps = []
    with open(os.path.join(work, "steps.tsv")) as f:
        for line in f:
            name, status, secs, detail = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
            steps.append({"step": name, "status": status, "seconds": float(secs or 0),
                          "detail": detail})
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
    report = {"versions": versions(), "steps": steps, "results": results,
              "ok": not failed}
    with open(outbase + ".json", "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    md = [f"# sympool GPU check: {report['versions'].get('gpu')}", ""]
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
    md += ["", f"Overall: {'PASS' if report['ok'] else 'FAIL'}", ""]
    with open(outbase + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
