"""The Python package under misuse: handles copied or pickled, objects used after they are gone,
a Python segment allocator that misbehaves, use_mem_pool contexts left out of order or on the
wrong thread, several threads destroying one object, arguments of the wrong type, and interpreter
exit with everything still alive. Each must be a clear Python exception (API.md: SympoolError
with a status, ValueError / TypeError for bad arguments), never a crash, a hang, or a silently
wrong answer.
"""

import asyncio
import copy
import ctypes
import pickle
import subprocess
import sys
import threading

import pytest

from _hostmem import host_segment


class Index:
    """An int-like that is not an int (numpy.int64 and friends take this path)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class HostSegments:
    """A Python segment allocator over ctypes buffers (the host backend's memory is host
    memory), counting its calls."""

    def __init__(self):
        self.bufs, self.allocs, self.frees = {}, 0, 0

    def alloc(self, size, device, stream):
        self.allocs += 1
        return host_segment(self.bufs, size)

    def free(self, ptr, size, device, stream):
        self.frees += 1
        self.bufs.pop(ptr)


# ---- handles are neither picklable nor copyable (torch.cuda.MemPool and CuPy's pools are not) --

@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_pool_and_stream_refuse_pickle_and_copy(sp, how):
    op = {"pickle": lambda o: pickle.loads(pickle.dumps(o)), "copy": copy.copy,
          "deepcopy": copy.deepcopy}[how]
    pool, stream = sp.MemPool(name="original"), sp.Stream()
    try:
        for obj in (pool, sp.get_default_memory_pool(), stream):
            with pytest.raises(TypeError, match="cannot pickle or copy a sympool"):
                op(obj)
        # Before the fix a copy was a second owner: collecting it destroyed the pool under the
        # original, whose queries then answered 0 for a pool that no longer existed.
        p = pool.malloc(1000)
        assert pool.used_bytes() == 1024 and pool.name == "original"
        sp.free(p)
    finally:
        stream.destroy()
        pool.destroy()


def test_pool_in_a_container_is_not_deep_copied(sp):
    pool = sp.MemPool()
    with pytest.raises(TypeError):
        copy.deepcopy({"pool": pool})
    assert pool.use_count() == 1
    pool.destroy()


# ---- a Python segment allocator that misbehaves ------------------------------------------------

@pytest.mark.parametrize("returned, cause", [
    ("0x1000", TypeError), (4096.0, TypeError), (True, TypeError), (object(), TypeError),
    (-4096, ValueError), (1 << 70, ValueError)])
def test_allocator_returning_no_address_is_out_of_memory_with_the_cause(sp, returned, cause):
    # ctypes cannot convert these to a void *: before the fix the library received an undefined
    # value (0x2, or a stale register) and used it as a segment, handing out blocks inside it.
    seen = []
    pool = sp.MemPool(allocator=(lambda size, d, s: seen.append(size) or returned,
                                 lambda ptr, size, d, s: None), name="garbage")
    with pytest.raises(sp.OutOfMemoryError) as e:
        pool.malloc(1000)
    assert isinstance(e.value.__cause__, cause)
    assert seen  # the allocator was asked
    assert (pool.total_bytes(), pool.used_bytes()) == (0, 0), "no segment may be made of it"
    with pytest.raises(sp.OutOfMemoryError):  # routed allocations too
        with sp.use_mem_pool(pool):
            sp.malloc(1000)
    pool.destroy()


def test_allocator_exception_is_the_cause_and_is_not_blamed_later(sp):
    calls = []

    def alloc(size, device, stream):
        calls.append(size)
        raise RuntimeError("segment allocator broke")

    pool = sp.MemPool(allocator=(alloc, lambda *a: None))
    with pytest.raises(sp.OutOfMemoryError) as e:
        pool.malloc(1 << 20)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert "segment allocator broke" in str(e.value.__cause__)
    # A later failure of another pool, where no Python allocator failed, has no such cause.
    other = sp.MemPool()
    other.set_limit(size=1)
    with pytest.raises(sp.OutOfMemoryError) as e2:
        other.malloc(1000)
    assert e2.value.__cause__ is None
    with pytest.raises(sp.OutOfMemoryError) as e3:
        sp.malloc(1 << 62)
    assert e3.value.__cause__ is None
    other.destroy()
    pool.destroy()


def test_allocator_that_fails_once_then_succeeds(sp):
    segs = HostSegments()
    failed = []

    def alloc(size, device, stream):
        if not failed:
            failed.append(size)
            raise MemoryError("transient")
        return segs.alloc(size, device, stream)

    pool = sp.MemPool(allocator=(alloc, segs.free))
    # As PyTorch's allocator, the library frees its cache and asks once more: that answer stands.
    p = pool.malloc(1000)
    assert p and pool.used_bytes() == 1024
    assert (len(failed), segs.allocs) == (1, 1)
    sp.free(p)
    pool.free_all_blocks()
    assert segs.bufs == {}
    # Nothing from that failure is left to chain onto an unrelated OOM.
    with pytest.raises(sp.OutOfMemoryError) as e:
        sp.malloc(1 << 62)
    assert e.value.__cause__ is None
    pool.destroy()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_interrupt_in_the_allocator_reaches_the_caller(sp, exc):
    calls = []

    def alloc(size, device, stream):
        calls.append(size)
        raise exc()

    pool = sp.MemPool(allocator=(alloc, lambda *a: None))
    with pytest.raises(exc):
        pool.malloc(1000)
    assert len(calls) == 1, "no retry after the interrupt"
    with pytest.raises(exc):
        with sp.use_mem_pool(pool):
            sp.malloc(1000)
    assert pool.use_count() == 1
    pool.destroy()


def test_interrupt_under_a_c_caller_does_not_stick(sp):
    # A C caller of sp_malloc (PyTorch's allocator after sympool.torch.enable(), routed by
    # use_mem_pool) has no sympool malloc to raise an interrupt after it. The interrupt was kept
    # all the same, and every later allocation of the thread's Python-allocator pools was out of
    # memory without the allocator being asked again.
    segs, calls = HostSegments(), []

    def alloc(size, device, stream):
        calls.append(size)
        if len(calls) == 1:
            raise KeyboardInterrupt()
        return segs.alloc(size, device, stream)

    pool = sp.MemPool(allocator=(alloc, segs.free))
    c_malloc = sp._lib.lib().sp_malloc
    p = ctypes.c_void_p()
    with sp.use_mem_pool(pool):
        first = c_malloc(1000, 0, None, ctypes.byref(p))
        if first != 0:  # the library's retry asks again once the interrupt is known lost
            assert c_malloc(1000, 0, None, ctypes.byref(p)) == 0
        assert p.value and pool.used_bytes() == 1024
        sp.free(p.value)
        q = sp.malloc(1000)  # and sympool's own malloc is not blamed for it
    assert len(calls) >= 2
    sp.free(q)
    pool.destroy()


def test_allocator_free_that_raises_is_contained(sp):
    segs = HostSegments()

    def bad_free(ptr, size, device, stream):
        segs.free(ptr, size, device, stream)
        raise RuntimeError("free broke")

    pool = sp.MemPool(allocator=(segs.alloc, bad_free))
    sp.free(pool.malloc(1000))
    pool.free_all_blocks()  # the exception stays in the callback; the segment is gone
    assert pool.total_bytes() == 0 and segs.frees == 1
    pool.destroy()


def test_allocator_that_destroys_its_own_pool_is_refused_not_deadlocked(sp):
    # destroy() holds the pool's lock across sp_mempool_destroy, which gives the segments back
    # through the allocator: a free that calls destroy() again must reach the library's
    # refusal (a sympool call from inside a callback), not wait on that lock for ever.
    segs, seen, holder = HostSegments(), [], {}

    def free(ptr, size, device, stream):
        segs.free(ptr, size, device, stream)
        try:
            holder["pool"].destroy()
            seen.append("destroyed")
        except sp.SympoolError as e:
            seen.append(e.status)

    pool = holder["pool"] = sp.MemPool(allocator=(segs.alloc, free))
    sp.free(pool.malloc(1000))
    pool.destroy()
    assert seen == ["SP_ERR_INVALID_USAGE"] and segs.bufs == {}
    with pytest.raises(sp.SympoolError):
        pool.used_bytes()


# ---- use_mem_pool contexts that close out of order or on the wrong thread ----------------------

def test_use_mem_pool_closed_out_of_order(sp):
    # torch.cuda.use_mem_pool ends a pool's routing by its id wherever it is in the thread's
    # stack. Before the fix the outer exit raised and left the outer pool routed for good: its
    # use count stayed 2, it could never be destroyed nor entered again on this thread.
    outer, inner = sp.MemPool(name="outer"), sp.MemPool(name="inner")
    c_outer, c_inner = sp.use_mem_pool(outer), sp.use_mem_pool(inner)
    c_outer.__enter__()
    c_inner.__enter__()
    c_outer.__exit__(None, None, None)
    assert (outer.use_count(), inner.use_count()) == (1, 2)
    p = sp.malloc(1000)
    assert (outer.used_bytes(), inner.used_bytes()) == (0, 1024), "inner still receives"
    sp.free(p)
    c_inner.__exit__(None, None, None)
    q = sp.malloc(1000)
    assert (outer.used_bytes(), inner.used_bytes()) == (0, 0), "back to the default pool"
    sp.free(q)
    with sp.use_mem_pool(outer):  # can be entered again
        sp.free(sp.malloc(10))
    outer.destroy()
    inner.destroy()


def test_use_mem_pool_middle_of_three_closed_first(sp):
    a, b, c = sp.MemPool(), sp.MemPool(), sp.MemPool()
    ca, cb, cc = (sp.use_mem_pool(x) for x in (a, b, c))
    for cm in (ca, cb, cc):
        cm.__enter__()
    cb.__exit__(None, None, None)
    p = sp.malloc(512)
    assert c.used_bytes() == 512
    cc.__exit__(None, None, None)
    q = sp.malloc(512)
    assert a.used_bytes() == 512, "with c gone, a is the innermost again (b was left)"
    ca.__exit__(None, None, None)
    for x in (p, q):
        sp.free(x)
    assert [x.use_count() for x in (a, b, c)] == [1, 1, 1]
    for x in (a, b, c):
        x.destroy()


def test_use_mem_pool_in_interleaved_asyncio_tasks(sp):
    # Two tasks on one thread, each inside its own use_mem_pool, finishing in the opposite order
    # from their start: the first task's context closes while the second's is innermost.
    pools = [sp.MemPool(name="t0"), sp.MemPool(name="t1")]
    order = []

    async def task(i, entered, release):
        with sp.use_mem_pool(pools[i]):
            entered.set()
            await release.wait()
            order.append(i)

    async def main():
        e0, e1, r0, r1 = (asyncio.Event() for _ in range(4))
        t0 = asyncio.ensure_future(task(0, e0, r0))
        await e0.wait()
        t1 = asyncio.ensure_future(task(1, e1, r1))
        await e1.wait()
        r0.set()  # t0 leaves first, while t1's pool is the innermost
        await t0
        r1.set()
        await t1

    asyncio.run(main())
    assert order == [0, 1]
    assert [p.use_count() for p in pools] == [1, 1]
    for p in pools:
        p.destroy()


def test_use_mem_pool_left_on_another_thread_is_refused_and_stays_open(sp):
    pool = sp.MemPool()
    cm = sp.use_mem_pool(pool)
    cm.__enter__()
    errors = []

    def leave():
        try:
            cm.__exit__(None, None, None)
        except sp.SympoolError as e:
            errors.append(e)

    t = threading.Thread(target=leave)
    t.start()
    t.join()
    assert len(errors) == 1 and errors[0].status == "SP_ERR_INVALID_USAGE"
    assert "entered on another thread" in str(errors[0])
    assert pool.use_count() == 2  # still routed here ...
    cm.__exit__(None, None, None)  # ... until this thread leaves it
    assert pool.use_count() == 1
    cm.__exit__(None, None, None)  # a second exit does nothing
    with pytest.raises(RuntimeError):
        cm.__enter__()  # one context, one use (as a contextlib generator)
    pool.destroy()


def test_use_mem_pool_decorates_a_function(sp):
    # torch.cuda.use_mem_pool is a contextlib.contextmanager, which also decorates a function
    # (a fresh context per call). The class that replaced sympool's generator was not callable:
    # @sympool.use_mem_pool(pool) raised TypeError.
    pool = sp.MemPool()

    @sp.use_mem_pool(pool)
    def alloc(n):
        assert pool.use_count() == 2
        return sp.malloc(n)

    blocks = [alloc(512), alloc(512)]  # twice: one use each
    assert pool.used_bytes() == 1024 and pool.use_count() == 1
    outside = sp.malloc(512)
    assert pool.used_bytes() == 1024
    for b in blocks + [outside]:
        sp.free(b)
    pool.destroy()


def test_use_mem_pool_exception_in_body_still_unroutes(sp):
    pool = sp.MemPool()
    with pytest.raises(ZeroDivisionError):
        with sp.use_mem_pool(pool):
            1 / 0
    assert pool.use_count() == 1
    pool.destroy()


# ---- objects used after they are gone; several threads at once ---------------------------------

def test_destroy_from_many_threads_runs_once(sp):
    for _ in range(20):
        pool, stream = sp.MemPool(), sp.Stream()
        barrier = threading.Barrier(8, timeout=10)
        errors = []

        def kill():
            try:
                barrier.wait()
                pool.destroy()
                stream.destroy()
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=kill) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with pytest.raises(sp.SympoolError):
            pool.used_bytes()
        with pytest.raises(sp.SympoolError):
            stream.synchronize()


def test_use_after_destroy_and_double_free(sp):
    pool = sp.MemPool()
    live = pool.malloc(1000)
    pool.destroy()
    for call in (pool.used_bytes, pool.total_bytes, pool.free_bytes, pool.n_free_blocks,
                 pool.get_limit, pool.use_count, pool.free_all_blocks, pool.snapshot,
                 lambda: pool.id, lambda: pool.malloc(1), lambda: pool.set_limit(1)):
        with pytest.raises(sp.SympoolError) as e:
            call()
        assert e.value.status == "SP_ERR_INVALID_USAGE"
    with pytest.raises(sp.SympoolError):
        with sp.use_mem_pool(pool):
            pass
    sp.free(live)  # the block outlives its pool
    with pytest.raises(sp.SympoolError) as e:
        sp.free(live)
    assert e.value.status == "SP_ERR_INVALID_USAGE"


def test_free_inside_a_block_is_refused_and_the_block_survives(sp):
    p = sp.malloc(4096)
    for bad in (p + 1, p + 512):
        with pytest.raises(sp.SympoolError) as e:
            sp.free(bad)
        assert e.value.status == "SP_ERR_INVALID_USAGE"
    assert sp.memory_allocated() >= 4096
    sp.free(p)


# ---- arguments of the wrong type ---------------------------------------------------------------

@pytest.mark.parametrize("bad, exc", [(None, TypeError), (1.0, TypeError), (True, TypeError),
                                      ("64", TypeError), (-1, ValueError),
                                      (1 << 64, ValueError)])
def test_sizes_of_the_wrong_type(sp, bad, exc):
    pool = sp.MemPool()
    for call in (sp.malloc, pool.malloc, lambda n: pool.set_limit(size=n)):
        if (bad is None or isinstance(bad, float)) and call not in (sp.malloc, pool.malloc):
            continue  # set_limit(size=None) removes the limit; a float size is CuPy's
        with pytest.raises(exc):
            call(bad)
    pool.destroy()


def test_int_likes_are_taken(sp):
    # numpy.int64 and other __index__ types are ints everywhere an int is asked for.
    p = sp.malloc(Index(1000), device=Index(0))
    assert sp.memory_stats(Index(0))["allocated_bytes.all.current"] >= 1024
    sp.free(Index(p))
    pool = sp.MemPool(device=Index(0))
    pool.set_limit(size=Index(1 << 30))
    assert pool.get_limit() == 1 << 30
    pool.destroy()


@pytest.mark.parametrize("bad, exc", [(1.0, TypeError), (True, TypeError), ("1", TypeError),
                                      ("cpu", TypeError), (-1, ValueError), (1 << 32, ValueError),
                                      (1, ValueError)])
def test_devices_of_the_wrong_type(sp, bad, exc):
    if bad == 1 and not isinstance(bad, bool) and sp.device_count() > 1:
        pytest.skip("device 1 exists here")
    for call in (sp.memory_stats, sp.memory_allocated, sp.reset_peak_memory_stats,
                 sp.get_memory_info, sp.get_default_memory_pool, lambda d: sp.MemPool(device=d),
                 lambda d: sp.Stream(d), lambda d: sp.malloc(1, device=d)):
        with pytest.raises(exc):
            call(bad)


# ---- interpreter exit with everything still alive ----------------------------------------------

# A Python segment allocator on ctypes buffers, for the scripts run in their own interpreter.
SCRIPT_ALLOCATOR = r'''
bufs = {}
def alloc(size, device, stream):
    b = ctypes.create_string_buffer(size); bufs[ctypes.addressof(b)] = b
    return ctypes.addressof(b)
def free(ptr, size, device, stream):
    bufs.pop(ptr, None)
'''

EXIT_SCRIPT = r'''
import ctypes, sys, threading, time
import sympool
mode = sys.argv[1]
''' + SCRIPT_ALLOCATOR + r'''sympool.record_memory_history("all", stacks="python")
pool = sympool.MemPool(allocator=(alloc, free), name="at-exit")
live = [pool.malloc(100), pool.malloc(5 << 20), sympool.malloc(1000)]
stream = sympool.Stream()
live.append(sympool.malloc(1000, stream=stream))
if mode == "routed":
    sympool.use_mem_pool(pool).__enter__()  # never left
    live.append(sympool.malloc(100))
elif mode == "threads":
    def spin():
        while True:
            p = pool.malloc(3 << 20); sympool.free(p); pool.free_all_blocks()
    for _ in range(3):
        threading.Thread(target=spin, daemon=True).start()
    time.sleep(0.2)
elif mode == "cycle":
    class Holder: pass
    h = Holder(); h.me = h; h.pool = pool; h.alloc = alloc
    del pool
print("exiting", mode, flush=True)
'''


@pytest.mark.parametrize("mode", ["plain", "routed", "threads", "cycle"])
def test_interpreter_exit_with_live_objects(sp, mode, tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    r = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"exiting {mode}" in r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_use_mem_pool_random_exit_order_routes_to_the_innermost_open_context(sp):
    # A model: the open contexts in the order they were entered; every allocation goes to the
    # last one still open (torch's captures_underway, searched from the back).
    import random
    rng = random.Random(7)
    pools = [sp.MemPool(name=f"p{i}") for i in range(6)]
    default = sp.get_default_memory_pool()
    open_ = []  # (pool, context)
    blocks = []
    for _ in range(400):
        closed = [p for p in pools if all(p is not q for q, _ in open_)]
        if closed and (not open_ or rng.random() < 0.5):
            p = rng.choice(closed)
            cm = sp.use_mem_pool(p)
            cm.__enter__()
            open_.append((p, cm))
        else:
            _, cm = open_.pop(rng.randrange(len(open_)))
            cm.__exit__(None, None, None)
        want = open_[-1][0] if open_ else default
        before = want.used_bytes()
        blocks.append(sp.malloc(512))
        assert want.used_bytes() == before + 512
        for p in pools:
            assert p.use_count() == 1 + any(p is q for q, _ in open_)
    for _, cm in reversed(open_):
        cm.__exit__(None, None, None)
    for b in blocks:
        sp.free(b)
    for p in pools:
        p.destroy()


def test_use_mem_pool_nesting_limit_leaves_the_stack_intact(sp):
    pools = [sp.MemPool() for _ in range(40)]
    cms = []
    with pytest.raises(sp.SympoolError) as e:
        for p in pools:
            cm = sp.use_mem_pool(p)
            cm.__enter__()
            cms.append(cm)
    assert e.value.status == "SP_ERR_INVALID_USAGE" and "nested" in str(e.value)
    depth = len(cms)
    p = sp.malloc(512)
    assert pools[depth - 1].used_bytes() == 512
    cms[0].__exit__(None, None, None)  # the outermost first, at full depth
    for cm in reversed(cms[1:]):
        cm.__exit__(None, None, None)
    sp.free(p)
    assert all(p.use_count() == 1 for p in pools)
    for p in pools:
        p.destroy()


RELOAD_SCRIPT = r'''
import ctypes, gc, importlib
import sympool
import sympool.memory
''' + SCRIPT_ALLOCATOR + r'''pool = sympool.MemPool((alloc, free), name="reloaded")
x = pool.malloc(1000)
pool.destroy()
del pool
outer, inner = sympool.MemPool(name="outer"), sympool.MemPool(name="inner")
a, b = sympool.use_mem_pool(outer), sympool.use_mem_pool(inner)
a.__enter__(); b.__enter__()
importlib.reload(sympool.memory)  # what Jupyter's autoreload does
gc.collect()
junk = [ctypes.CFUNCTYPE(None)(lambda: None) for _ in range(1000)]  # takes freed callbacks' room
print("kept", len(sympool.memory._keepalive))
a.__exit__(None, None, None)  # out of order: the stack of routed pools must have survived too
y = sympool.malloc(100)
print("routed", inner.used_bytes() > 0, outer.used_bytes() == 0)
b.__exit__(None, None, None)
sympool.free(y)
sympool.free(x)
sympool.empty_cache()  # the destroyed pool's last segment goes back through its own free
print("returned", not bufs)
'''


def test_reload_keeps_the_allocators_and_routes_the_library_still_uses(tmp_path):
    # importlib.reload(sympool.memory) ran `_keepalive = {}` again: the only reference to a
    # destroyed pool's callbacks went, and the library's next call into them ran freed memory
    # (another Python function, or a crash); the thread's stack of routed pools went too, so
    # closing contexts out of order failed.
    script = tmp_path / "reload.py"
    script.write_text(RELOAD_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["kept 1", "routed True True", "returned True"], \
        (r.stdout, r.stderr)


def test_a_torch_cuda_device_object_names_its_device(sp):
    # torch's _get_device_index takes a torch.cuda.device (the context manager: idx, no type)
    # as well as a torch.device; sympool refused it ("device must be an int, not device").
    class device:  # torch.cuda.device's shape
        def __init__(self, idx):
            self.idx = idx

    assert sp.memory_allocated(device(0)) == sp.memory_allocated(0)
    assert sp._lib.as_device(device(1)) == 1
    with pytest.raises(ValueError):
        sp._lib.as_device(device(-1))
