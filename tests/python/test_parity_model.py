"""sympool against a reference model of PyTorch's caching allocator (_torch_model.py): random
mallocs on three streams (some routed to MemPools), frees, record_stream, stream
synchronizations and empty_cache, with each of PyTorch's settings that change where blocks go.
Every malloc must return the address the model puts the block at (best fit, splits, merges,
expandable pages), and after every call memory_stats must show the model's figures (reserved,
allocated, active, requested, inactive_split, oversize, retries, OOMs). Each setting runs in a
child process, since sympool reads its settings when it starts; expandable segments run with
PyTorch's own page rules (SYMPOOL_EXPANDABLE_PAGE=0, RECYCLE=0, BORROW=0; docs/expandable.md).
"""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXPANDABLE_ENV = {"SYMPOOL_EXPANDABLE_PAGE": "0", "SYMPOOL_EXPANDABLE_RECYCLE": "0",
                  "SYMPOOL_EXPANDABLE_BORROW": "0"}

# (id, SYMPOOL_ALLOC_CONF, Config arguments, fraction in MiB or 0)
CASES = [
    ("default", "", "", 0),
    ("max_split", "max_split_size_mb:40", "max_split_mb=40", 300),
    ("max_split_20", "max_split_size_mb:20", "max_split_mb=20", 200),
    ("fraction", "", "", 300),
    ("roundup_4", "roundup_power2_divisions:4", "divisions=[4] * 16", 0),
    ("roundup_list", "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
     "divisions=[8] * 7 + [2] * 3 + [1] * 6", 0),
    ("gc", "garbage_collection_threshold:0.5", "gc=0.5", 300),
    ("gc_max_split", "garbage_collection_threshold:0.7,max_split_size_mb:40",
     "gc=0.7, max_split_mb=40", 300),
    ("expandable", "expandable_segments:True", "expandable=True", 0),
    ("expandable_fraction", "expandable_segments:True", "expandable=True", 300),
]


@pytest.mark.parametrize("conf,args,cap_mb", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement_and_stats_follow_pytorchs_rules(conf, args, cap_mb):
    env = dict(os.environ)
    env.pop("SYMPOOL_THREAD_CACHE", None)  # a thread cache changes best fit (docs/threads.md)
    env["SYMPOOL_ALLOC_CONF"] = conf
    if "expandable" in conf:
        env.update(EXPANDABLE_ENV)
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    src = textwrap.dedent(f"""
        import sympool as sp
        from _torch_model import MB, Config, drive
        allowed = None
        if {cap_mb}:
            total = sp.get_memory_info()[1]
            f = {cap_mb} * MB / total
            sp.set_per_process_memory_fraction(f)
            allowed = int(f * total)  # PyTorch's allowed_memory_maximum
        # MemPools as (use_on_oom, no_split): none, one that lends, one of each
        pools = [(), ((True, False),), ((False, True), (True, False))]
        seen = [drive(sp, Config({args}{", " if args else ""}allowed=allowed), seed, 1500,
                      mempools=pools[seed])
                for seed in range(3)]
        print(sum(o for o, _ in seen), sum(r for _, r in seen))
    """)
    r = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    ooms, retries = map(int, r.stdout.split())
    if cap_mb:  # the fraction's cases must reach the OOM path, or they check less than they say
        assert ooms > 0 and retries >= ooms
