#!/usr/bin/env python3
"""A replay's own snapshot lines up in time with the one it replayed (issue 24 item 2): its
external_annotations (record_function scopes' starts and ends) equal the original's, and each
replayed event's entries carry the recorded time_us (every alloc and free_requested in order, on
a real trace with annotations), in the pickle and in the JSON snapshot. An annotation that is not
PyTorch's {stage, name, device, time_us} is left out, said on stderr, and the replay goes on.

usage: replay_annotations.py SYMPOOL DATA_DIR OUT_DIR
"""
import os
import pickle
import sys

from snaptest import replay_snapshot

SYMPOOL, DATA, OUT = sys.argv[1:4]
failures = []


def replay(trace, out):
    return replay_snapshot(SYMPOOL, trace, out)


def times(trace, action):
    return [e["time_us"] for e in trace if e["action"] == action]


path = os.path.join(DATA, "real/wedsonlin-training-aligned-pages.pickle")
with open(path, "rb") as f:
    rec = pickle.load(f)
assert len(rec["external_annotations"]) == 2, "the test trace has 2 annotations"
for ext in ("pickle", "json"):
    ours, _ = replay(path, os.path.join(OUT, "annotations-wedsonlin." + ext))
    if ours["external_annotations"] != rec["external_annotations"]:
        failures.append("%s: external_annotations %r, recorded %r" % (
            ext, ours["external_annotations"][:2], rec["external_annotations"][:2]))
    for a in ours["external_annotations"]:
        if list(a) != ["stage", "name", "device", "time_us"]:
            failures.append("%s: annotation keys %r, not PyTorch's order" % (ext, list(a)))
    for action in ("alloc", "free_requested"):
        want = times(rec["device_traces"][0], action)
        got = times(ours["device_traces"][0], action)
        if got != want:
            bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), len(got))
            failures.append("%s: %s times differ (%d of ours, %d recorded; first at %d)" % (
                ext, action, len(got), len(want), bad))

# Not PyTorch's shape (a test trace's annotation of other keys): left out, said, replay goes on.
odd, err = replay(os.path.join(DATA, "trace-small-u64.pickle"),
                  os.path.join(OUT, "annotations-u64.pickle"))
if odd["external_annotations"] != [] or "1 of 1 external_annotations" not in err:
    failures.append("u64: annotations %r, stderr %r" % (odd["external_annotations"], err))

if failures:
    sys.exit("replay-annotations: " + "\n".join(failures))
print("replay-annotations: ok")
