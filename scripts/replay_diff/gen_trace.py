#!/usr/bin/env python3
"""A random PyTorch-style trace (JSON snapshot, device_traces only) for differential replays.

usage: gen_trace.py SEED EVENTS OUT.json [MODE]

Sizes straddle the free set's size classes (512 B .. 64 MiB, powers of two +-512 and odd
sizes); several streams (MODE 1: two or three, switching often, few live tensors, so that a
pool's free set empties and refills and goes between its class trees and its one tree); frees
in random order, some deferred (free_requested now, free_completed later: the replay holds the
block on a side stream with sp_record_stream), MemPools (pool_id), and empty_cache (a run of
segment_free not followed by a segment_alloc). Deterministic in SEED.
"""
import json
import random
import sys


def gen(seed, n, mode=0):
    R = random.Random(seed)
    nstreams = R.choice([2, 3]) if mode else R.choice([1, 1, 2, 3, 4])
    streams = [0] + [R.randrange(1, 1 << 40) * 16 for _ in range(nstreams - 1)]
    npools = R.choice([0, 0, 1, 2])
    live, pending, ev = [], [], []
    state = {"addr": 1 << 40, "t": 1700000000000000}

    def emit(action, addr, size, stream, pool=None):
        state["t"] += 1
        d = {"action": action, "addr": addr, "size": size, "stream": stream,
             "time_us": state["t"]}
        if pool is not None:
            d["pool_id"] = [1, pool]
        ev.append(d)

    cur = 0
    for _ in range(n):
        if R.random() < (0.15 if mode else 0.02):
            cur = R.randrange(nstreams)
        r = R.random()
        if mode and len(live) > 6 and r < 0.5:
            r += 0.5
        if r < 0.5 or not live:
            k = R.randrange(0, 18)
            base = 512 << k
            sz = max(1, base + R.choice([-512, 0, 0, 512, -1, 1,
                                         R.randrange(-base // 2, base // 2 + 1)]))
            if R.random() < 0.3:
                sz = R.randrange(1, 4096)
            s = streams[cur] if R.random() < 0.9 else R.choice(streams)
            pool = R.randrange(1, npools + 1) if npools and R.random() < 0.2 else None
            a = state["addr"]
            state["addr"] += 1 << 27
            emit("alloc", a, sz, s, pool)
            live.append((a, sz, s, pool))
        elif r < 0.93:
            j = R.randrange(len(live)) if R.random() < 0.7 else len(live) - 1
            a, sz, s, pool = live.pop(j)
            emit("free_requested", a, sz, s, pool)
            if R.random() < 0.12:
                pending.append((a, sz, s, pool))
            else:
                emit("free_completed", a, sz, s, pool)
        elif r < 0.97 and pending:
            a, sz, s, pool = pending.pop(R.randrange(len(pending)))
            emit("free_completed", a, sz, s, pool)
        elif r < 0.985:
            emit("segment_free", 1 << 60, 2 << 20, 0)
    for a, sz, s, pool in pending:
        emit("free_completed", a, sz, s, pool)
    return {"segments": [], "device_traces": [ev]}


if __name__ == "__main__":
    mode = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    with open(sys.argv[3], "w") as f:
        json.dump(gen(int(sys.argv[1]), int(sys.argv[2]), mode), f)
