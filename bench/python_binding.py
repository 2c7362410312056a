#!/usr/bin/env python3
"""python_binding.py: what the Python binding costs over the same calls in C, in one run.

Times sympool.memory_stats() (ctypes call + the 122-key OrderedDict) and a cached
sympool.malloc(4096) + sympool.free() pair, then runs bench_python_calls (the same calls in C,
same backend, same machine, right after) and prints one JSON line per call with both medians
(median over R repeats of N calls) and the ratio.

    SYMPOOL_DEVICE=host SYMPOOL_LIBRARY=build/libsympool.so PYTHONPATH=python \\
        python3 bench/python_binding.py build/bench/bench_python_calls [N [R]]
"""

import json
import os
import statistics
import subprocess
import sys
import time


def per_call(fn, n):
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    c_bench = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    r = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    os.environ.setdefault("SYMPOOL_DEVICE", "host")
    import sympool
    stats, malloc, free = sympool.memory_stats, sympool.malloc, sympool.free

    def stats_loop(k):
        for _ in range(k):
            stats()

    def pair_loop(k):
        for _ in range(k):
            free(malloc(4096))

    pair_loop(1)  # the segment exists before timing: every timed pair is a cache hit
    py_stats = statistics.median(per_call(stats_loop, n) for _ in range(r))
    py_pairs = statistics.median(per_call(pair_loop, n) for _ in range(r))
    out = subprocess.run([c_bench, str(n), str(r)], capture_output=True, text=True, check=True,
                         timeout=600)
    c = json.loads(out.stdout.strip().splitlines()[-1])
    for name, py, cv in (("memory_stats", py_stats, c["memory_stats_ns"]),
                         ("malloc_free", py_pairs, c["malloc_free_ns"])):
        print(json.dumps({"bench": "python_binding", "call": name, "backend": sympool.backend(),
                          "calls": n, "repeats": r, "python_ns": round(py, 1),
                          "c_ns": cv, "ratio": round(py / cv, 1) if cv else None}))


if __name__ == "__main__":
    main()
