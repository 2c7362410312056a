#!/usr/bin/env python3
"""peak_waste.py: where the reserved but unallocated bytes lie when a replay's allocated bytes
peak, from that replay's own snapshot (`sympool replay TRACE --conf expandable_segments:True
--snapshot OUT.pickle`; expandable segments only: it reads segment_map/segment_unmap entries;
and a trace that starts from an empty cache: a starting state's blocks and segments are made
before the replay records, so they are not in its entries).

It walks device 0's trace entries (segment_map/unmap: mapped pages; alloc/free_completed: live
blocks) to the entry where the live bytes peak (of equal peaks, the one with the most mapped) and prints, for that moment: the mapped and live
MiB, the free ranges between live blocks inside mapped ranges (holes), the free MiB in pages
that hold a block of 1 MiB or less (PyTorch's small-pool sizes) and in pages that hold only
larger ones, and the mapped pages no block touches.

    python3 bench/peak_waste.py OUT.pickle [PAGE_BYTES]
"""
import collections
import pickle
import sys


def main():
    with open(sys.argv[1], "rb") as f:
        snap = pickle.load(f)
    page = int(sys.argv[2]) if len(sys.argv) > 2 else 2 << 20
    trace = snap["device_traces"][0]
    live, mapped_bytes, best, at = 0, 0, (-1, -1), -1
    for i, e in enumerate(trace):
        sign = {"alloc": 1, "free_completed": -1}.get(e["action"], 0)
        live += sign * e["size"]
        mapped_bytes += {"segment_map": 1, "segment_unmap": -1}.get(e["action"], 0) * e["size"]
        if (live, mapped_bytes) > best:  # ties of the live peak: the most mapped of them
            best, at = (live, mapped_bytes), i
    best = best[0]
    mapped, blocks = set(), {}
    for e in trace[:at + 1]:
        a, pages = e["action"], range(e["addr"], e["addr"] + e["size"], page)
        if a == "segment_map":
            mapped.update(pages)
        elif a == "segment_unmap":
            mapped.difference_update(pages)
        elif a == "alloc":
            blocks[e["addr"]] = e["size"]
        elif a == "free_completed":
            blocks.pop(e["addr"], None)
    used, small = collections.Counter(), set()
    for addr, size in blocks.items():
        p = addr - addr % page
        while p < addr + size:
            used[p] += min(p + page, addr + size) - max(p, addr)
            if size <= 1 << 20:
                small.add(p)
            p += page
    mib = 1 << 20
    free = {p: page - used[p] for p in mapped}
    holes = count_holes(sorted(mapped), sorted(blocks.items()), page)
    print(f"entry {at} of {len(trace)}: mapped {len(mapped) * page / mib:.2f} MiB, "
          f"live {best / mib:.2f} MiB, {holes} holes")
    print(f"free in pages holding blocks <= 1 MiB: {sum(free[p] for p in mapped & small) / mib:.2f}"
          f" MiB ({len(mapped & small)} pages, {sum(1 for s in blocks.values() if s <= mib)} blocks)")
    part = [p for p in mapped - small if 0 < used[p] < page]
    print(f"free in partly used pages of larger blocks only: {sum(free[p] for p in part) / mib:.2f}"
          f" MiB ({len(part)} pages)")
    print(f"mapped pages no block touches: {sum(1 for p in mapped if used[p] == 0)}")


def count_holes(pages, blocks, page):
    """Free ranges between live blocks (or a mapped range's ends) inside mapped ranges."""
    runs, holes, k = [], 0, 0
    for p in pages:
        if runs and runs[-1][1] == p:
            runs[-1][1] = p + page
        else:
            runs.append([p, p + page])
    for lo, hi in runs:
        cur = lo
        while k < len(blocks) and blocks[k][0] < hi:
            addr, size = blocks[k]
            if addr >= lo:
                holes += addr > cur
                cur = max(cur, addr + size)
            k += 1
        holes += cur < hi
    return holes


if __name__ == "__main__":
    main()
