#!/usr/bin/env python3
"""Compare two `sympool replay --snapshot` JSON files up to the host backend's addresses.

usage: norm_snapshot.py A.json B.json   (exit 0 and SAME when equal)

Each address becomes (segment number in order of appearance, offset), or for expandable
segments its distance from the lowest address seen; streams become their order of first
appearance. Every trace entry and the final segments with their blocks are compared.
"""
import json
import sys


def norm(path):
    with open(path) as f:
        d = json.load(f)
    tr = d["device_traces"][0] if d.get("device_traces") else []
    smap, segs, nid = {}, {}, [0]

    def st(s):
        return smap.setdefault(s, len(smap))

    exp = any(e["action"] == "segment_map" for e in tr)
    addrs = [e["addr"] for e in tr if "addr" in e] + [s["address"] for s in d["segments"]]
    lo = min(addrs) if addrs else 0

    def new_seg(base, size):
        segs[base] = (nid[0], size)
        nid[0] += 1

    def loc(a):
        if a == 0:
            return 0
        if exp:
            return ("x", a - lo)
        for b, (i, sz) in segs.items():
            if b <= a < b + sz:
                return (i, a - b)
        return ("?", a)

    made = {e["addr"] for e in tr if e["action"] == "segment_alloc"}
    for e in tr:  # segments of the starting state: freed but never made
        if e["action"] == "segment_free" and e["addr"] not in made and e["addr"] not in segs:
            new_seg(e["addr"], e["size"])
    for s in d["segments"]:
        if s["address"] not in made and s["address"] not in segs:
            new_seg(s["address"], s["total_size"])
    out = []
    for e in tr:
        act, a = e["action"], e.get("addr", 0)
        if act == "segment_alloc":
            new_seg(a, e["size"])
        out.append((act, loc(a), e.get("size", 0), st(e.get("stream", 0))))
        if act == "segment_free":
            segs.pop(a, None)
    fin = []
    for s in d["segments"]:
        base = s["address"]
        i = ("x", base - lo) if exp else segs.get(base, ("?",))[0]
        blocks = [(b["address"] - base, b["size"], b["requested_size"], b["state"])
                  for b in s["blocks"]]
        fin.append((str(i), s["total_size"], st(s["stream"]), s["segment_type"],
                    str(s["segment_pool_id"]), s["is_expandable"], blocks,
                    s["allocated_size"], s["active_size"], s["requested_size"]))
    fin.sort()
    return out, fin, d.get("allocator_settings")


a, b = norm(sys.argv[1]), norm(sys.argv[2])
if a == b:
    print("SAME", len(a[0]))
    sys.exit(0)
for k, (x, y) in enumerate(zip(a[0], b[0])):
    if x != y:
        print("trace differs at", k, x, y)
        break
if len(a[0]) != len(b[0]):
    print("trace lengths", len(a[0]), len(b[0]))
if a[1] != b[1]:
    print("final segments differ")
if a[2] != b[2]:
    print("settings differ")
sys.exit(1)
