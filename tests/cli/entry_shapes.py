#!/usr/bin/env python3
"""Trace entries whose keys change from one entry to the next (argv: sympool, work dir). The
loader reads an entry whose keys are the previous entry's, in its order, by comparing the keys'
addresses (take_entry's shape); every other entry is read key by key. Each entry here must read
as itself, never with a value the entry before it had:
 - the same keys in another order, and with a key the previous entry lacked in place of one it
   had (a stream only the earlier entry named: the later one is on the default stream);
 - a key given twice (the last value wins, as for Python) after entries without it, and before
   entries without it again;
 - a final state's blocks of differing keys (one without requested_size) between them.
The figures are checked against what the snapshot means, and the replay's JSON against the
same replay read whole (--snapshot reads every stack, without the entry hook)."""
import json
import os
import sys

sys.dont_write_bytecode = True  # the shared helpers leave no cache in the source tree
from snaptest import runner, writer  # noqa: E402

cli, work = sys.argv[1], sys.argv[2]
write, run = writer(work), runner(cli)
MiB = 1 << 20
SEG = 0x7F00_0000_0000
S7 = 0x7000  # a side stream's handle

frames = [{"name": "f", "filename": "x.py", "line": 1}]
entries = [
    # the usual order, on stream S7
    {"action": "segment_alloc", "addr": SEG, "size": 20 * MiB, "stream": S7, "time_us": 1,
     "frames": frames},
    {"action": "alloc", "addr": SEG, "size": 4 * MiB, "stream": S7, "time_us": 2,
     "frames": frames},
    # the same count of keys, "stream" replaced by "user_metadata": the default stream
    {"action": "alloc", "addr": SEG + 4 * MiB, "size": 4 * MiB, "user_metadata": "",
     "time_us": 3, "frames": frames},
    # "size" given twice (a pickler writes each key once; a dict read whole takes the last):
    # written as "sizX" and made "size" in the bytes below, after its first value
    {"action": "alloc", "addr": SEG + 8 * MiB, "sizX": 1, "stream": S7, "time_us": 4,
     "frames": frames, "size": 2 * MiB},
    # the usual keys in another order
    {"size": 4 * MiB, "addr": SEG, "action": "free_requested", "time_us": 5, "stream": S7,
     "frames": frames},
    {"size": 4 * MiB, "addr": SEG, "action": "free_completed", "time_us": 6, "stream": S7,
     "frames": frames},
    {"action": "free_requested", "addr": SEG + 8 * MiB, "size": 2 * MiB, "stream": S7,
     "time_us": 7, "frames": frames},
    {"action": "free_completed", "addr": SEG + 8 * MiB, "size": 2 * MiB, "stream": S7,
     "time_us": 8, "frames": frames},
]
blocks = [{"address": SEG, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "inactive",
           "frames": []},
          {"address": SEG + 4 * MiB, "size": 4 * MiB, "state": "active_allocated",
           "requested_size": 4 * MiB, "frames": frames},
          {"address": SEG + 8 * MiB, "size": 12 * MiB, "state": "inactive", "frames": []}]
doc = {"segments": [{"device": 0, "address": SEG, "total_size": 20 * MiB, "stream": S7,
                     "segment_type": "large", "blocks": blocks}],
       "device_traces": [entries]}
path = write("shapes.pickle", doc)
with open(path, "rb") as f:
    data = f.read()
if data.count(b"\x8c\x04sizX") != 1:
    sys.exit("the pickle does not hold the placeholder key once")
with open(path, "wb") as f:
    f.write(data.replace(b"\x8c\x04sizX", b"\x8c\x04size"))

r = run("info", path)
if r.returncode != 0 or "streams: 2 (the default stream included)" not in r.stdout:
    sys.exit(f"info: rc {r.returncode}: {r.stdout}{r.stderr}")
if "events: 8, alloc 3, free_requested 2, free_completed 2, segment_alloc 1" not in r.stdout:
    sys.exit(f"info events: {r.stdout}")
r = run("replay", path, "--json")
if r.returncode != 0:
    sys.exit(f"replay: rc {r.returncode}: {r.stderr}")
fast = json.loads(r.stdout)
# The three allocs live at once: 4 + 4 + 2 MiB (the last one's size is its second value).
if fast["trace_peak_requested_bytes"] != 10 * MiB or fast["peak_requested_bytes"] != 10 * MiB:
    sys.exit(f"replay peaks: {r.stdout}")
r = run("replay", path, "--json", "--snapshot", os.path.join(work, "ours.pickle"))
if r.returncode != 0:
    sys.exit(f"replay --snapshot: rc {r.returncode}: {r.stderr}")
whole = json.loads(r.stdout)
for j in (fast, whole):
    j.pop("ns_per_event", None)
if fast != whole:
    sys.exit(f"the entries read as the hook reads them:\n{fast}\nand whole:\n{whole}")
print("ok")
