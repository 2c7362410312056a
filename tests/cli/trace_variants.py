#!/usr/bin/env python3
"""Snapshots of forms seen in public repositories, each read as what it is (argv: sympool, work
dir):
 - frees recorded as free_completed only (no free_requested; other tools write traces so), or
   as single "free" entries (MemoryViz's): info counts them, and the replay frees the blocks (one
   segment, reused, as recorded);
 - a trace that requests more than the recorded run reserved (blocks outside the recorded
   segments, no segment_alloc for them): the replay says the trace is inconsistent, also when
   the recorded run reserved nothing at all (there is no percentage to differ by), in its text
   and in --json's differs_because;
 - entries of actions sympool does not know: the replay says they were ignored;
 - annotations ("user_defined" entries): info counts them as such, and the replay does not give
   them as a reason it differs;
 - segments placed each below the last: the replay places its own where the recorded ones were,
   and breaks ties among free blocks of one size as PyTorch did;
 - a block live at the start that kept a remainder PyTorch did not split off, which only a later
   alloc's address, or the next live block's, shows: the replay rebuilds it at that size;
 - blocks the user freed while other streams used them ("active_pending_free" at the end, no
   entry naming them): freed at the start, not allocated, and not reused while pending;
 - a recording made with expandable segments: replayed with its settings, by PyTorch's rules;
 - a free_completed of a block no entry before it names: pending at the start (or, in a trace
   of completions only, live until then);
 - one whose window began after pages between two mapped ranges of a segment were unmapped: the
   ranges are rebuilt as far apart as they were, so a growth maps those pages again (the hole
   is the lowest that holds it) instead of new ones at the end;
 - a pickled list of something else than segment dicts: not a memory snapshot."""
import json
import os
import pickle
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # the shared helpers leave no cache in the source tree
from snaptest import entry, replay_snapshot, runner, writer  # noqa: E402

cli, work = sys.argv[1], sys.argv[2]
write, run = writer(work), runner(cli)
MiB = 1 << 20
SEG = 0x7F00_0000_0000
OUT = 0x7E00_0000_0000  # in no recorded segment


def segment(addr, size):
    return {"device": 0, "address": addr, "total_size": size, "stream": 0,
            "segment_type": "large", "blocks": [{"size": size, "state": "inactive",
                                                 "requested_size": 0}]}


# Frees as completions only: three 20 MiB blocks one after another in the one 20 MiB segment.
entries = [entry("segment_alloc", SEG, 20 * MiB, 1)]
for k in range(3):
    entries += [entry("alloc", SEG, 20 * MiB, 10 * k + 2), entry("free_completed", SEG, 20 * MiB,
                                                                 10 * k + 3)]
path = write("completions.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                    "device_traces": [entries]})
r = run("info", path)
if r.returncode != 0 or "free_completed (no free_requested before them): 3, read as the frees" \
        not in r.stdout:
    sys.exit(f"info completions: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path, "--json")
if r.returncode != 0:
    sys.exit(f"replay completions: rc {r.returncode}: {r.stderr}")
j = json.loads(r.stdout)
if (j["frees"], j["num_device_alloc"], j["peak_reserved_bytes"]) != (3, 1, 20 * MiB) or \
        j["pytorch_peak_reserved_bytes"] != 20 * MiB:
    sys.exit(f"replay completions: {r.stdout}")

# The same frees as single "free" entries (a request and its completion in one, as MemoryViz
# writes the pairs it elides).
entries = [entry("segment_alloc", SEG, 20 * MiB, 1)]
for k in range(3):
    entries += [entry("alloc", SEG, 20 * MiB, 10 * k + 2), entry("free", SEG, 20 * MiB, 10 * k + 3)]
path = write("free_entries.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                     "device_traces": [entries]})
r = run("info", path)
if r.returncode != 0 or "alloc 3, free_requested 3," not in r.stdout or \
        "recorded as 'free' (a request and its completion in one entry): 3" not in r.stdout:
    sys.exit(f"info free entries: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path, "--json")
if r.returncode != 0:
    sys.exit(f"replay free entries: rc {r.returncode}: {r.stderr}")
j = json.loads(r.stdout)
if (j["frees"], j["num_device_alloc"], j["peak_reserved_bytes"]) != (3, 1, 20 * MiB):
    sys.exit(f"replay free entries: {r.stdout}")

# More requested than reserved: a 20 MiB segment recorded, 64 MiB blocks outside it.
entries = [entry("alloc", OUT, 64 * MiB, 1), entry("free_requested", OUT, 64 * MiB, 2),
           entry("free_completed", OUT, 64 * MiB, 3)]
for name, segs in (("outgrown.pickle", [segment(SEG, 20 * MiB)]), ("unreserved.pickle", [])):
    path = write(name, {"segments": segs, "device_traces": [entries]})
    r = run("replay", path)
    if r.returncode != 0 or "differs by more than 2%" not in r.stdout or \
            "an inconsistent trace (blocks outside the recorded segments" not in r.stdout:
        sys.exit(f"replay {name}: rc {r.returncode}: {r.stdout}{r.stderr}")
    if not segs and "recorded run: 0 bytes" not in r.stdout:
        sys.exit(f"replay {name}: {r.stdout}")
    # --json gives the same reasons (and only where the replay differs: not for the traces above)
    r = run("replay", path, "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    if "an inconsistent trace (blocks outside the recorded segments" not in \
            j.get("differs_because", ""):
        sys.exit(f"replay --json {name}: rc {r.returncode}: {r.stdout}{r.stderr}")
for name in ("completions.pickle", "free_entries.pickle"):
    r = run("replay", os.path.join(work, name), "--json")
    if r.returncode != 0 or "differs_because" in json.loads(r.stdout):
        sys.exit(f"replay --json {name}: rc {r.returncode}: {r.stdout}{r.stderr}")

# Entries of an action sympool does not know (here frees under another name): ignored, and the
# replay says so when it differs.
entries = [entry("segment_alloc", SEG, 20 * MiB, 1)]
for k in range(3):
    entries += [entry("alloc", SEG, 20 * MiB, 10 * k + 2),
                entry("released", SEG, 20 * MiB, 10 * k + 3)]
path = write("unknown.pickle", {"segments": [segment(SEG, 20 * MiB)], "device_traces": [entries]})
r = run("replay", path)
if r.returncode != 0 or "differs by more than 2%" not in r.stdout or \
        "3 trace entries of actions sympool does not know were ignored" not in r.stdout:
    sys.exit(f"replay unknown: rc {r.returncode}: {r.stdout}{r.stderr}")

# Annotations some PyTorch versions wrote among the allocator's entries ("user_defined", a
# record_function scope's name as the frames, address and size 0): counted as what they are, and
# not given as a reason the replay differs (here it does because the trace outgrows its segment).
def annotation(name, t):
    return dict(entry("user_defined", 0, 0, t), frames=[{"name": name, "filename": "", "line": 0}])


entries = [annotation("## forward ##", 0), entry("alloc", OUT, 64 * MiB, 1),
           entry("free_requested", OUT, 64 * MiB, 2), entry("free_completed", OUT, 64 * MiB, 3),
           annotation("## forward ##", 4)]
path = write("annotated.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                  "device_traces": [entries]})
r = run("info", path)
if r.returncode != 0 or ", user_defined 2" not in r.stdout or ", other " in r.stdout:
    sys.exit(f"info annotated: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path)
if r.returncode != 0 or "an inconsistent trace (blocks outside" not in r.stdout or \
        "actions sympool does not know" in r.stdout:
    sys.exit(f"replay annotated: rc {r.returncode}: {r.stdout}{r.stderr}")

# Two free blocks of one size, in segments CUDA placed each below the one before (as in most
# recorded runs): PyTorch takes the lower one, the newer segment. The replay places its segments at
# the recorded addresses (shifted), so it takes the same block: the 40 MiB request then fits where the older
# segment's two halves merged (60 MiB reserved, as recorded; placed the other way up, 100 MiB).
HI, LO = SEG, SEG - (1 << 30)
evs = [("segment_alloc", HI, 40), ("alloc", HI, 40), ("free_requested", HI, 40),
       ("free_completed", HI, 40), ("alloc", HI, 20), ("alloc", HI + 20 * MiB, 20),
       ("segment_alloc", LO, 20), ("alloc", LO, 20), ("free_requested", HI, 20),
       ("free_completed", HI, 20), ("free_requested", LO, 20), ("free_completed", LO, 20),
       ("alloc", LO, 20), ("free_requested", HI + 20 * MiB, 20),
       ("free_completed", HI + 20 * MiB, 20), ("alloc", HI, 40)]
entries = [entry(a, addr, n * MiB, t) for t, (a, addr, n) in enumerate(evs)]
live = lambda addr, n: {"device": 0, "address": addr, "total_size": n * MiB, "stream": 0,
                        "segment_type": "large", "blocks": [{"size": n * MiB, "state":
                                                             "active_allocated",
                                                             "requested_size": n * MiB}]}
path = write("descending.pickle", {"segments": [live(LO, 20), live(HI, 40)],
                                   "device_traces": [entries]})
r = run("replay", path, "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
if (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes")) != (60 * MiB, 60 * MiB):
    sys.exit(f"replay descending: rc {r.returncode}: {r.stdout}{r.stderr}")

# A block live at the start (a 4 MiB request at SEG, freed at the end) kept a 960 KiB remainder,
# which the final state cannot show (the block is freed by then): an 8 MiB alloc lands 960 KiB
# past the request's end, where the free block began. Rebuilt at 4 MiB the tail after the 8 MiB
# block would hold the 51.5 MiB request; rebuilt as it was it does not, and a 52 MiB segment is
# made, as recorded (116 MiB reserved; 64 MiB before the remainder was inferred).
A, SEG2 = SEG + 4 * MiB + 960 * 1024, SEG + (1 << 30)
evs = [("alloc", A, 8 * MiB), ("segment_alloc", SEG2, 52 * MiB), ("alloc", SEG2, 51 * MiB + MiB // 2),
       ("free_requested", SEG, 4 * MiB), ("free_completed", SEG, 4 * MiB),
       ("free_requested", A, 8 * MiB), ("free_completed", A, 8 * MiB),
       ("free_requested", SEG2, 51 * MiB + MiB // 2), ("free_completed", SEG2, 51 * MiB + MiB // 2)]
entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
path = write("kept_remainder.pickle", {"segments": [segment(SEG, 64 * MiB), segment(SEG2, 52 * MiB)],
                                       "device_traces": [entries]})
r = run("replay", path, "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
if (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes")) != (116 * MiB, 116 * MiB):
    sys.exit(f"replay kept remainder: rc {r.returncode}: {r.stdout}{r.stderr}")

# The same kept remainder shown by the next live block instead: a 4 MiB request at SEG, freed at
# the end, then an 8 MiB block live throughout 960 KiB past the request's end. Every large-pool
# block is over 1 MiB, so those 960 KiB were the first block's; the free tail is 51.06 MiB and a
# 52 MiB request needs a segment of its own, as recorded (116 MiB; 64 MiB before, the 8 MiB block
# rebuilt 960 KiB lower and the tail large enough).
B = SEG + 4 * MiB + 960 * 1024
seg = segment(SEG, 64 * MiB)
seg["blocks"] = [{"size": 4 * MiB + 960 * 1024, "state": "inactive", "requested_size": 0},
                 {"size": 8 * MiB, "state": "active_allocated", "requested_size": 8 * MiB},
                 {"size": 64 * MiB - 12 * MiB - 960 * 1024, "state": "inactive", "requested_size": 0}]
evs = [("segment_alloc", SEG2, 52 * MiB), ("alloc", SEG2, 52 * MiB),
       ("free_requested", SEG, 4 * MiB), ("free_completed", SEG, 4 * MiB),
       ("free_requested", SEG2, 52 * MiB), ("free_completed", SEG2, 52 * MiB)]
entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
path = write("kept_before_live.pickle", {"segments": [seg, segment(SEG2, 52 * MiB)],
                                         "device_traces": [entries]})
r = run("replay", path, "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
if (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes")) != (116 * MiB, 116 * MiB):
    sys.exit(f"replay kept before a live block: rc {r.returncode}: {r.stdout}{r.stderr}")

# A 20 MiB block freed while another stream used it, before recording began, still pending at the
# end (its events never completed), beside a live 10 MiB one and 10 MiB free: the replay frees it
# on a side stream at the start, so it counts as active, not allocated (PyTorch's stats: the
# allocated bytes drop at the free, the block waits for its events), and the trace's 20 MiB alloc
# cannot take it: a new 20 MiB segment. The replay's own snapshot shows it pending.
seg = segment(SEG, 40 * MiB)
seg["blocks"] = [{"size": 20 * MiB, "state": "active_pending_free", "requested_size": 20 * MiB},
                 {"size": 10 * MiB, "state": "active_allocated", "requested_size": 10 * MiB},
                 {"size": 10 * MiB, "state": "inactive", "requested_size": 0}]
for name, entries, segs in (
        ("pending_state.pickle", [], [seg]),
        ("pending_trace.pickle",
         [entry("segment_alloc", SEG2, 20 * MiB, 1), entry("alloc", SEG2, 20 * MiB, 2)],
         [seg, {**segment(SEG2, 20 * MiB), "blocks": [
             {"size": 20 * MiB, "state": "active_allocated", "requested_size": 20 * MiB}]}])):
    path = write(name, {"segments": segs, "device_traces": [entries]})
    live = 10 * MiB + (20 * MiB if entries else 0)
    r = run("replay", path, "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    if (j.get("end_allocated_bytes"), j.get("pytorch_end_allocated_bytes"), j.get("peak_allocated_bytes"),
            j.get("num_device_alloc"), j.get("peak_reserved_bytes")) != \
            (live, live, live, 1 if entries else 0, live + 30 * MiB):
        sys.exit(f"replay {name}: rc {r.returncode}: {r.stdout}{r.stderr}")
    # The pending block is held through the peak: active, the floor of the peak reserved, given
    # as the last key (older readers see the keys before it as they were).
    if j.get("peak_active_bytes") != live + 20 * MiB or \
            list(j)[-2:] != ["peak_active_bytes", "page_floor_bytes"] or \
            j.get("page_floor_bytes") != live + 20 * MiB:  # whole pages already
        sys.exit(f"replay {name} peak_active_bytes: {r.stdout}")
    r = run("replay", path)
    if r.returncode != 0 or "pending at the start 1 blocks freed before recording began while other streams used them" \
            not in r.stdout or "  peak active          " not in r.stdout:
        sys.exit(f"replay {name} text: rc {r.returncode}: {r.stdout}{r.stderr}")
    out = os.path.join(work, "out_" + name)
    r = run("replay", path, "--snapshot", out)
    with open(out, "rb") as f:
        states = [b["state"] for s in pickle.load(f)["segments"] for b in s["blocks"]]
    if r.returncode != 0 or states.count("active_pending_free") != 1:
        sys.exit(f"replay {name} --snapshot: rc {r.returncode}: {states}{r.stderr}")

# Recorded with expandable segments, so under PyTorch's rules: one 20 MiB unit mapped for a 3 MiB
# block. Replayed with the snapshot's settings the replay re-enacts those rules (20 MiB, as
# recorded; sympool's 2 MiB pages would map 4 MiB); with --conf it asks what sympool does.
conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True,
        "max_split_size": -1, "garbage_collection_threshold": 0.0}
seg = {**segment(SEG, 20 * MiB), "is_expandable": True}
evs = [("segment_map", SEG, 20 * MiB), ("alloc", SEG, 3 * MiB), ("free_requested", SEG, 3 * MiB),
       ("free_completed", SEG, 3 * MiB)]
entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
path = write("expandable_recorded.pickle", {"segments": [seg], "device_traces": [entries],
                                            "allocator_settings": conf})
for args, want in (((), 20 * MiB), (("--conf", "expandable_segments:True"), 4 * MiB)):
    r = run("replay", path, "--json", *args)
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    if (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes")) != (want, 20 * MiB):
        sys.exit(f"replay expandable recorded {args}: rc {r.returncode}: {r.stdout}{r.stderr}")
# --compare: the snapshot's settings alone re-enact them too; an item added asks about ours.
r = run("replay", path, "--json", "--compare", "", "expandable_segments:True")
peaks = [json.loads(l)["peak_reserved_bytes"] for l in r.stdout.splitlines()] \
    if r.returncode == 0 else []
if peaks != [20 * MiB, 4 * MiB]:
    sys.exit(f"replay expandable recorded --compare: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path)
if r.returncode != 0 or "the snapshot's: 'expandable_segments:True', by PyTorch's rules" \
        not in r.stdout:
    sys.exit(f"replay expandable recorded text: rc {r.returncode}: {r.stdout}{r.stderr}")

# Expandable segments whose window began after pages between mapped ranges were unmapped: at the
# start, mapped ranges with unmapped pages between them (the segment's end state less the
# trace's map). The live block at the start is freed, and a request twice its size maps the
# 20 MiB after it (free block + unmapped pages hold it): 20 MiB more, not a new 40 MiB at the
# end. With two holes the first one (20 MiB) is unmapped before the second (40 MiB) is laid
# out. Case: (ranges at the end as (offset, blocks), the trace's map, the peak PyTorch had).
def xseg(off, blocks):
    return {"device": 0, "address": SEG + off * MiB, "total_size": sum(blocks) * MiB, "stream": 0,
            "segment_type": "large", "is_expandable": True,
            "blocks": [{"size": n * MiB, "state": "active_allocated", "requested_size": n * MiB}
                       for n in blocks]}


for name, segs, peak in (("one hole", [xseg(0, [40, 20])], 60),
                         ("two holes", [xseg(0, [40, 60]), xseg(140, [40])], 140)):
    evs = [("free_requested", SEG, 20 * MiB), ("free_completed", SEG, 20 * MiB),
           ("segment_map", SEG + 20 * MiB, 20 * MiB), ("alloc", SEG, 40 * MiB)]
    entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
    path = write("expandable_holes.pickle", {"segments": segs, "device_traces": [entries],
                                             "allocator_settings": conf})
    out = os.path.join(work, "expandable_holes_out.pickle")
    r = run("replay", path, "--json", "--snapshot", out)
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    got = (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes"))
    ends = []
    if r.returncode == 0:
        with open(out, "rb") as f:
            ends = sorted((s["address"] - SEG, s["total_size"]) for s in pickle.load(f)["segments"])
    base = ends[0][0] if ends else 0
    want_ends = sorted((s["address"] - SEG, s["total_size"]) for s in segs)
    if got != (peak * MiB, peak * MiB) or [(a - base, n) for a, n in ends] != want_ends:
        sys.exit(f"replay expandable {name}: rc {r.returncode}: peak {got}, ranges {ends}, "
                 f"want {want_ends}: {r.stderr}")

# A 20 MiB block at SEG freed before recording began whose free_completed comes at event 3: in a
# trace that records requests it was pending at the start, so the 30 MiB alloc before that
# cannot take the segment's 40 MiB and makes a segment of its own, as recorded (70 MiB; 40 MiB
# when the completion was ignored). In a trace of completions only the same entries say the
# block was live and freed there: the same 70 MiB.
seg = segment(SEG, 40 * MiB)
for name, evs in (
        ("pending_before_window.pickle",
         [("segment_alloc", SEG2, 30 * MiB), ("alloc", SEG2, 30 * MiB), ("free_completed", SEG, 20 * MiB),
          ("free_requested", SEG2, 30 * MiB), ("free_completed", SEG2, 30 * MiB)]),
        ("live_before_window_completions.pickle",
         [("segment_alloc", SEG2, 30 * MiB), ("alloc", SEG2, 30 * MiB), ("free_completed", SEG, 20 * MiB),
          ("free_completed", SEG2, 30 * MiB)])):
    entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
    path = write(name, {"segments": [seg, segment(SEG2, 30 * MiB)], "device_traces": [entries]})
    r = run("replay", path, "--json")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    if (j.get("peak_reserved_bytes"), j.get("pytorch_peak_reserved_bytes"),
            j.get("end_allocated_bytes")) != (70 * MiB, 70 * MiB, 0):
        sys.exit(f"replay {name}: rc {r.returncode}: {r.stdout}{r.stderr}")

# A peak that is not whole 2 MiB pages: a GPU maps memory in pages of its granularity (2 MiB), so
# no allocator reserves less than the peak rounded up to them; the replay gives that floor
# (page_floor_bytes, last) and, where it alone is past 1.01 x the peak allocated, says so. Sizes
# of whole pages have no floor line.
for name, size, floor in (("small_peak.pickle", 3 * MiB + 512, 4 * MiB),
                          ("whole_pages.pickle", 4 * MiB, 4 * MiB)):
    evs = [("segment_alloc", SEG, 20 * MiB), ("alloc", SEG, size), ("free_requested", SEG, size),
           ("free_completed", SEG, size)]
    entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
    path = write(name, {"segments": [segment(SEG, 20 * MiB)], "device_traces": [entries]})
    r = run("replay", path, "--json", "--conf", "expandable_segments:True")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    if (j.get("peak_allocated_bytes"), j.get("page_floor_bytes"), list(j)[-1:]) != \
            (size, floor, ["page_floor_bytes"]):
        sys.exit(f"replay {name}: rc {r.returncode}: {r.stdout}{r.stderr}")
    r = run("replay", path, "--conf", "expandable_segments:True")
    line = "  page floor           0.004 GiB (%.4f x the peak allocated)" % (floor / size)
    if r.returncode != 0 or (line in r.stdout) != (floor > 1.01 * size) or \
            ("page floor" in r.stdout) != (floor > 1.01 * size):
        sys.exit(f"replay {name} text: rc {r.returncode}: {r.stdout}{r.stderr}")

# Recorded with roundup_power2_divisions:[>:4] (PyTorch: interval 0, sizes below 2 MiB, keeps 0,
# no rounding; every later one 4), as the settings' dict writes it, one key per interval. Its 0
# was left out of the list the replay rebuilt ("[2:4,4:4,...]"), whose first boundary then
# filled interval 0 with 4 too: a 1363000-byte request became a 1.5 MiB block, not PyTorch's
# 1363456 (the next multiple of 512).
size = 1363000
rp = {str(1 << i): (0 if i == 0 else 4) for i in range(16)}
conf = {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[>:4]", "max_split_size": -1,
        "garbage_collection_threshold": 0.0, "expandable_segments": False,
        "roundup_power2_divisions": rp}
evs = [("segment_alloc", SEG, 20 * MiB), ("alloc", SEG, size), ("free_requested", SEG, size),
       ("free_completed", SEG, size)]
entries = [entry(a, addr, n, t) for t, (a, addr, n) in enumerate(evs)]
path = write("roundup_zero_first.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                          "device_traces": [entries],
                                          "allocator_settings": conf})
r = run("replay", path, "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
if j.get("peak_allocated_bytes") != 1363456:
    sys.exit(f"replay roundup [>:4]: rc {r.returncode}: {r.stdout}{r.stderr}")

# A recorded garbage_collection_threshold is read back whole: "%g" kept 6 digits, and
# 0.123456789 was replayed as 0.123457.
conf = {"garbage_collection_threshold": 0.123456789, "max_split_size": -1,
        "expandable_segments": False}
path = write("gc_digits.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                  "device_traces": [entries], "allocator_settings": conf})
r = run("info", path)
got = [float(v) for v in re.findall(r"settings: '.*garbage_collection_threshold:([0-9.eE+-]+)",
                                    r.stdout)]
if r.returncode != 0 or got != [0.123456789]:
    sys.exit(f"info gc threshold digits: rc {r.returncode}: {got}: {r.stdout}{r.stderr}")

# A sympool snapshot recorded with SYMPOOL_MAX_SPLIT_SIZE of no whole MiB (20.5 MiB; PyTorch's
# are whole MiB): the replay rebuilt it as max_split_size_mb:20 and ran another allocator. It
# runs with the recorded bytes, which its own snapshot records; a configuration of --compare
# that sets its own max_split_size_mb replaces them. --json says so.
split = 20 * MiB + MiB // 2
conf = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": split,
        "garbage_collection_threshold": 0.0, "expandable_segments": False}
path = write("split_bytes.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                    "device_traces": [entries], "allocator_settings": conf})
ours, _ = replay_snapshot(cli, path, os.path.join(work, "split_bytes_replay.pickle"))
if ours["allocator_settings"]["max_split_size"] != split:
    sys.exit(f"replay max_split_size {split}: ran with {ours['allocator_settings']}")
r = run("info", path)
if r.returncode != 0 or f"max_split_size {split} bytes" not in r.stdout or \
        "max_split_size_mb" in r.stdout:
    sys.exit(f"info max_split_size {split}: rc {r.returncode}: {r.stdout}{r.stderr}")
ours, _ = replay_snapshot(cli, os.path.join(work, "split_bytes_replay.pickle"),
                          os.path.join(work, "split_bytes_replay2.pickle"))
if ours["allocator_settings"]["max_split_size"] != split:  # a replay of the replay: the same
    sys.exit(f"replay of a replay, max_split_size {split}: {ours['allocator_settings']}")
# --compare: each configuration starts from the recorded bytes, unless it sets its own; the
# library says at start-up what it runs with.
r = subprocess.run([cli, "replay", path, "--compare", "", "max_split_size_mb:40", ""],
                   capture_output=True, text=True, env=dict(os.environ, SYMPOOL_DEBUG="INFO"))
got = re.findall(r"allocator ready: .*max_split_size (\d+)", r.stderr)
if r.returncode != 0 or got != [str(split), str(40 * MiB), str(split)]:
    sys.exit(f"replay --compare max_split_size {split}: rc {r.returncode}: {got}: {r.stderr}")
# --json names the configuration that ran: the recorded bytes too (its conf string left them out,
# as if the replay had run without them), as the item --compare takes, SYMPOOL_MAX_SPLIT_SIZE=N;
# in each --compare configuration's settings that starts from them, not in one that sets its own,
# and not where the environment's SYMPOOL_MAX_SPLIT_SIZE (which wins) ran instead.
item = f"SYMPOOL_MAX_SPLIT_SIZE={split}"
r = run("replay", path, "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
if (j.get("conf"), j.get("settings")) != (f"expandable_segments:False,{item}",) * 2:
    sys.exit(f"replay --json max_split_size {split}: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path, "--json", "--compare", "", "max_split_size_mb:40")
got = [json.loads(line)["settings"] for line in r.stdout.splitlines()] if r.returncode == 0 else []
if got != [f"expandable_segments:False,{item}", "expandable_segments:False,max_split_size_mb:40"]:
    sys.exit(f"replay --json --compare max_split_size {split}: rc {r.returncode}: {got}: "
             f"{r.stdout}{r.stderr}")
# The string is a configuration --compare takes, and it runs the same allocator.
r = subprocess.run([cli, "replay", path, "--compare", j["conf"]], capture_output=True, text=True,
                   env=dict(os.environ, SYMPOOL_DEBUG="INFO"))
got = re.findall(r"allocator ready: .*max_split_size (\d+)", r.stderr)
if r.returncode != 0 or got != [str(split)]:
    sys.exit(f"replay --compare '{j['conf']}': rc {r.returncode}: {got}: {r.stderr}")
r = subprocess.run([cli, "replay", path, "--json"], capture_output=True, text=True,
                   env=dict(os.environ, SYMPOOL_MAX_SPLIT_SIZE=str(40 * MiB)))
j = json.loads(r.stdout) if r.returncode == 0 else {}
# Not the recorded bytes: the environment's variable, which ran (as an item of the form
# --compare takes; the allocator's own variables the environment sets are listed last).
if j.get("conf") != "expandable_segments:False,SYMPOOL_MAX_SPLIT_SIZE=40MiB":
    sys.exit(f"replay --json, SYMPOOL_MAX_SPLIT_SIZE set: rc {r.returncode}: {r.stdout}{r.stderr}")
# The text says which max_split_size ran: the recorded bytes, or the environment's variable,
# which wins over them (it used to say "as recorded" either way).
r = run("replay", path)
if r.returncode != 0 or f"max_split_size       {split} bytes, as recorded" not in r.stdout:
    sys.exit(f"replay text max_split_size {split}: rc {r.returncode}: {r.stdout}{r.stderr}")
r = subprocess.run([cli, "replay", path], capture_output=True, text=True,
                   env=dict(os.environ, SYMPOOL_MAX_SPLIT_SIZE=str(40 * MiB)))
if r.returncode != 0 or "as recorded" in r.stdout or \
        f"SYMPOOL_MAX_SPLIT_SIZE={40 * MiB} from the environment, in place of the recorded " \
        f"{split} bytes" not in r.stdout:
    sys.exit(f"replay text, SYMPOOL_MAX_SPLIT_SIZE set: rc {r.returncode}: {r.stdout}{r.stderr}")
# --compare's text names the recorded bytes and the configurations they ran in (its settings
# line, in whole MiB terms, cannot show them).
r = run("replay", path, "--compare", "", "max_split_size_mb:40")
if r.returncode != 0 or f"max_split_size: {split} bytes, as recorded (no whole MiB: " \
        "SYMPOOL_MAX_SPLIT_SIZE), in (recorded)\n" not in r.stdout:
    sys.exit(f"replay --compare text max_split_size {split}: rc {r.returncode}: {r.stdout}"
             f"{r.stderr}")
r = run("replay", path, "--compare", "", "garbage_collection_threshold:0.5")
if r.returncode != 0 or f"max_split_size: {split} bytes, as recorded (no whole MiB: " \
        "SYMPOOL_MAX_SPLIT_SIZE), in every configuration\n" not in r.stdout:
    sys.exit(f"replay --compare text max_split_size {split}, every configuration: rc "
             f"{r.returncode}: {r.stdout}{r.stderr}")
# info --json gives the bytes too (alloc_conf's max_split_size_mb cannot), null where the
# setting is whole MiB or absent.
r = run("info", path, "--json")
got = json.loads(r.stdout)["settings"] if r.returncode == 0 else {}
if got.get("max_split_size_bytes") != split or "max_split_size_mb" in got.get("alloc_conf", "?"):
    sys.exit(f"info --json max_split_size {split}: rc {r.returncode}: {r.stdout}{r.stderr}")
whole = dict(conf, max_split_size=40 * MiB)
path = write("split_whole.pickle", {"segments": [segment(SEG, 20 * MiB)],
                                    "device_traces": [entries], "allocator_settings": whole})
r = run("info", path, "--json")
got = json.loads(r.stdout)["settings"] if r.returncode == 0 else {}
if "max_split_size_bytes" not in got or got["max_split_size_bytes"] is not None or \
        "max_split_size_mb:40" not in got.get("alloc_conf", ""):
    sys.exit(f"info --json max_split_size 40 MiB: rc {r.returncode}: {r.stdout}{r.stderr}")
r = run("replay", path, "--compare", "", "max_split_size_mb:60")
if r.returncode != 0 or "max_split_size:" in r.stdout:
    sys.exit(f"replay --compare, whole MiB: rc {r.returncode}: {r.stdout}{r.stderr}")

# A pickled list of tuples (a tokenizer's merges, say).
path = write("merges.pickle", [(b"a", b"b"), (b"ab", b"c")])
for cmd in ("info", "replay", "summary"):
    r = run(cmd, path)
    if r.returncode == 0 or \
            "not a memory snapshot (a list whose item 0 is a tuple, not a segment dict)" \
            not in r.stderr:
        sys.exit(f"{cmd} merges: rc {r.returncode}: {r.stdout}{r.stderr}")
print("ok")
