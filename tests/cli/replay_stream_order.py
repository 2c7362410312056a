#!/usr/bin/env python3
"""replay orders a trace's streams as the recording did, whatever the heap. The free set orders
blocks by (stream, size, address) with the stream compared by handle, as PyTorch's compared
cudaStream_t values; the host backend's handles were heap addresses, made where the replay first
used each stream, so the replay ordered streams by first use and by where malloc put them.

1. Faithful: two segments, one on each of two streams, the stream with the larger recorded value
   used first, then an empty_cache. PyTorch releases the cached segments in the free set's
   order, so the smaller value's segment first: the replay's snapshot must show its
   segment_free entries in that order.
2. Deterministic: random traces with several streams (scripts/replay_diff/gen_trace.py, mode 1)
   replayed twice, the second time with malloc serving every request by mmap
   (MALLOC_MMAP_THRESHOLD_=0: heap structs at other, descending addresses), must give the same
   `replay --json` and the same snapshot up to the host backend's addresses (norm_snapshot.py).
   Under a sanitizer's allocator the variable changes nothing and this part checks nothing.

argv: sympool, work dir."""
import json
import os
import subprocess
import sys

cli, work = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
tools = os.path.join(here, "..", "..", "scripts", "replay_diff")
os.makedirs(work, exist_ok=True)


def run(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([cli] + args, capture_output=True, text=True, env=e)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)}: rc {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


# 1. The larger stream value first used, then the smaller; both segments freed by empty_cache.
HI, LO = 0x7F00_0000_1000, 0x5500_0000_2000
seg = 20 << 20  # a large segment each (above the 10 MiB rounding)
entries, t = [], 0


def entry(action, addr, size, stream):
    global t
    t += 1
    entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                    "time_us": t, "frames": []})


base = 1 << 36
for i, s in enumerate((HI, LO)):
    entry("segment_alloc", base + i * seg, seg, s)
    entry("alloc", base + i * seg, seg, s)
for i, s in enumerate((HI, LO)):
    entry("free_requested", base + i * seg, seg, s)
    entry("free_completed", base + i * seg, seg, s)
# PyTorch's empty_cache walks the free set: the smaller stream value's segment goes first.
for i, s in sorted(enumerate((HI, LO)), key=lambda x: x[1]):
    entry("segment_free", base + i * seg, seg, s)
src = os.path.join(work, "order.json")
with open(src, "w") as f:
    json.dump({"segments": [], "device_traces": [entries]}, f)
out = os.path.join(work, "order-ours.json")
run(["replay", src, "--snapshot", out])
with open(out) as f:
    ours = json.load(f)
freed = [e["stream"] for e in ours["device_traces"][0] if e["action"] == "segment_free"]
if freed != [LO, HI]:
    sys.exit(f"segment_free streams {[hex(s) for s in freed]}, recorded {[hex(LO), hex(HI)]}")

# 2. The same outputs under another heap layout.
for seed in (5, 7, 11):
    trace = os.path.join(work, f"gen{seed}.json")
    subprocess.run([sys.executable, os.path.join(tools, "gen_trace.py"), str(seed), "3000",
                    trace, "1"], check=True)
    outs = []
    for k, env in enumerate(({}, {"MALLOC_MMAP_THRESHOLD_": "0"})):
        snap = os.path.join(work, f"gen{seed}-{k}.json")
        text = run(["replay", trace, "--json", "-s", snap], env)
        doc = json.loads(text)
        doc.pop("ns_per_event", None)
        outs.append((doc, snap))
    if outs[0][0] != outs[1][0]:
        sys.exit(f"seed {seed}: replay --json differs with another heap layout")
    r = subprocess.run([sys.executable, os.path.join(tools, "norm_snapshot.py"), outs[0][1],
                        outs[1][1]], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"seed {seed}: the snapshot differs with another heap layout: "
                 f"{r.stdout[-1000:]}{r.stderr[-1000:]}")
print("ok")
