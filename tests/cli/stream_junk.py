"""A stream of junk (a pipe, /dev/urandom, /dev/zero) is refused from its first bytes: not read
up to the 4 GiB input cap first, nor waited on for more once those bytes show it refused. What
the command says of it is what it says of a regular file that holds the same bytes.

usage: stream_junk.py SYMPOOL_CLI WORKDIR
"""

import os
import random
import re
import subprocess
import sys

CLI, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
PLANNED = 64 << 20  # what the writer offers; the reader should take a small part of it
CHUNK = 64 << 10


def file_message(cmd, data):
    path = os.path.join(WORK, "junk.bin")
    with open(path, "wb") as f:
        f.write(data)
    p = subprocess.run([CLI, cmd, path], capture_output=True, timeout=120)
    assert p.returncode != 0, (cmd, data[:16], p.stdout[:200])
    return p.stderr.decode("utf-8", "replace").replace(path, "INPUT")


def stream_message(cmd, data, more):
    """data, then more(i) for chunk i until PLANNED bytes, to the command's stdin: its message
    and how many bytes it took before it closed the pipe."""
    p = subprocess.Popen([CLI, cmd, "/dev/stdin"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sent, i, blob = 0, 0, data
    try:
        while sent < PLANNED:
            if not blob:
                blob = more(i)
                i += 1
            p.stdin.write(blob)
            p.stdin.flush()
            sent += len(blob)
            blob = b""
    except BrokenPipeError:
        pass
    try:
        p.stdin.close()
    except BrokenPipeError:
        pass
    err = p.stderr.read().decode("utf-8", "replace")
    rc = p.wait(timeout=120)
    assert rc != 0, (cmd, data[:16])
    return err.replace("/dev/stdin", "INPUT"), sent


rng = random.Random(27)
zeros = bytes(CHUNK)
cases = [
    b"(" + zeros,                    # MARK, then 0x00: no opcode
    b"}" + zeros,
    b"\x80\x02" + zeros,
    b"\x80\x09" + zeros,             # a protocol pickle.load does not read
    b"\x80\x04\x95" + (1 << 40).to_bytes(8, "little") + zeros,  # a frame past any input
    b"\x80\x04\x95" + (200).to_bytes(8, "little") + b"}q\x00\x01" + zeros,  # junk inside a frame
    b" \x80\x02" + zeros,            # a pickle that does not start at byte 0
    b"\xef\xbb\xbf\x80\x02" + zeros,  # a byte order mark before a pickle
    b"(X\x03\x00\x00\x00abc\x81" + zeros,  # NEWOBJ, refused where it is
    b"(I12\n\x00" + zeros,           # a text opcode's line, then junk
    b"\x80\x02T\xf0\xff\xff\xff" + zeros,  # BINSTRING with a negative length
    b"\x80\x02(\x8b\x00\x00\x00\x80" + zeros,  # LONG4 with a negative length
    b'{"a": "x' + zeros,              # JSON: a control character (in a string or out)
    b"\xef\xbb\xbf  [1, 2" + zeros,
    b'{"segments": [], "k": "\xff"' + zeros,  # a byte that is never UTF-8
    # A zip archive (torch.save's) is read to its end, but only while members follow one
    # another: no header where the next should be is refused there.
    b"PK\x03\x04" + zeros,
    b"PK\x03\x04" + bytes([20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0,
                            1, 0, 0, 0]) + b"ahello" + zeros,
]
FIXED = len(cases)  # those above: each stopped at its first bytes
for seed in range(40):
    cases.append(bytes(rng.choice(b"(}]\x80KJMqh") for _ in range(1)) +
                 bytes(rng.getrandbits(8) for _ in range(CHUNK)))
for seed in range(10):  # JSON documents' first bytes, then junk
    cases.append(rng.choice([b"{", b"[", b' {"segments": [', b"\xef\xbb\xbf["]) +
                 bytes(rng.getrandbits(8) for _ in range(CHUNK)))

checked = 0
for cmd in ("info", "replay"):
    for k, data in enumerate(cases):
        want = file_message(cmd, data)
        if k >= FIXED and ("truncated" in want or "runs past the end" in want):
            continue  # a length that reaches past these bytes: the stream's rest would count
        got, sent = stream_message(cmd, data, lambda i: bytes(CHUNK))
        assert got == want, (cmd, k, data[:24], want, got)
        # The pipe was closed long before the writer's 64 MiB were all taken.
        assert sent < 8 << 20, (cmd, k, data[:24], sent)
        checked += 1
assert checked >= 120, checked

# A writer that sends a few junk bytes and then nothing more, keeping the pipe open: the
# command refuses them without waiting for more (it waited for a whole MB).
for cmd in ("info", "replay"):
    p = subprocess.Popen([CLI, cmd, "/dev/stdin"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    p.stdin.write(b"(\x00")
    p.stdin.flush()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(cmd + ": still reading a pipe whose first bytes are refused")
    err = p.stderr.read().decode()
    p.stdin.close()
    assert rc == 1 and "unknown opcode 0x00 at offset 1" in err, (rc, err)

# A pipe that holds a MB of junk before the command's first read (its buffer grown with
# F_SETPIPE_SZ; the writer keeps it open): that first read is more than the bytes looked at,
# and their refusal is still not left for the rest.
r, w = os.pipe()
try:
    import fcntl
    fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    big = True
except (ImportError, OSError):
    big = False
if big:
    os.write(w, b"(" + bytes((1 << 20) - 1))
    p = subprocess.Popen([CLI, "info", "/dev/stdin"], stdin=r, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    os.close(r)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError("a first read past the bytes looked at: still reading")
    os.close(w)
    err = p.stderr.read().decode()
    assert rc == 1 and "unknown opcode 0x00 at offset 1" in err, (rc, err)

# Valid snapshots through a pipe still load (read to the end: what arrives is parsed as it
# comes, and a pickle cut short is no refusal), as their files do.
data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
for name in ("cs336-2.7b-ctx128-forward-bf16.pickle", "trace-small-p4.pickle",
             "trace-gc-tiny.json"):
    trace = os.path.join(data_dir, name)
    with open(trace, "rb") as f:
        data = f.read()
    for cmd in (["info", "--json"], ["replay", "--json"]):
        p = subprocess.Popen([CLI] + cmd + ["/dev/stdin"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(data, timeout=120)
        q = subprocess.run([CLI] + cmd + [trace], capture_output=True, timeout=120)
        assert p.returncode == 0 and q.returncode == 0, (name, cmd, err[-300:], q.stderr[-300:])
        strip = re.compile(rb'"ns_per_event":[0-9.e+-]+')
        assert strip.sub(b"", out.replace(b"/dev/stdin", b"X")) == \
            strip.sub(b"", q.stdout.replace(trace.encode(), b"X")), (name, cmd)
# A valid snapshot cut, or one byte changed, at random in its first 64 KiB (what the stream's
# first bytes are judged by), junk after the cut: through a pipe the command says what it says
# of the same bytes in a file, to the byte (refused or not).
for name in ("trace-small-p4.pickle", "trace-gc-tiny.json"):
    with open(os.path.join(data_dir, name), "rb") as f:
        whole = f.read()
    for it in range(20):
        k = rng.randrange(1, min(len(whole), 70000))
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
        if it % 2 == 0:
            data = whole[:k] + junk + whole[k:k + 100000]
        else:
            b = bytearray(whole[:k + 100000])
            b[k] = rng.getrandbits(8)
            data = bytes(b)
        path = os.path.join(WORK, "cut.bin")
        with open(path, "wb") as f:
            f.write(data)
        a = subprocess.run([CLI, "info", path], capture_output=True, timeout=120)
        p = subprocess.Popen([CLI, "info", "/dev/stdin"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(data, timeout=120)
        assert (a.returncode, a.stdout.replace(path.encode(), b"X"),
                a.stderr.replace(path.encode(), b"X")) == \
            (p.returncode, out.replace(b"/dev/stdin", b"X"), err.replace(b"/dev/stdin", b"X")), \
            (name, it, k, a.stderr[-200:], err[-200:])
        checked += 1
print("ok", checked)
