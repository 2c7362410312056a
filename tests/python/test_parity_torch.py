"""PyTorch's allocator tests (test/test_cuda.py: TestCuda memory tests and TestMemPool) rewritten
against sympool's torch.cuda-named functions, on the host backend. Tests that need allocator
settings run a child Python with SYMPOOL_ALLOC_CONF (sympool reads its settings when it starts;
PyTorch's _set_allocator_settings has no counterpart).

test/test_cuda_expandable_segments.py runs TestCuda and TestMemPool again with expandable segments
on; tests/cmake/python.cmake runs this file again so too, with PyTorch's exact page rules
(SYMPOOL_EXPANDABLE_PAGE=0, RECYCLE=0, BORROW=0). Where a test's figures follow from fixed segments,
it checks what PyTorch's expandable segments give instead (expandable() says which).
"""

import gc
import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest

MB = 1 << 20


def run_child(body, **env):
    """Run body (Python source using `sp`) in a fresh process with extra environment."""
    e = dict(os.environ)
    e.update({k: str(v) for k, v in env.items()})
    src = "import sympool as sp\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", src], env=e, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def expandable(sp):
    """Whether this process's default pool maps expandable segments."""
    return sp._snapshot()["allocator_settings"]["expandable_segments"]


def counting_allocator():
    """An (alloc, free) pair for sp.MemPool over host buffers, and the dict counting its calls."""
    import ctypes
    calls = {"alloc": 0, "free": 0}
    bufs = {}

    def alloc(size, device, stream):
        calls["alloc"] += 1
        b = ctypes.create_string_buffer(size)
        bufs[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def free(ptr, size, device, stream):
        calls["free"] += 1
        del bufs[ptr]

    return calls, (alloc, free)


def test_memory_allocation(sp):
    gc.collect()
    sp.empty_cache()
    prev = sp.memory_allocated()
    mem = sp.caching_allocator_alloc(1)
    assert sp.memory_allocated() > prev
    sp.caching_allocator_delete(mem)
    assert sp.memory_allocated() == prev


def test_memory_stats(sp):
    gc.collect()
    sp.empty_cache()
    sp.reset_peak_memory_stats()
    sp.reset_accumulated_memory_stats()
    prev_allocated = sp.memory_allocated()
    prev_reserved = sp.memory_reserved()
    prev_max_allocated = sp.max_memory_allocated()
    prev_max_reserved = sp.max_memory_reserved()
    assert prev_allocated == prev_max_allocated
    assert prev_reserved == prev_max_reserved
    prev_active = sp.memory_stats()["active_bytes.all.current"]
    tmp = sp.malloc(256 * 4)  # torch.randn(256): 1 KiB
    assert sp.memory_stats()["active_bytes.all.current"] == prev_active + 1024
    assert sp.memory_stats()["active_bytes.all.freed"] == 0
    sp.free(tmp)
    sp.empty_cache()
    assert sp.memory_stats()["active_bytes.all.current"] == prev_active
    assert sp.memory_stats()["active_bytes.all.freed"] == 1024
    sp.reset_peak_memory_stats()
    assert sp.max_memory_allocated() == prev_max_allocated
    assert sp.max_memory_reserved() == prev_max_reserved


def test_memory_stats_keys(sp):
    st = sp.memory_stats()
    assert len(st) == 122
    assert list(st) == sorted(st)
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            for f in ("allocated", "current", "freed", "peak"):
                assert f"{name}.{pool}.{f}" in st
    for name in ("oversize_allocations", "oversize_segments"):
        for f in ("allocated", "current", "freed", "peak"):
            assert f"{name}.{f}" in st
    for name in ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                 "num_device_alloc", "num_device_free"):
        assert name in st
    assert st["max_split_size"] == -1  # SIZE_MAX read as int64, as PyTorch reports it


def _memory_stats_steps(sp, device=0, n=35):
    """PyTorch's _test_memory_stats_generator (test_cuda_multigpu.py): allocated grows and
    shrinks as tensors come and go, peaks never fall below currents, empty_cache counts one sync
    and never raises a peak. A generator, yielding where PyTorch's does, so that callers can
    check consistency between steps or interleave two devices."""
    m0 = sp.memory_allocated(device)
    last_m, max_m = [sp.memory_allocated(device)], [sp.max_memory_allocated(device)]
    last_r, max_r = [sp.memory_reserved(device)], [sp.max_memory_reserved(device)]
    live = {}

    def alloc(*shape):
        nbytes = 4
        for d in shape:
            nbytes *= d
        p = sp.malloc(nbytes, device=device)
        key = object()
        live[key] = p
        return key, nbytes

    def drop(t):
        sp.free(live.pop(t[0]))

    def assert_change(comp=1, empty_cache=False, reset_peak=False):
        new_m, new_max_m = sp.memory_allocated(device), sp.max_memory_allocated(device)
        if comp > 0:
            assert new_m > last_m[0]
        elif comp < 0:
            assert new_m < last_m[0]
        else:
            assert new_m == last_m[0]
        assert new_m <= new_max_m
        assert new_max_m >= max_m[0]
        last_m[0], max_m[0] = new_m, new_max_m
        new_r, new_max_r = sp.memory_reserved(device), sp.max_memory_reserved(device)
        assert new_r <= new_max_r
        assert new_max_r >= max_r[0]
        last_r[0], max_r[0] = new_r, new_max_r
        if empty_cache:
            st = sp.memory_stats(device)
            sync1, alloc1, free1 = (st["num_sync_all_streams"], st["num_device_alloc"],
                                    st["num_device_free"])
            assert sync1 >= 0 and free1 >= 0
            assert alloc1 >= (0 if new_m == 0 else 1)
            sp.empty_cache()
            st = sp.memory_stats(device)
            assert st["num_sync_all_streams"] == sync1 + 1
            assert st["num_device_alloc"] >= alloc1
            assert st["num_device_free"] >= free1
            new_r, new_max_r = sp.memory_reserved(device), sp.max_memory_reserved(device)
            assert new_r <= last_r[0]
            assert new_r <= new_max_r
            assert new_max_r == max_r[0]
            last_r[0] = new_r
        if reset_peak:
            sp.reset_peak_memory_stats(device)
            assert sp.memory_allocated(device) == last_m[0]
            assert sp.max_memory_allocated(device) == last_m[0]
            max_m[0] = last_m[0]
            assert sp.memory_reserved(device) == last_r[0]
            assert sp.max_memory_reserved(device) == last_r[0]
            max_r[0] = last_r[0]

    assert_change(0)
    assert_change(0, reset_peak=True)
    assert_change(0, empty_cache=True)
    assert_change(0, reset_peak=True)
    assert_change(0)
    yield
    tensors1 = [alloc(1), alloc(10, 20), alloc(200, 300, 2000)]
    m1 = sp.memory_allocated(device)
    assert_change(1)
    yield
    tensors2 = []
    for i in range(1, n // 2 + 1):  # small ones
        tensors2.append(alloc(i, i * 4))
        assert_change(1)
        yield
    for i in range(5, n // 2 + 5):  # large ones
        tensors2.append(alloc(i, i * 7, i * 9, i * 11))
        assert_change(1, reset_peak=(i % 2 == 0))
        yield
    tensors2.append(alloc(0, 0, 0))  # size 0: no block
    assert_change(0)
    yield
    random.Random(device).shuffle(tensors2)
    assert_change(0, reset_peak=True)
    yield
    for i in range(n // 2):
        t = tensors2.pop(i)
        drop(t)
        assert_change(-t[1])  # -0 when the tensor was empty
        yield
    for i in range(2, 2 * n // 3 + 2):
        tensors2.append(alloc(i, i * 3, i * 8))
        assert_change(1)
        yield
    for t in tensors2:
        drop(t)
    assert_change(-1, reset_peak=True)
    assert_change(0)
    assert sp.memory_allocated(device) == m1
    yield
    for t in tensors1:
        drop(t)
    assert_change(-1, reset_peak=True)
    assert sp.memory_allocated(device) == m0
    assert_change(0, empty_cache=True)
    assert_change(0, reset_peak=True)


def _memory_stats_generator(sp, device=0, n=35):
    for _ in _memory_stats_steps(sp, device, n):
        pass


def _check_memory_stat_consistency(sp):
    """test_cuda_multigpu.py's _check_memory_stat_consistency: every device's current counts
    and bytes, rebuilt from the snapshot's segments and blocks, equal memory_stats (segments
    and inactive splits counted for fixed segments only, as PyTorch does)."""
    expected_each_device = {}
    for segment in sp.memory_snapshot():
        expandable = segment["is_expandable"]
        expected = expected_each_device.setdefault(segment["device"], {})
        pool_str = segment["segment_type"] + "_pool"

        def add(key, v=1):
            for k in (key % "all", key % pool_str):
                expected[k] = expected.get(k, 0) + v

        if not expandable:
            add("segment.%s.current")
        add("allocated_bytes.%s.current", segment["allocated_size"])
        add("reserved_bytes.%s.current", segment["total_size"])
        add("active_bytes.%s.current", segment["active_size"])
        add("requested_bytes.%s.current", segment["requested_size"])
        sum_requested = 0
        is_split = len(segment["blocks"]) > 1
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                add("allocation.%s.current")
            if block["state"].startswith("active_"):
                sum_requested += block["requested_size"]
                add("active.%s.current")
            if block["state"] == "inactive" and is_split and not expandable:
                add("inactive_split.%s.current")
                add("inactive_split_bytes.%s.current", block["size"])
        assert sum_requested == segment["requested_size"]
    for device, expected in expected_each_device.items():
        stats = sp.memory_stats(device)
        for k, v in expected.items():
            assert stats[k] == v, (device, k, stats[k], v)


def test_memory_stats_generator(sp):
    _memory_stats_generator(sp)


def test_memory_stats_generator_expandable():
    # test_cuda_expandable_segments.py runs test_cuda's tests again with expandable segments.
    run_child("""
        import sys
        sys.path.insert(0, %r)
        import test_parity_torch as t
        t._memory_stats_generator(sp)
    """ % os.path.dirname(os.path.abspath(__file__)), SYMPOOL_ALLOC_CONF="expandable_segments:True")


def test_memory_stats_consistency(sp):
    # test_cuda_multigpu.py's test_memory_stats: the generator, with the snapshot-versus-stats
    # check after every step.
    sp.empty_cache()
    for _ in _memory_stats_steps(sp):
        _check_memory_stat_consistency(sp)


def test_memory_stats_consistency_expandable():
    run_child("""
        import sys
        sys.path.insert(0, %r)
        import test_parity_torch as t
        sp.empty_cache()
        for _ in t._memory_stats_steps(sp):
            t._check_memory_stat_consistency(sp)
    """ % os.path.dirname(os.path.abspath(__file__)), SYMPOOL_ALLOC_CONF="expandable_segments:True")


def test_memory_stats_multigpu():
    # test_cuda_multigpu.py's test_memory_stats_multigpu on two emulated devices: each device's
    # generator, interlaced step by step and then in a semi-random order, never sees the other's
    # allocations in its own stats.
    run_child("""
        import random, sys
        sys.path.insert(0, %r)
        import test_parity_torch as t

        def advance(gen, end):
            if not end:
                try:
                    next(gen)
                except StopIteration:
                    end = True
            return end

        sp.empty_cache()
        gen0, gen1 = t._memory_stats_steps(sp, 0), t._memory_stats_steps(sp, 1)
        end0 = end1 = False
        while not (end0 and end1):
            end0 = advance(gen0, end0)
            end1 = advance(gen1, end1)
            t._check_memory_stat_consistency(sp)

        sp.empty_cache()
        rng = random.Random(3)
        gen0, gen1 = t._memory_stats_steps(sp, 0), t._memory_stats_steps(sp, 1)
        end0 = end1 = False
        while not (end0 and end1):
            end0 = advance(gen0, end0)
            times = rng.randrange(0, 3) if not end0 else float("inf")
            k = 0
            while k < times and not end1:
                end1 = advance(gen1, end1)
                k += 1
    """ % os.path.dirname(os.path.abspath(__file__)), SYMPOOL_HOST_DEVICES=2)


def test_out_of_memory(sp):
    before = sp.memory_stats()["num_ooms"]
    with pytest.raises(sp.OutOfMemoryError, match="Tried to allocate 800000000.00 GiB"):
        sp.malloc(1024 * 1024 * 1024 * 800000000)
    assert sp.memory_stats()["num_ooms"] == before + 1
    # 1 EB and more: refused before the allocator runs, not counted as an OOM
    with pytest.raises(sp.OutOfMemoryError, match="Tried to allocate more than 1EB memory"):
        sp.malloc(1024 * 1024 * 1024 * 8000000000)
    assert sp.memory_stats()["num_ooms"] == before + 1
    # the failure leaves the allocator usable
    p = sp.malloc(1024)
    sp.free(p)


def test_out_of_memory_retry(sp):
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    size = int(total * 0.5)
    a = sp.malloc(size)
    with pytest.raises(sp.OutOfMemoryError, match="Tried to allocate"):
        sp.malloc(int(total * 0.6))
    sp.free(a)
    b = sp.malloc(size)  # the cached block, as is
    assert b == a
    sp.free(b)
    # A larger request does not fit the cached block nor beside it: the allocator releases its
    # cache and retries (num_alloc_retries counts that retry).
    # With expandable segments the cached block grows in place instead: the free block and the
    # unmapped space after it hold the request, so no release and no retry.
    retries = sp.memory_stats()["num_alloc_retries"]
    c = sp.malloc(int(total * 0.6))
    try:
        if expandable(sp):
            assert c == a
            assert sp.memory_stats()["num_alloc_retries"] == retries
        else:
            assert sp.memory_stats()["num_alloc_retries"] == retries + 1
    finally:
        sp.free(c)
    sp.empty_cache()
    sp.reset_peak_memory_stats()


def test_set_per_process_memory_fraction(sp):
    with pytest.raises(TypeError, match="Invalid type"):
        sp.set_per_process_memory_fraction(1)  # an int, as in torch.cuda: not a float
    with pytest.raises(TypeError, match="Invalid type"):
        sp.set_per_process_memory_fraction("0.5")
    with pytest.raises(ValueError, match="Invalid fraction value"):
        sp.set_per_process_memory_fraction(-0.1)
    with pytest.raises(ValueError, match="Invalid fraction value"):
        sp.set_per_process_memory_fraction(2.0)
    keep = sp.malloc(1024 * 4)
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    sp.set_per_process_memory_fraction(0.5, 0)
    try:
        application = int(total * 0.499) - sp.max_memory_reserved()
        tmp = sp.malloc(application)
        sp.free(tmp)
        sp.empty_cache()
        with pytest.raises(sp.OutOfMemoryError):
            sp.malloc(int(total * 0.5))
        # the error does not disturb the live block
        sp.free(keep)
    finally:
        sp.set_per_process_memory_fraction(1.0, 0)


def test_get_per_process_memory_fraction(sp):
    init = sp.get_per_process_memory_fraction()
    assert init == 1.0
    sp.set_per_process_memory_fraction(1.0)
    assert sp.get_per_process_memory_fraction() == 1.0
    sp.set_per_process_memory_fraction(0.0)
    assert sp.get_per_process_memory_fraction() == 0.0
    rng = random.Random(1)
    for _ in range(3):
        val = rng.random()
        sp.set_per_process_memory_fraction(val)
        assert sp.get_per_process_memory_fraction() == val
    sp.set_per_process_memory_fraction(init)
    with pytest.raises(ValueError):
        sp.get_per_process_memory_fraction(-1)


@pytest.mark.parametrize("value", ["0.0", "0.5", "1.0"])
def test_allocator_memory_fraction_setting(value):
    # PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction sets every device's fraction at
    # start-up, read back by get_per_process_memory_fraction and enforced like the call's.
    out = run_child('''
        print(sp.get_per_process_memory_fraction(0), end=" ")
        total = sp.get_memory_info()[1]
        try:
            sp.free(sp.malloc(int(total * 0.75)))
            print("fits", end="")
        except sp.OutOfMemoryError:
            print("oom", end="")
    ''', SYMPOOL_ALLOC_CONF=f"per_process_memory_fraction:{value}")
    assert out == f"{float(value)} {'fits' if value == '1.0' else 'oom'}"


def test_allocator_settings_accepted():
    out = run_child('''
        import ctypes
        lib = sp._lib.lib()
        lib.sp_x_option_set.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        for conf in ("pinned_num_register_threads:8", "pinned_num_register_threads:128",
                     "release_lock_on_cudamalloc:True", "per_process_memory_fraction:0.25",
                     "expandable_segments:False,max_split_size_mb:40"):
            print(lib.sp_x_option_set(b"SYMPOOL_ALLOC_CONF", conf.encode()), end="")
    ''')
    assert out == "00000"


def test_caching_allocator_record_stream_oom(sp):
    """Frees delayed by record_stream are still returned by the OOM retry (pytorch#19219)."""
    s = sp.Stream()
    total = sp.get_memory_info()[1]
    size = total // 8
    y = sp.malloc(size, stream=s)
    for _ in range(20):  # 20 x total/8: only fits if delayed frees are reclaimed
        x = sp.malloc(size)
        sp.record_stream(x, s)
        sp.free(x)
    sp.free(y)
    s.synchronize()
    s.destroy()
    sp.empty_cache()


def test_max_split_and_fraction():
    # test_max_split_expandable, without switching expandable segments mid-run: with room for
    # 120 MiB, three 40 MiB blocks fit and a fourth does not; after freeing them, 120 MiB fits
    # again by releasing the cached (oversize) segments.
    for conf in ("max_split_size_mb:40", "expandable_segments:True,max_split_size_mb:40"):
        run_child("""
            MB = 1 << 20
            total = sp.get_memory_info()[1]
            sp.set_per_process_memory_fraction((120 * MB) / total)
            a, b, c = sp.malloc(40 * MB), sp.malloc(40 * MB), sp.malloc(40 * MB)
            try:
                sp.malloc(40 * MB)
                raise SystemExit("no OOM")
            except sp.OutOfMemoryError:
                pass
            for p in (a, b, c):
                sp.free(p)
            sp.free(sp.malloc(120 * MB))
        """, SYMPOOL_ALLOC_CONF=conf)


def test_garbage_collect():
    # test_garbage_collect_expandable's shape: with a fraction and a GC threshold, freed cached
    # blocks are collected instead of failing the next request.
    for conf in ("garbage_collection_threshold:0.5",
                 "garbage_collection_threshold:0.5,expandable_segments:True"):
        run_child("""
            MB = 1 << 20
            total = sp.get_memory_info()[1]
            sp.set_per_process_memory_fraction((120 * MB) / total)
            a, b = sp.malloc(40 * MB), sp.malloc(40 * MB)
            sp.free(a)
            sp.free(b)
            sp.free(sp.malloc(80 * MB))
        """, SYMPOOL_ALLOC_CONF=conf)


def power2_div(size, div_factor):
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret += step
    return int(ret)


@pytest.mark.parametrize("conf,nbytes,div", [
    ("", 4 * 21 * MB, 0),
    ("roundup_power2_divisions:4", 4 * 21 * MB, 4),
    ("garbage_collection_threshold:0.5,max_split_size_mb:40", 4 * 21 * MB, 0),
    ("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
     4 * 21 * MB, 8),
    ("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
     4 * 100 * MB, 2),
    ("release_lock_on_cudamalloc:True", 4 * 21 * MB, 0),
])
def test_allocator_settings(conf, nbytes, div):
    out = run_child(f"""
        st0 = sp.memory_stats()
        p = sp.malloc({nbytes})
        st1 = sp.memory_stats()
        print(st1["active_bytes.all.allocated"] - st0["active_bytes.all.allocated"],
              st1["requested_bytes.all.allocated"] - st0["requested_bytes.all.allocated"])
        sp.free(p)
    """, SYMPOOL_ALLOC_CONF=conf)
    got, requested = map(int, out.split())
    assert got == (power2_div(nbytes, div) if div else nbytes)
    assert requested == nbytes


@pytest.mark.parametrize("conf", ["foo:1,bar:2", "garbage_collection_threshold:1.2",
                                  "max_split_size_mb:2", "release_lock_on_cudamalloc:none",
                                  "pinned_use_cuda_host_register:none",
                                  "pinned_num_register_threads:none",
                                  "pinned_num_register_threads:1024",
                                  "pinned_num_register_threads:3",
                                  "roundup_power2_divisions:3",
                                  "per_process_memory_fraction:-0.1",
                                  "per_process_memory_fraction:1.1"])
def test_allocator_settings_refused(conf):
    # PyTorch raises ValueError; a variable read at start-up cannot, so sympool refuses it
    # through the option API (the CLI's --conf) and warns and keeps the defaults from the
    # environment.
    out = run_child(f"""
        import ctypes
        lib = sp._lib.lib()
        lib.sp_x_option_set.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        print(lib.sp_x_option_set(b"SYMPOOL_ALLOC_CONF", {conf!r}.encode()))
    """)
    assert int(out) != 0


# ---- snapshots and history ------------------------------------------------------------------

def test_memory_snapshot(sp):
    sp.empty_cache()
    sp._record_memory_history("state")
    x = sp.malloc(311 * 411 * 4)
    # many 512-byte blocks tiling one segment, freed in random order: exercises merging
    tensors = [sp.malloc(128 * 4) for _ in range(1000)]
    rng = random.Random(0)
    while tensors:
        sp.free(tensors.pop(rng.randrange(len(tensors))))
    y = sp.malloc(128 * 5 * 4)
    ss = sp._snapshot()
    found = False
    for seg in ss["segments"]:
        assert "frames" in seg
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for b in seg["blocks"]:
            if b["requested_size"] == 311 * 411 * 4:
                found = True
                assert b["address"] == x
                assert b["state"] == "active_allocated"
    assert found
    sp.free(x)
    sp.free(y)
    sp._record_memory_history(None)


def test_memory_snapshot_trace_sizes(sp):
    sp.empty_cache()
    sp._record_memory_history("all", clear_history=True)
    p = sp.malloc(1000)
    sp.free(p)
    sp.empty_cache()
    trace = sp._snapshot()["device_traces"][0]
    actions = [(e["action"], e["size"]) for e in trace]
    # An expandable segment maps and unmaps a 2 MiB page instead of allocating a segment.
    seg_alloc, seg_free = (("segment_map", "segment_unmap") if expandable(sp)
                           else ("segment_alloc", "segment_free"))
    assert (seg_alloc, 2 * MB) in actions
    assert ("alloc", 1000) in actions  # the request, not the rounded size
    assert ("free_requested", 1000) in actions
    assert ("free_completed", 1000) in actions
    assert (seg_free, 2 * MB) in actions
    order = [a for a, _ in actions if a in (seg_alloc, "alloc", "free_requested",
                                            "free_completed", seg_free)]
    assert order == [seg_alloc, "alloc", "free_requested", "free_completed", seg_free]
    for e in trace:
        assert {"action", "addr", "size", "stream", "time_us"} <= set(e)
    sp._record_memory_history(None)


def test_snapshot_last_action_is_the_alloc(sp):
    # test_cpp_memory_snapshot_pickle: PyTorch copies the traces before snapshot() records its
    # `snapshot` entry, so a dump's last entry is the last action, and the marker shows up in
    # the next dump.
    for _ in range(2):
        sp._record_memory_history("all", max_entries=10)
        x = sp.malloc(311 * 411 * 4)
        mem = sp._snapshot()
        found = any(b["state"] == "active_allocated" and b["requested_size"] == 311 * 411 * 4
                    for s in mem["segments"] for b in s["blocks"])
        assert found
        last = mem["device_traces"][0][-1]
        assert last["action"] == "alloc"
        assert last["size"] == 311 * 411 * 4
        nxt = sp._snapshot()["device_traces"][0][-1]
        assert nxt["action"] == "snapshot"
        assert nxt["size"] == sum(s["active_size"] for s in mem["segments"])
        sp.free(x)
        sp._record_memory_history(None)


def test_record_memory_history_max_entries(sp):
    sp._record_memory_history("all", max_entries=3, clear_history=True)
    ptrs = [sp.malloc(512 * (i + 1)) for i in range(5)]
    trace = [e for e in sp._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    # the ring keeps the newest entries, in order
    assert [e["size"] for e in trace] == [512 * 3, 512 * 4, 512 * 5][-len(trace):]
    for p in ptrs:
        sp.free(p)
    sp._record_memory_history(None)
    assert sp._snapshot()["device_traces"][0] == []  # None stops recording and clears


def test_snapshot_allocator_settings(sp):
    st = sp._snapshot()["allocator_settings"]
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                "expandable_segments", "roundup_power2_divisions"):
        assert key in st
    assert len(st["roundup_power2_divisions"]) == 16


# ---- MemPool (TestMemPool) ------------------------------------------------------------------

def test_mempool_id(sp):
    p1 = sp.MemPool().id
    p2 = sp.MemPool().id
    assert p1[0] == 0 and p2[0] == 0  # user-created ids: {0, uid}
    assert abs(p2[1] - p1[1]) > 0


def test_mempool_multithread(sp):
    ids = []
    pools = []
    lock = threading.Lock()

    def make():
        pool = sp.MemPool()
        with lock:
            ids.append(pool.id)
            pools.append(pool)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 4


def test_mempool_use_count_and_segments(sp):
    # test_mempool_with_allocator: a pool with its own allocator (PyTorch's dummy one), whose
    # segments stay fixed with expandable segments on (an allocator cannot map pages).
    _, allocator = counting_allocator()
    pool = sp.MemPool(allocator)
    assert pool.use_count() == 1
    nbytes_1mb = 1024 * 1024
    with sp.use_mem_pool(pool):
        out_0 = sp.malloc(nbytes_1mb)
        assert pool.use_count() == 2
    assert pool.use_count() == 1
    out_non_pool = sp.malloc(nbytes_1mb)
    with sp.use_mem_pool(pool):
        # a 1 MiB request is small: packed into a 2 MiB segment
        assert len(sp.memory_snapshot(pool.id)) == 1
        out_1 = sp.malloc(nbytes_1mb)
        assert len(sp.memory_snapshot(pool.id)) == 1
        out_2 = sp.malloc(nbytes_1mb)
        assert len(sp.memory_snapshot(pool.id)) == 2
    assert len(pool.snapshot()["segments"]) == 2
    for p in (out_0, out_1, out_2, out_non_pool):
        sp.free(p)
    pool.destroy()
    sp.empty_cache()
    assert sp.memory_snapshot() == []


def test_mempool_with_allocator_calls(sp):
    calls, allocator = counting_allocator()
    pool = sp.MemPool(allocator)
    with sp.use_mem_pool(pool):
        p = sp.malloc(1024 * 1024)
    assert calls == {"alloc": 1, "free": 0}
    sp.free(p)
    pool.destroy()  # its destruction empties its cache
    assert calls == {"alloc": 1, "free": 1}


def test_mempool_empty_cache_inactive(sp):
    # a pool dropped while a block of it lives: the block stays valid, and its segment is
    # released by a later empty_cache once freed
    sp.empty_cache()

    def f():
        pool = sp.MemPool()
        with sp.use_mem_pool(pool):
            x = sp.malloc(1024 * 1024 * 2 * 8)
        return x

    x = f()
    gc.collect()
    assert sp.memory_reserved() > 0
    frees = sp.memory_stats()["num_device_free"]
    sp.free(x)
    sp.empty_cache()
    assert sp.memory_stats()["num_device_free"] == frees + 1
    assert sp.memory_reserved() == 0


def test_mempool_limited_memory_use_on_oom(sp):
    # test_mempool_limited_memory_with_allocator, with the device's own segments
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    pool_do_not_use = sp.MemPool()
    pool_use = sp.MemPool(use_on_oom=True)
    sp.set_per_process_memory_fraction((80 * MB) / total)
    try:
        with sp.use_mem_pool(pool_do_not_use):
            a = sp.malloc(40 * MB)
        with sp.use_mem_pool(pool_use):
            b = sp.malloc(40 * MB)
        with pytest.raises(sp.OutOfMemoryError):
            sp.malloc(40 * MB)
        sp.free(a)
        sp.free(b)
        if expandable(sp):
            # Recent PyTorch's try_mempool_fallback searches with expandable segments inactive,
            # and get_free_block then passes over expandable blocks: pool_use (expandable, as
            # every pool without an allocator of its own) lends nothing.
            with pytest.raises(sp.OutOfMemoryError):
                sp.malloc(30 * MB)
            return
        c = sp.malloc(30 * MB)  # borrows pool_use's free block
        with pytest.raises(sp.OutOfMemoryError):
            sp.malloc(30 * MB)  # pool_do_not_use is not lent
        sp.free(c)
        assert c == b
        with sp.use_mem_pool(pool_use):
            e = sp.malloc(20 * MB)
        sp.free(e)
        assert e == c
    finally:
        pool_use.destroy()
        pool_do_not_use.destroy()
        sp.set_per_process_memory_fraction(1.0)
        sp.empty_cache()


def test_mempool_no_split(sp):
    pool = sp.MemPool(no_split=True)
    with sp.use_mem_pool(pool):
        p = sp.malloc(1024)
    # never split: the whole 2 MiB segment is the block
    assert pool.used_bytes() == 2 * MB
    assert sp.memory_allocated() == 2 * MB
    sp.free(p)
    pool.destroy()


# ---- the stats' exact rules (CUDACachingAllocator.cpp) --------------------------------------

def test_reset_accumulated_memory_stats(sp):
    keep = sp.malloc(3 * MB)
    with pytest.raises(sp.OutOfMemoryError):
        sp.malloc(1 << 62)
    p = sp.malloc(1000)
    sp.free(p)
    sp.empty_cache()
    before = sp.memory_stats()
    assert before["num_ooms"] >= 1 and before["num_sync_all_streams"] >= 1
    assert before["num_device_alloc"] >= 1 and before["num_device_free"] >= 1
    sp.reset_accumulated_memory_stats()
    st = sp.memory_stats()
    for k, v in st.items():
        if k.endswith(".allocated") or k.endswith(".freed") or k in (
                "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                "num_device_free"):
            assert v == 0, k
        else:
            assert v == before[k], k  # currents, peaks and max_split_size stay
    sp.free(keep)


def test_reset_peak_memory_stats(sp):
    a = sp.malloc(30 * MB)
    b = sp.malloc(1000)
    sp.free(a)
    st = sp.memory_stats()
    assert st["allocated_bytes.all.peak"] > st["allocated_bytes.all.current"]
    sp.reset_peak_memory_stats()
    st = sp.memory_stats()
    for k, v in st.items():
        if k.endswith(".peak"):
            assert v == st[k[:-len("peak")] + "current"], k
    sp.free(b)


def test_inactive_split_and_pool_stats(sp):
    held = set()
    try:
        _check_inactive_split_and_pool_stats(sp, held)
    finally:  # a failure must not leave its blocks to the tests after it
        for p in held:
            sp.free(p)


def _check_inactive_split_and_pool_stats(sp, held):
    def malloc(n):
        p = sp.malloc(n)
        held.add(p)
        return p

    def free(p):
        held.discard(p)
        sp.free(p)

    sp.empty_cache()
    sp.reset_accumulated_memory_stats()
    # With expandable segments, a mapped page counts in reserved_bytes but not in segment, and
    # inactive_split leaves expandable segments out (their free pages can always be unmapped).
    exp = expandable(sp)
    p = malloc(4 * MB)  # large pool: one 20 MiB segment (or page), split
    st = sp.memory_stats()
    assert st["segment.large_pool.current"] == (0 if exp else 1)
    assert st["reserved_bytes.large_pool.current"] == 20 * MB
    assert st["inactive_split.large_pool.current"] == (0 if exp else 1)
    assert st["inactive_split_bytes.large_pool.current"] == (0 if exp else 16 * MB)
    q = malloc(1000)  # small pool: a 2 MiB segment (or page)
    st = sp.memory_stats()
    assert st["reserved_bytes.small_pool.current"] == 2 * MB
    assert st["allocated_bytes.small_pool.current"] == 1024
    assert st["requested_bytes.small_pool.current"] == 1000
    assert st["inactive_split_bytes.small_pool.current"] == (0 if exp else 2 * MB - 1024)
    assert st["inactive_split_bytes.all.current"] == (0 if exp else 16 * MB + 2 * MB - 1024)
    free(p)
    free(q)
    st = sp.memory_stats()
    assert st["inactive_split.all.current"] == 0  # merged back: nothing split is left
    assert st["inactive_split_bytes.all.current"] == 0
    # a large request that leaves <= 1 MiB is not split: the block keeps the extra bytes (in an
    # expandable segment any rest of 512 bytes or more is split off)
    r = malloc(20 * MB - MB)
    st = sp.memory_stats()
    assert st["allocated_bytes.large_pool.current"] == (19 if exp else 20) * MB
    assert st["requested_bytes.large_pool.current"] == 19 * MB
    free(r)
    sp.empty_cache()


def test_oversize_rules():
    run_child("""
        MB = 1 << 20
        st = lambda: sp.memory_stats()
        assert st()["max_split_size"] == 40 * MB
        a = sp.malloc(50 * MB)
        assert st()["oversize_allocations.current"] == 1
        assert st()["oversize_segments.current"] == 1
        sp.free(a)
        assert st()["oversize_allocations.current"] == 0
        # below max_split_size: never the cached oversize block
        b = sp.malloc(30 * MB)
        assert b != a and st()["segment.all.current"] == 2
        # at or above it, within max_non_split_rounding (20 MiB): the whole block, unsplit
        c = sp.malloc(45 * MB)
        assert c == a
        assert st()["allocated_bytes.all.current"] == 80 * MB
        assert st()["inactive_split.all.current"] == 0
        sp.free(b)
        sp.free(c)
        sp.empty_cache()
        assert st()["oversize_segments.current"] == 0
        assert st()["reserved_bytes.all.current"] == 0
    """, SYMPOOL_ALLOC_CONF="max_split_size_mb:40")


def test_mempool_empty_cache(sp):
    sp.empty_cache()
    pool = sp.MemPool()
    x = sp.malloc(4 * MB)
    with sp.use_mem_pool(pool):
        y = sp.malloc(4 * MB)
    sp.free(y)
    sp.free(x)
    pool.destroy()
    assert len(sp._snapshot()["segments"]) > 0  # x's cached segment: no empty_cache ran


def test_mempool_emptycache_multithread(sp):
    n = 4

    def work(pool):
        with sp.use_mem_pool(pool):
            x = sp.malloc(16)
            sp.free(x)
            sp.empty_cache()

    pools = [sp.MemPool() for _ in range(n)]
    threads = [threading.Thread(target=work, args=(pools[i],)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # empty_cache leaves a pool that is in use (routed) alone
    for p in pools:
        assert len(p.snapshot()["segments"]) == 1
        p.destroy()


def test_nested_mempool(sp):
    sp.empty_cache()
    pool1, pool2, pool3 = sp.MemPool(), sp.MemPool(), sp.MemPool()
    data = []

    def allocate_data():
        data.append(sp.malloc(20 * MB))

    with sp.use_mem_pool(pool1):
        allocate_data()
        with sp.use_mem_pool(pool2):
            allocate_data()
            with sp.use_mem_pool(pool3):
                allocate_data()
            allocate_data()
        allocate_data()
    if expandable(sp):
        # A MemPool without an allocator maps its own expandable segment: a pool's second block
        # is mapped right after its first, and a snapshot shows one segment per mapped range.
        for pool, n in ((pool1, 2), (pool2, 2), (pool3, 1)):
            segs = sp.memory_snapshot(pool.id)
            assert [len(s["blocks"]) for s in segs] == [n], segs
            assert all(s["is_expandable"] for s in segs)
    else:
        assert len(sp.memory_snapshot(pool1.id)) == 2
        assert len(sp.memory_snapshot(pool2.id)) == 2
        assert len(sp.memory_snapshot(pool3.id)) == 1
    for p in data:
        sp.free(p)
    for p in (pool1, pool2, pool3):
        p.destroy()


def test_mempool_no_split_large(sp):
    sp.empty_cache()
    pool_split = sp.MemPool()
    pool_no_split = sp.MemPool(no_split=True)
    ptrs = []
    try:
        _check_no_split_large(sp, pool_split, pool_no_split, ptrs)
    finally:  # a failure must not leave the pools' segments to the tests after it
        for p in ptrs:
            sp.free(p)
        pool_split.destroy()
        pool_no_split.destroy()


def _check_no_split_large(sp, pool_split, pool_no_split, ptrs):
    for _ in range(2):
        with sp.use_mem_pool(pool_split):
            ptrs.append(sp.malloc(4 * MB))
        with sp.use_mem_pool(pool_no_split):
            ptrs.append(sp.malloc(4 * MB))
    segs_split = sp.memory_snapshot(pool_split.id)
    segs_no_split = sp.memory_snapshot(pool_no_split.id)
    if expandable(sp):
        # Both pools grow one expandable segment; the no_split one keeps each whole 20 MiB page
        # as the block, the other splits it.
        assert len(segs_no_split) == len(segs_split) == 1
        assert [b["size"] for b in segs_no_split[0]["blocks"]] == [20 * MB, 20 * MB]
    else:
        assert len(segs_no_split) > len(segs_split)
        for seg in segs_no_split:
            assert len(seg["blocks"]) == 1  # the whole 20 MiB segment is the block
    assert sum(len(s["blocks"]) for s in segs_no_split) < sum(len(s["blocks"]) for s in segs_split)


def test_deleted_mempool_not_used_on_oom(sp):
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    sp.set_per_process_memory_fraction((40 * MB) / total)
    try:
        for _ in range(10):
            pool = sp.MemPool(use_on_oom=True)
            with sp.use_mem_pool(pool):
                a = sp.malloc(40 * MB)
            sp.free(a)
            pool.destroy()  # torch: `del pool` (its destructor empties its cache)
        new_pool = sp.MemPool(use_on_oom=True)
        with sp.use_mem_pool(new_pool):
            a = sp.malloc(40 * MB)
        sp.free(a)
        if expandable(sp):  # an expandable pool lends nothing (test_mempool_limited_memory_use_on_oom)
            with pytest.raises(sp.OutOfMemoryError):
                sp.malloc(20 * MB)
            new_pool.destroy()
            return
        # the default pool has no room: both fall back to new_pool's free block, never to a
        # deleted pool
        b = sp.malloc(20 * MB)
        c = sp.malloc(20 * MB)
        assert {b, c} == {a, a + 20 * MB}
        sp.free(b)
        sp.free(c)
        new_pool.destroy()
    finally:
        sp.empty_cache()
        sp.set_per_process_memory_fraction(1.0)


def test_tensor_delete_after_allocator_delete(sp):
    calls, allocator = counting_allocator()
    pool = sp.MemPool(allocator)
    with sp.use_mem_pool(pool):
        data = sp.malloc(16)
    assert calls == {"alloc": 1, "free": 0}
    del pool  # the pool keeps its allocator alive until its last block is gone
    gc.collect()
    assert calls["free"] == 0
    sp.free(data)
    sp.empty_cache()
    assert calls == {"alloc": 1, "free": 1}


# ---- history contexts (TestCudaMallocAsync's snapshot tests run on the native allocator) ----

def test_memory_snapshot_state_python_frames(sp):
    try:
        sp.empty_cache()
        sp._record_memory_history("state", stacks="python")
        first = sp.malloc(2 * 311 * 411 * 4)  # makes x the second block of a segment
        unused = sp.malloc(310 * 410 * 4)
        x = sp.malloc(311 * 411 * 4)
        ss = sp._snapshot()
        found = False
        for seg in ss["segments"]:
            assert "frames" in seg
            for b in seg["blocks"]:
                if b["requested_size"] == 311 * 411 * 4:
                    assert "test_parity_torch" in b["frames"][0]["filename"]
                    assert b["address"] == x
                    found = True
        assert found
        sp.free(unused)
        sp.free(x)
        sp.free(first)
        sp.empty_cache()
        ss = sp._snapshot()
        assert ss["device_traces"][0][-1]["action"] in ("segment_free", "segment_unmap")
    finally:
        sp._record_memory_history(None)


@pytest.mark.parametrize("context", ["alloc", "all", "state"])
def test_memory_plots_free_stack(sp, context):
    import json
    try:
        sp.empty_cache()
        # A live block keeps the small segment: x's block then comes from it, so no segment's
        # allocation stack (kept at every context) names thealloc, as in PyTorch's run where
        # earlier tensors hold that segment.
        keep = sp.malloc(512)
        sp._record_memory_history(context=context)
        x = [None]

        def thealloc():
            x[0] = sp.malloc(3 * 4 * 4)

        def thefree():
            sp.free(x[0])

        thealloc()
        thefree()
        ss = json.dumps(sp._snapshot())
        assert ("thefree" in ss) == (context == "all")
        assert ("thealloc" in ss) == (context != "state")
        sp.free(keep)
    finally:
        sp._record_memory_history(None)


def test_memory_plots_history_context(sp):
    import json
    keep = []
    try:
        sp.empty_cache()

        def should_capture1():
            keep.append(sp.malloc(4 * 4 * 4))

        def should_not_capture():
            keep.append(sp.malloc(3 * 4 * 4))

        def should_capture2():
            keep.append(sp.malloc(4 * 4 * 4))

        sp._record_memory_history(context="all", stacks="python")
        should_capture1()
        sp._record_memory_history(context=None)
        should_not_capture()
        sp._record_memory_history(context="all", stacks="python")
        should_capture2()
        ss = json.dumps(sp._snapshot())
        assert "should_capture1" in ss
        assert "should_not_capture" not in ss
        assert "should_capture2" in ss
    finally:
        for p in keep:
            sp.free(p)
        sp._record_memory_history(None)


@pytest.mark.parametrize("context", ["alloc", "all", "state"])
def test_memory_plots_free_segment_stack(sp, context):
    import json
    try:
        sp.empty_cache()
        sp._record_memory_history(context=context)
        x = sp.malloc(3 * 4 * 4)
        sp.free(x)

        # sympool's Python frames leave out the package's own (torch.cuda.empty_cache's frame
        # is where PyTorch's test finds "empty_cache"): the caller's frame stands for it.
        def calls_empty_cache():
            sp.empty_cache()

        calls_empty_cache()
        ss = json.dumps(sp._snapshot())
        assert ("calls_empty_cache" in ss) == (context == "all")
    finally:
        sp._record_memory_history(None)


def test_memory_plots(sp):
    import json
    for context, stacks in (("all", "all"), ("all", "python"), (None, "python")):
        try:
            sp.empty_cache()
            sp._record_memory_history("all", context=context, stacks=stacks)

            def run():
                x = sp.malloc(128 * 128 * 4)
                sp.free(x)

            run()
            text = json.dumps(sp._snapshot())
            assert (context is not None) == ("test_memory_plots" in text)
            assert str(128 * 128 * 4) in text
        finally:
            sp._record_memory_history(None)


@pytest.mark.parametrize("skip_actions", [["free_requested"], ["free_requested", "free_completed"],
                                          ["alloc"], ["segment_alloc", "segment_free"], [], None])
def test_memory_snapshot_skip_actions(sp, skip_actions):
    try:
        sp.empty_cache()
        sp._record_memory_history(context="all", stacks="python", skip_actions=skip_actions)
        x = sp.malloc(128 * 128 * 4)
        sp.free(x)
        sp.empty_cache()
        trace = sp._snapshot()["device_traces"][0]
        assert len(trace) > 0
        actions = {e["action"] for e in trace}
        for a in skip_actions or []:
            assert a not in actions
        assert actions - set(skip_actions or [])
    finally:
        sp._record_memory_history(None)


def test_memory_snapshot_skip_actions_refused(sp):
    with pytest.raises(ValueError):
        sp._record_memory_history(skip_actions=["not_an_action"])
    with pytest.raises(TypeError):
        sp._record_memory_history(skip_actions="alloc")
    with pytest.raises(ValueError):  # an empty name is not "nothing skipped"
        sp._record_memory_history(skip_actions=["alloc", ""])
    sp._record_memory_history(None)



def test_use_mem_pool_same_pool_nested_is_refused(sp):
    # PyTorch: "beginAllocateToPool: already recording to mempool_id"
    pool = sp.MemPool()
    with sp.use_mem_pool(pool):
        with pytest.raises(sp.SympoolError) as e:
            with sp.use_mem_pool(pool):
                pass
        assert e.value.status == "SP_ERR_INVALID_USAGE"
        assert pool.use_count() == 2
        p = sp.malloc(1000)  # still routed to the pool
    assert pool.use_count() == 1
    assert pool.used_bytes() == 1024
    sp.free(p)
    pool.destroy()


# ---- more of test_cuda.py (TestCuda, TestCudaMallocAsync, TestMemPool) ------------------------

def test_out_of_memory_message(sp):
    # test_out_of_memory's whole regex: the size, then PyTorch's "GPU <n> has a total capacity
    # of" sentence, which ported tests and log scrapers match on.
    with pytest.raises(sp.OutOfMemoryError,
                       match=r"Tried to allocate 800000000\.00 GiB\. GPU 0 has a total capacity "
                             r"of [0-9.]+ [KMGT]?i?B of which [0-9.]+ [KMGT]?i?B is free"):
        sp.malloc(1024 * 1024 * 1024 * 800000000)


@pytest.mark.parametrize("conf", ["", "max_split_size_mb:1024"])
def test_raises_oom(conf):
    # test_raises_oom: a 4 TiB request (torch.empty(1024**4) floats) raises OutOfMemoryError, also
    # with max_split_size_mb set, which makes the free-block search go past its early return.
    run_child("""
        sp.empty_cache()
        try:
            sp.malloc(1024 * 1024 * 1024 * 1024 * 4)
            raise SystemExit("no OOM")
        except sp.OutOfMemoryError:
            pass
        sp.free(sp.malloc(1024))
    """, SYMPOOL_ALLOC_CONF=conf)


def test_record_stream(sp):
    # test_record_stream, the native allocator's part: a block allocated on `alloc_s` and used
    # on `use_s` (record_stream) is not handed out again on alloc_s until use_s's work is done;
    # once it is, the next allocation of that size on alloc_s gets it back. (A second user stream
    # stands for PyTorch's current stream, so that the test can synchronize it.)
    alloc_s, use_s = sp.Stream(), sp.Stream()
    try:
        tmp = sp.malloc(16, stream=alloc_s)
        sp.record_stream(tmp, use_s)
        sp.free(tmp)
        tmp2 = sp.malloc(16, stream=alloc_s)
        assert tmp2 != tmp, "allocation reused too soon"
        use_s.synchronize()
        tmp3 = sp.malloc(16, stream=alloc_s)
        assert tmp3 == tmp, "allocation not reused"
        sp.free(tmp2)
        sp.free(tmp3)
    finally:
        alloc_s.synchronize()
        use_s.synchronize()
        alloc_s.destroy()
        use_s.destroy()


def test_record_stream_on_shifted_view(sp):
    # test_record_stream_on_shifted_view (pytorch#27366): record_stream given an address inside
    # the block (a view's offset) still delays the whole block's reuse.
    stream_alloc, stream_record = sp.Stream(), sp.Stream()
    try:
        base = sp.malloc(10 * 4, stream=stream_alloc)
        sp.record_stream(base + 5 * 4, stream_record)  # base[5:], a shifted view
        sp.free(base)
        stream_alloc.synchronize()
        try_realloc = sp.malloc(10 * 4, stream=stream_alloc)
        assert try_realloc != base
        sp.free(try_realloc)
    finally:
        stream_alloc.synchronize()
        stream_record.synchronize()
        stream_alloc.destroy()
        stream_record.destroy()


def test_allocator_fuzz(sp):
    # test_allocator_fuzz: 10,000 random steps of allocate (2 to 20 MiB), free and empty_cache,
    # live bytes kept under 100 MiB; every block still holds what was written to it when it is
    # freed (the first and last 4-byte words, as torch.full's value is checked there).
    import ctypes
    if sp.backend() != "host":
        pytest.skip("reads block contents through host pointers")
    rng = random.Random(123)
    base_req = sp.memory_stats()["requested_bytes.all.current"]
    mem = []
    state = {"total": 0, "c": 0}

    def word(p, i):
        return ctypes.c_int32.from_address(p + 4 * i)

    def alloc():
        n = rng.randrange(2 * MB // 4, 20 * MB // 4)
        p = sp.malloc(4 * n)
        word(p, 0).value = word(p, n - 1).value = state["c"]
        mem.append((state["c"], p, n))
        state["c"] += 1
        state["total"] += n

    def free():
        v, p, n = mem.pop(rng.randrange(len(mem)))
        assert word(p, 0).value == v and word(p, n - 1).value == v
        sp.free(p)
        state["total"] -= n

    try:
        for step in range(10000):
            while state["total"] >= 1024 * 1024 * 1024 / (4 * 10):
                free()
            (action,) = rng.choices([alloc, free, sp.empty_cache],
                                    weights=[1, 1 if mem else 0, 0.1])
            action()
            if step % 250 == 0:
                st = sp.memory_stats()
                assert st["requested_bytes.all.current"] == base_req + 4 * state["total"]
                assert st["allocated_bytes.all.current"] <= st["reserved_bytes.all.current"]
    finally:
        while mem:
            free()
    sp.empty_cache()
    assert sp.memory_stats()["requested_bytes.all.current"] == base_req


def test_mempool_ctx_multithread(sp):
    # test_mempool_ctx_multithread: use_mem_pool routes only its own thread. While the main
    # thread sits inside the context (its pool's block already freed), another thread's 1 MiB
    # goes to the default pool, into the small segment the main thread's first 1 MiB opened.
    sp.empty_cache()
    assert len(sp._snapshot()["segments"]) == 0, "expected no segment at the start"
    nbytes = 1024 * 1024
    trigger_alloc, done_allocation = threading.Event(), threading.Event()
    held, segments, pools = [], [], []

    def main_thread_fn():
        pool = sp.MemPool()
        pools.append(pool)
        held.append(sp.malloc(nbytes))
        with sp.use_mem_pool(pool):
            out = sp.malloc(nbytes)
            sp.free(out)
            trigger_alloc.set()
            done_allocation.wait(10)

    def side_thread_fn():
        trigger_alloc.wait(10)
        held.append(sp.malloc(nbytes))
        segments.append(sp._snapshot()["segments"])
        done_allocation.set()

    threads = [threading.Thread(target=main_thread_fn), threading.Thread(target=side_thread_fn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    trigger_alloc.set()
    done_allocation.set()
    try:
        assert len(segments) == 1, "expected a memory snapshot"
        assert len(segments[0]) == 2, "expected 2 segments"
        active = {}
        for s in segments[0]:
            key = tuple(s["segment_pool_id"])
            active[key] = active.get(key, 0) + s["active_size"]
        for k, v in active.items():
            assert v == (2 * MB if k == (0, 0) else 0), (k, v)
    finally:
        for p in held:
            sp.free(p)
        for pool in pools:
            pool.destroy()


def test_mempool_expandable():
    # test_mempool_expandable: with expandable segments on, a pool with its own allocator gets
    # an ordinary segment (its allocator cannot map pages), the default pool an expandable one.
    run_child("""
        import ctypes
        sp.empty_cache()
        bufs = {}
        def alloc(size, device, stream):
            b = ctypes.create_string_buffer(size)
            bufs[ctypes.addressof(b)] = b
            return ctypes.addressof(b)
        def free(ptr, size, device, stream):
            del bufs[ptr]
        pool = sp.MemPool((alloc, free))
        data = []
        with sp.use_mem_pool(pool):
            data.append(sp.malloc(1 << 20))
        data.append(sp.malloc(1 << 20))  # the default pool: an expandable segment
        segments = sp.memory_snapshot()
        assert len(segments) == 2, segments
        assert sum(1 for s in segments if s["is_expandable"]) == 1, segments
        assert [s["is_expandable"] for s in segments
                if tuple(s["segment_pool_id"]) == pool.id] == [False], segments
        for p in data:
            sp.free(p)
        pool.destroy()
    """, SYMPOOL_ALLOC_CONF="expandable_segments:True")


@pytest.mark.parametrize("context", ["alloc", "all", "state"])
def test_memory_plots_metadata(sp, context):
    # test_memory_plots_metadata: with _set_memory_metadata set, every trace entry recorded
    # (alloc, frees, the segment's alloc and free) carries it as "user_metadata".
    try:
        sp.empty_cache()
        sp._set_memory_metadata("metadata test")
        assert sp._get_memory_metadata() == "metadata test"
        sp._record_memory_history(context=context)
        x = sp.malloc(3 * 4 * 4)
        sp.free(x)
        sp.empty_cache()
        sp._set_memory_metadata("")
        trace = sp._snapshot()["device_traces"][0]
        assert len(trace) >= 4
        for event in trace:
            assert event["user_metadata"] == "metadata test", event
        # the dump's own snapshot marker, appended after the reset, has none
        assert sp._snapshot()["device_traces"][0][-1]["user_metadata"] == ""
    finally:
        sp._set_memory_metadata("")
        sp._record_memory_history(None)


def test_trace_entry_keys(sp):
    # The keys of a trace entry as recent PyTorch writes them (torch/csrc/cuda/Module.cpp):
    # compile_context "N/A" and user_metadata "" in every entry, frames only with a context.
    try:
        sp._record_memory_history("all", context=None)
        sp.free(sp.malloc(1000))
        for e in sp._snapshot()["device_traces"][0]:
            assert set(e) == {"action", "addr", "size", "stream", "time_us", "compile_context",
                              "user_metadata"}, e
            assert (e["compile_context"], e["user_metadata"]) == ("N/A", "")
    finally:
        sp._record_memory_history(None)


# ---- a second pass: allocator settings, raw alloc, C stacks, MemPool.allocator ----------------

def _settings_of(env):
    """allocator_settings of a fresh process's snapshot, with env set (and no SYMPOOL_ALLOC_CONF
    unless env names it)."""
    import json
    e = {"SYMPOOL_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": ""}
    e.update(env)
    drop = [k for k, v in e.items() if v == ""]
    body = """
        import json, os
        print(json.dumps(sp._snapshot()["allocator_settings"]))
    """
    saved = {k: os.environ.pop(k) for k in drop if k in os.environ}
    try:
        return json.loads(run_child(body, **{k: v for k, v in e.items() if v != ""}))
    finally:
        os.environ.update(saved)


def test_allocator_config_test():
    # c10/test/core/AllocatorConfig_test.cpp (allocator_config_test): every device key of one
    # string is read back, and the roundup list gives PyTorch's divisions per size (an interval
    # named by no entry keeps 0; the first entry also covers the sizes below it).
    env = ("max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
           "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],"
           "expandable_segments:True,pinned_use_background_threads:True")
    st = _settings_of({"SYMPOOL_ALLOC_CONF": env})
    assert st["PYTORCH_CUDA_ALLOC_CONF"] == env
    assert st["max_split_size"] == 40 * MB
    assert st["garbage_collection_threshold"] == 0.5
    assert st["expandable_segments"] is True
    div = st["roundup_power2_divisions"]  # keyed by the interval's lower bound in MB
    for mb, want in ((32, 8), (64, 8), (128, 2), (256, 4), (512, 2), (1024, 4), (2048, 1),
                     (4096, 1), (8192, 1)):
        assert div[str(mb)] == want, (mb, div)

    env = "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]"
    div = _settings_of({"SYMPOOL_ALLOC_CONF": env})["roundup_power2_divisions"]
    for mb, want in ((64, 8), (128, 8), (256, 16), (512, 1), (1024, 0), (2048, 8), (4096, 2)):
        assert div[str(mb)] == want, (mb, div)

    div = _settings_of({"SYMPOOL_ALLOC_CONF": "roundup_power2_divisions:4"})[
        "roundup_power2_divisions"]
    assert set(div.values()) == {4}

    st = _settings_of({"SYMPOOL_ALLOC_CONF": "expandable_segments:False,"})  # trailing comma
    assert st["expandable_segments"] is False
    assert st["max_split_size"] == -1  # not named: unlimited


def test_allocator_config_roundup_any_order():
    # AcceleratorAllocatorConfig::parseRoundUpPower2Divisions: boundaries in any order, the later
    # entry for an interval winning; ">" fills after the boundary read before it. sympool read such
    # a string as bad (a warning, and no rounding at all).
    div = _settings_of({"SYMPOOL_ALLOC_CONF": "roundup_power2_divisions:[256:4,64:8,>:2]"})[
        "roundup_power2_divisions"]
    assert [div[str(1 << i)] for i in range(16)] == [4] * 6 + [8] + [2] * 9


def test_alloc_conf_variable_order():
    # AcceleratorAllocatorConfig::instance(): PYTORCH_ALLOC_CONF is read first; the older
    # PYTORCH_CUDA_ALLOC_CONF only when it is unset.
    st = _settings_of({"PYTORCH_ALLOC_CONF": "max_split_size_mb:40",
                       "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:60"})
    assert st["max_split_size"] == 40 * MB
    st = _settings_of({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:60"})
    assert st["max_split_size"] == 60 * MB


def test_caching_allocator_raw_alloc(sp):
    # test_cachingAllocator_raw_alloc, the caching half (caching_allocator_enable has no
    # counterpart): a raw allocation on a given stream is counted in requested_bytes, exactly.
    s = sp.Stream()
    try:
        sp.empty_cache()
        sp.reset_accumulated_memory_stats()
        start = sp.memory_stats()["requested_bytes.all.allocated"]
        p = sp.caching_allocator_alloc(1024 * 1024, 0, s)
        finish = sp.memory_stats()["requested_bytes.all.allocated"]
        sp.caching_allocator_delete(p)
        assert finish - start == 1024 * 1024
    finally:
        s.synchronize()
        s.destroy()


def test_memory_snapshot_with_cpp(sp):
    # test_memory_snapshot_with_cpp: with stacks="all", a live block's frames hold the C frames
    # of its allocation beside the Python ones (PyTorch finds "::rand"; here the caller's C frames
    # follow the test's own Python frame, sympool's own frames left out).
    try:
        sp.empty_cache()
        sp._record_memory_history("state", stacks="all")
        x = sp.malloc(311 * 411 * 4)
        found = False
        for seg in sp._snapshot()["segments"]:
            for b in seg["blocks"]:
                if b["requested_size"] == 311 * 411 * 4:
                    names = [f["name"] for f in b["frames"]]
                    assert "test_memory_snapshot_with_cpp" in names
                    assert len(names) > names.index("test_memory_snapshot_with_cpp") + 1
                    assert not any(n.startswith("sp_") for n in names), names
                    found = True
        assert found
        sp.free(x)
    finally:
        sp._record_memory_history(None)


def test_mempool_allocator_property(sp):
    # test_mempool_with_allocator's first checks: a MemPool has no allocator unless given one,
    # and then reports the very allocator it was given.
    assert sp.MemPool().allocator is None
    calls, allocator = counting_allocator()
    pool = sp.MemPool(allocator)
    assert pool.allocator is allocator
    assert pool.use_count() == 1
    assert calls == {"alloc": 0, "free": 0}
    pool.destroy()


def test_garbage_collection_frees_oldest_first():
    # garbage_collect_cached_blocks (CUDACachingAllocator.cpp), behind test_garbage_collect_*:
    # with a fraction (200 MiB) and garbage_collection_threshold:0.5, a request no cached block
    # fits, made while more than 100 MiB is reserved, first frees the unsplit free blocks at least
    # as old as the average (age: lookups in the large pool since the block was freed), not
    # everything and not by the full release-and-retry.
    out = run_child("""
        MB = 1 << 20
        total = sp.get_memory_info()[1]
        sp.set_per_process_memory_fraction(200 * MB / total)
        a = sp.malloc(30 * MB)
        b = sp.malloc(30 * MB)
        sp.free(a)               # a: freed before the next lookup, so older than b and c
        c = sp.malloc(46 * MB)   # 30 MiB does not fit it: a new segment, 106 MiB reserved
        sp.free(b)
        sp.free(c)
        st = sp.memory_stats()
        frees, retries = st["num_device_free"], st["num_alloc_retries"]
        d = sp.malloc(50 * MB)   # ages a:2, b:1, c:1 -> only a (>= 4/3) is collected
        st = sp.memory_stats()
        kept = sorted(s["address"] for s in sp.memory_snapshot() if s["allocated_size"] == 0)
        print(st["num_device_free"] - frees, st["num_alloc_retries"] - retries,
              sp.memory_reserved() // MB, kept == sorted([b, c]))
    """, SYMPOOL_ALLOC_CONF="garbage_collection_threshold:0.5")
    assert out.split() == ["1", "0", "126", "True"]


def test_memory_plots_free_segment_stack_expandable():
    # test_memory_plots_free_segment_stack as test_cuda_expandable_segments.py runs it: the pages
    # empty_cache unmaps are recorded (segment_unmap) with empty_cache's stack under context
    # "all", and otherwise with the stack that mapped the segment (unmap_block:
    # `context ? context : block->context_when_segment_allocated`), as segment_free is.
    out = run_child("""
        for context in ("alloc", "all", "state"):
            sp.empty_cache()
            sp._record_memory_history(context=context)

            def the_alloc():
                return sp.malloc(3 * 4 * 4)

            sp.free(the_alloc())

            def calls_empty_cache():
                sp.empty_cache()

            calls_empty_cache()
            trace = sp._snapshot()["device_traces"][0]
            unmaps = [e for e in trace if e["action"] == "segment_unmap"]
            assert unmaps, trace
            names = {f["name"] for e in unmaps for f in e.get("frames", [])}
            print(context, "calls_empty_cache" in names, "the_alloc" in names)
            sp._record_memory_history(None)
    """, SYMPOOL_ALLOC_CONF="expandable_segments:True")
    assert out.splitlines() == ["alloc False True", "all True False", "state False False"]


def test_snapshot_allocator_settings_cuda_keys():
    # torch/csrc/cuda/Module.cpp writes CUDAAllocatorConfig's values into the snapshot's
    # allocator_settings: the CUDA-only keys read back as set (their ROCm spellings set the same
    # values), even where they change nothing on this backend; unset, PyTorch's defaults.
    st = _settings_of({"SYMPOOL_ALLOC_CONF": ""})
    assert (st["pinned_num_register_threads"], st["release_lock_on_cudamalloc"],
            st["pinned_use_cuda_host_register"], st["graph_capture_record_stream_reuse"]) == (
        1, False, False, False)
    st = _settings_of({"SYMPOOL_ALLOC_CONF":
                       "pinned_num_register_threads:8,release_lock_on_cudamalloc:True,"
                       "pinned_use_cuda_host_register:True,graph_capture_record_stream_reuse:True"})
    assert (st["pinned_num_register_threads"], st["release_lock_on_cudamalloc"],
            st["pinned_use_cuda_host_register"], st["graph_capture_record_stream_reuse"]) == (
        8, True, True, True)
    st = _settings_of({"PYTORCH_ALLOC_CONF":
                       "release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True"})
    assert (st["release_lock_on_cudamalloc"], st["pinned_use_cuda_host_register"]) == (True, True)


# ---- TestBlockStateAbsorption and the graph tests, with a MemPool for the graph's private pool

SMALL_SIZE, SMALL_BUFFER, LARGE_BUFFER = 1 << 20, 2 << 20, 20 << 20


def test_allocate_in_thread_to_pool(sp):
    # TestBlockStateAbsorption.test_allocate_in_thread_to_pool: a private pool that already holds
    # one small segment (the captured torch.rand([4]), freed) is routed from one thread while
    # another thread allocates the same sizes outside it. The routed thread's three live 20 MiB
    # blocks take three large segments of the pool (one expandable segment with expandable
    # segments on) and the other thread's never land there; once the pool goes, empty_cache
    # releases them all.
    sp.empty_cache()
    pool = sp.MemPool()
    with sp.use_mem_pool(pool):
        sp.free(sp.malloc(16))
    assert len(sp.memory_snapshot(pool.id)) == 1

    def alloc_three():
        a = sp.malloc(LARGE_BUFFER)
        b = sp.malloc(LARGE_BUFFER)
        c = sp.malloc(LARGE_BUFFER)  # c = a + b
        for p in (a, b, c):
            sp.free(p)

    errors = []

    def use_pool():
        try:
            with sp.use_mem_pool(pool):
                for _ in range(10):
                    alloc_three()
            alloc_three()  # three more allocations, not in the pool
        except Exception as e:  # reported by the main thread
            errors.append(e)

    def no_pool():
        try:
            for _ in range(10):
                a = sp.malloc(LARGE_BUFFER)
                b = sp.malloc(LARGE_BUFFER)
                sp.free(a)
                sp.free(b)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=use_pool), threading.Thread(target=no_pool)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    pool_id = pool.id
    assert len(sp.memory_snapshot(pool_id)) == (2 if expandable(sp) else 4)
    pool.destroy()  # del graph
    gc.collect()
    sp.empty_cache()
    assert len(sp.memory_snapshot(pool_id)) == 0


@pytest.mark.parametrize("case", range(5))
def test_graph_memory_stats_and_use_result_after_destroy_graph(sp, case):
    # test_graph_memory_stats_and_use_result_after_destroy_graph: the capture's allocations land
    # in its private pool (here a MemPool routed to); `b = a.clone()` then five times
    # `b = b.clone() + 1` keeps at most three blocks of the size live, so the pool grows by the
    # segments PyTorch's table names. After the pool goes and the cache is emptied, only b's
    # segment stays. The device-wide stats of the size's pool count both. The capture's two rng
    # holders (PyTorch's extra 2 blocks and 1024 bytes in the small cases) have no counterpart.
    elem = 4
    kMinLargeAlloc, kRoundLarge = 10 * MB, 2 * MB
    round_large = kRoundLarge * ((kMinLargeAlloc + 512 + kRoundLarge - 1) // kRoundLarge)
    cases = (
        (512 // elem, 1, SMALL_BUFFER, SMALL_BUFFER, "small_pool"),
        (SMALL_SIZE // elem, 2, 2 * SMALL_BUFFER, SMALL_BUFFER, "small_pool"),
        ((SMALL_SIZE + 512) // elem, 1, LARGE_BUFFER, LARGE_BUFFER, "large_pool"),
        ((kMinLargeAlloc - 512) // elem, 2, 2 * LARGE_BUFFER, LARGE_BUFFER, "large_pool"),
        ((kMinLargeAlloc + 512) // elem, 3, 3 * round_large, round_large, "large_pool"),
    )
    numel, d_mallocs, d_bytes, d_bytes_post_del, pool_string = cases[case]
    nbytes = numel * elem
    exp = expandable(sp)
    stats_to_check = ("segment.", "reserved_bytes.", "active.", "active_bytes.")
    gc.collect()
    sp.empty_cache()

    a = sp.malloc(nbytes)  # the input, in the default pool, before the capture
    pre = sp.memory_stats()
    pool = sp.MemPool()
    with sp.use_mem_pool(pool):  # g.capture_begin() ... g.capture_end()
        b = sp.malloc(nbytes)  # b = a.clone()
        for _ in range(5):  # b = b.clone() + 1
            t = sp.malloc(nbytes)
            r = sp.malloc(nbytes)
            sp.free(t)
            sp.free(b)
            b = r
    post = sp.memory_stats()
    for stat, expected in zip(stats_to_check, (d_mallocs, d_bytes, 1, nbytes)):
        stat = stat + pool_string + ".current"
        # One expandable segment per pool and stream: mapping pages never counts a segment.
        if exp and "segment" in stat:
            expected = 0
        # PyTorch does not unmap part of an expandable segment smaller than its page.
        if exp and "reserved" in stat and case in (3, 4):
            expected = 2 * LARGE_BUFFER
        assert post[stat] - pre[stat] == expected, (stat, post[stat] - pre[stat], expected)

    pool.destroy()  # del g
    gc.collect()
    sp.empty_cache()
    postdel = sp.memory_stats()
    # b, the graph's result, outlives its pool: the only live block left of it
    for stat, expected in zip(stats_to_check, (1, d_bytes_post_del, 1, nbytes)):
        stat = stat + pool_string + ".current"
        if exp and "segment" in stat:
            expected = 0
        if exp and "reserved" in stat and case == 3:
            expected = 2 * LARGE_BUFFER
        if exp and "reserved" in stat and case == 4:
            expected = LARGE_BUFFER
        assert postdel[stat] - pre[stat] == expected, (stat, postdel[stat] - pre[stat], expected)
    sp.free(a)
    sp.free(b)
    sp.empty_cache()


def _func_with_temps(sp, t, nbytes):
    # x = t.clone() + val; y = t.clone() + val; return x + y: each clone a temporary, freed
    # once the sum it feeds exists; x and y freed when the function returns.
    x_tmp = sp.malloc(nbytes)
    x = sp.malloc(nbytes)
    sp.free(x_tmp)
    y_tmp = sp.malloc(nbytes)
    y = sp.malloc(nbytes)
    sp.free(y_tmp)
    z = sp.malloc(nbytes)
    sp.free(x)
    sp.free(y)
    return z


def _chain(sp, b, nbytes, n):
    for _ in range(n):  # b = func_with_temps(b, val)
        z = _func_with_temps(sp, b, nbytes)
        sp.free(b)
        b = z
    return b


def test_graph_two_successive(sp):
    # test_graph_two_successive: two captures, each making temporaries and keeping one result.
    # Sharing one private pool (g1 captured into g0's pool) reserves one small segment fewer
    # than two pools, each of which needs its own.
    nbytes = 1000 * 4
    reserved = {}
    for share_mem in ("Don't share", "via pool()"):
        sp.empty_cache()
        a = sp.malloc(nbytes)
        g0 = sp.MemPool()
        with sp.use_mem_pool(g0):
            b = sp.malloc(nbytes)  # b = a.clone()
            b = _chain(sp, b, nbytes, 5)
        g1 = g0 if share_mem == "via pool()" else sp.MemPool()
        with sp.use_mem_pool(g1):
            b = _chain(sp, b, nbytes, 5)
        c = sp.malloc(nbytes)  # eager ops beside the replays, in the default pool
        c = _chain(sp, c, nbytes, 6)
        reserved[share_mem] = sp.memory_stats()["reserved_bytes.all.current"]
        for p in (a, b, c):
            sp.free(p)
        for g in {id(g0): g0, id(g1): g1}.values():
            g.destroy()
        sp.empty_cache()
    assert reserved["Don't share"] - reserved["via pool()"] == SMALL_BUFFER


def test_graph_three_successive(sp):
    # test_graph_three_successive: g0 makes b, c = b + 1, d = b + 2; g1 makes e = c + 3 and drops
    # c; g2 makes f = d + 4. Sharing g0's pool, g2's f takes the block c left (which is why
    # replaying g0, g2, g1 corrupts e in PyTorch); with pools of their own it cannot.
    nbytes = 1000 * 4
    for share_mem in ("Don't share", "via pool()"):
        sp.empty_cache()
        a = sp.malloc(nbytes)
        g0 = sp.MemPool()
        with sp.use_mem_pool(g0):
            b = sp.malloc(nbytes)
            c = sp.malloc(nbytes)
            d = sp.malloc(nbytes)
        g1 = g0 if share_mem == "via pool()" else sp.MemPool()
        with sp.use_mem_pool(g1):
            e = sp.malloc(nbytes)
            c_ptr = c
            sp.free(c)
        g2 = g0 if share_mem == "via pool()" else sp.MemPool()
        with sp.use_mem_pool(g2):
            f = sp.malloc(nbytes)
        if share_mem == "via pool()":
            assert f == c_ptr
        else:
            assert f != c_ptr
        for p in (a, b, d, e, f):
            sp.free(p)
        for g in {id(g0): g0, id(g1): g1, id(g2): g2}.values():
            g.destroy()
        sp.empty_cache()


def test_mempool_limited_memory_with_allocator(sp):
    # test_mempool_limited_memory_with_allocator as written upstream: both pools get segments
    # from their own allocator (PyTorch's dummy one), so they keep fixed segments with expandable
    # segments on too, and the memory fraction (80 MiB) still counts their segments. A request
    # of the default pool that hits OOM borrows pool_use's free block (use_on_oom), never
    # pool_do_not_use's.
    calls, allocator = counting_allocator()
    pool_do_not_use = sp.MemPool(allocator)
    pool_use = sp.MemPool(allocator, use_on_oom=True)
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    sp.set_per_process_memory_fraction((80 * MB + sp.memory_reserved()) / total)
    held = []
    try:
        with sp.use_mem_pool(pool_do_not_use):
            a = sp.malloc(40 * MB)
        with sp.use_mem_pool(pool_use):
            b = sp.malloc(40 * MB)
        with pytest.raises(sp.OutOfMemoryError):
            held.append(sp.malloc(40 * MB))
        sp.free(a)
        sp.free(b)
        c = sp.malloc(30 * MB)  # no OOM: pool_use's free block as the fallback
        held.append(c)
        with pytest.raises(sp.OutOfMemoryError):
            held.append(sp.malloc(30 * MB))  # pool_do_not_use is never lent
        sp.free(held.pop())
        assert b == c
        with sp.use_mem_pool(pool_use):
            e = sp.malloc(20 * MB)
        sp.free(e)
        assert e == c
        assert calls["alloc"] == 2
    finally:
        for p in held:
            sp.free(p)
        pool_use.destroy()
        pool_do_not_use.destroy()
        sp.set_per_process_memory_fraction(1.0)
        sp.empty_cache()
    assert calls == {"alloc": 2, "free": 2}  # the pools' destruction empties their caches


def test_deleted_mempool_not_used_on_oom_with_allocator(sp):
    # test_deleted_mempool_not_used_on_oom as written upstream: the use_on_oom pools have an
    # allocator of their own (fixed segments, expandable segments or not). With 40 MiB allowed,
    # ten pools each take and free 40 MiB and are deleted; a new one does the same. The default
    # pool's 20 MiB requests then fall back to the new pool's free block, never a deleted pool's.
    calls, allocator = counting_allocator()
    sp.empty_cache()
    total = sp.get_memory_info()[1]
    sp.set_per_process_memory_fraction((40 * MB + sp.memory_reserved()) / total)
    try:
        for _ in range(10):
            pool = sp.MemPool(allocator, use_on_oom=True)
            with sp.use_mem_pool(pool):
                a = sp.malloc(40 * MB)
            sp.free(a)
            pool.destroy()
        assert calls == {"alloc": 10, "free": 10}
        new_pool = sp.MemPool(allocator, use_on_oom=True)
        with sp.use_mem_pool(new_pool):
            a = sp.malloc(40 * MB)
        sp.free(a)
        b = sp.malloc(20 * MB)
        c = sp.malloc(20 * MB)
        assert {b, c} == {a, a + 20 * MB}
        sp.free(b)
        sp.free(c)
        new_pool.destroy()
        assert calls == {"alloc": 11, "free": 11}
    finally:
        sp.set_per_process_memory_fraction(1.0)
        sp.empty_cache()


def test_device_memory_used(sp):
    # test_device_memory_used: the device's used memory (torch.cuda.device_memory_used, NVML's
    # figure for every process; device_usage()["used"] here) grows by about a live 512 MiB
    # allocation, which empty_cache cannot release.
    sp.empty_cache()
    a = sp.device_usage()["used"]
    num_bytes = 512 * MB
    p = sp.malloc(num_bytes)
    try:
        sp.empty_cache()
        b = sp.device_usage()["used"]
        assert num_bytes // 32 <= b - a <= num_bytes * 32
    finally:
        sp.free(p)
        sp.empty_cache()
