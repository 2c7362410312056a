#!/usr/bin/env python3
"""A replay's own snapshot gives each entry the recorded stack, lines included (issue 24 item
2): PyTorch writes a line it could not tell as 2^64-1 (its line is an unsigned 64-bit number),
which ours read as 0. trace-small-u64.pickle has such lines on most of its C++ frames; ours has
the recorded frames (name, filename, line) on every alloc, free_requested and free_completed,
the k-th entry of each action against the k-th recorded one.

usage: replay_frame_lines.py SYMPOOL DATA_DIR OUT_DIR
"""
import os
import sys

from snaptest import load, replay_snapshot

SYMPOOL, DATA, OUT = sys.argv[1:4]
UNKNOWN = 2**64 - 1

trace = os.path.join(DATA, "trace-small-u64.pickle")
docs = [replay_snapshot(SYMPOOL, trace, os.path.join(OUT, "frame-lines-ours.pickle"))[0],
        load(trace)]


def stacks(doc, action):
    return [[(f["name"], f["filename"], f["line"]) for f in e.get("frames") or []]
            for e in doc["device_traces"][0] if e["action"] == action]


failures = []
unknown = 0
for action in ("alloc", "free_requested", "free_completed"):
    got, want = stacks(docs[0], action), stacks(docs[1], action)
    unknown += sum(1 for s in want for fr in s if fr[2] == UNKNOWN)
    if len(got) != len(want):
        failures.append("%s: %d entries, recorded %d" % (action, len(got), len(want)))
    bad = [k for k, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad:
        k = bad[0]
        diff = next(((g, w) for g, w in zip(got[k], want[k]) if g != w), None)
        failures.append("%s: %d entries' stacks differ; #%d: ours %r, recorded %r" % (
            action, len(bad), k, diff and diff[0], diff and diff[1]))
if unknown == 0:
    failures.append("the trace has no frame with line 2^64-1")
if failures:
    sys.exit("replay-frame-lines: " + "\n".join(failures))
print("replay-frame-lines: ok")
