#!/usr/bin/env python3
"""replay --snapshot shows the streams the recording had: a trace with allocations on the default
stream and on two others (CUDA stream handles as PyTorch records them) replays to a snapshot
whose segments and trace entries carry those same values, not the replay's own stream handles
(which only said where the allocator's heap put them). argv: sympool, work dir."""
import json
import os
import pickle
import subprocess
import sys

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
STREAMS = [0, 94_558_021_403_520, 94_558_021_409_088]
entries = []
t = 0
for k in range(6):
    for i, s in enumerate(STREAMS):
        addr = (1 << 32) + (k * 3 + i) * (4 << 20)
        size = (1 + i) << 20  # large blocks: a segment each on each stream
        for action in ("alloc", "free_requested", "free_completed"):
            t += 1
            entries.append({"action": action, "addr": addr, "size": size, "stream": s,
                            "time_us": t, "frames": []})
snap = {"segments": [], "device_traces": [entries]}
src = os.path.join(work, "streams.pickle")
with open(src, "wb") as f:
    pickle.dump(snap, f)
for out in ("ours.pickle", "ours.json"):
    path = os.path.join(work, out)
    if os.path.exists(path):
        os.remove(path)
    r = subprocess.run([cli, "replay", src, "--snapshot", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"replay --snapshot {out}: rc {r.returncode}: {r.stderr}")
    if out.endswith(".json"):

        with open(path) as f:
            doc = json.load(f)
    else:
        with open(path, "rb") as f:
            doc = pickle.load(f)
    seen = {e["stream"] for e in doc["device_traces"][0]}
    segs = {s["stream"] for s in doc["segments"]}
    if seen != set(STREAMS):
        sys.exit(f"{out}: trace streams {sorted(seen)}, recorded {STREAMS}")
    if not segs <= set(STREAMS) or len(segs) != len(STREAMS):
        sys.exit(f"{out}: segment streams {sorted(segs)}, recorded {STREAMS}")
print("ok")
