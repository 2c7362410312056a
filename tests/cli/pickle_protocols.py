#!/usr/bin/env python3
"""A snapshot re-pickled with any protocol a user may pick (pickle.dump(snap, f, protocol=0..3);
protocols 0 and 1 have no PROTO, protocol 0 is text: INT, LONG, FLOAT, UNICODE, PUT, GET) reads
as the protocol-4 original (argv: sympool, work dir, real traces...): `replay --json` (but its
timing), `info` (but the protocol it names), `info --json`, `summary` and `plot`'s SVG are the
same, byte for byte. A malformed text opcode is refused naming what is wrong, with a nonzero exit."""
import json
import os
import pickle
import re
import shutil
import subprocess
import sys

cli, work, traces = sys.argv[1], sys.argv[2], sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)


def run(*args):
    return subprocess.run([cli, *args], capture_output=True)


def outputs(path):
    """What each command prints of path, with what may differ between protocols taken out."""
    out = {}
    r = run("replay", path, "--json")
    out["replay"] = (r.returncode, re.sub(rb'"ns_per_event":[0-9.eE+-]*', b"", r.stdout), r.stderr)
    r = run("info", path)
    out["info"] = (r.returncode, re.sub(rb"pickle protocol [0-5],", b"pickle protocol N,", r.stdout),
                   r.stderr)
    r = run("info", path, "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else None
    protocol = j["format"].pop("pickle_protocol") if j else None
    out["info --json"] = (r.returncode, j, r.stderr)
    r = run("summary", path)
    out["summary"] = (r.returncode, r.stdout, r.stderr)
    svg = os.path.join(work, "plot.svg")
    r = run("plot", path, "-o", svg)
    out["plot"] = (r.returncode, None, r.stderr)
    if os.path.exists(svg):
        with open(svg, "rb") as f:
            out["plot"] = (r.returncode, f.read(), r.stderr)
        os.unlink(svg)
    return out, protocol


for trace in traces:
    name = os.path.basename(trace)
    with open(trace, "rb") as f:
        snap = pickle.load(f)
    # Every copy at one path in turn: the commands print it.
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, name)
    shutil.copyfile(trace, path)
    want, p = outputs(path)
    if p != 4 or any(rc != 0 for rc, _, _ in want.values()):
        sys.exit(f"{name}: the protocol-4 original: protocol {p}, {want}")
    for proto in (0, 1, 2, 3):
        with open(path, "wb") as f:
            pickle.dump(snap, f, protocol=proto)
        got, p = outputs(path)
        if p != proto:
            sys.exit(f"{name} protocol {proto}: info --json names protocol {p}")
        for cmd in want:
            if got[cmd] != want[cmd]:
                sys.exit(f"{name} protocol {proto}: `{cmd}` differs from protocol 4's:\n"
                         f"{str(got[cmd])[:600]}\n{str(want[cmd])[:600]}")

# Malformed text opcodes in a protocol-0 snapshot: each refused by every command, saying what.
with open(traces[0], "rb") as f:
    p0 = pickle.dumps(pickle.load(f), protocol=0)
cases = {
    # a number that is no number
    "bad_int": (re.sub(rb"\nI(\d+)\n", rb"\nI\g<1>x\n", p0, count=1),
                rb"INT argument '\d+x' is not a decimal integer"),
    # a LONG cut at the end of the file: no newline
    "cut_long": (p0[: p0.index(b"\nL") + 4], rb"truncated LONG \(no newline ends its argument\)"),
    # a GET of a memo key never PUT
    "unknown_get": (re.sub(rb"\ng\d+\n", b"\ng99999999\n", p0, count=1),
                    rb"memo key 99999999 is not defined"),
    # a UNICODE with a cut escape
    "bad_unicode": (p0.replace(b"\nV", b"\nV\\u12", 1),
                    rb"UNICODE argument '\\x5cu12.*' has a truncated \\u escape"),
    # a STRING without its closing quote
    "bad_string": (p0.replace(b"\nV", b"\nS'", 1), rb"STRING argument .* is not quoted"),
    # a FLOAT past a double's range
    "float_overflow": (re.sub(rb"\nF[^\n]*\n", b"\nF1e999\n", p0, count=1),
                       rb"FLOAT argument '1e999' is too large for a float"),
}
os.makedirs(os.path.join(work, "bad"), exist_ok=True)
for case, (data, want) in cases.items():
    if data == p0:
        sys.exit(f"{case}: the trace has nothing to break")
    path = os.path.join(work, "bad", case + ".pickle")
    with open(path, "wb") as f:
        f.write(data)
    for cmd in ("info", "replay", "summary", "plot"):
        r = run(cmd, path, *(["-o", os.path.join(work, "bad.svg")] if cmd == "plot" else []))
        if r.returncode == 0 or not re.search(rb"pickle: " + want + rb".* at offset \d+",
                                              r.stderr):
            sys.exit(f"{cmd} {case}: rc {r.returncode}: {r.stderr[:400]}")
print("ok")
