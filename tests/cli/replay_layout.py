#!/usr/bin/env python3
"""A replay ends in the recorded run's segment layout: every segment at the end has the size and
the blocks (sizes, allocated or free, in address order) of one recorded at the end of the trace,
and the segments sit at the recorded addresses shifted by one constant (the host backend places
each segment the recorded run made where that run had it, so best fit's ties among free blocks
of one size fall as they did on the recorded GPU). Traces whose replay decides as PyTorch did
from start to end: one with 28 empty_cache calls whose peak was 7% off before placement, one
whose end layout differed in 67 of 688 segments, and one whose layout was already equal but not
its addresses.

usage: replay_layout.py SYMPOOL DATA_DIR OUT_DIR
"""
import collections
import os
import pickle
import subprocess
import sys

SYMPOOL, DATA, OUT = sys.argv[1:4]
TRACES = ["real/sqattn-empty-cache.pickle", "cs336-2.7b-ctx128-forward-bf16.pickle",
          "real/wedsonlin-training-aligned-pages.pickle"]
failures = []


def segments(doc):
    segs = doc["segments"] if isinstance(doc, dict) else doc
    return [s for s in segs if s["total_size"] > 0]


def layout(seg):
    return (seg.get("device", 0), seg["total_size"],
            tuple((b["size"], b["state"] == "active_allocated") for b in seg["blocks"]))


for name in TRACES:
    path = os.path.join(DATA, name)
    out = os.path.join(OUT, "layout-" + os.path.basename(name))
    if os.path.exists(out):
        os.unlink(out)
    r = subprocess.run([SYMPOOL, "replay", path, "--snapshot", out], capture_output=True,
                       text=True, env=dict(os.environ, SYMPOOL_DEVICE="host"))
    if r.returncode != 0:
        sys.exit("sympool replay %s: exit %d: %s" % (name, r.returncode, r.stderr))
    with open(path, "rb") as f:
        rec = segments(pickle.load(f))
    with open(out, "rb") as f:
        ours = segments(pickle.load(f))
    same = collections.Counter(map(layout, rec)) == collections.Counter(map(layout, ours))
    shifts = {o["address"] - s["address"] for s, o in
              zip(sorted(rec, key=lambda s: s["address"]), sorted(ours, key=lambda s: s["address"]))}
    ok = same and len(shifts) == 1 and len(rec) == len(ours)
    print("%-50s %d segments recorded, %d replayed; layouts %s; %d address shift(s): %s"
          % (name, len(rec), len(ours), "equal" if same else "DIFFERENT", len(shifts),
             "ok" if ok else "DIFFERENT"))
    if not ok:
        failures.append(name)

if failures:
    sys.exit("replay-layout: different: " + ", ".join(failures))
print("replay-layout: ok")
