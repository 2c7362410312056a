#!/usr/bin/env python3
"""`sympool summary` and `sympool plot` print the same requested and reserved peaks for the same
trace, and both equal the trace loader's exact figures (what `sympool replay --json` reports as
trace_peak_requested_bytes and pytorch_peak_reserved_bytes): whole traces, partial ones (whose
end state does not hold the trace's own blocks) and a state-only snapshot. summary's allocated
peak is the replay's where the replay ends in the recorded state, the end state's for a
snapshot without events, and "-" otherwise.

usage: peaks_agree.py SYMPOOL DATA_DIR OUT_DIR
"""
import json
import os
import re
import subprocess
import sys

SYMPOOL, DATA, OUT = sys.argv[1:4]
UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
TRACES = ["trace-small-p4.pickle",  # partial: its blocks live at the start are not in the end state
          "trace-small-u64.pickle", "cs336-2.7b-ctx128-forward-bf16.pickle", "trace-gc-tiny.json",
          "real/silmont-small.pickle", "real/sqattn-empty-cache.pickle",
          "real/attention-state-only.pickle"]
failures = []


def run(*args):
    r = subprocess.run([SYMPOOL] + list(args), capture_output=True, text=True,
                       env=dict(os.environ, SYMPOOL_DEVICE="host"))
    if r.returncode != 0:
        sys.exit("sympool %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


def near(what, shown, decimals, unit, exact):
    """shown (a number printed with `decimals` decimals in `unit`) is exact, rounded."""
    ok = abs(shown * UNIT[unit] - exact) <= 0.5 * 10 ** -decimals * UNIT[unit] + 1
    print("%-50s %s %s vs %d bytes: %s" % (what, shown, unit, exact, "ok" if ok else "DIFFERENT"))
    if not ok:
        failures.append(what)


for name in TRACES:
    path = os.path.join(DATA, name)
    r = json.loads(run("replay", "--json", path))
    exact_req, exact_resv = r["trace_peak_requested_bytes"], r["pytorch_peak_reserved_bytes"]
    info = json.loads(run("info", "--json", path))
    shown = sum(d["requested"]["peak_bytes"] for d in info["devices"])
    print("%-50s %d vs %d bytes" % (name + ": info's requested peak", shown, exact_req))
    if shown != exact_req:
        failures.append(name + ": info --json requested peak")
    svg = os.path.join(OUT, os.path.basename(name) + ".svg")
    out = run("plot", path, "-o", svg)
    m = re.search(r"device (\d+): \d+ events, peak requested ([\d.]+) GiB, peak reserved "
                  r"([\d.]+) GiB", out)
    dev = m.group(1)
    near(name + ": plot requested", float(m.group(2)), 3, "GiB", exact_req)
    near(name + ": plot reserved", float(m.group(3)), 3, "GiB", exact_resv)
    m = re.search(r">peak requested ([\d.]+) (B|KiB|MiB|GiB)</text>", open(svg).read())
    near(name + ": plot's chart requested", float(m.group(1)), 2, m.group(2), exact_req)
    table = run("summary", "-d", dev, path)

    def peak(row):
        m = re.search(r"\| %s +\| +[\d.]+ (?:B|KiB|MiB|GiB|TiB) +\| +([\d.]+) (B|KiB|MiB|GiB|TiB) "
                      % row, table)
        return float(m.group(1)), 0 if m.group(2) == "B" else 1, m.group(2)

    v, dec, unit = peak("Requested memory")
    near(name + ": summary requested", v, dec, unit, exact_req)
    v, dec, unit = peak("Reserved memory")
    near(name + ": summary reserved", v, dec, unit, exact_resv)
    # Allocated: replay's peak where the replay ends in the recorded state, else "-".
    faithful = r["end_allocated_bytes"] == r["pytorch_end_allocated_bytes"] and r["ooms"] == 0
    if r["trace_entries"] == 0:  # state only: the peak is the end state
        m = re.search(r"\| Allocated memory +\| +([\d.]+ \w+) +\| +([\d.]+ \w+) +\|", table)
        print("%-50s %s = %s" % (name + ": summary allocated = current", m.group(2), m.group(1)))
        if m.group(1) != m.group(2):
            failures.append(name + ": allocated peak of a state-only snapshot")
    elif faithful:
        v, dec, unit = peak("Allocated memory")
        near(name + ": summary allocated", v, dec, unit, r["peak_allocated_bytes"])
    else:
        shown = re.search(r"\| Allocated memory +\| +[\d.]+ \w+ +\| +(\S+)", table).group(1)
        print("%-50s %s" % (name + ": summary allocated (replay not exact)", shown))
        if shown != "-":
            failures.append(name + ": allocated peak shown where the replay differs")
if failures:
    sys.exit("peaks-agree: %d different: %s" % (len(failures), ", ".join(failures)))
print("peaks-agree: ok")
