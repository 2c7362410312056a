#!/usr/bin/env python3
"""bench/replay_self.py: does sympool replay its own snapshots exactly?

A random program per seed runs on the host backend with the allocator settings given
(SYMPOOL_ALLOC_CONF): mallocs of small, large and huge sizes on several streams of two devices,
frees, frees held for another stream (record_stream, completed when that stream synchronizes),
a private MemPool per device, empty_cache, OOMs under a memory fraction; memory history is
recorded from the start, and the snapshot written. `sympool replay SNAP --json` of it must then
reach the recorded peak reserved to the byte: the replay runs the same allocator with the same
settings on the same trace, so nothing is left to chance.

Usage:
  replay_self.py CLI LIBRARY OUTDIR [--seeds A-B] [--conf CONF]... [--steps N] [--check]
                 [--tolerance PCT]
One JSON line per (conf, seed): the recorded and replayed peak reserved and the error in percent;
then a table of conf x seeds. --check: exit 1 unless every replay is exact (the ctest's form), or
within PCT percent with --tolerance (expandable segments: docs/API.md says why not exact).
The program itself runs as `replay_self.py --run SEED STEPS OUT` in a child process, so that each
gets its own settings from the environment.
"""
import json
import os
import random
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def size_of(rng):
    k = rng.random()
    if k < 0.45:
        return rng.randint(1, 1 * MiB)  # the small pool's sizes
    if k < 0.85:
        return rng.randint(MiB + 1, 24 * MiB)  # large blocks, split or not
    return rng.randint(24 * MiB, 90 * MiB)  # past max_split_size and the 20 MiB segments


def run(seed, steps, out):
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import sympool

    rng = random.Random(seed)
    ndev = sympool.device_count()
    sympool._record_memory_history(stacks="python", context=None)
    streams = {d: [None] + [sympool.Stream(d) for _ in range(2)] for d in range(ndev)}
    pools = {d: sympool.MemPool(device=d) for d in range(ndev)}
    live = []  # (ptr, device)
    for _ in range(steps):
        k = rng.random()
        d = rng.randrange(ndev)
        if k < 0.50 or not live:
            s = rng.choice(streams[d])
            try:
                if rng.random() < 0.2:
                    with sympool.use_mem_pool(pools[d]):
                        p = sympool.malloc(size_of(rng), device=d, stream=s)
                else:
                    p = sympool.malloc(size_of(rng), device=d, stream=s)
            except sympool.OutOfMemoryError:
                continue
            if p:
                live.append((p, d))
        elif k < 0.88:
            p, pd = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.25:  # used on another stream: its free waits for that stream
                sympool.record_stream(p, rng.choice(streams[pd][1:]))
            sympool.free(p)
        elif k < 0.97:
            rng.choice(streams[d][1:]).synchronize()
        else:
            sympool.empty_cache()
    sympool._dump_snapshot(out)


def one(cli, lib, outdir, conf, seed, steps):
    snap = os.path.join(outdir, "self-%s-%d.pickle" % (conf_name(conf), seed))
    env = dict(os.environ, SYMPOOL_DEVICE="host", SYMPOOL_HOST_DEVICES="2",
               SYMPOOL_LIBRARY=lib, SYMPOOL_ALLOC_CONF=conf, SYMPOOL_DEBUG="NONE")
    for k in [k for k in env if k.startswith("PYTORCH_") or
              (k.startswith("SYMPOOL_") and k not in ("SYMPOOL_DEVICE", "SYMPOOL_HOST_DEVICES",
                                                      "SYMPOOL_LIBRARY", "SYMPOOL_ALLOC_CONF",
                                                      "SYMPOOL_DEBUG"))]:
        del env[k]
    subprocess.run([sys.executable, os.path.abspath(__file__), "--run", str(seed), str(steps),
                    snap], env=env, check=True)
    # The replay reads the settings from the snapshot alone; the CLI (with a sanitizer's runtime
    # linked in) takes no preloaded one, which a sanitized library in Python needs.
    renv = {k: v for k, v in env.items() if k not in ("SYMPOOL_ALLOC_CONF", "LD_PRELOAD")}
    r = subprocess.run([cli, "replay", snap, "--json"], env=renv, capture_output=True, text=True)
    if r.returncode != 0:
        return {"conf": conf, "seed": seed, "error": r.stderr.strip()}
    j = json.loads(r.stdout)
    mine, theirs = j["peak_reserved_bytes"], j["pytorch_peak_reserved_bytes"]
    return {"conf": conf, "seed": seed, "recorded": theirs, "replayed": mine,
            "err_pct": round(100.0 * (mine - theirs) / theirs, 3) if theirs else None,
            "ooms": j["ooms"], "why": j.get("differs_because", "")}


def conf_name(conf):
    name = "".join(c if c.isalnum() else "_" for c in conf) or "default"
    return name if len(name) <= 60 else name[:50] + "_%08x" % zlib.crc32(conf.encode())


def main(argv):
    if argv[:1] == ["--run"]:
        run(int(argv[1]), int(argv[2]), argv[3])
        return 0
    cli, lib, outdir = argv[:3]
    seeds, confs, steps, check, tolerance = range(1, 11), [], 400, False, 0.0
    i = 3
    while i < len(argv):
        if argv[i] == "--seeds":
            a, _, b = argv[i + 1].partition("-")
            seeds = range(int(a), int(b or a) + 1)
            i += 2
        elif argv[i] == "--conf":
            confs.append(argv[i + 1])
            i += 2
        elif argv[i] == "--steps":
            steps = int(argv[i + 1])
            i += 2
        elif argv[i] == "--tolerance":
            tolerance = float(argv[i + 1])
            i += 2
        elif argv[i] == "--check":
            check = True
            i += 1
        else:
            sys.exit("replay_self.py: unknown argument " + argv[i])
    os.makedirs(outdir, exist_ok=True)
    confs = confs or [""]
    table, bad = {}, 0
    for conf in confs:
        for seed in seeds:
            r = one(cli, lib, outdir, conf, seed, steps)
            print(json.dumps(r), flush=True)
            table[(conf, seed)] = r.get("err_pct", "error")
            err = r.get("err_pct")
            bad += err is None or abs(err) > tolerance
    print("conf" + "".join("%9d" % s for s in seeds))
    for conf in confs:
        print((conf or "(defaults)") + "\n    " +
              "".join("%9s" % table[(conf, s)] for s in seeds))
    if check:
        print("replay-self: ok" if bad == 0 else "replay-self: %d replays not exact" % bad)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
