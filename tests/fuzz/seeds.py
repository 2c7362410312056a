"""Seed corpora for the snapshot fuzzers, cut from the real snapshots in tests/data: a few
segments, blocks, trace entries and frames of each, written as pickles (protocols 0 to 5) and
as JSON. Small seeds keep every fuzz iteration fast; they still hold every key and value kind
the readers know (u64 line numbers, big and negative ints, floats, nested frames)."""
import json
import os
import pickle
import sys


def cut(v, depth=0):
    if isinstance(v, dict):
        return {k: cut(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        keep = 3 if depth < 2 else 2
        return [cut(x, depth + 1) for x in v[:keep]]
    return v


def main(data_dir, pickle_out, json_out):
    os.makedirs(pickle_out, exist_ok=True)
    os.makedirs(json_out, exist_ok=True)
    for name in sorted(os.listdir(data_dir)):
        if not name.endswith(".pickle"):
            continue
        with open(os.path.join(data_dir, name), "rb") as f:
            snap = pickle.load(f)
        small = cut(snap)
        base = name[: -len(".pickle")]
        for proto in (0, 1, 2, 3, 4, 5):
            with open(os.path.join(pickle_out, f"{base}-p{proto}.pickle"), "wb") as f:
                pickle.dump(small, f, protocol=proto)
        with open(os.path.join(json_out, f"{base}.json"), "w") as f:
            json.dump(small, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
