"""PyTorch's and CuPy's names and signatures, so that code written for torch.cuda.memory or
cupy.get_default_memory_pool() runs against sympool unchanged."""

import inspect
import os

import pytest


def test_memory_summary_abbreviated_leaves_out_pool_rows(sp):
    p = sp.malloc(1 << 20)
    full = sp.memory_summary(device=None, abbreviated=False)
    short = sp.memory_summary(abbreviated=True)
    sp.free(p)
    assert "from large pool" in full and "from small pool" in full
    assert "from large pool" not in short and "from small pool" not in short
    assert "Allocated memory" in short and len(short.splitlines()) < len(full.splitlines())


def test_mempool_third_positional_is_no_split(sp):
    params = list(inspect.signature(sp.MemPool).parameters)
    assert params[:3] == ["allocator", "use_on_oom", "no_split"]
    pool = sp.MemPool(None, False, True)  # torch.cuda.MemPool(allocator, use_on_oom, no_split)
    assert not pool.is_symmetric
    with sp.use_mem_pool(pool):
        a = sp.malloc(1 << 20)
        b = sp.malloc(1 << 20)
    # no_split: each allocation keeps its whole 2 MiB segment (or, with expandable segments on,
    # its whole page): two blocks of 2 MiB, no free remainder.
    blocks = [b for s in sp.memory_snapshot(pool.id) for b in s["blocks"]]
    assert [b["size"] for b in blocks] == [2 << 20, 2 << 20], blocks
    sp.free(a)
    sp.free(b)


def test_record_memory_history_torch_signature(sp, tmp_path):
    # torch's own: (enabled="all", *args, **kwargs), a bool enabled taking the legacy form;
    # _record_memory_history_impl has the named parameters.
    params = list(inspect.signature(sp._record_memory_history).parameters)
    assert params == ["enabled", "args", "kwargs"]
    from sympool.history import _record_memory_history_impl
    params = list(inspect.signature(_record_memory_history_impl).parameters)
    assert params[:6] == ["enabled", "context", "stacks", "max_entries", "device",
                          "clear_history"]
    sp._record_memory_history("all", "all", "python", 1000, None, False)
    p = sp.malloc(4096)
    sp.free(p)
    traces = sp._snapshot()["device_traces"]
    assert any(e["action"] == "alloc" for t in traces for e in t)
    sp._record_memory_history(clear_history=True)  # still recording, history dropped
    actions = [e["action"] for t in sp._snapshot()["device_traces"] for e in t]
    assert "alloc" not in actions and "free_completed" not in actions, actions
    q = sp.malloc(4096)
    assert all(t == [] for t in sp.snapshot(include_traces=False)["device_traces"])
    assert any(e["action"] == "alloc" for t in sp.snapshot()["device_traces"] for e in t)
    sp.free(q)
    with pytest.raises(TypeError):
        sp._record_memory_history(clear_history="yes")


def test_dump_snapshot_default_name_and_filename(sp, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sp._dump_snapshot()
    assert (tmp_path / "dump_snapshot.pickle").stat().st_size > 0
    sp._dump_snapshot(filename=str(tmp_path / "named.pickle"))
    assert (tmp_path / "named.pickle").exists()
    sp.dump_snapshot()
    assert os.path.exists("dump_snapshot.pickle")


def test_memory_snapshot_by_pool_id(sp):
    pool = sp.MemPool(name="by-id")
    with sp.use_mem_pool(pool):
        p = sp.malloc(1 << 20)
    q = sp.malloc(1 << 20)
    mine = sp.memory_snapshot(mempool_id=pool.id, include_traces=False)
    assert mine and all(tuple(s["segment_pool_id"]) == pool.id for s in mine)
    assert len(sp.memory_snapshot()) > len(mine)
    assert sp.memory_snapshot(pool) == mine
    sp.free(p)
    sp.free(q)


def test_default_memory_pool_like_cupy(sp):
    pool = sp.get_default_memory_pool()
    assert pool is sp.get_default_memory_pool(0)
    before = pool.used_bytes()
    p = sp.malloc(1 << 20)  # outside use_mem_pool: the default pool
    assert pool.used_bytes() >= before + (1 << 20)
    assert pool.total_bytes() >= pool.used_bytes()
    assert pool.n_free_blocks() >= 0 and pool.free_bytes() >= 0
    sp.free(p)
    pool.free_all_blocks()
    with pytest.raises(ValueError):
        pool.destroy()
    with pytest.raises(ValueError):
        sp.get_default_memory_pool(sp.device_count())


def test_snapshot_second_argument_is_torchs_augment_with_fx_traces(sp):
    # torch.cuda.memory._snapshot(device=None, augment_with_fx_traces=False): passing False
    # positionally keeps the traces there; it was snapshot()'s include_traces here, which
    # dropped them.
    assert list(inspect.signature(sp._snapshot).parameters) == ["device",
                                                                 "augment_with_fx_traces"]
    sp._record_memory_history("all")
    p = sp.malloc(4096)
    sp.free(p)
    assert any(e["action"] == "alloc" for t in sp._snapshot(None, False)["device_traces"]
               for e in t)
    assert sp._snapshot(None, True)["segments"] == sp._snapshot()["segments"]
    sp._record_memory_history(None)
