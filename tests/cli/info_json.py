#!/usr/bin/env python3
"""`sympool info --json` says what `sympool info` says: the same backend, devices, versions and
options (values, defaults, sources) with and without a trace, read from both outputs and
compared field by field. Failures print nothing on stdout that parses as JSON.

usage: info_json.py SYMPOOL DATA_DIR
"""
import json
import os
import re
import subprocess
import sys

SYMPOOL, DATA = sys.argv[1], sys.argv[2]
UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, env=None):
    e = dict(os.environ, SYMPOOL_DEVICE="host")
    e.update(env or {})
    return subprocess.run([SYMPOOL] + args, env=e, capture_output=True, text=True)


def text_value(kind, text):
    """The table's text of a value as the JSON form types it."""
    if kind == "bool":
        return {"on": True, "off": False}[text]
    if kind in ("enum", "string"):
        assert text.startswith('"') and text.endswith('"'), text
        return text[1:-1]
    if kind == "size":
        m = re.fullmatch(r"(\d+)(KiB|MiB|GiB|TiB)?", text)
        return int(m.group(1)) * UNITS[m.group(2) or ""]
    if kind == "long":
        return int(text)
    return None if text in ("inf", "-inf", "nan") else float(text)


def check_library_info():
    env = {"SYMPOOL_HOST_CAPACITY": "3GiB", "SYMPOOL_HOST_DEVICES": "2",
           "SYMPOOL_SYM_TIMEOUT": "inf", "SYMPOOL_ALLOC_CONF": "max_split_size_mb:64",
           "SYMPOOL_DEBUG_FILE": 'a "quoted" \\ name'}
    t, j = run(["info"], env), run(["info", "--json"], env)
    check(t.returncode == 0 and j.returncode == 0, "info and info --json exit 0")
    doc = json.loads(j.stdout)
    text = t.stdout
    check(doc["sympool"] == re.search(r"^sympool (\S+)$", text, re.M).group(1), "version")
    check(doc["backend"] == re.search(r"^backend: (\S+)$", text, re.M).group(1) == "host",
          "backend")
    devs = re.findall(r"^  device (\d+): capacity .* \((\d+) bytes\)", text, re.M)
    check([(d["device"], d["capacity_bytes"]) for d in doc["devices"]]
          == [(int(a), int(b)) for a, b in devs] == [(0, 3 << 30), (1, 3 << 30)],
          "devices and their capacity: %s vs %s" % (doc["devices"], devs))
    check(all(d["free_bytes"] == 3 << 30 for d in doc["devices"]), "free bytes")
    v = doc["versions"]
    check(v["sympool"] == doc["sympool"], "versions.sympool")
    m = re.search(r"^  CUDA runtime (\S+) \(built with (\S+)\), driver (.*)$", text, re.M)
    if m:
        check(v["cuda"]["runtime"] == m.group(1) and v["cuda"]["runtime_built_with"] == m.group(2),
              "cuda versions")
        check((v["cuda"]["driver_supports"] is None) == (m.group(3) == "none found"), "driver")
    else:
        check(v["cuda"] is None and "CUDA not linked" in text, "cuda not linked")
    m = re.search(r"^  NCCL (\S+) \(built with (\S+)\)$", text, re.M)
    if m:
        check(v["nccl"] == {"version": m.group(1), "built_with": m.group(2)}, "nccl versions")
    else:
        check(v["nccl"] is None or v["nccl"]["version"] is None, "nccl")
    m = re.search(r"^  MPI (\S+) standard(?:, (.*))?$", text, re.M)
    if m:
        check(v["mpi"]["standard"] == m.group(1) and v["mpi"]["library"] == m.group(2), "mpi")
    elif re.search(r"^  MPI version unavailable \(\S+ did not load or answer\)$", text, re.M):
        check(v["mpi"] == {"standard": None, "library": None}, "mpi unavailable")
    else:
        check(v["mpi"] is None and "MPI not linked" in text, "mpi not linked")

    rows = re.findall(r"^  (SYMPOOL_\w+) +(.*?) +default (.*?) +\[(\w[^\]]*)\]  (.*)$", text, re.M)
    opts = doc["options"]
    check(len(rows) > 20 and [r[0] for r in rows] == list(opts), "the same options, same order")
    for name, val, default, source, desc in rows:
        o = opts.get(name, {})
        if name == "SYMPOOL_DEBUG_FILE":  # the table shows it quoted as is
            check(o.get("value") == env[name], "string with quotes and backslash: %r" % o)
            continue
        check(o.get("value") == text_value(o.get("kind"), val), "%s value %r vs %r" % (name, o, val))
        check(o.get("default") == text_value(o.get("kind"), default), "%s default" % name)
        check(o.get("source") == source and o.get("description") == desc, "%s source/desc" % name)
    check(opts["SYMPOOL_HOST_CAPACITY"]["value"] == 3 << 30, "capacity in bytes")
    check(opts["SYMPOOL_HOST_CAPACITY"]["source"] == "env", "capacity from env")
    check(opts["SYMPOOL_MAX_SPLIT_SIZE"]["value"] == 64 << 20
          and opts["SYMPOOL_MAX_SPLIT_SIZE"]["source"] == "ALLOC_CONF", "ALLOC_CONF key's source")
    check(opts["SYMPOOL_SYM_TIMEOUT"]["value"] is None
          and opts["SYMPOOL_SYM_TIMEOUT"]["default"] == 60, "infinite double is null")
    check(opts["SYMPOOL_NO_CACHING"]["value"] is False, "bool")
    check(opts["SYMPOOL_HOST_DEVICES"]["value"] == 2, "long")


GIB = float(1 << 30)


def check_trace(path):
    t, j = run(["info", path]), run(["info", "--json", path])
    check(t.returncode == 0 and j.returncode == 0, "%s: both exit 0" % path)
    doc = json.loads(j.stdout)
    text = t.stdout
    check(doc["trace"] == path, "trace path")
    m = re.search(r"^format: (?:pickle protocol (\d+)|JSON), (.*)$", text, re.M)
    f = doc["format"]
    check(f["encoding"] == ("pickle" if m.group(1) else "json") and f["contents"] == m.group(2)
          and f["pickle_protocol"] == (int(m.group(1)) if m.group(1) else None), "format %s" % f)
    m = re.search(r"^devices: (\d+) with data \(of (\d+) device traces\), (\d+) segments", text, re.M)
    check((doc["devices_with_data"], doc["device_traces"], doc["segments_at_end"])
          == tuple(map(int, m.groups())), "device counts")
    check(len(doc["devices"]) == doc["device_traces"]
          and [d["device"] for d in doc["devices"]] == list(range(doc["device_traces"])),
          "one entry per device trace")
    blocks = re.split(r"^device (\d+):\n", text, flags=re.M)
    shown = {int(blocks[i]): blocks[i + 1] for i in range(1, len(blocks), 2)}
    check(sorted(shown) == [d["device"] for d in doc["devices"] if d["with_data"]],
          "devices with data")
    for dv in doc["devices"]:
        if not dv["with_data"]:
            continue
        b = shown[dv["device"]]
        m = re.search(r"events: (\d+)((?:, \w+ \d+)*)", b)
        check(dv["events"] == int(m.group(1)), "events")
        counts = dict((k, int(n)) for k, n in re.findall(r", (\w+) (\d+)", m.group(2)))
        check({k: n for k, n in dv["events_by_action"].items() if n} == counts,
              "events by action %s vs %s" % (dv["events_by_action"], counts))
        check(sum(dv["events_by_action"].values()) == dv["events"], "actions add up")
        check(dv["streams"] == int(re.search(r"streams: (\d+)", b).group(1)), "streams")
        pools = re.findall(r"\((\d+), (\d+)\)", re.search(r"pools: default(.*)", b).group(1))
        check(dv["private_pools"] == [[int(a), int(c)] for a, c in pools], "pools")
        m = re.search(r"empty_cache calls: (\d+); frees held for other streams: (\d+); "
                      r"releases inside malloc: (\d+)", b)
        check((dv["empty_cache_calls"], dv["frees_held_for_other_streams"],
               dv["segment_frees_inside_malloc"]) == tuple(map(int, m.groups())), "counts")
        m = re.search(r"starting state: (\d+) segments \(([\d.]+) GiB; PyTorch reserved ([\d.]+) "
                      r"GiB before the first event\), (\d+) live blocks in them, (\d+) outside "
                      r"\(([\d.]+) GiB\)", b)
        s = dv["starting_state"]
        check(s["segments"] == int(m.group(1)) and s["live_blocks_in_segments"] == int(m.group(4))
              and s["live_blocks_outside"] == int(m.group(5)), "starting state counts")
        for key, g in (("segment_bytes", 2), ("pytorch_reserved_bytes", 3), ("bytes_outside", 6)):
            check("%.3f" % (s[key] / GIB) == m.group(g), "starting %s" % key)
        m = re.search(r"requested: ([\d.]+) GiB live before the first event \((\d+) blocks\), "
                      r"peak ([\d.]+) GiB", b)
        q = dv["requested"]
        check("%.3f" % (q["start_bytes"] / GIB) == m.group(1) and q["start_blocks"] == int(m.group(2))
              and "%.3f" % (q["peak_bytes"] / GIB) == m.group(3), "requested %s" % q)
        m = re.search(r"PyTorch reserved: peak ([\d.]+) GiB, at the end ([\d.]+) GiB \(([\d.]+) "
                      r"GiB allocated\); recorded OOMs: (\d+)", b)
        p = dv["pytorch"]
        check(["%.3f" % (p[k] / GIB) for k in
               ("peak_reserved_bytes", "end_reserved_bytes", "end_allocated_bytes")]
              == list(m.groups()[:3]) and p["recorded_ooms"] == int(m.group(4)), "pytorch")
    st = doc["settings"]
    m = re.search(r"^settings: '(.*)'", text, re.M)
    if m:
        check(st["recorded"] and (st["alloc_conf"] or "defaults") == m.group(1), "settings")
    else:
        check(not st["recorded"] and st["alloc_conf"] is None, "settings not recorded")
    m = re.search(r"^  max_split_size (\d+) bytes", text, re.M)
    check(st["max_split_size_bytes"] == (int(m.group(1)) if m else None), "max_split_size bytes")
    return doc


def check_failure(args, env, what):
    r = run(args, env)
    check(r.returncode != 0, "%s: non-zero exit" % what)
    check(r.stderr.strip().splitlines()[-1].startswith("sympool info: "), "%s: says why" % what)
    try:
        json.loads(r.stdout)
        check(False, "%s: stdout parses as JSON: %r" % (what, r.stdout))
    except ValueError:
        pass
    check(r.stdout == "", "%s: stdout empty" % what)


check_library_info()
small = check_trace(os.path.join(DATA, "trace-small-p4.pickle"))
check(small["devices"][0]["events_by_action"]["alloc"] == 67, "known: 67 allocs")
check(small["devices"][0]["starting_state"]["segment_bytes"] == 335544320, "known: start bytes")
check(small["settings"]["alloc_conf"] == "expandable_segments:False", "known: settings")
check(small["devices"][0]["requested"] == {"start_bytes": 314671104, "start_blocks": 21,
                                           "peak_bytes": 463071232}, "known: requested")
sq = check_trace(os.path.join(DATA, "real", "sqattn-empty-cache.pickle"))
check(sq["devices"][0]["empty_cache_calls"] == 28, "known: 28 empty_cache calls")
check(check_trace(os.path.join(DATA, "trace-gc-tiny.json"))["format"]["encoding"] == "json",
      "a JSON snapshot")
check_trace(os.path.join(DATA, "real", "attention-state-only.pickle"))
check_trace(os.path.join(DATA, "real", "layoutediting-legacy-list.pickle"))
check_failure(["info", "--json", os.path.join(DATA, "does-not-exist.pickle")], None, "missing")
check_failure(["info", "--json", os.path.join(DATA, "real", "SOURCES.md")], None, "not a trace")
# The library cannot start: the cuda backend where no GPU answers (skipped where one does).
if run(["info"], {"SYMPOOL_DEVICE": "cuda"}).returncode != 0:
    check_failure(["info", "--json"], {"SYMPOOL_DEVICE": "cuda"}, "no cuda device")
if failures:
    sys.exit("info-json: %d failure(s)" % len(failures))
print("info-json: ok")
