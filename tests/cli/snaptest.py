"""What the CLI tests that write their own snapshots share: a pickle writer into the work
directory, a runner of the sympool CLI, and a trace entry on stream 0."""
import os
import pickle
import subprocess


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
