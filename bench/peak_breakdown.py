#!/usr/bin/env python3
"""peak_breakdown.py: where a replay's reserved but unallocated bytes lie at its peak of live
bytes, starting state included (issue 25, session 29).

    sympool replay TRACE --conf expandable_segments:True --snapshot OUT.pickle
    python3 bench/peak_breakdown.py OUT.pickle [NAME]

bench/peak_waste.py replays the trace entries forward from nothing, so a trace that starts from
a requested starting state (a cut recording: its blocks are made before the replay records)
shows none of the starting blocks. This walks backward instead, from the snapshot's own final
segments and blocks, undoing every entry after the peak, so every live block is there. The peak
is the entry where the live bytes peak (of equal peaks, the most mapped); at it, it prints one
JSON line: mapped pages, pages the live blocks touch, whole free pages, partly used pages and
their free MiB (pages that hold a block of 1 MiB or less, PyTorch's small sizes, or only larger
ones; by segment type and stream), the holes (free ranges inside mapped runs) by their
neighbours (L: a block over 1 MiB, S: 1 MiB or less, -: the end of a mapped run), and the free
MiB at the ends of mapped runs against inside holes. Pages are counted from each segment's
base, not from address 0 (the host backend's reservations are not 2 MiB aligned). Device 0.
"""
import bisect
import collections
import json
import pickle
import sys

PAGE = 2 << 20
MIB = 1 << 20


def final_state(snap):
    """The snapshot's mapped pages (by segment base), live blocks and segment ranges."""
    segs = [g for g in snap["segments"] if g["device"] == 0]
    trace = snap["device_traces"][0]
    # Page grid: every mapped range starts on a page of its segment, so the nearest map entry or
    # segment start below an address gives the grid's offset there.
    anchors = sorted({e["addr"] for e in trace if e["action"].startswith("segment_")} |
                     {g["address"] for g in segs})

    def page_of(a):
        i = max(bisect.bisect_right(anchors, a) - 1, 0)
        return a - (a - anchors[i] % PAGE) % PAGE

    mapped, blocks, ranges = set(), {}, []
    for g in segs:
        mapped.update(range(g["address"], g["address"] + g["total_size"], PAGE))
        ranges.append((g["address"], g["address"] + g["total_size"], g["segment_type"],
                       g["stream"]))
        for b in g["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = b["size"]
    return trace, page_of, mapped, blocks, ranges


def rewind(trace, mapped, blocks):
    """Undo the entries after the live peak; returns its index."""
    pages, live = len(mapped), sum(blocks.values())
    after = []
    for e in reversed(trace):  # (live, mapped pages) after each entry, last first
        after.append((live, pages))
        a, k = e["action"], e["size"] // PAGE
        pages += {"segment_map": -k, "segment_unmap": k}.get(a, 0)
        live += {"alloc": -e["size"], "free_completed": e["size"]}.get(a, 0)
    after.reverse()
    at = max(range(len(trace)), key=lambda i: after[i])
    for e in reversed(trace[at + 1:]):
        a, span = e["action"], range(e["addr"], e["addr"] + e["size"], PAGE)
        if a == "segment_map":
            mapped.difference_update(span)
        elif a == "segment_unmap":
            mapped.update(span)
        elif a == "alloc":
            blocks.pop(e["addr"], None)
        elif a == "free_completed":
            blocks[e["addr"]] = e["size"]
    return at


def holes_of(mapped, items):
    """Free ranges inside the mapped runs, with their left and right live neighbours' sizes."""
    addrs = [a for a, _ in items]
    runs = []
    for p in sorted(mapped):
        if runs and runs[-1][1] == p:
            runs[-1][1] = p + PAGE
        else:
            runs.append([p, p + PAGE])
    out = []
    for lo, hi in runs:
        i = bisect.bisect_left(addrs, lo)
        if i > 0 and addrs[i - 1] + items[i - 1][1] > lo:
            i -= 1
        pos, left = lo, None
        while i < len(items) and items[i][0] < hi:
            a, size = items[i]
            if a > pos:
                out.append((pos, a, left, size))
            pos, left = max(pos, a + size), size
            i += 1
        if pos < hi:
            out.append((pos, hi, left, None))
    return out


def main():
    with open(sys.argv[1], "rb") as f:
        snap = pickle.load(f)
    trace, page_of, mapped, blocks, ranges = final_state(snap)
    at = rewind(trace, mapped, blocks)
    used, small = collections.Counter(), set()
    for a, size in blocks.items():
        p = page_of(a)
        while p < a + size:
            used[p] += min(p + PAGE, a + size) - max(p, a)
            if size <= MIB:
                small.add(p)
            p += PAGE
    part = [p for p in mapped if 0 < used[p] < PAGE]
    kind, by_type, by_stream = collections.Counter(), collections.Counter(), collections.Counter()
    for p in part:
        free = PAGE - used[p]
        kind["small-block pages" if p in small else "large-only pages"] += free
        seg = next((r for r in ranges if r[0] <= p < r[1]), (0, 0, "?", "?"))
        by_type[seg[2]] += free
        by_stream[str(seg[3])] += free
    name = lambda s: "-" if s is None else ("S" if s <= MIB else "L")
    holes = holes_of(mapped, sorted(blocks.items()))
    shapes = collections.Counter("%s|%s %.3f MiB" % (name(l), name(r), (hi - lo) / MIB)
                                 for lo, hi, l, r in holes)
    run_end = sum(hi - lo for lo, hi, l, r in holes if l is None or r is None)
    mib = lambda c: {k: round(v / MIB, 2) for k, v in c.items()}
    print(json.dumps(dict(
        trace=sys.argv[2] if len(sys.argv) > 2 else sys.argv[1], entry=at, entries=len(trace),
        live_mib=round(sum(blocks.values()) / MIB, 3), mapped_pages=len(mapped),
        pages_live_blocks_touch=len(used), whole_free_pages=sum(1 for p in mapped if not used[p]),
        partly_used_pages=len(part), free_mib_by_page_kind=mib(kind),
        free_mib_by_segment_type=mib(by_type), free_mib_by_stream=mib(by_stream),
        holes=len(holes), free_mib_at_run_ends=round(run_end / MIB, 2),
        free_mib_inside_runs=round((sum(hi - lo for lo, hi, _, _ in holes) - run_end) / MIB, 2),
        commonest_holes=shapes.most_common(6))))


if __name__ == "__main__":
    main()
