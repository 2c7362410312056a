#!/usr/bin/env python3
"""Strings only Python's str holds: U+0000 and lone surrogates (what json.load makes of \\u0000,
\\ud800, \\udc00 escapes; what pickle.load makes of a 0 byte and 'surrogatepass' bytes). A snapshot
whose stacks carry them, as JSON and as pickle, is read by every command (the JSON reader refused
it), and replay --snapshot writes the same str back, as pickle and as JSON (U+0000 cut the pickle
path's strings short; lone surrogates became '?'), external annotations' stage and name and
trace entries' user_metadata too. And a str with a U+0000 is not the str before it (strcmp read
"alloc\\0x" as "alloc"). argv: sympool, work dir."""
import json
import os
import pickle
import subprocess
import sys

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
ODD = ["a\x00b", "\ud800", "x\udc00y", "\ud800A", "\ud800\U00010000", "\udc00\ud800", "\x00"]


def frames(tag):
    return [{"filename": f"{tag}{i}.py{s}", "line": i + 1, "name": s + tag}
            for i, s in enumerate(ODD)]


seg = 1 << 30
snap = {
    "segments": [{
        "device": 0, "address": seg, "total_size": 2 << 20, "allocated_size": 512,
        "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames("s"),
        "blocks": [{"address": seg, "size": 512, "requested_size": 500,
                    "state": "active_allocated", "frames": frames("b")},
                   {"address": seg + 512, "size": (2 << 20) - 512, "requested_size": 0,
                    "state": "inactive", "frames": []}]}],
    "device_traces": [[
        {"action": "alloc", "addr": seg + 4096, "size": 100, "stream": 0, "time_us": 1,
         "frames": frames("t"), "odd\x00key\ud800": "\udc00", "user_metadata": "m\x00d\ud800"},
        {"action": "free_requested", "addr": seg + 4096, "size": 100, "stream": 0,
         "time_us": 2, "frames": frames("u"), "user_metadata": "m\x00e"},
        {"action": "free_completed", "addr": seg + 4096, "size": 100, "stream": 0,
         "time_us": 3, "frames": frames("u")},
    ]],
    "allocator_settings": {},
    "external_annotations": [{"stage": s, "name": "n" + s, "device": 0, "time_us": i + 1}
                             for i, s in enumerate(ODD)],
}
inputs = {"in.json": json.dumps(snap).encode(), "in.pickle": pickle.dumps(snap, protocol=4)}
fails = []
for name, data in inputs.items():
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(data)
    for args in (["info", path], ["info", "--json", path], ["summary", path], ["replay", path],
                 ["replay", path, "--json"]):
        r = subprocess.run([cli] + args, capture_output=True)
        if r.returncode != 0:
            fails.append(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.decode()[:200]}")
    for out in ("out.pickle", "out.json"):
        dst = os.path.join(work, f"{name}.{out}")
        if os.path.exists(dst):
            os.unlink(dst)
        r = subprocess.run([cli, "replay", path, "--snapshot", dst], capture_output=True)
        if r.returncode != 0:
            fails.append(f"replay {name} --snapshot {out}: exit {r.returncode}: "
                         f"{r.stderr.decode()[:200]}")
            continue
        if out.endswith(".pickle"):
            with open(dst, "rb") as f:
                got = pickle.load(f)
        else:
            with open(dst, encoding="utf-8") as f:  # strict: escapes, no raw surrogate
                got = json.load(f)
        blocks = [b for s in got["segments"] for b in s["blocks"] if b["frames"]]
        events = [e for e in got["device_traces"][0] if e["action"] == "alloc"]
        if [b["frames"] for b in blocks] != [frames("b")]:
            fails.append(f"{name} -> {out}: block frames {ascii(blocks)[:300]}")
        if [e["frames"] for e in events] != [frames("t")]:
            fails.append(f"{name} -> {out}: alloc frames {ascii(events)[:300]}")
        # user_metadata whole (U+0000 cut it), and a text that differs from the one before it
        # only after its U+0000 is a new text (strcmp took it for the same one).
        metas = [(e["action"], e.get("user_metadata")) for e in got["device_traces"][0]]
        if metas[:2] != [("alloc", "m\x00d\ud800"), ("free_requested", "m\x00e")]:
            fails.append(f"{name} -> {out}: user_metadata {ascii(metas)[:300]}")
        # The external annotations' stage and name too (U+0000 cut them short there).
        if got["external_annotations"] != snap["external_annotations"]:
            fails.append(f"{name} -> {out}: external_annotations "
                         f"{ascii(got['external_annotations'])[:300]}")

# A str with a U+0000 in it is another str than the one before it: an action "alloc\0x", a state
# "active_allocated\0", a segment_type "small\0" read as any unknown string does ("allocx",
# "weird", "smallx"), not as "alloc", "active_allocated", "small" (strcmp's reading).
def nul_snap(action, state, stype):
    return {"segments": [{
        "device": 0, "address": seg, "total_size": 2 << 20, "allocated_size": 512,
        "active_size": 512, "requested_size": 500, "stream": 0, "segment_type": stype,
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [{"address": seg, "size": 512, "requested_size": 500, "state": state,
                    "frames": []},
                   {"address": seg + 512, "size": (2 << 20) - 512, "requested_size": 0,
                    "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": action, "addr": seg + 4096, "size": 100, "stream": 0, "time_us": 1},
            {"action": "free_requested", "addr": seg + 4096, "size": 100, "stream": 0,
             "time_us": 2}]],
        "allocator_settings": {}, "external_annotations": []}


def outputs(snap, sub, ext):
    d = os.path.join(work, sub)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "s." + ext)
    with open(path, "wb") as f:
        f.write(json.dumps(snap).encode() if ext == "json" else pickle.dumps(snap, protocol=4))
    res = []
    for args in (["info", "--json"], ["summary"], ["replay", "--json"]):
        r = subprocess.run([cli, args[0], path] + args[1:], capture_output=True, text=True)
        out = r.stdout.replace(path, "S")
        if args[0] == "replay":
            out = json.loads(out) if r.returncode == 0 else out
            if isinstance(out, dict):
                out.pop("ns_per_event", None)
        res.append((r.returncode, out))
    return res


for ext in ("json", "pickle"):
    a = outputs(nul_snap("alloc\x00x", "active_allocated\x00", "small\x00"), "nulls", ext)
    b = outputs(nul_snap("allocx", "weird", "smallx"), "other", ext)
    for (ra, oa), (rb, ob), what in zip(a, b, ("info", "summary", "replay")):
        if (ra, oa) != (rb, ob):
            fails.append(f"{what} {ext}: a str with a 0 byte reads unlike another unknown str")

for f in fails:
    print("FAIL", f)
print("ok" if not fails else f"{len(fails)} failures")
