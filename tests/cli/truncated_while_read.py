#!/usr/bin/env python3
"""A snapshot emptied while a command reads it (argv: sympool, work dir): PyTorch's
_dump_snapshot rewrites its file in place (open(path, "wb") empties it first), so a user who runs
`sympool plot` on a file a training job dumps to now and then can meet it. The file is read
through its mapping, and the pages past its new end faulted: the command died of SIGBUS. Now it
ends with exit 1 and one line naming the file. Each run empties the file at another moment after
the command started; whichever moment it is (before, during or after the read), the command exits
0 or 1, with at most one line on stderr, never by a signal."""
import os
import subprocess
import sys
import time

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
path = os.path.join(work, "rewritten.pickle")
# A pickle of 20 M small ints in one list (40 MB; no snapshot, which the command says once it has
# read it all): reading it takes long enough for the file to be emptied meanwhile.
doc = b"\x80\x04](" + b"K\x01" * (20 << 20) + b"e."
fails = []
for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
    with open(path, "wb") as f:
        f.write(doc)
    p = subprocess.Popen([cli, "info", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    time.sleep(delay)
    with open(path, "wb"):
        pass  # emptied, as open(path, "wb") does
    _, err = p.communicate(timeout=120)
    lines = err.splitlines()
    if p.returncode not in (0, 1) or len(lines) > 1 or (p.returncode == 1 and path not in err):
        fails.append(f"emptied after {delay} s: rc {p.returncode}, stderr {err!r}")
if fails:
    sys.exit("truncated while read:\n  " + "\n  ".join(fails))
print("ok")
