"""What the CLI tests that write their own snapshots share: a pickle writer into the work
directory, a runner of the sympool CLI, a trace entry on stream 0, and a replay's own snapshot
with its loader."""
import json
import os
import pickle
import subprocess
import sys


def writer(work):
    """write(name, doc): doc pickled (protocol 4, as PyTorch dumps) to work/name; its path."""
    os.makedirs(work, exist_ok=True)

    def write(name, doc):
        path = os.path.join(work, name)
        with open(path, "wb") as f:
            pickle.dump(doc, f, protocol=4)
        return path
    return write


def runner(cli):
    """run(*args): the CLI run with args, its output captured as text."""
    def run(*args):
        return subprocess.run([cli, *args], capture_output=True, text=True)
    return run


def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}


def load(path):
    """A snapshot as Python reads it: JSON by its name, else a pickle."""
    with open(path, "rb") as f:
        return json.load(f) if path.endswith(".json") else pickle.load(f)


def replay_snapshot(cli, trace, out):
    """`sympool replay TRACE --snapshot OUT` on the host backend (OUT removed first, so that a
    stale one cannot pass): (our snapshot, the replay's stderr); exits the test on a failure."""
    if os.path.exists(out):
        os.unlink(out)
    r = subprocess.run([cli, "replay", trace, "--snapshot", out], capture_output=True,
                       text=True, env=dict(os.environ, SYMPOOL_DEVICE="host"))
    if r.returncode != 0:
        sys.exit("sympool replay %s: exit %d: %s" % (trace, r.returncode, r.stderr))
    return load(out), r.stderr
