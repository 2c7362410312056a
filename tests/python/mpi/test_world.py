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


@pytest.mark.parametrize("fmt", ["table", "json", "prometheus"])
def test_stats_report(world, fmt):
    buf = io.StringIO()
    text = world.stats_report(fmt, file=buf)
    if world.rank == 0:
        assert text == buf.getvalue() and text
        if fmt == "json":
            doc = json.loads(text)
            assert doc["nranks"] == world.size
        elif fmt == "prometheus":
            assert "# TYPE" in text
        else:
            assert "allocated" in text
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
