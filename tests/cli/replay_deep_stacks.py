#!/usr/bin/env python3
"""A replay's own snapshot keeps every frame of a deep recorded stack (issue 24 item 2). PyTorch
keeps every frame; real traces have Python stacks of 263 (ftcourse's memory_snapshot) and 303
(code_location) frames, which ours cut to the 256 a frames hook was asked for. The trace here,
made for the test: allocs and frees with stacks of 255 to 1100 frames (a stack of exactly 256 or
1024 fills the hook's first or second buffer: asked again, it must come back whole too).

usage: replay_deep_stacks.py SYMPOOL DATA_DIR OUT_DIR (DATA_DIR unused: the trace is made here)
"""
import os
import sys

from snaptest import replay_snapshot, writer

SYMPOOL, OUT = sys.argv[1], sys.argv[3]
write = writer(OUT)
SEG, MIB = 0x7F0000000000, 1 << 20
DEPTHS = (255, 256, 257, 303, 1024, 1100)


def stack(depth, tag):
    return [{"name": "%s_%d" % (tag, k), "filename": "model.py", "line": k + 1}
            for k in range(depth)]


events = [{"action": "segment_alloc", "addr": SEG, "size": 20 * MIB, "stream": 0,
           "time_us": 1, "frames": stack(DEPTHS[0], "a")}]  # the first alloc's: it made it
t = 2
for depth in DEPTHS:
    for action in ("alloc", "free_requested", "free_completed"):
        tag = "a" if action == "alloc" else "f"
        events.append({"action": action, "addr": SEG, "size": 4 * MIB, "stream": 0,
                       "time_us": t, "frames": stack(depth, tag)})
        t += 1
final = [{"device": 0, "address": SEG, "total_size": 20 * MIB, "allocated_size": 0,
          "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
          "segment_pool_id": (0, 0), "is_expandable": False,
          "blocks": [{"address": SEG, "size": 20 * MIB, "requested_size": 4 * MIB,
                      "state": "inactive", "frames": []}]}]
doc = {"segments": final, "device_traces": [events],
       "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}
trace = write("deep-stacks.pickle", doc)
ours = replay_snapshot(SYMPOOL, trace, os.path.join(OUT, "deep-stacks-ours.pickle"))[0]


def shown(entries):
    return [(e["action"], [(f["name"], f["line"]) for f in e.get("frames") or []])
            for e in entries]


got, want = shown(ours["device_traces"][0]), shown(events)
bad = ["%s #%d: %d frames, recorded %d" % (w[0], k, len(g[1]), len(w[1]))
       for k, (g, w) in enumerate(zip(got, want)) if g != w]
if len(got) != len(want):
    bad.append("%d entries, recorded %d" % (len(got), len(want)))
if bad:
    sys.exit("replay-deep-stacks: " + "; ".join(bad))
print("replay-deep-stacks: ok")
