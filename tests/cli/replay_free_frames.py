#!/usr/bin/env python3
"""A replay's own snapshot keeps a free's recorded stack even where it is empty (issue 24 item
2). PyTorch recording at "all" gathers a context for every free; on a thread without Python
frames (the autograd engine's backward frees) that context is empty, not absent, so the entry
shows no frames and does not take its allocation's stack (3353 of 9134 frees of a real trace,
Athrun0109's memory_snapshot_False_ctx128, are so). Ours gave such frees their allocation's
stack. The trace here, made for the test: a block allocated with a stack and freed with none,
then allocated and freed again each with its own stack, and an empty_cache's segment_free with
no frames (as a PyTorch that wrote none for it recorded it).

usage: replay_free_frames.py SYMPOOL DATA_DIR OUT_DIR (DATA_DIR unused: the trace is made here)
"""
import os
import sys

from snaptest import replay_snapshot, writer

SYMPOOL, OUT = sys.argv[1], sys.argv[3]
write = writer(OUT)
SEG, MIB = 0x7F0000000000, 1 << 20


def stack(name):
    return [{"name": name, "filename": "train.py", "line": 7},
            {"name": "<module>", "filename": "train.py", "line": 1}]


def entry(action, addr, size, t, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": frames}


events = [
    entry("segment_alloc", SEG, 20 * MIB, 1, stack("forward")),
    entry("alloc", SEG, 4 * MIB, 2, stack("forward")),
    entry("free_requested", SEG, 4 * MIB, 3, []),  # a backward free: no Python frames
    entry("free_completed", SEG, 4 * MIB, 4, []),
    entry("alloc", SEG, 4 * MIB, 5, stack("step")),
    entry("free_requested", SEG, 4 * MIB, 6, stack("zero_grad")),
    entry("free_completed", SEG, 4 * MIB, 7, stack("zero_grad")),
    entry("segment_free", SEG, 20 * MIB, 8, []),  # the user's torch.cuda.empty_cache()
]
doc = {"segments": [], "device_traces": [events],
       "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}
trace = write("free-frames.pickle", doc)
ours = replay_snapshot(SYMPOOL, trace, os.path.join(OUT, "free-frames-ours.pickle"))[0]


def shown(entries):
    return [(e["action"], [f["name"] for f in e.get("frames") or []]) for e in entries]


got, want = shown(ours["device_traces"][0]), shown(events)
if got != want:
    sys.exit("replay-free-frames: ours %r\n  recorded %r" % (got, want))
print("replay-free-frames: ok")
