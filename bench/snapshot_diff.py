#!/usr/bin/env python3
"""Compare a replay's own snapshot with the PyTorch snapshot it replayed, for what PyTorch's
memory viewer (MemoryViz.js) shows: each device's trace entry for entry and the final state's
segments and blocks. Prints one JSON line per trace: {"trace", "differences": {kind: count}, ...}.

usage: snapshot_diff.py ORIGINAL OURS [--sympool SYMPOOL]
       snapshot_diff.py --replay SYMPOOL TRACE... (replays each into a temporary snapshot first)

Entries are paired by kind: the k-th alloc of ours with the k-th alloc of the original, the k-th
free_completed with the k-th, and so on (a replay makes the same requests in the same order, so
allocs and frees pair one to one; what the allocator did on its own -- segments, completions --
pairs when both did the same; an action whose counts differ is paired by relative address and
size instead, so that one entry more on one side does not shift every pair after it). Kinds:
  devices             device_traces lists that differ in count (only empty ones: "devices.empty")
  order               the action sequences differ (first index counted once per device)
  count.ACTION        |ours - theirs| entries of that action
  ACTION.FIELD        paired entries whose FIELD differs (addr: once the segments' offset, the
                      most common difference of the pairs' addresses, is taken off; frames:
                      the list of {name, filename, line}; keys: the set of keys)
  segments.count / segment.FIELD / block.FIELD: the final state, paired by address order
                      (or, where fewer differ so, by device, pool, type and size: then
                      segment.layout counts the segments out of the recorded address order)
  top.KEY             a top-level key's presence or (external_annotations) value
"""
import collections
import difflib
import json
import os
import pickle
import subprocess
import sys
import tempfile

FIELDS = ("size", "stream", "time_us", "frames", "pool_id", "user_metadata", "compile_context",
          "device_free")
SEG_FIELDS = ("device", "total_size", "allocated_size", "active_size", "requested_size",
              "stream", "segment_type", "segment_pool_id", "is_expandable", "frames")
BLOCK_FIELDS = ("size", "requested_size", "state", "frames")


def load(path):
    with open(path, "rb") as f:
        head = f.read(1)
        f.seek(0)
        doc = json.load(f) if head in (b"{", b"[") else pickle.load(f)
    if isinstance(doc, list):  # the legacy format: the segments alone
        doc = {"segments": doc, "device_traces": []}
    return doc


def norm_frames(fr):
    return [(f.get("name"), f.get("filename"), f.get("line")) for f in (fr or [])]


def value(e, k):
    if k == "frames":
        return norm_frames(e.get("frames"))
    v = e.get(k)
    return tuple(v) if isinstance(v, list) else v


def common_delta(pairs, key):
    c = collections.Counter(t.get(key, 0) - o.get(key, 0) for o, t in pairs)
    return c.most_common(1)[0][0] if c else 0


def diff_trace(ours, theirs, out, examples):
    if [e["action"] for e in ours] != [e["action"] for e in theirs]:
        out["order"] += 1
        i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a["action"] != b["action"]),
                 min(len(ours), len(theirs)))
        examples.setdefault("order", "entry %d: ours %s, theirs %s" % (
            i, ours[i]["action"] if i < len(ours) else "-",
            theirs[i]["action"] if i < len(theirs) else "-"))
    by = collections.defaultdict(lambda: ([], []))
    for e in ours:
        by[e["action"]][0].append(e)
    for e in theirs:
        by[e["action"]][1].append(e)
    pairs_all = [p for a in by for p in zip(*by[a]) if len(by[a][0]) == len(by[a][1])]
    delta = common_delta(pairs_all or [p for a in by for p in zip(*by[a])], "addr")
    for action, (o_list, t_list) in sorted(by.items()):
        pairs = list(zip(o_list, t_list))
        if len(o_list) != len(t_list):
            out["count." + action] += abs(len(o_list) - len(t_list))
            examples.setdefault("count." + action, "ours %d, theirs %d" % (len(o_list),
                                                                          len(t_list)))
            # Paired by what they are (relative address, size), not by rank: one entry more
            # on one side would shift every pair after it.
            ko = [(e.get("addr", 0) + delta, e.get("size")) for e in o_list]
            kt = [(e.get("addr", 0), e.get("size")) for e in t_list]
            m = difflib.SequenceMatcher(None, ko, kt, autojunk=False)
            pairs = [(o_list[b.a + i], t_list[b.b + i]) for b in m.get_matching_blocks()
                     for i in range(b.size)]
        for k, (o, t) in enumerate(pairs):
            if set(o) != set(t):
                kind = "%s.keys" % action
                out[kind] += 1
                examples.setdefault(kind, "ours-only %s, theirs-only %s" % (
                    sorted(set(o) - set(t)), sorted(set(t) - set(o))))
            # a snapshot's addr is 0, an oom's the device's free bytes: no address to place
            if action not in ("snapshot", "oom") and t.get("addr", 0) - o.get("addr", 0) != delta:
                out[action + ".addr"] += 1
            for f in FIELDS:
                if f in o and f in t and value(o, f) != value(t, f):
                    kind = "%s.%s" % (action, f)
                    out[kind] += 1
                    if f != "frames":
                        examples.setdefault(kind, "#%d ours %r theirs %r" % (k, o[f], t[f]))
                    else:
                        examples.setdefault(kind, "#%d ours %d frames, theirs %d" % (
                            k, len(o[f] or []), len(t[f] or [])))
    return delta


def diff_segment_pairs(o_s, t_s, out, examples, tally):
    pairs = list(zip(o_s, t_s))
    delta = common_delta(pairs, "address")
    for o, t in pairs:
        if t["address"] - o["address"] != delta:
            out["segment.address"] += 1
        for f in SEG_FIELDS:
            if value(o, f) != value(t, f):
                out["segment." + f] += 1
                if f != "frames":
                    examples.setdefault("segment." + f, "ours %r theirs %r" % (o.get(f),
                                                                              t.get(f)))
        ob, tb = o.get("blocks", []), t.get("blocks", [])
        if len(ob) != len(tb):
            out["block.count"] += abs(len(ob) - len(tb))
        for x, y in zip(ob, tb):
            if y["address"] - x["address"] != t["address"] - o["address"]:
                out["block.address"] += 1
            if x.get("state") == y.get("state") == "inactive" and x["size"] == y["size"]:
                # agreements too, not only differences: how often PyTorch's rule held
                tally["compared"] += 1
                xr, yr = x.get("requested_size"), y.get("requested_size")
                tally["equal" if xr == yr else "theirs_0" if yr == 0 else
                      "ours_0" if xr == 0 else "both_nonzero_differ"] += 1
            for f in BLOCK_FIELDS:
                if value(x, f) != value(y, f):
                    out["block." + f] += 1
                    if f != "frames":
                        examples.setdefault("block." + f, "ours %r theirs %r" % (x.get(f),
                                                                                y.get(f)))


def diff_segments(ours, theirs, out, examples, tally):
    """Segments paired in address order; where that pairs unlike segments (a layout other than
    the recorded one), paired by (device, pool, size, address) instead, and each segment whose
    place in the address order differs counted once as segment.layout."""
    if len(ours) != len(theirs):
        out["segments.count"] += abs(len(ours) - len(theirs))
        examples.setdefault("segments.count", "ours %d, theirs %d" % (len(ours), len(theirs)))
    by_addr = lambda s: (s.get("device", 0), s["address"])
    by_kind = lambda s: (s.get("device", 0), tuple(s.get("segment_pool_id") or (0, 0)),
                         s.get("segment_type"), s["total_size"], s["address"])
    best = None
    for key in (by_addr, by_kind):
        c, ex, ta = collections.Counter(), {}, collections.Counter()
        diff_segment_pairs(sorted(ours, key=key), sorted(theirs, key=key), c, ex, ta)
        if best is None or sum(c.values()) < sum(best[0].values()):
            best = (c, ex, key, ta)
    c, ex, key, ta = best
    tally.update(ta)
    if key is by_kind:
        # which segments sit elsewhere in the address order than their counterparts
        o_kinds = [by_kind(s)[:4] for s in sorted(ours, key=by_addr)]
        t_kinds = [by_kind(s)[:4] for s in sorted(theirs, key=by_addr)]
        c["segment.layout"] += sum(1 for a, b in zip(o_kinds, t_kinds) if a != b)
        ex.setdefault("segment.layout", "segments in another address order (paired by kind)")
    out.update(c)
    for k, v in ex.items():
        examples.setdefault(k, v)


def compare(orig, ours_path):
    theirs, ours = load(orig), load(ours_path)
    out, examples = collections.Counter(), {}
    for k in sorted(set(theirs) | set(ours)):
        if (k in theirs) != (k in ours):
            out["top." + k] += 1
            examples.setdefault("top." + k, "ours %s, theirs %s" % (k in ours, k in theirs))
    if theirs.get("external_annotations", []) != ours.get("external_annotations", []):
        out["top.external_annotations"] += 1
    ot, tt = ours.get("device_traces", []), theirs.get("device_traces", [])
    if len(ot) != len(tt):
        # Only lists without entries on one side: a viewer's device menu shows them all.
        extra = ot[len(tt):] if len(ot) > len(tt) else tt[len(ot):]
        kind = "devices.empty" if all(len(x) == 0 for x in extra) else "devices"
        out[kind] += 1
        examples.setdefault(kind, "ours %d lists, theirs %d" % (len(ot), len(tt)))
    for o, t in zip(ot, tt):
        diff_trace(o, t, out, examples)
    tally = collections.Counter()
    diff_segments(ours.get("segments", []), theirs.get("segments", []), out, examples, tally)
    entries = sum(len(x) for x in tt)
    # inactive blocks paired with an inactive block of the same size: how many show the same
    # requested_size, and of those that do not, which side wrote 0
    return {"trace": orig, "entries": entries, "differences": dict(sorted(out.items())),
            "inactive_requested": dict(sorted(tally.items())), "examples": examples}


def replay(sympool, trace, out):
    env = dict(os.environ, SYMPOOL_DEVICE="host")
    r = subprocess.run([sympool, "replay", trace, "--snapshot", out], capture_output=True,
                       text=True, env=env)
    return r.returncode, r.stderr.strip()


def main(argv):
    if len(argv) >= 3 and argv[0] == "--replay":
        sympool = argv[1]
        with tempfile.TemporaryDirectory() as tmp:
            for trace in argv[2:]:
                snap = os.path.join(tmp, "ours.pickle")
                rc, err = replay(sympool, trace, snap)
                if rc != 0:
                    print(json.dumps({"trace": trace, "replay_failed": err[-300:]}))
                    continue
                print(json.dumps(compare(trace, snap)), flush=True)
        return 0
    if len(argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(compare(argv[0], argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
