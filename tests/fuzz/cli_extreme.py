"""The CLI on legal but extreme snapshot values: sizes near 2^63-2^64, time_us spanning +-2^63 or
going backwards, an alloc at address 0, sums past 4 EiB. Each command (summary, plot, replay)
either handles the snapshot (exit 0, no negative or absurd figure) or refuses it (exit 1) with
a message naming the field.
  python3 cli_extreme.py SYMPOOL_BINARY WORK_DIR"""
import os
import pickle
import re
import subprocess
import sys

SEG = 0x7F0000000000


def snapshot(events, segments=None):
    if segments is None:
        segments = [{"device": 0, "address": SEG, "total_size": 2 << 20, "allocated_size": 0,
                     "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
                     "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                     "blocks": [{"address": SEG, "size": 2 << 20, "requested_size": 0,
                                 "state": "inactive", "frames": []}]}]
    return {"segments": segments, "device_traces": [events], "allocator_settings": {}}


def ev(action, addr, size, t=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}
    if t is not None:
        e["time_us"] = t
    return e


def alloc_free(size, addr=SEG, t0=None, t1=None):
    return [ev("alloc", addr, size, t0), ev("free_requested", addr, size, t1),
            ev("free_completed", addr, size, t1)]


REFUSED = [  # (name, snapshot, field the message must name)
    ("size_2p64", snapshot(alloc_free(2**64 - 2)), "size"),
    ("size_2p63", snapshot(alloc_free(2**63)), "size"),
    ("size_1eb", snapshot(alloc_free(2**60)), "size"),
    ("time_min", snapshot(alloc_free(4096, t0=-2**63, t1=2**63 - 1)), "time_us"),
    ("time_max", snapshot(alloc_free(4096, t0=0, t1=2**63 - 1)), "time_us"),
    ("addr_zero", snapshot(alloc_free(4096, addr=0)), "addr"),
    ("sum_4eib", snapshot([ev("alloc", SEG + i * 2**60, 2**60 - 1) for i in range(8)]),
     "4 EiB"),
    ("segment_2p63", snapshot([], [{"device": 0, "address": SEG, "total_size": 2**63 - 1,
                                    "stream": 0, "blocks": [{"size": 2**63 - 1,
                                                             "state": "active_allocated"}]}]),
     "total_size"),
]
HANDLED = [  # (name, snapshot)
    ("time_backwards", snapshot(alloc_free(4096, t0=2000, t1=1000) + alloc_free(8192, t0=3000,
                                                                                 t1=500))),
    ("largest_size", snapshot(alloc_free(2**60 - 512))),
]


def run(cli, cmd, path, work):
    args = {"summary": [cli, "summary", path],
            "plot": [cli, "plot", path, "-o", os.path.join(work, "out.svg")],
            "replay": [cli, "replay", path, "--json"]}[cmd]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SYMPOOL_DEVICE="host"))
    return p.returncode, p.stdout + p.stderr


def main(cli, work):
    os.makedirs(work, exist_ok=True)
    bad = []
    for name, snap, field in REFUSED:
        path = os.path.join(work, name + ".pickle")
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=2)
        for cmd in ("summary", "plot", "replay"):
            rc, out = run(cli, cmd, path, work)
            if rc != 1 or field not in out:
                bad.append(f"{name} {cmd}: want exit 1 naming '{field}', got {rc}: {out[-300:]}")
    for name, snap in HANDLED:
        path = os.path.join(work, name + ".pickle")
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=2)
        for cmd in ("summary", "plot", "replay"):
            rc, out = run(cli, cmd, path, work)
            if rc != 0 or re.search(r"(?<![\w.])-[0-9]", out):
                bad.append(f"{name} {cmd}: want exit 0 and no negative figure, got {rc}: "
                           f"{out[-300:]}")
    for b in bad:
        print("FAIL", b)
    print("cli-extreme:", "ok" if not bad else f"{len(bad)} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
