#!/usr/bin/env python3
"""Traces no allocator could have written, which the replay must still run through without
freeing a block twice or losing one (argv: sympool, work dir); found by the whole-replay fuzzer
(tests/fuzz/fuzz_replay.c):
 - an address allocated twice with no free between: the first block stays held to the end, as
   the address map held it, and is given back with the others, so --repeat's sp_shutdown before
   the next replay finds nothing left (it refused with 'blocks are still allocated', and the
   command failed with an empty reason; --compare's rows failed as 'sp_init: sp_shutdown...');
 - an address freed twice and never allocated (two blocks live at the start at one address):
   the one the address map replaces is given back at the end as well (the same refusal);
 - a starting block that the trace frees with a request larger than its segment (taken at its
   recorded size, then asked again at its request, which is an OOM): the block given back is not
   freed a second time (the replay failed on 'not a pointer sympool returned');
 - a --compare configuration with blanks around a SYMPOOL_NAME=VALUE item, its name or its value
   ("max_split_size_mb:40, SYMPOOL_HOST_CAPACITY = 1MiB"), as ALLOC_CONF's items take them: the
   item was sent to ALLOC_CONF, which refused the configuration ("expected key:value");
 - a SYMPOOL_ item whose value is a comma list (SYMPOOL_DEBUG_SUBSYS=ENV,INIT): its list was cut
   at the first comma, and the rest ("INIT") sent to ALLOC_CONF, which refused it; so was a
   list in brackets (SYMPOOL_ROUNDUP_POWER2_DIVISIONS=[1:8,>:8])."""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # the shared helpers leave no cache in the source tree
from snaptest import entry, runner, writer  # noqa: E402

cli, work = sys.argv[1], sys.argv[2]
write, run = writer(work), runner(cli)
MiB = 1 << 20
GiB = 1 << 30
SEG = 0x7F00_0000_0000


# One address allocated twice, freed once.
path = write("twice.pickle", {"segments": [], "device_traces": [[
    entry("alloc", SEG, 512, 1), entry("alloc", SEG, 512, 2),
    entry("free_requested", SEG, 512, 3), entry("free_completed", SEG, 512, 4)]]})
once = run("replay", path, "--json")
if once.returncode != 0:
    sys.exit(f"replay twice: rc {once.returncode}: {once.stderr}")
r = run("replay", path, "--json", "--repeat", "3")
if r.returncode != 0:
    sys.exit(f"replay twice --repeat 3: rc {r.returncode}: {r.stderr}")
a, b = json.loads(once.stdout), json.loads(r.stdout)
for k in ("allocs", "frees", "peak_allocated_bytes", "end_allocated_bytes"):
    if a[k] != b[k]:
        sys.exit(f"replay twice: {k} {a[k]} once, {b[k]} with --repeat 3")
if a["end_allocated_bytes"] != 512:
    sys.exit(f"replay twice: the first block is not held to the end: {once.stdout}")
r = run("replay", path, "--compare", "max_split_size_mb:20", "--repeat", "2")
if r.returncode != 0 or "sp_shutdown" in r.stderr:
    sys.exit(f"replay twice --compare --repeat 2: rc {r.returncode}: {r.stderr}")

# One address freed twice, never allocated: two starting blocks there.
path = write("seeded_twice.pickle", {"segments": [], "device_traces": [[
    entry("alloc", SEG + 64 * MiB, 30 * MiB, 1),
    entry("free_requested", SEG, 40 * MiB, 2), entry("free_requested", SEG, 40 * MiB, 3)]]})
once = run("replay", path, "--json")
r = run("replay", path, "--json", "--repeat", "2")
if once.returncode != 0 or r.returncode != 0:
    sys.exit(f"replay seeded_twice: rc {once.returncode}, --repeat 2: rc {r.returncode}: "
             f"{r.stderr}")
a, b = json.loads(once.stdout), json.loads(r.stdout)
if (a["seeded_blocks"], a["frees"]) != (2, 2) or \
        a["peak_allocated_bytes"] != b["peak_allocated_bytes"]:
    sys.exit(f"replay seeded_twice: {once.stdout} / {r.stdout}")

# A 2 MiB segment's one block, free in the final state, freed by the trace with a 200 GiB request (past the emulated 80 GiB).
seg = {"device": 0, "address": SEG, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
       "blocks": [{"address": SEG, "size": 2 * MiB, "state": "inactive", "requested_size": 0}]}
path = write("whole_oom.pickle", {"segments": [seg], "device_traces": [[
    entry("free_requested", SEG, 200 * GiB, 1), entry("free_completed", SEG, 200 * GiB, 2)]]})
r = run("replay", path, "--json")
if r.returncode != 0:
    sys.exit(f"replay whole_oom: rc {r.returncode}: {r.stderr}")
j = json.loads(r.stdout)
if j["ooms"] != 1 or j["skipped_frees"] != 1:
    sys.exit(f"replay whole_oom: {r.stdout}")
# Blanks around a SYMPOOL_ item of a --compare configuration: the item sets its option (the
# emulated device of 1 MiB cannot hold the 4 MiB block), and a SYMPOOL_DEBUG_FILE item naming the
# trace is still refused, the trace left whole.
path = write("blanks.pickle", {"segments": [], "device_traces": [[
    entry("alloc", SEG, 4 * MiB, 1), entry("free_requested", SEG, 4 * MiB, 2),
    entry("free_completed", SEG, 4 * MiB, 3)]]})
for conf in ("max_split_size_mb:40, SYMPOOL_HOST_CAPACITY = 1MiB", " SYMPOOL_HOST_CAPACITY=1MiB ",
             "SYMPOOL_HOST_CAPACITY\t=\t1MiB"):
    r = run("replay", path, "--json", "--compare", "", conf)
    rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
    if [row["ooms"] for row in rows] != [0, 1]:
        sys.exit(f"replay --compare '{conf}': rc {r.returncode}: {r.stdout}{r.stderr}")
with open(path, "rb") as f:
    before = f.read()
r = run("replay", path, "--compare", f" SYMPOOL_DEBUG_FILE = {path} ")
with open(path, "rb") as f:
    after = f.read()
if r.returncode != 2 or "names the trace being replayed" not in r.stderr or after != before:
    sys.exit(f"replay --compare ' SYMPOOL_DEBUG_FILE = {path} ': rc {r.returncode}: {r.stderr}")
# A SYMPOOL_ item's comma list is the item's: INIT (the "allocator ready" line's subsystem) is
# logged with ENV,INIT and not with ENV alone; a bad list is refused whole, as the variable's.
for conf, want in (("SYMPOOL_DEBUG_SUBSYS=ENV,INIT", 1), ("SYMPOOL_DEBUG_SUBSYS=ENV", 0),
                   ("SYMPOOL_DEBUG_SUBSYS=ENV,INIT,max_split_size_mb:40", 1),
                   ("max_split_size_mb:40, SYMPOOL_DEBUG_SUBSYS = ENV , INIT ", 1)):
    r = subprocess.run([cli, "replay", path, "--json", "--compare", conf], capture_output=True,
                       text=True, env=dict(os.environ, SYMPOOL_DEBUG="INFO"))
    if r.returncode != 0 or r.stderr.count("allocator ready") != want:
        sys.exit(f"replay --compare '{conf}': rc {r.returncode}: {r.stderr}")
r = run("replay", path, "--compare", "SYMPOOL_DEBUG_SUBSYS=ENV,BOGUS")
if r.returncode != 2 or "SYMPOOL_DEBUG_SUBSYS='ENV,BOGUS' is malformed" not in r.stderr:
    sys.exit(f"replay --compare 'SYMPOOL_DEBUG_SUBSYS=ENV,BOGUS': rc {r.returncode}: {r.stderr}")
# ... and so is a list in brackets: the variable rounds a 1300000-byte block as the key does
# (to 10 steps of 128 KiB, not to 512 bytes).
path = write("roundup.pickle", {"segments": [], "device_traces": [[
    entry("alloc", SEG, 1300000, 1)]]})
for conf in ("SYMPOOL_ROUNDUP_POWER2_DIVISIONS=[1:8,>:8]",
             "SYMPOOL_ROUNDUP_POWER2_DIVISIONS=[1:8,>:8],max_split_size_mb:40",
             "roundup_power2_divisions:[1:8,>:8]"):
    r = run("replay", path, "--json", "--compare", "", conf)
    rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
    if [row["peak_allocated_bytes"] for row in rows] != [1300480, 10 * 128 * 1024]:
        sys.exit(f"replay --compare '{conf}': rc {r.returncode}: {r.stdout}{r.stderr}")
print("ok")
