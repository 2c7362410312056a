#!/usr/bin/env python3
"""replay_traces.py DIR --out FILE.jsonl: every PyTorch memory snapshot in DIR (*.pickle) replayed
on the GPU through PyTorch's caching allocator and sympool's cuda backend (bench/gpu/replay.py, a
process per run), in four configurations:

  default      PyTorch's default settings on both sides
  expandable   expandable_segments:True on both sides, sympool with PyTorch's rules
               (SYMPOOL_EXPANDABLE_PAGE/RECYCLE/BORROW=0)
  sympool_exp  sympool alone, expandable_segments:True with its own defaults (2 MiB pages,
               recycling, borrowing): what it saves against PyTorch's expandable run

One JSON line per run goes to FILE, then a table on stdout: the peak reserved bytes of each side
and whether they are equal to the byte. Exit status 1 if any PyTorch-rules pair differs or a run
fails; a trace that uses several devices is reported as skipped (the torch side replays one)."""

import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from replay import events  # noqa: E402
PYTORCH_RULES = {"SYMPOOL_EXPANDABLE_PAGE": "0", "SYMPOOL_EXPANDABLE_RECYCLE": "0",
                 "SYMPOOL_EXPANDABLE_BORROW": "0"}
CONFIGS = [
    ("default", "torch", {}),
    ("default", "sympool", {}),
    ("expandable", "torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("expandable", "sympool", dict(PYTORCH_RULES, SYMPOOL_ALLOC_CONF="expandable_segments:True")),
    ("sympool_exp", "sympool", {"SYMPOOL_ALLOC_CONF": "expandable_segments:True"}),
]


def run_one(trace, which, extra, tmp):
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "SYMPOOL_ALLOC_CONF", *PYTORCH_RULES):
        env.pop(k, None)
    env.update(extra)
    r = subprocess.run([sys.executable, os.path.join(HERE, "replay.py"), which, trace, "--out", tmp],
                       env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["rc %d" % r.returncode]}
    with open(tmp) as f:
        return json.load(f)


def main():
    if len(sys.argv) != 4 or sys.argv[2] != "--out":
        sys.exit("usage: replay_traces.py DIR --out FILE.jsonl")
    traces = sorted(glob.glob(os.path.join(sys.argv[1], "*.pickle")))
    out, tmp = sys.argv[3], sys.argv[3] + ".tmp.json"
    rows, bad = [], 0
    with open(out, "w") as f:
        for t in traces:
            devices = sorted({e[1] for e in events(t)})
            if len(devices) > 1:
                f.write(json.dumps({"trace": os.path.basename(t), "skipped": True,
                                    "devices": devices}) + "\n")
                print(f"{os.path.basename(t)}: skipped, uses devices {devices} (the torch side "
                      "replays one device)")
                continue
            peaks = {}
            for config, which, extra in CONFIGS:
                res = run_one(t, which, extra, tmp)
                res.update({"trace": os.path.basename(t), "config": config, "allocator": which})
                f.write(json.dumps(res) + "\n")
                f.flush()
                peaks[(config, which)] = res.get("peak_reserved_bytes", res.get("error"))
            rows.append((os.path.basename(t), peaks))
    if os.path.exists(tmp):
        os.remove(tmp)
    print("| trace | default torch | default sympool | equal | expandable torch | "
          "expandable sympool (PyTorch rules) | equal | sympool defaults, expandable |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in rows:
        eq = []
        for config in ("default", "expandable"):
            a, b = p[(config, "torch")], p[(config, "sympool")]
            same = isinstance(a, int) and a == b
            bad += 0 if same else 1
            eq.append("yes" if same else "NO")
        print(f"| {name} | {p[('default', 'torch')]} | {p[('default', 'sympool')]} | {eq[0]} | "
              f"{p[('expandable', 'torch')]} | {p[('expandable', 'sympool')]} | {eq[1]} | "
              f"{p[('sympool_exp', 'sympool')]} |")
    print(f"{len(rows)} traces, {bad} PyTorch-rules pairs differ or failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
