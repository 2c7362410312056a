"""Check a sympool snapshot the way PyTorch's memory viewer reads it (standard library only).

The structure of torch.cuda.memory._snapshot(), then MemoryViz.js's Allocator State History:
starting from the final segments it undoes trace entries backwards (segment_map/segment_alloc
remove a range from a segment that contains it; segment_unmap/segment_free put it back, merging
touching ranges of one stream). A range no segment contains would throw in the viewer.
"""
import pickle
import sys


def main(path):
    with open(path, "rb") as f:
        s = pickle.load(f)
    assert set(s) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert s["allocator_settings"]["expandable_segments"] is True
    for g in s["segments"]:
        assert sum(b["size"] for b in g["blocks"]) == g["total_size"]
        assert g["is_expandable"] is True, g["address"]
        addr = g["address"]
        for b in g["blocks"]:
            assert b["address"] == addr
            addr += b["size"]
    trace = s["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert "segment_alloc" not in actions and "segment_free" not in actions
    segs = sorted(
        ([g["address"], g["total_size"], g["stream"]] for g in s["segments"] if g["device"] == 0),
        key=lambda x: x[0],
    )
    for e in reversed(trace):
        a, n = e.get("addr"), e.get("size")
        if e["action"] in ("segment_map", "segment_alloc"):
            hit = [x for x in segs if x[0] <= a and a + n <= x[0] + x[1]]
            assert hit, "no segment contains %s %x+%d" % (e["action"], a, n)
            x = hit[0]
            if x[0] == a:
                x[0] += n
                x[1] -= n
                if x[1] == 0:
                    segs.remove(x)
            elif x[0] + x[1] == a + n:
                x[1] -= n
            else:
                segs.append([a + n, x[0] + x[1] - a - n, x[2]])
                x[1] = a - x[0]
        elif e["action"] in ("segment_unmap", "segment_free"):
            segs.append([a, n, e["stream"]])
        segs.sort(key=lambda x: x[0])
        # Touching ranges of one stream are one mapped range again (an unmapped hole put back).
        merged = []
        for x in segs:
            if merged and merged[-1][0] + merged[-1][1] == x[0] and merged[-1][2] == x[2]:
                merged[-1][1] += x[1]
            else:
                merged.append(x)
        segs = merged
        assert all(x[1] >= 0 for x in segs)
    # What is left is the starting state (segments that existed before the first entry: a
    # replay rebuilds the recorded run's before replaying its trace).
    assert all(x[1] > 0 for x in segs), segs[:3]
    print("viewer ok: %d segments, %d segment_map, %d bytes before the first entry"
          % (len(s["segments"]), actions.count("segment_map"), sum(x[1] for x in segs)))


if __name__ == "__main__":
    main(sys.argv[1])
