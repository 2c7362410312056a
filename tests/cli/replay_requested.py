#!/usr/bin/env python3
"""A replay's own snapshot shows each inactive block's requested_size as the original does
(issue 24 item 2): PyTorch keeps the last request on a free block (the freed block's, kept by
the block it merges into; a split's remainder keeps the found block's, 0 for a new segment's,
even more than its own size), not 0. One trace made here: a small segment the trace makes,
whose blocks are freed and merged, and two segments from before the trace began, whose free
space no event touches: the replay's starting state gives that free space the requested size
the original shows.

usage: replay_requested.py SYMPOOL DATA_DIR OUT_DIR
"""
import os
import sys

from snaptest import entry, replay_snapshot, writer

SYMPOOL, DATA, OUT = sys.argv[1:4]
MiB = 1 << 20
A = 0x7f0000000000  # the trace's segment (small)
L = A + 64 * MiB    # a large segment from before the trace
S = A + 128 * MiB   # a small one from before the trace


def block(size, req, state):
    return {"size": size, "requested_size": req, "state": state, "frames": []}


def segment(addr, kind, blocks, stream=0):
    live = [b for b in blocks if b["state"] != "inactive"]
    addr_at = addr
    for b in blocks:
        b["address"] = addr_at
        addr_at += b["size"]
    return {"device": 0, "address": addr, "total_size": addr_at - addr,
            "allocated_size": sum(b["size"] for b in live),
            "active_size": sum(b["size"] for b in live),
            "requested_size": sum(b["requested_size"] for b in live), "stream": stream,
            "segment_type": kind, "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "blocks": blocks}


trace = [entry("segment_alloc", A, 2 * MiB, 1),
         entry("alloc", A, 1000, 2), entry("alloc", A + 1024, 3000, 3),
         entry("alloc", A + 4096, 700, 4),
         entry("free_requested", A + 1024, 3000, 5), entry("free_completed", A + 1024, 3000, 6),
         entry("free_requested", A, 1000, 7), entry("free_completed", A, 1000, 8)]
doc = {"segments": [
    # a's free merged into b's free block: a's request; the fresh segment's remainder: 0
    segment(A, "small", [block(4096, 1000, "inactive"), block(1024, 700, "active_allocated"),
                         block(2 * MiB - 5120, 0, "inactive")]),
    # from before the trace: a free remainder that kept a larger block's request, and 0
    segment(L, "large", [block(2 * MiB, 2 * MiB, "active_allocated"),
                         block(4 * MiB, 5000000, "inactive"),
                         block(2 * MiB, 2 * MiB, "active_allocated"),
                         block(12 * MiB, 0, "inactive")]),
    # on another stream: its free space cannot take the trace's requests
    segment(S, "small", [block(512, 500, "active_allocated"), block(1536, 777, "inactive"),
                         block(512, 400, "active_allocated"),
                         block(2 * MiB - 2560, 123456, "inactive")], stream=7)],
    "device_traces": [trace]}
src = writer(OUT)("requested-input.pickle", doc)


def inactive(d):
    """(segment type, stream, segment size, block offset, block size, requested_size) of every
    inactive block (the replay places segments elsewhere: each is told by its kind)."""
    out = []
    for s in d["segments"]:
        at = s["address"]
        for b in s["blocks"]:
            if b["state"] == "inactive":
                out.append((s["segment_type"], s["stream"] != 0, s["total_size"],
                            at - s["address"], b["size"], b["requested_size"]))
            at += b["size"]
    return sorted(out)


ours = replay_snapshot(SYMPOOL, src, os.path.join(OUT, "requested-ours.pickle"))[0]
want, got = inactive(doc), inactive(ours)
failures = ["%s segment of %d bytes, block at +%d (%d bytes): ours %r, recorded %r" % (
    w[0], w[2], w[3], w[4], g[5] if g[:5] == w[:5] else g, w[5])
    for w, g in zip(want, got) if g != w]
if len(got) != len(want):
    failures.append("%d inactive blocks, recorded %d" % (len(got), len(want)))
if failures:
    sys.exit("replay-requested: " + "\n".join(failures))
print("replay-requested: ok")
