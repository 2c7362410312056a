#!/usr/bin/env python3
"""Snapshots no PyTorch writes, each refused by every command that would misread it with exit 1
and one line on stderr naming the trace and what is wrong (argv: sympool, work dir):
 - segments on device 100 (SYMPOOL_HOST_DEVICES allows 64 emulated devices): replay printed the
   option's warning and an error blaming a SYMPOOL_HOST_DEVICES='101' nobody set; info, summary
   and plot still read such a snapshot (summary, with events to replay for its allocated peaks,
   printed the option's warning and left them unknown without a word: it says why instead);
 - a block whose state is none of PyTorch's three (active_allocated, active_pending_free,
   inactive): every command took it as live for the replay's starting state and as not
   allocated for the recorded run's, and said nothing;
 - no device at all (no segments, no device traces): summary printed nothing and exited 0
   (plot says there is no device);
 - one trace entry or segment referenced many times through the pickle's memo (a small file
   standing for millions of entries, or passes over the segments per device trace);
 - a segment's total_size or a block's size present but negative: "missing or bad", not
   "missing" (the key is there);
 - one stack referenced many times through the memo (100 MB of frame text from 46 KB);
 - a snapshot compressed (gzip, bzip2, xz, zstd), or a zip archive with no NAME/data.pkl in it
   (torch.save's, which every command reads: torch_save.py): said so, not read as a pickle that
   fails at some opcode."""
import bz2
import gzip
import io
import lzma
import os
import pickle
import sys
import zipfile

sys.dont_write_bytecode = True  # the shared helpers leave no cache in the source tree
from snaptest import runner, writer  # noqa: E402

cli, work = sys.argv[1], sys.argv[2]
write, run = writer(work), runner(cli)
MiB = 1 << 20
SEG = 0x7F00_0000_0000
fails = []


def segment(device, state="inactive"):
    return {"device": device, "address": SEG, "total_size": 2 * MiB, "stream": 0,
            "segment_type": "small",
            "blocks": [{"size": 2 * MiB, "state": state, "requested_size": 0}]}


def refused(what, args, needle):
    """args refused: exit 1, one line on stderr holding needle, nothing on stdout."""
    r = run(*args)
    lines = r.stderr.splitlines()
    if r.returncode != 1 or len(lines) != 1 or needle not in lines[0] or r.stdout:
        fails.append(f"{what}: rc {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}")


def accepted(what, args):
    r = run(*args)
    if r.returncode != 0:
        fails.append(f"{what}: rc {r.returncode}: {r.stderr!r}")


# Device 100: past the 64 emulated devices a replay has.
path = write("device100.pickle", {"segments": [segment(100)], "device_traces": [[]]})
for args in (["replay", path], ["replay", path, "--json"],
             ["replay", path, "--compare", "", "max_split_size_mb:64"]):
    refused("replay device 100 " + " ".join(args[2:]), args,
            path + ": the snapshot has 101 devices")
accepted("info device 100", ["info", path])
accepted("summary device 100", ["summary", path])
accepted("plot device 100", ["plot", path, "-o", os.path.join(work, "device100.svg")])
# ... with events on device 0: summary's allocated peaks are not replayed, and it says why.
events = [{"action": "alloc", "addr": SEG, "size": 512, "stream": 0, "time_us": 1}]
path = write("device100_events.pickle", {"segments": [segment(100)], "device_traces": [events]})
r = run("summary", path, "-d", "0")
if r.returncode != 0 or r.stderr != (f"sympool summary: note: {path}: the snapshot has 101 devices"
                                     " and a replay emulates at most 64: the allocated peaks are"
                                     " not replayed\n"):
    fails.append(f"summary device 100 with events: rc {r.returncode}, stderr {r.stderr!r}")
# Device 63 (64 devices) is still replayed.
path = write("device63.pickle", {"segments": [segment(63)], "device_traces": [[]]})
accepted("replay device 63", ["replay", path, "--json"])

# A block state PyTorch never writes.
path = write("state.pickle", {"segments": [segment(0, "freed")], "device_traces": [[]]})
for args in (["info", path], ["info", "--json", path], ["summary", path], ["replay", path],
             ["plot", path, "-o", os.path.join(work, "state.svg")]):
    refused(args[0] + " block state 'freed'", args,
            path + ": segments[0].blocks[0]: 'state' is none of active_allocated, "
            "active_pending_free, inactive")
for state in ("active_allocated", "active_pending_free", "inactive"):
    accepted("replay block state " + state,
             ["replay", write(state + ".pickle", {"segments": [segment(0, state)],
                                                  "device_traces": [[]]}), "--json"])

# No device at all.
path = write("no_device.pickle", {"segments": [], "device_traces": []})
refused("summary no device", ["summary", path], path + ": the snapshot has no device")
refused("plot no device", ["plot", path, "-o", os.path.join(work, "no_device.svg")],
        path + ": the snapshot has no device")
accepted("info no device", ["info", path])

# One object standing for many (the pickle's memo): a 4 MB pickle of one trace entry referenced
# 2,000,000 times took 131 MB for info (336 MB for replay), and one segment referenced 400,000
# times over 4096 device traces took 7.7 s of passes before its first error. Refused at once,
# before anything is allocated for them; a snapshot written out entry by entry (below) loads.
entry = {"action": "alloc", "addr": SEG, "size": 512, "stream": 0, "time_us": 1}
path = write("memo_entries.pickle", {"segments": [segment(0)], "device_traces": [[entry] * 500000]})
for args in (["info", path], ["summary", path], ["replay", path],
             ["plot", path, "-o", os.path.join(work, "memo_entries.svg")]):
    refused(args[0] + " one entry referenced 500000 times", args,
            path + ": the snapshot names 500002 trace entries, segments and blocks (over 1 "
            "device) in ")
path = write("memo_segments.pickle", {"segments": [segment(4095)] * 100000,
                                      "device_traces": [[] for _ in range(4096)]})
refused("info one segment referenced 100000 times over 4096 devices", ["info", path],
        path + ": the snapshot names 200000 trace entries, segments and blocks (over 4096 devices)")
# The same number of entries written out one by one (each its own dict) is within the bound.
spread = [dict(entry, addr=SEG + 512 * i, time_us=i) for i in range(2000)]
accepted("info 2000 entries written out", ["info", write("spread.pickle", {
    "segments": [segment(0)], "device_traces": [spread]})])

# A value present but not one PyTorch writes (a negative total_size or block size) is bad, not
# missing: every command said "missing 'address' or 'total_size'" of a segment that has both.
bad_total = dict(segment(0), total_size=-2 * MiB)
bad_block = dict(segment(0), blocks=[{"size": -512, "state": "inactive", "requested_size": 0}])
for name, seg, needle in (("bad_total", bad_total, "segments[0]: missing or bad 'address' or "
                           "'total_size'"),
                          ("bad_block", bad_block, "segments[0].blocks[0]: missing or bad 'size' "
                           "or 'state'")):
    path = write(name + ".pickle", {"segments": [seg], "device_traces": [[]]})
    for args in (["info", path], ["replay", path], ["summary", path]):
        refused(f"{args[0]} {name}", args, needle)

# One stack standing for many (the pickle's memo again): ten frames of one 10 KB file name shared
# by 1000 entries read as 100 MB of frame text from a 46 KB file (at a larger scale, 173 KB took
# `replay --snapshot OUT.json` to 16 GB, plot to 20 s). The commands that use the stacks refuse
# it at once (plot of one snapshot reads the stacks of its blocks at the peak); replay without
# --snapshot, summary and plot of several snapshots do not use them and run.
fname = "f" * 10000  # one str: the pickle holds it once
stack = [{"filename": fname, "line": i, "name": "g"} for i in range(10)]
bomb = [dict(entry, addr=SEG + 512 * i, time_us=i, frames=stack) for i in range(1000)]
path = write("stack_bomb.pickle", {"segments": [], "device_traces": [bomb]})
for args in (["replay", path, "--snapshot", os.path.join(work, "stack_bomb.json")],
             ["plot", path, "-o", os.path.join(work, "stack_bomb.svg")]):
    refused(args[0] + " one stack referenced 1000 times", args,
            path + ": its stacks repeat to more than 1024 x its ")
accepted("replay one stack referenced 1000 times, without stacks", ["replay", path, "--json"])
accepted("summary one stack referenced 1000 times (it shows no stacks)", ["summary", path])
accepted("plot of two snapshots, one of them the stack bomb (the ranks' chart shows no stacks)",
         ["plot", path, write("one_entry.pickle", {"segments": [], "device_traces": [[entry]]}),
          "-o", os.path.join(work, "two.svg")])
if os.path.exists(os.path.join(work, "stack_bomb.json")):
    fails.append("stack bomb: a snapshot was written")

# A snapshot compressed, or a zip archive that is no torch.save of one, is named for what it is:
# read as a pickle, the zip was "opcode PERSID at offset 0 not allowed", a bzip2 file a "truncated
# string (needs 825845850 bytes ...)" and a zstd one an "unknown opcode 0xb5".
raw = pickle.dumps({"segments": [segment(0)], "device_traces": [[]]}, protocol=4)
zbuf = io.BytesIO()
with zipfile.ZipFile(zbuf, "w") as z:  # torch.save's layout (archive/data.pkl) but no data.pkl
    z.writestr("archive/snapshot.pickle", raw)
for name, data, needle in (
        ("gz.pickle.gz", gzip.compress(raw), "a gzip-compressed file, not a snapshot"),
        ("bz2.pickle.bz2", bz2.compress(raw), "a bzip2-compressed file, not a snapshot"),
        ("xz.pickle.xz", lzma.compress(raw), "an xz-compressed file, not a snapshot"),
        ("zstd.pickle.zst", b"\x28\xb5\x2f\xfd" + raw, "a zstd-compressed file, not a snapshot"),
        ("saved.zip", zbuf.getvalue(),
         "a zip archive (what torch.save writes), but it has no NAME/data.pkl member")):
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(data)
    for args in (["info", path], ["replay", path], ["summary", path],
                 ["plot", path, "-o", os.path.join(work, name + ".svg")]):
        refused(f"{args[0]} {name}", args, path + ": " + needle)

if fails:
    sys.exit("hostile snapshots:\n  " + "\n  ".join(fails))
print("ok")
