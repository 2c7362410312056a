#!/usr/bin/env python3
"""Dicts of a few key lists taking turns (argv: sympool, work dir). The loader keeps the key
lists (shapes) of the last dicts it read key by key and reads a dict with one of them by
comparing the keys' addresses; a dict of another shape than the last one's must not keep a
value of a key only the last one had:
 - trace entries with "stream" and entries without it (the default stream) in turns: an entry
   without it that read the last one's stream would let an alloc on the default stream take a
   block freed on the side stream;
 - a final state's blocks without "requested_size" after their segments, which have one: a
   block that read its segment's would seed that many bytes instead of its size;
 - a block with "requested_size" between them;
 - blocks of one shape whose states differ ("active_allocated", then "inactive"): the loader
   knows a state str by its address, and an inactive block read as the active ones before it
   would count its bytes as live.
The figures are checked against what the snapshot means, and the replay's JSON against the same
replay read whole (--snapshot reads every stack, without the entry hook)."""
import json
import os
import sys

sys.dont_write_bytecode = True  # the shared helpers leave no cache in the source tree
from snaptest import runner, writer  # noqa: E402

cli, work = sys.argv[1], sys.argv[2]
write, run = writer(work), runner(cli)
MiB = 1 << 20
SEG = 0x7F00_0000_0000  # the trace's blocks
OLD = 0x7E00_0000_0000  # the final state's older segments, untouched by the trace
S7 = 0x7000  # a side stream's handle
frames = [{"name": "f", "filename": "x.py", "line": 1}]


def on_side(action, addr, t):  # the usual keys, on stream S7
    return {"action": action, "addr": addr, "size": 12 * MiB, "stream": S7, "time_us": t,
            "frames": frames}


def on_default(action, addr, t):  # "stream" replaced by "user_metadata": the default stream
    return {"action": action, "addr": addr, "size": 12 * MiB, "user_metadata": "",
            "time_us": t, "frames": frames}


# 12 MiB blocks are segments of their own. The block freed on S7 serves no alloc on the
# default stream: the replay makes three segments, not two.
entries = [on_side("alloc", SEG, 1),
           on_default("alloc", SEG + 12 * MiB, 2),
           on_side("free_requested", SEG, 3),
           on_side("free_completed", SEG, 4),
           on_default("alloc", SEG + 24 * MiB, 5)]


def block(addr, req=None, state="active_allocated"):
    b = {"address": addr, "size": 4 * MiB, "state": state, "frames": frames}
    if req is not None:
        b["requested_size"] = req
    return b


def segment(i, blk):  # requested_size 1 MiB, none of its block's
    return {"device": 0, "address": OLD + i * 4 * MiB, "total_size": 4 * MiB,
            "allocated_size": 4 * MiB, "active_size": 4 * MiB, "requested_size": 1 * MiB,
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": [blk]}


# Blocks without requested_size hold their size (4 MiB) requested, the one with it 3 MiB: 15 MiB
# live before the first event, not 9 MiB (the segments' 1 MiB in place of each missing one); the
# inactive block's segment holds no live bytes.
segments = [segment(0, block(OLD)),
            segment(1, block(OLD + 4 * MiB)),
            segment(2, block(OLD + 8 * MiB, req=3 * MiB)),
            segment(3, block(OLD + 12 * MiB)),
            segment(4, block(OLD + 16 * MiB, state="inactive"))]
path = write("turns.pickle", {"segments": segments, "device_traces": [entries]})

r = run("info", path, "--json")
if r.returncode != 0:
    sys.exit(f"info: rc {r.returncode}: {r.stdout}{r.stderr}")
info = r.stdout
if '"start_bytes": 15728640' not in info:
    sys.exit(f"info: the blocks' requested bytes before the first event are not 15 MiB:\n{info}")
r = run("replay", path, "--json")
if r.returncode != 0:
    sys.exit(f"replay: rc {r.returncode}: {r.stderr}")
fast = json.loads(r.stdout)
# Live at the peak: two 12 MiB blocks of the trace and the 15 MiB of the blocks before it.
want = {"num_device_alloc": 3, "trace_peak_requested_bytes": 24 * MiB + 15 * MiB}
got = {k: fast.get(k) for k in want}
if got != want:
    sys.exit(f"replay: {got}, not {want}:\n{r.stdout}")
r = run("replay", path, "--json", "--snapshot", os.path.join(work, "ours.pickle"))
if r.returncode != 0:
    sys.exit(f"replay --snapshot: rc {r.returncode}: {r.stderr}")
whole = json.loads(r.stdout)
for j in (fast, whole):
    j.pop("ns_per_event", None)
if fast != whole:
    sys.exit(f"the dicts read as the hook reads them:\n{fast}\nand whole:\n{whole}")
print("ok")
