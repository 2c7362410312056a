"""Seed corpora for the snapshot fuzzers, cut from the real snapshots in tests/data: a few
segments, blocks, trace entries and frames of each, written as pickles (protocols 0 to 5) and
as JSON. Small seeds keep every fuzz iteration fast; they still hold every key and value kind
the readers know (u64 line numbers, big and negative ints, floats, nested frames).
With a fourth directory, seeds for the whole-replay fuzzer (fuzz_replay.c) too: the snapshots
of tests/data and tests/data/real with their first segments whole (a starting state to rebuild
and place) and their first trace entries (allocs that reuse, split and free them), without
stacks."""
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


def strip_frames(v):
    if isinstance(v, dict):
        return {k: ([] if k == "frames" else strip_frames(x)) for k, x in v.items()}
    if isinstance(v, list):
        return [strip_frames(x) for x in v]
    return v


def replay_seeds(data_dir, out):
    os.makedirs(out, exist_ok=True)
    for sub in (data_dir, os.path.join(data_dir, "real")):
        if not os.path.isdir(sub):
            continue
        for name in sorted(os.listdir(sub)):
            if not name.endswith(".pickle"):
                continue
            with open(os.path.join(sub, name), "rb") as f:
                snap = pickle.load(f)
            for nseg, nev in ((4, 40), (12, 200)):
                s = snap
                if isinstance(s, dict):
                    s = dict(s)
                    if isinstance(s.get("segments"), list):
                        s["segments"] = s["segments"][:nseg]
                    if isinstance(s.get("device_traces"), list):
                        s["device_traces"] = [t[:nev] for t in s["device_traces"]]
                elif isinstance(s, list):
                    s = s[:nseg]
                base = name[: -len(".pickle")]
                with open(os.path.join(out, f"{base}-{nseg}-{nev}.pickle"), "wb") as f:
                    pickle.dump(strip_frames(s), f, protocol=4)


def main(data_dir, pickle_out, json_out, replay_out=None):
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
    if replay_out is not None:
        replay_seeds(data_dir, replay_out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
