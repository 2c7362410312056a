#!/usr/bin/env python3
"""python_history.py: what recording memory history costs a 512-byte allocate+free pair from
Python, with history off, on without context (context=None) and on with Python stacks
(context="all", stacks="python"): bench/gpu/probe.py's pair, on any backend.

Each round times PAIRS pairs in every mode in turn (recording started before and stopped after
each timing), ROUNDS rounds; the medians and their ratios (to "off", and stacks to no context)
come from the same process. --depths runs the loop under that many more Python frames (a test
runner's stack is some 30 deep), one JSON line each.

    SYMPOOL_DEVICE=host SYMPOOL_LIBRARY=build/libsympool.so PYTHONPATH=python \\
        python3 bench/python_history.py [--pairs N] [--rounds R] [--depths 0,30] [--label L]

--ab LABEL=LIBRARY:PYTHONPATH ... runs this bench in a fresh process per build, the builds
alternating, --repeats times (e.g. main's library and package against a branch's), prints every
line and, after them, one "compare" line per label and depth with the medians over the runs.

--only MODE runs PAIRS pairs in that mode once at the first depth, untimed and silent: for
counting instructions, which the machine's load does not move (the run with --pairs 0 gives
what to subtract):
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python3 bench/python_history.py --only on_python_stacks --pairs 20000
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = {
    "off": None,
    "on_no_context": dict(context=None, stacks="python", max_entries=100_000),
    "on_python_stacks": dict(context="all", stacks="python", max_entries=100_000),
}


def _pair_loop(pairs):
    import sympool
    malloc, free = sympool.malloc, sympool.free

    def loop():
        for _ in range(pairs):
            free(malloc(512))

    def nested(k):
        return loop() if k == 0 else nested(k - 1)

    free(malloc(512))  # the segment exists before timing: every timed pair is a cache hit
    return nested


def only(mode, pairs, depth):
    import sympool
    nested = _pair_loop(pairs)
    if MODES[mode]:
        sympool.record_memory_history(**MODES[mode])
    nested(depth)


def measure(pairs, rounds, depth):
    import sympool
    nested = _pair_loop(pairs)

    def timed():
        w0, c0 = time.perf_counter_ns(), time.process_time_ns()
        nested(depth)
        return (time.perf_counter_ns() - w0) / pairs, (time.process_time_ns() - c0) / pairs

    wall = {m: [] for m in MODES}
    cpu = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode, kw in MODES.items():
            if kw:
                sympool.record_memory_history(**kw)
            w, c = timed()
            sympool.record_memory_history(enabled=None)
            wall[mode].append(w)
            cpu[mode].append(c)
    med = {m: statistics.median(v) for m, v in wall.items()}
    cmed = {m: statistics.median(v) for m, v in cpu.items()}
    out = {"pairs": pairs, "rounds": rounds, "depth": depth, "backend": sympool.backend()}
    out.update({f"{m}_ns": round(v, 1) for m, v in med.items()})
    out.update({f"{m}_cpu_ns": round(v, 1) for m, v in cmed.items()})
    for m in ("on_no_context", "on_python_stacks"):
        out[f"{m}_vs_off"] = round(med[m] / med["off"], 3)
    out["stacks_vs_no_context"] = round(med["on_python_stacks"] / med["on_no_context"], 3)
    out["stacks_vs_no_context_cpu"] = round(cmed["on_python_stacks"] / cmed["on_no_context"], 3)
    out["stacks_cost_per_pair_ns"] = round(med["on_python_stacks"] - med["on_no_context"], 1)
    return out


def run_ab(args):
    builds = []
    for spec in args.ab:
        label, _, rest = spec.partition("=")
        lib, _, pypath = rest.partition(":")
        if not (label and lib and pypath):
            sys.exit(f"--ab wants LABEL=LIBRARY:PYTHONPATH, got {spec!r}")
        builds.append((label, lib, pypath))
    lines = []
    for rep in range(args.repeats):
        order = builds if rep % 2 == 0 else builds[::-1]  # neither build always runs first
        for label, lib, pypath in order:
            env = dict(os.environ, SYMPOOL_LIBRARY=lib, PYTHONPATH=pypath)
            env.setdefault("SYMPOOL_DEVICE", "host")
            cmd = [sys.executable, os.path.abspath(__file__), "--pairs", str(args.pairs),
                   "--rounds", str(args.rounds), "--depths", args.depths, "--label", label]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                 timeout=1800)
            for text in out.stdout.splitlines():
                line = json.loads(text)
                line["run"] = rep
                lines.append(line)
                print(json.dumps(line), flush=True)
    for label, _, _ in builds:
        for depth in sorted({line["depth"] for line in lines}):
            mine = [x for x in lines if x["build"] == label and x["depth"] == depth]
            keys = [k for k, v in mine[0].items()
                    if isinstance(v, (int, float)) and k not in ("run", "depth")]
            cmp = {"bench": "compare", "of": "python_history", "build": label, "depth": depth,
                   "runs": len(mine), "date": mine[0]["date"]}
            cmp.update({k: round(statistics.median(x[k] for x in mine), 3) for k in keys})
            print(json.dumps(cmp), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depths", default="0")
    ap.add_argument("--label", default="")
    ap.add_argument("--ab", nargs="+", metavar="LABEL=LIBRARY:PYTHONPATH")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=list(MODES))
    args = ap.parse_args()
    if args.only:
        os.environ.setdefault("SYMPOOL_DEVICE", "host")
        only(args.only, args.pairs, int(args.depths.split(",")[0]))
        return
    if args.ab:
        run_ab(args)
        return
    os.environ.setdefault("SYMPOOL_DEVICE", "host")
    import sympool
    for depth in (int(d) for d in args.depths.split(",")):
        line = {"bench": "python_history", "build": args.label,
                "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0],
                "library": sympool._lib.path()}
        line.update(measure(args.pairs, args.rounds, depth))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
