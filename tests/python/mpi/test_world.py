"""World, symmetric pools, collectives and stats across ranks. Run under mpirun (2+ ranks):
    mpirun -np 2 /usr/bin/python3 -m pytest -x tests/python/mpi
Every test is collective: all ranks run the same tests in the same order."""

import ctypes
import io
import json

import pytest

MPI = pytest.importorskip("mpi4py.MPI")
if MPI.COMM_WORLD.Get_size() < 2:  # e.g. `pytest tests/python` by hand, without mpirun
    pytest.skip("needs mpirun -np 2 (or more)", allow_module_level=True)


@pytest.fixture(scope="module")
def world():
    import sympool
    w = sympool.World()
    yield w
    w.finalize()


def floats(addr, n):
    return (ctypes.c_float * n).from_address(addr)


def test_world_matches_mpi4py(world):
    comm = MPI.COMM_WORLD
    assert (world.rank, world.size) == (comm.Get_rank(), comm.Get_size())
    assert 0 <= world.local_rank < world.size
    assert world.local_rank < world.local_size <= world.size
    assert 1 <= world.node_count <= world.size
    assert world.node(0) == 0 and world.node_name(0)
    assert world.node_name() == world.node_name(world.node())
    assert world.device == 0  # one emulated device on the host backend
    assert world.size >= 2


def test_symmetric_pool_and_allreduce(world):
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="grads")
    assert pool.is_symmetric and pool.use_count() >= 1
    n = 4096
    a = pool.malloc(n * 4)
    b = pool.malloc(n * 4)
    assert pool.used_bytes() == 2 * n * 4
    x = floats(a, n)
    for i in range(n):
        x[i] = world.rank + 1
    world.allreduce(a, b, n)
    expect = world.size * (world.size + 1) / 2
    assert floats(b, n)[0] == expect and floats(b, n)[n - 1] == expect
    world.allreduce(a, a, n, dtype="float32", op="max")  # in place
    assert x[0] == world.size
    world.allreduce(b, b, n, op="avg")
    assert floats(b, n)[7] == pytest.approx(expect)  # every rank held expect
    sympool.free(a)
    sympool.free(b)
    pool.destroy()


def test_allgather_reduce_scatter_broadcast(world):
    import sympool
    r, size = world.rank, world.size
    send, recv = sympool.malloc(8 * 4), sympool.malloc(8 * 4 * size)
    s = (ctypes.c_int32 * 8).from_address(send)
    for i in range(8):
        s[i] = r * 100 + i
    world.allgather(send, recv, 8, dtype="int32")
    out = (ctypes.c_int32 * (8 * size)).from_address(recv)
    assert [out[k * 8] for k in range(size)] == [k * 100 for k in range(size)]
    world.reduce_scatter(recv, send, 8, dtype="int32", op="sum")  # every rank's block r summed
    assert s[0] == size * r * 100
    for i in range(8):
        s[i] = 7 if r == 1 else 0
    world.broadcast(send, send, 8, dtype="int32", root=1)
    assert list(s) == [7] * 8
    sympool.free(send)
    sympool.free(recv)


def test_stats_aggregate(world):
    import sympool
    p = sympool.malloc(1024 * (world.rank + 1))
    agg = world.stats_aggregate()
    cur = agg["allocated_bytes.all.current"]
    assert set(cur) == {"min", "max", "sum", "min_rank", "max_rank"}
    assert cur["max_rank"] == world.size - 1 and cur["min_rank"] == 0
    assert cur["max"] - cur["min"] == 1024 * (world.size - 1)
    assert len(agg) == 122 + 2  # memory_stats, then device.used_bytes and device.untracked_bytes
    assert agg["device.untracked_bytes"]["min"] >= 0
    sympool.free(p)


class CudaArray:
    """What CuPy and Numba tensors show: __cuda_array_interface__ over sympool memory."""

    def __init__(self, addr, n, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (addr, False),
                                         "strides": None, "version": 3}


class DLPackArray:
    """A DLPack producer (__dlpack__ / __dlpack_device__) over sympool memory."""

    _NAME = b"dltensor"

    def __init__(self, addr, n):
        from sympool._array import _DLTensor

        class Managed(ctypes.Structure):
            _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                        ("deleter", ctypes.c_void_p)]

        self._shape = (ctypes.c_int64 * 1)(n)
        self._m = Managed()
        t = self._m.dl_tensor
        t.data, t.ndim = addr, 1
        t.device.device_type, t.device.device_id = 1, 0  # kDLCPU: the host backend's memory
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1  # float32
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                      ctypes.c_void_p]
        return new(ctypes.addressof(self._m), self._NAME, None)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize("kind", ["buffer", "cuda_array_interface", "dlpack"])
def test_collectives_take_array_objects(world, kind):
    """count and dtype come from the object; recv=None is in place; mpi4py's ops work."""
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="arrays")
    n = 1000
    a = pool.malloc(n * 4)
    x = floats(a, n)
    for i in range(n):
        x[i] = world.rank + 1
    wrap = {"buffer": lambda p: floats(p, n), "cuda_array_interface": lambda p: CudaArray(p, n),
            "dlpack": lambda p: DLPackArray(p, n)}[kind]
    world.allreduce(wrap(a), op=MPI.SUM)
    total = world.size * (world.size + 1) / 2
    assert x[0] == total and x[n - 1] == total
    world.allreduce(wrap(a), wrap(a), op="max")
    assert x[n - 1] == total
    g = pool.malloc(n * 4 * world.size)
    world.allgather(wrap(a), floats(g, n * world.size))  # send_count from send: n
    assert floats(g, n * world.size)[n * world.size - 1] == total
    world.broadcast(wrap(a), root=0, dtype="f4")  # NumPy's spelling, same type
    sympool.free(g)
    sympool.free(a)
    pool.destroy()


def test_collective_dtype_names_and_ops(world):
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="names")
    a = pool.malloc(64 * 8)
    x = (ctypes.c_double * 64).from_address(a)
    for i in range(64):
        x[i] = world.rank
    world.allreduce(a, a, 64, dtype="<f8", op=MPI.MAX)
    assert x[63] == world.size - 1
    world.allreduce(a, a, 64, dtype="double", op="SUM")
    assert x[0] == (world.size - 1) * world.size
    with pytest.raises(ValueError, match="dtype"):
        world.allreduce(a, a, 64, dtype="complex64")
    with pytest.raises(ValueError, match="op"):
        world.allreduce(a, a, 64, dtype="float64", op=MPI.BAND)
    with pytest.raises(TypeError, match="count is needed"):
        world.allreduce(a, a, dtype="float64")
    sympool.free(a)
    pool.destroy()


def test_stats_report_to_binary_streams(world, tmp_path):
    # io.BytesIO has no .mode and gzip.GzipFile's is an int: rank 0 wrote a str into them and
    # raised TypeError after the collective, the report lost.
    import gzip
    buf = io.BytesIO()
    text = world.stats_report("json", file=buf)
    with gzip.open(tmp_path / f"r{world.rank}.json.gz", "wb") as gz:
        world.stats_report("json", file=gz)
    with gzip.open(tmp_path / f"r{world.rank}.json.gz", "rb") as gz:
        zipped = gz.read()
    if world.rank == 0:
        assert buf.getvalue() == text.encode() and json.loads(text)["nranks"] == world.size
        assert json.loads(zipped)["nranks"] == world.size
    else:
        assert text is None and buf.getvalue() == b"" and zipped == b""


@pytest.mark.parametrize("fmt", ["table", "json", "prometheus", "table_all"])
def test_stats_report(world, fmt):
    buf = io.StringIO()
    text = world.stats_report(fmt, file=buf)
    short = world.stats_report("table", file=io.StringIO()) if fmt == "table_all" else None
    if world.rank == 0:
        assert text == buf.getvalue() and text
        if fmt == "json":
            doc = json.loads(text)
            assert doc["nranks"] == world.size
        elif fmt == "prometheus":
            assert "# TYPE" in text
        else:
            assert "allocated" in text
        if fmt == "table_all":  # every key: more than the table's key figures
            assert len(text.splitlines()) > len(short.splitlines())
    else:
        assert text is None and buf.getvalue() == ""


def test_bad_argument_on_one_rank_fails_every_rank(world):
    import sympool
    n = 64
    a = sympool.malloc(n * 4)
    count = -1 if world.rank == 0 else n
    with pytest.raises(ValueError) as e:  # rank 0: its own reason; others: the library's
        world.allreduce(a, a, count)
    assert isinstance(e.value, sympool.SympoolError) or world.rank == 0
    with pytest.raises((TypeError, ValueError)):
        world.allreduce(a, a, n, dtype="complex64" if world.rank == 1 else "float32")
    sympool.free(a)


def test_none_op_or_root_on_one_rank_fails_every_rank(world):
    # op=None and root=None were read as "this collective has no op / root": the argument was
    # left out, ctypes refused the call ("takes at least 7 arguments (6 given)") before it
    # reached the library, and the other ranks waited for this one until the deadline.
    import sympool
    n = 16
    a = sympool.malloc(n * 4)
    with pytest.raises(TypeError if world.rank == 0 else sympool.SympoolError) as e:
        world.allreduce(a, a, n, op=None if world.rank == 0 else "sum")
    assert world.rank != 0 or "op must be" in str(e.value)
    with pytest.raises(TypeError if world.rank == 1 else sympool.SympoolError) as e:
        world.broadcast(a, a, n, root=None if world.rank == 1 else 0)
    assert world.rank != 1 or "root must be" in str(e.value)
    sympool.free(a)


def test_mismatched_counts_fail_every_rank(world):
    import sympool
    a = sympool.malloc(1024)
    with pytest.raises(sympool.SympoolError) as e:
        world.allreduce(a, a, 16 + world.rank)
    assert e.value.status == "SP_ERR_MISMATCH"
    sympool.free(a)


def test_symmetric_size_mismatch(world):
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="mismatch")
    with pytest.raises(sympool.SympoolError) as e:
        pool.malloc(4096 * (world.rank + 1))
    assert e.value.status == "SP_ERR_MISMATCH"
    # A bad size on rank 0 only: rank 0 raises its ValueError, the others a library error.
    with pytest.raises(ValueError if world.rank == 0 else sympool.SympoolError):
        pool.malloc(-1 if world.rank == 0 else 4096)
    assert pool.used_bytes() == 0
    pool.destroy()


def test_world_init_when_mpi_is_running(world):
    import sympool
    w2 = sympool.World.init()  # MPI is already initialized (by mpi4py): not finalized by us
    assert (w2.rank, w2.size) == (world.rank, world.size)
    w2.finalize()
    assert not MPI.Is_finalized()
    with pytest.raises(sympool.SympoolError):
        w2.rank


def test_world_on_a_split_communicator(world):
    import sympool
    sub = MPI.COMM_WORLD.Split(world.rank % 2, world.rank)
    w = sympool.World(sub)
    assert w.size == sub.Get_size() and w.rank == sub.Get_rank()
    w.finalize()
    sub.Free()


def test_bad_world_arguments(world):
    import sympool
    with pytest.raises(TypeError):
        sympool.World(comm=42)
    with pytest.raises(ValueError):
        sympool.MemPool(symmetric=True, world=None)
    with pytest.raises(ValueError):
        world.stats_report("xml")


def test_world_handles_refuse_copy_and_bad_node_arguments(world):
    # A copied World was a second owner: finalizing both reached sp_world_finalize twice, and
    # the copy's rank read -1 after the first. node() took int(), so 'cut to a C int' answered
    # node(2**32) with node 0 and node(1.9) with rank 1's node.
    import copy
    import pickle
    import threading

    import sympool
    for op in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot pickle or copy a sympool.World"):
            op(world)
    pool = sympool.MemPool(symmetric=True, world=world)
    with pytest.raises(TypeError, match="cannot pickle or copy a sympool.MemPool"):
        copy.copy(pool)
    pool.destroy()
    for bad, exc in ((1 << 32, ValueError), (-1, ValueError), (world.size, ValueError),
                     (1.9, TypeError), ("0", TypeError), (True, TypeError)):
        with pytest.raises(exc):
            world.node(bad)
        with pytest.raises(exc):
            world.node_name(bad if bad != world.size else world.node_count)
    # Two threads finalizing one world: one collective call per rank, no error.
    sub = sympool.World(MPI.COMM_WORLD)
    errors = []

    def fin():
        try:
            sub.finalize()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=fin) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with pytest.raises(sympool.SympoolError):
        sub.rank


def test_other_byte_order_and_python_number_types(world):
    # A big-endian buffer (ctypes' __ctype_be__, NumPy's ">f4" typestr) was reduced as native
    # numbers: 1.0 summed over ranks came back as garbage, silently. And dtype=float (Python's
    # float, 64 bits in NumPy and torch) was taken as float32: a float64 buffer reduced as twice
    # as many float32 halves.
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="order")
    n = 8
    a = pool.malloc(n * 8)
    be = (ctypes.c_float.__ctype_be__ * n).from_address(a)
    for i in range(n):
        be[i] = 1.0
    for call in (lambda: world.allreduce(be),
                 lambda: world.allreduce(CudaArray(a, n, ">f4")),
                 lambda: world.allreduce(a, a, n, dtype=">f4")):
        with pytest.raises(ValueError, match="byte order"):
            call()
    assert list(be) == [1.0] * n, "nothing was reduced"
    world.allreduce(CudaArray(a, n, ">u1"), op="max")  # one byte: no order to get wrong
    x = (ctypes.c_double * n).from_address(a)
    for i in range(n):
        x[i] = 0.5 + world.rank
    world.allreduce(a, a, n, dtype=float)
    assert list(x) == [sum(0.5 + r for r in range(world.size))] * n
    y = (ctypes.c_int64 * n).from_address(a)
    for i in range(n):
        y[i] = (1 << 40) + world.rank
    world.allreduce(a, a, n, dtype=int, op="max")
    assert list(y) == [(1 << 40) + world.size - 1] * n
    sympool.free(a)
    pool.destroy()


def test_count_and_dtype_must_fit_the_buffer_objects(world):
    # The library checks a buffer against its sympool allocation, not against the object that
    # describes it: a view of 4 floats at the start of a 4 KiB block took count=100 (or, as
    # allgather's recv, 4 x size floats into room for 2) and the collective wrote past the view
    # into the rest of the block. As mpi4py's [buf, count, datatype], the object bounds it.
    import sympool
    pool = sympool.MemPool(symmetric=True, world=world, name="views")
    a = pool.malloc(4096)
    view = floats(a, 4)
    x = floats(a, 1024)
    for i in range(1024):
        x[i] = 1.0
    for call in (lambda: world.allreduce(view, count=100),
                 lambda: world.allreduce(view, floats(a + 2048, 2)),
                 lambda: world.allgather(view, floats(a + 2048, 4 * world.size - 1)),
                 lambda: world.reduce_scatter(floats(a, 4 * world.size - 1), floats(a + 2048, 4)),
                 lambda: world.broadcast(view, floats(a + 2048, 3), root=0),
                 lambda: world.allreduce(floats(a, 3), dtype="float64")):  # 12 bytes: 1.5 doubles
        with pytest.raises(ValueError):
            call()
    assert all(x[i] == 1.0 for i in range(1024)), "nothing was written"
    # A dtype of another size over the same object: the count is the object's bytes in it.
    world.allreduce(view, dtype="float64", op="max")  # 2 doubles
    world.allgather(view, floats(a + 2048, 4 * world.size))
    sympool.free(a)
    pool.destroy()


def test_any_error_in_one_ranks_arguments_fails_every_rank(world):
    # The calls join the collective with a poisoned one when this rank's Python arguments fail,
    # so that its peers get an error now. Only TypeError and ValueError were caught: a destroyed
    # sympool.Stream (SympoolError from as_stream) or a buffer object whose description raised
    # anything else left this rank out of the call, and its peers waited for it until
    # SYMPOOL_SYM_TIMEOUT and failed with SP_ERR_TIMEOUT (a symmetric malloc's stream too, even
    # on the path that poisons a bad size).
    import sympool

    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("this object cannot describe itself")

    n = 16
    a = sympool.malloc(n * 4)
    dead = sympool.Stream()
    dead.destroy()
    pool = sympool.MemPool(symmetric=True, world=world, name="poison")
    bad_rank = world.size - 1
    calls = (
        (lambda bad: world.allreduce(a, a, n, stream=dead if bad else None), sympool.SympoolError),
        (lambda bad: world.allgather(Broken() if bad else a + 4 * world.rank, a, 1),
         RuntimeError),
        (lambda bad: world.broadcast(a, a, n, stream=dead if bad else None), sympool.SympoolError),
        (lambda bad: pool.malloc(4096, stream=dead if bad else None), sympool.SympoolError),
        (lambda bad: pool.malloc(-1 if bad else 4096, stream="no stream" if bad else None),
         ValueError),  # the size's reason (the poison itself raised the stream's TypeError)
    )
    for call, exc in calls:
        bad = world.rank == bad_rank
        with pytest.raises(exc if bad else sympool.SympoolError) as e:
            call(bad)
        if not bad:  # the library's refusal, not a deadline passed waiting for the bad rank
            assert e.value.status != "SP_ERR_TIMEOUT", str(e.value)
    # Every rank is still in step: the next call works everywhere.
    world.allreduce(a, a, n)
    assert pool.used_bytes() == 0
    pool.destroy()
    sympool.free(a)


def test_broadcast_reads_send_on_the_root_only(world):
    # The library reads a broadcast's send on its root only (elsewhere it may be NULL). A
    # non-root's placeholder send was checked against the count (its ValueError failed every
    # rank) and gave the count, where recv is what the call fills.
    import sympool
    n = 16
    a, b = sympool.malloc(n * 4), sympool.malloc(n * 4)
    src, dst = floats(a, n), floats(b, n)
    for i in range(n):
        src[i], dst[i] = (7.0 if world.rank == 0 else 0.0), 0.0
    send = src if world.rank == 0 else floats(a, 1)
    world.broadcast(send, dst, root=0)  # count: the root's send, the others' recv
    assert list(dst) == [7.0] * n
    for i in range(n):
        dst[i] = 0.0
    world.broadcast(send, dst, count=n, root=0)
    assert list(dst) == [7.0] * n
    for i in range(n):
        dst[i] = 0.0
    world.broadcast(src if world.rank == 0 else None, dst, root=0)
    assert list(dst) == [7.0] * n
    # recv still bounds the call everywhere, and a non-root in place (recv=None) is its send.
    with pytest.raises(ValueError):
        world.broadcast(send, floats(b, n - 1), count=n, root=0)
    world.broadcast(floats(b, n), root=0)
    sympool.free(a)
    sympool.free(b)


def test_symmetric_pool_arguments_refused_on_one_rank_fail_every_rank(world):
    # MemPool(symmetric=True) is collective: a rank whose own arguments fail in Python (a NUL in
    # the name, an allocator, a flag that is no bool) still joins the create, refused there, so
    # that its peers fail at once instead of waiting until SYMPOOL_SYM_TIMEOUT in the agreement.
    import sympool

    bad_rank = world.size - 1
    bad = world.rank == bad_rank
    cases = (
        (dict(name="a\0b"), ValueError),
        (dict(allocator=(lambda *a: 0, lambda *a: None)), ValueError),
        (dict(no_split=1), TypeError),
    )
    for extra, exc in cases:
        with pytest.raises(exc if bad else sympool.SympoolError) as e:
            kw = {"name": "ok", **(extra if bad else {})}
            sympool.MemPool(symmetric=True, world=world, **kw)
        if not bad:
            # told that the rank failed, not that the names or flags differ (that rank joins
            # with no name and default flags)
            assert e.value.status == "SP_ERR_INVALID_USAGE", str(e.value)
            assert "could not create the pool" in str(e.value), str(e.value)
    # Every rank is still in step: a symmetric pool can be made and used everywhere.
    pool = sympool.MemPool(symmetric=True, world=world, name="after")
    p = pool.malloc(4096)
    sympool.free(p)
    pool.destroy()


def test_read_only_buffers_are_refused_only_where_written(world):
    # A collective reads send and writes recv. A read-only send was refused ("send is a
    # read-only buffer") although nothing writes it, as mpi4py takes one; and a
    # __cuda_array_interface__ whose data is marked read-only ("data": (ptr, True)) was
    # written all the same, as recv or as send in place.
    import sympool
    n = 8
    a, b = sympool.malloc(n * 4), sympool.malloc(n * 4)
    src, dst = floats(a, n), floats(b, n)
    for i in range(n):
        src[i], dst[i] = world.rank + 1.0, 0.0
    world.allreduce(memoryview(src).toreadonly(), dst)
    assert list(dst) == [world.size * (world.size + 1) / 2] * n
    world.broadcast(memoryview(src).toreadonly(), dst, root=0)
    assert list(dst) == [1.0] * n

    def read_only(addr):
        arr = CudaArray(addr, n)
        arr.__cuda_array_interface__["data"] = (addr, True)
        return arr

    for i in range(n):
        dst[i] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        world.allreduce(CudaArray(a, n), read_only(b))
    with pytest.raises(ValueError, match="read-only"):
        world.allreduce(read_only(b))  # in place: send is written
    with pytest.raises(ValueError, match="read-only"):
        world.allgather(CudaArray(a, 1), read_only(b))
    assert list(dst) == [0.0] * n
    world.allreduce(read_only(a), CudaArray(b, n))  # only read: taken
    assert list(dst) == [world.size * (world.size + 1) / 2] * n
    sympool.free(a)
    sympool.free(b)


def test_world_whose_finalize_failed_is_finalized(world):
    # sp_world_finalize frees the world even when it fails (a peer missed its deadline), but
    # World kept the handle: rank read -1, a second finalize() raised "not a live world", and
    # once a new World got the same address (malloc reuses it) finalize() on the old object
    # finalized the new one. Rank 1 finalizes late, after rank 0's deadline: both calls fail.
    import sympool
    from sympool import _lib
    comm = MPI.COMM_WORLD.Split(world.rank < 2, world.rank)
    sub = sympool.World(comm)
    set_opt = _lib.lib().sp_x_option_set
    set_opt.restype, set_opt.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p]
    if world.rank < 2:
        assert set_opt(b"SYMPOOL_SYM_TIMEOUT", b"1") == 0
        try:
            if world.rank == 1:
                MPI.COMM_WORLD.recv(source=0, tag=7321)  # rank 0's deadline has passed
            with pytest.raises(sympool.SympoolError) as e:
                sub.finalize()
            assert e.value.status == "SP_ERR_TIMEOUT", str(e.value)
            if world.rank == 0:
                MPI.COMM_WORLD.send(None, dest=1, tag=7321)
        finally:
            set_opt(b"SYMPOOL_SYM_TIMEOUT", None)
        with pytest.raises(sympool.SympoolError, match="finalized"):
            sub.rank
        sub.finalize()  # nothing left to finalize: a no-op, as after a successful one
    else:
        sub.finalize()
    comm.Free()
    MPI.COMM_WORLD.Barrier()
