"""sympool.torch's Python logic against a stand-in `torch` module (no torch, no GPU in CI).

The stand-in models only what sympool.torch reads and what PyTorch 2.11 does at those points,
each with the PyTorch source it follows; the C++ shim has its own test (tests/torch_shim) and the
real torch runs on the GPU machine (scripts/gpu-check.sh)."""

import sys
import types

import pytest


class _Device:
    """torch.device: sympool recognizes it by its class name and its type/index."""

    def __init__(self, spec):
        kind, _, index = spec.partition(":")
        self.type = kind
        self.index = int(index) if index else None


_Device.__name__ = "device"


def _fake_torch(current_device=0, initialized=True):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.__file__ = "/nonexistent/torch/__init__.py"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.device = _Device
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: initialized
    cuda.current_device = lambda: current_device
    cuda.memory_stats = lambda device=None: {"torch": device}
    memory = types.ModuleType("torch.cuda.memory")
    memory.CUDAPluggableAllocator = object

    class MemPool:
        # torch/cuda/memory.py MemPool.__init__ -> at::cuda::MemPool's constructor
        # (aten/src/ATen/cuda/MemPool.cpp) calls CUDACachingAllocator::createOrIncrefPool on the
        # *current* allocator; CUDAPluggableAllocator (torch/csrc/cuda/CUDAPluggableAllocator.h)
        # does not override it, so CUDAAllocator's default (c10/cuda/CUDACachingAllocator.h)
        # throws this, whatever allocator the MemPool itself is given.
        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            if torch._pluggable_current:
                raise RuntimeError("pluggable does not yet support createOrIncrefPool. If you "
                                   "need it, please file an issue describing your use case.")
            self.allocator = allocator

    cuda.MemPool = MemPool
    cuda.memory = memory
    torch.cuda = cuda
    torch._pluggable_current = False
    torch._C = types.SimpleNamespace(_cuda_customAllocator=lambda a, f: ("custom", a, f))
    return torch


@pytest.fixture
def sptorch(monkeypatch):
    """(sympool.torch, the stand-in torch); sympool.torch's module state is restored after."""
    import sympool.torch as st
    for name in ("_enabled", "_allocator", "_segment_allocator", "_shim_lib"):
        monkeypatch.setattr(st, name, getattr(st, name))
    fake = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return st, fake


def test_mem_pool_after_enable_says_why(sptorch):
    st, fake = sptorch
    # What enable() leaves behind: sympool's pluggable allocator is torch's current one.
    st._enabled = True
    fake._pluggable_current = True
    with pytest.raises(RuntimeError) as e:
        st.mem_pool()
    msg = str(e.value)
    assert "enable()" in msg and "createOrIncrefPool" not in msg, msg


def test_mem_pool_refuses_allocator_argument(sptorch):
    st, _ = sptorch
    with pytest.raises(TypeError):
        st.mem_pool(allocator=object())


@pytest.mark.parametrize("spec,current,want", [
    ("cuda", 1, 1), (_Device("cuda"), 1, 1), (None, 1, 1),
    (0, 1, 0), ("cuda:1", 0, 1), (_Device("cuda:1"), 0, 1)])
def test_memory_stats_device(sptorch, monkeypatch, spec, current, want):
    # torch.cuda.memory_stats(device) (torch/cuda/memory.py, memory_stats_as_nested_dict) reads
    # _get_device_index(device, optional=True): None, "cuda" and torch.device("cuda") mean the
    # current device, not device 0; an index names its device.
    st, fake = sptorch
    fake.cuda.current_device = lambda: current
    st._enabled = True
    seen = []
    monkeypatch.setattr(st._memory, "memory_stats", lambda d: seen.append(d) or {})
    st.memory_stats(spec)
    assert seen == [want], seen


def test_memory_stats_not_enabled_is_torchs(sptorch):
    st, _ = sptorch
    assert st.memory_stats(0) == {"torch": 0}


def test_enable_refuses_after_cuda_init(sptorch):
    # torch/csrc/cuda/CUDAPluggableAllocator.cpp changeCurrentAllocator: "Can't swap an already
    # initialized allocator"; sympool refuses first, with the order to follow.
    st, fake = sptorch
    with pytest.raises(RuntimeError, match="before the first CUDA tensor"):
        st.enable()
    assert not st.is_enabled()


def test_shim_builds_for_a_torch_whose_headers_need_cxx20(sptorch, tmp_path, monkeypatch):
    # PyTorch moved c10 and cpp_extension to C++20 (pytorch#177311, #176659), and extensions
    # built with C++17 against newer releases stop at an "#error C++20 or later" (as reported by
    # mamba#1000, flash-attention#2879): the shim is built with C++20 first. The stand-in torch
    # tree: the test's stand-in Exception.h behind such a guard, and an empty libc10.
    import os
    import shutil
    import subprocess
    st, fake = sptorch
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    here = os.path.dirname(os.path.abspath(__file__))
    stand_in = os.path.join(here, "..", "torch_shim", "c10", "util", "Exception.h")
    tdir = tmp_path / "torch"
    (tdir / "include" / "c10" / "util").mkdir(parents=True)
    (tdir / "lib").mkdir()
    with open(stand_in) as f:
        header = f.read()
    (tdir / "include" / "c10" / "util" / "Exception.h").write_text(
        "#if __cplusplus < 202002L\n#error C++20 or later compatible compiler is required to use "
        "PyTorch.\n#endif\n" + header)
    subprocess.run([os.environ.get("CXX", "c++"), "-shared", "-fPIC", "-x", "c++", "/dev/null",
                    "-o", str(tdir / "lib" / "libc10.so")], check=True)
    fake.__file__ = str(tdir / "__init__.py")
    fake.__version__ = "2.99.0+test"
    fake._C._GLIBCXX_USE_CXX11_ABI = True
    monkeypatch.setenv("SYMPOOL_CACHE_DIR", str(tmp_path / "cache"))
    st._shim_lib = None
    shim = st._shim(fake)
    assert shim is not None and hasattr(shim, "sympool_shim_init")
