#!/usr/bin/env python3
"""A replay's own snapshot shows the stacks of the segments that existed before the trace began
as the original does (issue 24 item 2): a segment's dict has the stack it was allocated with
("frames") while it was never split, and the starting state rebuilt from the final state keeps
it. trace-start-frames.json has a whole live segment whose stack is not its block's, a whole
cached one (its one block free, after the trace allocated and freed it whole), a split one and a
small one the trace made (no stack: split at once); ours shows each segment's stack as recorded,
from the JSON snapshot and from the same snapshot pickled (the two loaders' paths).

usage: replay_start_frames.py SYMPOOL DATA_DIR OUT_DIR
"""
import json
import os
import pickle
import sys

from snaptest import replay_snapshot

SYMPOOL, DATA, OUT = sys.argv[1:4]
failures = []


def stacks(doc):
    """Each final segment's stack and its blocks' stacks, in address order, addresses relative
    to the first segment's."""
    segs = sorted(doc["segments"], key=lambda s: s["address"])
    base = segs[0]["address"] if segs else 0

    def names(fr):
        return [(f["name"], f["filename"], f["line"]) for f in fr or []]

    return [(s["address"] - base, s["total_size"], names(s.get("frames")),
             [names(b.get("frames")) for b in s["blocks"]]) for s in segs]


src = os.path.join(DATA, "trace-start-frames.json")
with open(src) as f:
    rec = json.load(f)
pickled = os.path.join(OUT, "start-frames-input.pickle")
with open(pickled, "wb") as f:
    pickle.dump(rec, f, protocol=2)
want = stacks(rec)
if sum(1 for s in want if s[2]) != 2:
    sys.exit("replay-start-frames: the trace should have two segments with a stack")
for trace in (src, pickled):
    got = stacks(replay_snapshot(SYMPOOL, trace, os.path.join(OUT, "start-frames-ours.pickle"))[0])
    for g, w in zip(got, want):
        if g != w:
            failures.append("%s: segment at +%d (%d bytes): ours %r, recorded %r" % (
                os.path.basename(trace), w[0], w[1], g[2:], w[2:]))
    if len(got) != len(want):
        failures.append("%s: %d segments, recorded %d" % (trace, len(got), len(want)))

if failures:
    sys.exit("replay-start-frames: " + "\n".join(failures))
print("replay-start-frames: ok")
