#!/usr/bin/env python3
"""A snapshot whose pickle memoizes more than 2^24 values (argv: sympool, work dir).

The pickle reader refused any memo index from 2^24 up ("memo index 16777216 exceeds the limit
of 16777216"), a count PyTorch's snapshots reach at about 1.5 GB (they memoize a value every
60-130 bytes) while the commands read files up to 4 GiB and pickle.load reads them whole. The
bound is the document's size now (each memo entry is at least one MEMOIZE byte). Here a
17 MB pickle memoizes one list 2^24 + 16 times (pickle.load takes that too) so that the test
stays small; every command reads it."""
import json
import os
import pickle
import subprocess
import sys

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
N = (1 << 24) + 16


def key(name):
    """SHORT_BINUNICODE name, memoized (as pickle.dump writes a dict's keys)."""
    b = name.encode()
    return b"\x8c" + bytes([len(b)]) + b + b"\x94"


doc = (b"\x80\x04}\x94(" + key("segments") + b"]\x94" + key("device_traces") + b"]\x94(]\x94e"
       + key("extra") + b"]" + b"\x94" * N + b"u.")
path = os.path.join(work, "memo_past_2_24.pickle")
with open(path, "wb") as f:
    f.write(doc)
if pickle.loads(doc)["device_traces"] != [[]]:
    sys.exit("pickle.load does not read the test's document as meant")
env = dict(os.environ, SYMPOOL_DEVICE="host")
for args in (["info", "--json", path], ["summary", path], ["replay", "--json", path]):
    r = subprocess.run([cli, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"sympool {args[0]}: rc {r.returncode}: {r.stderr.strip()}")
    if args[0] == "info" and json.loads(r.stdout)["device_traces"] != 1:
        sys.exit(f"sympool info --json: {r.stdout[:200]}")
os.unlink(path)
print("ok")
