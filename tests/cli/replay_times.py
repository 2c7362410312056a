#!/usr/bin/env python3
"""A replay's own snapshot carries the recorded time of every entry the trace has a counterpart
for (issue 24 item 2), not only of the allocs and frees it replays: an immediate free's
free_completed its own (recorded some microseconds after its free_requested), a segment_alloc its
own (recorded before the alloc that needed it), a deferred free's free_completed its own (recorded
at a later malloc), an empty_cache's segment frees each their own, in PyTorch's order (the large
pool's by size, then the small pool's). trace-times-tiny.json has each of them; on it our entries
equal the recorded ones in action, size and time, one for one. On real traces: every
free_completed and segment_alloc time, and (an empty_cache of 287 segments) every segment_free's
time, size and relative address; and the recorded run's own snapshots' `snapshot` entries.

usage: replay_times.py SYMPOOL DATA_DIR OUT_DIR
"""
import os
import sys

from snaptest import load, replay_snapshot

SYMPOOL, DATA, OUT = sys.argv[1:4]
failures = []


def replay(trace, out):
    return replay_snapshot(SYMPOOL, trace, out)[0]


def entries(doc, keys):
    return [tuple(e[k] for k in keys) for e in doc["device_traces"][0]]


def first_diff(got, want):
    return next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))


# The tiny trace: every entry of ours is the recorded one (action, size, time), in both formats.
tiny = os.path.join(DATA, "trace-times-tiny.json")
rec = load(tiny)
for ext in ("json", "pickle"):
    ours = replay(tiny, os.path.join(OUT, "times-tiny." + ext))
    keys = ("action", "size", "time_us")
    got, want = entries(ours, keys), entries(rec, keys)
    if got != want:
        i = first_diff(got, want)
        failures.append("tiny %s: entry %d: ours %r, recorded %r" % (
            ext, i, got[i] if i < len(got) else None, want[i] if i < len(want) else None))

# Real traces: the allocator's own entries carry the recorded times.
REAL = (("real/wedsonlin-training-aligned-pages.pickle", ("free_completed",)),
        ("cs336-2.7b-ctx128-forward-bf16.pickle", ("free_completed", "segment_alloc")),
        ("real/sqattn-empty-cache.pickle", ("free_completed", "segment_alloc", "segment_free")))
for name, actions in REAL:
    path = os.path.join(DATA, name)
    rec = load(path)
    ours = replay(path, os.path.join(OUT, "times-" + os.path.basename(name)))
    for action in actions:
        want = [e["time_us"] for e in rec["device_traces"][0] if e["action"] == action]
        got = [e["time_us"] for e in ours["device_traces"][0] if e["action"] == action]
        if got != want or not want:
            failures.append("%s: %s times differ (%d of ours, %d recorded; first at %d)" % (
                name, action, len(got), len(want), first_diff(got, want)))

# An empty_cache's segment frees in PyTorch's order: sizes and addresses relative to the first
# segment freed equal the recorded ones (sqattn's 420 frees, in runs of up to 50 segments).
rec = load(os.path.join(DATA, "real/sqattn-empty-cache.pickle"))
ours = load(os.path.join(OUT, "times-sqattn-empty-cache.pickle"))
frees = [[(e["size"], e["addr"]) for e in doc["device_traces"][0] if e["action"] == "segment_free"]
         for doc in (ours, rec)]
rel = [[(s, a - f[0][1]) for s, a in f] for f in frees]
if rel[0] != rel[1]:
    failures.append("sqattn: segment_free sizes/addresses differ from entry %d" % first_diff(*rel))

# The recorded run's own snapshots (9 `snapshot` entries, the user's mid-run snapshots): ours has
# them at the same places, with their times and the active bytes then.
path = os.path.join(DATA, "real/eor-nn-small-peak.pickle")
rec = load(path)
ours = replay(path, os.path.join(OUT, "times-eor.pickle"))
keys = ("action", "size", "time_us")
marks = [[(i, e["size"], e["time_us"]) for i, e in enumerate(doc["device_traces"][0])
          if e["action"] == "snapshot"] for doc in (ours, rec)]
if marks[0] != marks[1] or len(marks[1]) != 9:
    failures.append("eor: snapshot entries %r, recorded %r" % (marks[0][:2], marks[1][:2]))

if failures:
    sys.exit("replay-times: " + "\n".join(failures))
print("replay-times: ok")
