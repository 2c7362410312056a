"""MemPools (torch.cuda.MemPool's shape, CuPy's queries) and use_mem_pool routing."""

import ctypes
import gc
import threading

import pytest

from _hostmem import host_segment as _host_segment


def test_ids_use_count_and_queries(sp):
    a, b = sp.MemPool(name="a"), sp.MemPool()
    assert isinstance(a.id, tuple) and len(a.id) == 2
    assert a.id[0] == 0 and b.id[1] > a.id[1] >= 1
    assert a.use_count() == 1
    assert a.is_symmetric is False
    assert (a.used_bytes(), a.total_bytes(), a.free_bytes(), a.n_free_blocks()) == (0, 0, 0, 0)
    assert a.get_limit() == 0


def test_use_mem_pool_routes_this_thread_only(sp):
    pool = sp.MemPool(name="routed")
    other = []
    with sp.use_mem_pool(pool) as p:
        assert p is pool and pool.use_count() == 2
        x = sp.malloc(3000)
        t = threading.Thread(target=lambda: other.append(sp.malloc(3000)))
        t.start()
        t.join()
    assert pool.use_count() == 1
    assert pool.used_bytes() == 3072  # only this thread's block
    sp.free(other[0])
    sp.free(x)
    assert pool.used_bytes() == 0 and pool.n_free_blocks() == 1
    assert pool.total_bytes() == 2 << 20 and pool.free_bytes() == 2 << 20
    pool.free_all_blocks()
    assert pool.total_bytes() == 0


def test_nested_pools_and_exception_unwinds(sp):
    outer, inner = sp.MemPool(), sp.MemPool()
    with pytest.raises(KeyError):
        with sp.use_mem_pool(outer):
            with sp.use_mem_pool(inner):
                y = sp.malloc(100)
            x = sp.malloc(100)
            raise KeyError("unwind")
    assert outer.use_count() == 1 and inner.use_count() == 1
    assert outer.used_bytes() == 512 and inner.used_bytes() == 512
    z = sp.malloc(100)  # routing ended: default pool
    assert outer.used_bytes() == 512
    for p in (x, y, z):
        sp.free(p)


def test_pool_malloc_and_limit(sp):
    pool = sp.MemPool(name="direct", no_split=True)
    p = pool.malloc(1 << 20)
    assert pool.used_bytes() == 2 << 20  # no_split: the whole small segment is the block
    pool.set_limit(pool.total_bytes())
    with pytest.raises(sp.OutOfMemoryError) as e:
        pool.malloc(64 << 20)
    assert e.value.status == "SP_ERR_OUT_OF_MEMORY"
    sp.free(p)
    pool.set_limit(0)
    assert pool.get_limit() == 0


def test_python_segment_allocator(sp):
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    calls = []

    class Segments:
        def alloc(self, size, device, stream):
            calls.append(("alloc", size))
            return libc.aligned_alloc(4096, size)

        def free(self, ptr, size, device, stream):
            calls.append(("free", size))
            libc.free(ptr)

    pool = sp.MemPool(Segments(), name="py-segments")
    with sp.use_mem_pool(pool):
        p = sp.malloc(100_000)
    assert calls == [("alloc", 2 << 20)]
    sp.free(p)
    pool.destroy()
    assert calls == [("alloc", 2 << 20), ("free", 2 << 20)]
    with pytest.raises(sp.SympoolError) as e:
        pool.used_bytes()
    assert e.value.status == "SP_ERR_INVALID_USAGE"


def test_destroying_a_pool_with_a_python_allocator_warns_about_nothing(sp, capfd):
    # The sweep that drops a destroyed pool's allocator asked sp_mempool_total_bytes of a handle
    # the destroy had just released: the library warned on stderr about a released handle.
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    class Segments:
        def alloc(self, size, device, stream):
            return libc.aligned_alloc(4096, size)

        def free(self, ptr, size, device, stream):
            libc.free(ptr)

    pool = sp.MemPool(Segments())
    with sp.use_mem_pool(pool):
        p = sp.malloc(1 << 20)
    sp.free(p)
    capfd.readouterr()
    pool.destroy()  # releases the pool's last segment, then the sweep
    sp.empty_cache()
    err = capfd.readouterr().err
    assert "SYMPOOL WARN" not in err, err
    # What the sweep asks instead: released (1), not yet (0), not a handle (-1), quietly.
    lib = sp._lib.lib()
    q = sp.MemPool()
    h = q._handle
    assert lib.sp_x_mempool_released(h) == 0
    q.destroy()
    assert lib.sp_x_mempool_released(h) == 1
    assert lib.sp_x_mempool_released(None) == -1
    assert lib.sp_x_mempool_released(ctypes.addressof(ctypes.c_int(0))) == -1
    assert "SYMPOOL WARN" not in capfd.readouterr().err


def test_segment_allocator_is_released_once_its_pool_can_no_longer_call_it(sp):
    # A Python segment allocator used to be kept for the process's life, with all it refers to.
    # Now it goes once its pool is destroyed and holds no segment: at the destroy, or at the
    # empty_cache that releases the last segment a live block kept. Until then it is still
    # called (the block's segment is handed back through it after the MemPool object is gone).
    import weakref
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    freed = []

    class Segments:
        def alloc(self, size, device, stream):
            return libc.aligned_alloc(4096, size)

        def free(self, ptr, size, device, stream):
            freed.append(size)
            libc.free(ptr)

    for keep_block in (False, True):
        segs = Segments()
        gone = weakref.ref(segs)
        pool = sp.MemPool(segs)
        p = pool.malloc(1000)
        if not keep_block:
            sp.free(p)
        del segs
        pool.destroy()
        del pool
        gc.collect()
        if keep_block:
            assert gone() is not None and freed == [2 << 20]  # the block's segment still needs it
            sp.free(p)
            gc.collect()
            assert gone() is not None  # freed, not yet released: the pool may still call it
            sp.empty_cache()
            assert freed == [2 << 20, 2 << 20]  # released through the allocator
            gc.collect()
        assert gone() is None, keep_block
    # A pool collected without destroy(): its allocator goes at the next empty_cache.
    segs = Segments()
    gone = weakref.ref(segs)
    pool = sp.MemPool(segs)
    sp.free(pool.malloc(1000))
    del segs, pool
    gc.collect()
    sp.empty_cache()
    gc.collect()
    assert gone() is None


def test_segment_allocator_calling_sympool_is_refused_not_deadlocked(sp):
    # The allocator runs under the device's allocator lock: a sympool call from it used to
    # deadlock the process; it raises now, and the pool's own allocation goes on.
    seen, bufs = [], {}

    def alloc(size, device, stream):
        try:
            sp.malloc(64)
            seen.append("allowed")
        except sp.SympoolError as e:
            seen.append(str(e))
        return _host_segment(bufs, size)

    pool = sp.MemPool((alloc, lambda ptr, *a: bufs.pop(ptr)), name="reentrant")
    p = pool.malloc(1 << 20)
    assert p and len(seen) == 1 and "inside a callback" in seen[0], seen
    sp.free(p)
    pool.free_all_blocks()
    assert not bufs
    pool.destroy()


def test_getters_inside_a_segment_allocator_raise_instead_of_answering_zero(sp):
    # Inside the allocator the library refuses every call, but its int getters set no status:
    # device_count() was 0, backend() "none", pool.used_bytes() 0, pool.id (0, 0), and
    # memory_allocated() blamed a device that "does not exist". They raise the refusal now.
    bufs, seen = {}, {}
    getters = {"device_count": lambda: sp.device_count(), "backend": lambda: sp.backend(),
               "memory_allocated": lambda: sp.memory_allocated(),
               "used_bytes": lambda: pool.used_bytes(), "total_bytes": lambda: pool.total_bytes(),
               "free_bytes": lambda: pool.free_bytes(),
               "n_free_blocks": lambda: pool.n_free_blocks(),
               "get_limit": lambda: pool.get_limit(), "id": lambda: pool.id,
               "use_count": lambda: pool.use_count(), "is_symmetric": lambda: pool.is_symmetric}

    def alloc(size, device, stream):
        for name, get in getters.items():
            try:
                seen[name] = get()
            except sp.SympoolError as e:
                seen[name] = (e.status, "inside a callback" in str(e))
        seen["repr"] = repr(pool)  # still a repr, without the figures
        return _host_segment(bufs, size)

    pool = sp.MemPool((alloc, lambda ptr, *a: bufs.pop(ptr)), name="asks")
    p = pool.malloc(1 << 20)
    assert {k: v for k, v in seen.items() if k != "repr"} == \
        {name: ("SP_ERR_INVALID_USAGE", True) for name in getters}
    assert seen["repr"] == "<sympool.MemPool name='asks' device=0>"
    # Outside it, the same getters answer.
    assert sp.device_count() == 1 and sp.backend() == "host" and pool.id[1] > 0
    assert pool.used_bytes() > 0 and not pool.is_symmetric
    sp.free(p)
    pool.free_all_blocks()
    pool.destroy()


def test_pool_with_an_allocator_made_inside_a_segment_allocator_is_refused_before_any_lock(sp):
    # The library refuses the create inside its callback (it holds the device lock there). The
    # package took its allocator table's lock first, which a thread releasing allocators holds
    # while it calls into the library: held here by this test's main thread, the callback waited
    # on it for good (on main: the malloc below never returned). Now it is refused first.
    import sympool.memory as mem
    bufs, seen = {}, []

    def alloc(size, device, stream):
        try:
            sp.MemPool((lambda *a: 0, lambda *a: None), name="inner")
            seen.append("made")
        except sp.SympoolError as e:
            seen.append(e.status)
        return _host_segment(bufs, size)

    pool = sp.MemPool((alloc, lambda ptr, *a: bufs.pop(ptr)), name="outer")
    got = []
    worker = threading.Thread(target=lambda: got.append(pool.malloc(1 << 20)), daemon=True)
    with mem._keepalive_lock:
        worker.start()
        worker.join(10)
        done = not worker.is_alive()
    worker.join()  # with the lock released, a blocked callback goes on
    assert done, "the malloc waited on the allocator table's lock inside the callback"
    assert seen == ["SP_ERR_INVALID_USAGE"] and got and got[0]
    sp.free(got[0])
    pool.free_all_blocks()
    pool.destroy()


def test_allocator_that_fails_gives_oom(sp):
    pool = sp.MemPool((lambda size, dev, stream: 0, lambda *a: None), name="empty")
    with pytest.raises(sp.OutOfMemoryError):
        pool.malloc(1 << 20)


def test_pool_snapshot_is_a_dict(sp):
    pool = sp.MemPool(name="snap")
    p = pool.malloc(5000)
    snap = pool.snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    assert len(snap["segments"]) == 1
    seg = snap["segments"][0]
    assert seg["total_size"] == 2 << 20
    assert any(b["state"] == "active_allocated" and b["size"] == 5120 for b in seg["blocks"])
    sp.free(p)


def test_collected_pool_is_destroyed(sp):
    pool = sp.MemPool(name="temp")
    p = pool.malloc(512)
    sp.free(p)
    del pool
    gc.collect()
    sp.empty_cache()
    assert sp.memory_reserved() == 0


def _private_segments(sp):
    return [s for s in sp.snapshot()["segments"] if s["segment_pool_id"][1] > 0]


def test_pool_collected_inside_a_segment_allocator_is_destroyed_later(sp):
    # A collection that runs inside a Python allocator (any allocation there may start one)
    # collected another pool; the library refused its destroy there (inside a callback) and
    # nothing could destroy it after: its cached segment stayed reserved until the process ended.
    bufs = {}

    def alloc(size, device, stream):
        gc.collect()
        b = ctypes.create_string_buffer(size)
        bufs[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    gc.disable()
    try:
        lost = sp.MemPool(name="lost")
        sp.free(lost.malloc(1 << 20))  # a cached 2 MiB segment
        cycle = [lost]
        cycle.append(cycle)
        del lost, cycle  # only the collector frees it
        pool = sp.MemPool((alloc, lambda ptr, *a: bufs.pop(ptr)), name="collects")
        sp.free(pool.malloc(100))
        pool.destroy()
    finally:
        gc.enable()
    sp.empty_cache()
    assert sp.memory_reserved() == 0 and not _private_segments(sp) and not bufs


def test_pool_collected_while_a_suspended_generator_routes_it_is_destroyed_later(sp):
    # The pool and a generator suspended inside `with use_mem_pool(pool)` in one cycle: the
    # pool's __del__ ran first, its destroy was refused (still routed), and the generator's close
    # then ended the routing of a pool nothing could destroy any more.
    class Holder:
        pass

    def routed(h):
        with sp.use_mem_pool(h.pool):
            yield

    gc.disable()
    try:
        h = Holder()
        h.pool = sp.MemPool(name="cycle")
        h.gen = routed(h)
        next(h.gen)
        sp.free(sp.malloc(1 << 20))  # into the routed pool: a cached 2 MiB segment
        h.me = h
        del h
        gc.collect()
    finally:
        gc.enable()
    sp.empty_cache()
    assert sp.memory_reserved() == 0 and not _private_segments(sp)
    p = sp.malloc(512)  # the routing ended with the generator
    assert sp.get_default_memory_pool().used_bytes() == 512
    sp.free(p)


class _PoolOwningAllocator:
    """A segment allocator that keeps its own pool (and may query it), as CuPy-style wrappers do."""

    def __init__(self, sp):
        self.bufs, self.freed = {}, []
        self.pool = sp.MemPool(self, name="owned")

    def alloc(self, size, device, stream):
        b = ctypes.create_string_buffer(size)
        self.bufs[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def free(self, ptr, size, device, stream):
        self.freed.append(size)
        self.bufs.pop(ptr)


def test_allocator_that_keeps_its_pool_is_collected_with_it(sp):
    # The table that keeps a pool's callbacks alive held them from the pool's creation: through
    # the callbacks' closures it kept the allocator, which keeps the pool, so neither was ever
    # collected: the pool was never destroyed and its cached segment stayed reserved.
    a = _PoolOwningAllocator(sp)
    sp.free(a.pool.malloc(1000))
    del a
    gc.collect()
    sp.empty_cache()
    assert sp.memory_reserved() == 0 and not sp.memory._keepalive
    # With a block still live at the collection: the callbacks stay until its segment goes.
    a = _PoolOwningAllocator(sp)
    p = a.pool.malloc(1000)
    freed = a.freed
    del a
    gc.collect()
    sp.empty_cache()  # the pool is destroyed, but its segment holds p
    assert sp.memory_reserved() == 2 << 20 and len(sp.memory._keepalive) == 1 and freed == []
    sp.free(p)
    sp.empty_cache()  # through the kept callbacks
    assert freed == [2 << 20] and sp.memory_reserved() == 0 and not sp.memory._keepalive


@pytest.mark.parametrize("kw,exc", [
    (dict(symmetric=True), ValueError),           # no world
    (dict(use_on_oom=1), TypeError),
    (dict(name=5), TypeError),
    (dict(device=-1), ValueError),
    (dict(device="0"), TypeError),
    (dict(allocator=object()), TypeError),
])
def test_bad_pool_arguments(sp, kw, exc):
    with pytest.raises(exc):
        sp.MemPool(**kw)


def test_unknown_device_pool(sp):
    with pytest.raises(sp.SympoolError) as e:
        sp.MemPool(device=sp.device_count())
    assert e.value.status == "SP_ERR_INVALID_ARGUMENT"


def test_use_mem_pool_bad_argument(sp):
    with pytest.raises(TypeError):
        with sp.use_mem_pool("pool"):
            pass


def test_destroy_while_routed_is_refused(sp):
    pool = sp.MemPool()
    with sp.use_mem_pool(pool):
        with pytest.raises(sp.SympoolError) as e:
            pool.destroy()
        assert e.value.status == "SP_ERR_INVALID_USAGE"
    pool.destroy()


def test_cupy_set_limit_forms_and_allocator_property(sp):
    segs = (lambda size, dev, stream: 0, lambda *a: None)
    assert sp.MemPool(segs).allocator is segs
    pool = sp.MemPool()
    assert pool.allocator is None
    pool.set_limit(size=1 << 20)
    assert pool.get_limit() == 1 << 20
    total = sp.get_memory_info()[1]
    pool.set_limit(fraction=0.5)
    assert abs(pool.get_limit() - total // 2) <= 1
    pool.set_limit()
    assert pool.get_limit() == 0
    with pytest.raises(ValueError):
        pool.set_limit(size=1, fraction=0.1)
    with pytest.raises(ValueError):
        pool.set_limit(fraction=2.0)


def test_memory_snapshot_lists_segments(sp):
    p = sp.malloc(1 << 20)
    segs = sp.memory_snapshot()
    assert isinstance(segs, list) and any(s["total_size"] >= 1 << 20 for s in segs)
    sp.free(p)


def test_memory_snapshot_of_pool_id_zero_is_every_segment(sp):
    # torch passes memory_snapshot(None) on as (0, 0), and its allocator's snapshot() filters by
    # pool only for another id: (0, 0) lists every segment, private pools' included. It listed
    # the default pool's alone.
    pool = sp.MemPool(name="zero-id")
    d = sp.malloc(1000)
    with sp.use_mem_pool(pool):
        p = sp.malloc(1000)
    every = sp.memory_snapshot(None)
    assert {tuple(s["segment_pool_id"]) for s in every} == {(0, 0), pool.id}
    assert sp.memory_snapshot((0, 0)) == every
    assert sp.memory_snapshot([0, 0]) == every
    mine = sp.memory_snapshot(pool.id)
    assert len(mine) == 1 and tuple(mine[0]["segment_pool_id"]) == pool.id
    sp.free(p)
    sp.free(d)
    pool.destroy()


@pytest.mark.parametrize("bad, kind", [("ab", TypeError), ((1,), ValueError),
                                       ((0, 0, 0), ValueError), ((1.5, 2), TypeError),
                                       ((0, -1), ValueError)])
def test_memory_snapshot_bad_pool_id(sp, bad, kind):
    # A pool id is two ints: "ab" raised int()'s "invalid literal for int() with base 10: 'a'",
    # and (1,) or (0, 0, 0) matched no segment and returned [] as if the pool had none.
    with pytest.raises(kind, match="mempool_id"):
        sp.memory_snapshot(bad)


def test_pool_name_with_a_lone_surrogate(sp):
    # A str from os.fsdecode of an undecodable byte holds a lone surrogate: encoding it raised
    # UnicodeEncodeError from inside MemPool(); it is kept in the 3-byte form the library keeps
    # for such a str (history.h), as the frames' names are.
    pool = sp.MemPool(name="run-\udcff")
    assert pool.name == "run-\udcff"
    pool.set_limit(1 << 20)
    with pytest.raises(sp.OutOfMemoryError, match='pool "run-'):  # the library has the name
        pool.malloc(2 << 20)
    pool.destroy()


def test_streams_keep_their_own_cache(sp):
    s = sp.Stream()
    pool = sp.MemPool(name="streams")
    a = pool.malloc(1000, stream=s)
    sp.free(a)
    assert pool.n_free_blocks() == 1
    b = pool.malloc(1000)  # default stream: never the block cached on s
    assert b != a
    pool.free_all_blocks(stream=s)  # releases the segment that is free on s only
    assert pool.total_bytes() == 2 << 20
    sp.free(b)
    s.synchronize()
    s.destroy()
    with pytest.raises(sp.SympoolError):
        s.synchronize()
    with pytest.raises(sp.SympoolError) as e:
        sp.malloc(512, stream=0xdead0)  # not a stream sympool made
    assert e.value.status == "SP_ERR_INVALID_ARGUMENT"


def test_pools_made_before_a_reload_still_serve(sp):
    # importlib.reload(sympool.memory) made the classes anew: a pool made before it failed every
    # isinstance check after it (use_mem_pool: "needs a sympool.MemPool, not MemPool").
    import importlib
    import sympool.memory as m
    pool = sp.MemPool()
    stream = sp.Stream()
    try:
        importlib.reload(m)
        assert isinstance(pool, m.MemPool) and isinstance(stream, m.Stream)
        with m.use_mem_pool(pool):
            p = sp.malloc(1000)
        assert pool.used_bytes() > 0
        sp.free(p)
        assert isinstance(m.memory_snapshot(pool), list)
        assert isinstance(sp.get_default_memory_pool(), m.MemPool)
    finally:
        pool.destroy()
        stream.destroy()
