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


def _u64(value):
    """What pybind11 takes for a uint64_t parameter: an int in [0, 2**64) (None, floats and
    negatives are 'incompatible function arguments', a TypeError)."""
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise TypeError(f"incompatible function arguments: {value!r} is not a uint64_t")
    return value


class _CUDAAllocator:
    """torch._C._cuda_CUDAAllocator: the base every allocator argument must be (a pybind11
    std::shared_ptr<CUDAAllocator> parameter refuses anything else)."""


class _CUDAPluggableAllocator(_CUDAAllocator):
    """torch._C._CUDAPluggableAllocator, what torch._C._cuda_customAllocator(malloc_ptr, free_ptr)
    returns (torch/csrc/cuda/Module.cpp, registerCudaPluggableAllocator). It has these eight
    setters and no other, each taking the hook's address as a uint64_t; CUDAPluggableAllocator
    (torch/csrc/cuda/CUDAPluggableAllocator.cpp) calls a hook that was never set not at all."""

    SETTERS = ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_base_alloc_fn",
               "set_record_stream_fn", "set_begin_allocate_to_pool",
               "set_end_allocate_to_pool_fn", "set_release_pool")

    def __init__(self, malloc_ptr, free_ptr):
        self.hooks = {"alloc": _u64(malloc_ptr), "free": _u64(free_ptr)}


def _setter(name):
    def set_hook(self, func_ptr):
        self.hooks[name] = _u64(func_ptr)
    set_hook.__name__ = name
    return set_hook


for _name in _CUDAPluggableAllocator.SETTERS:
    setattr(_CUDAPluggableAllocator, _name, _setter(_name))


def _fake_torch(current_device=0, initialized=True):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.__file__ = "/nonexistent/torch/__init__.py"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.device = _Device
    # Whether PyTorch's own caching allocator is initialized (torch.cuda's lazy init does it; so
    # does torch.cuda.MemPool's constructor, torch/csrc/cuda/MemPool.cpp THCPMemPool_init).
    torch._initialized = initialized
    torch._current_allocator = None  # what _cuda_changeCurrentAllocator installed
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: torch._initialized
    cuda.current_device = lambda: current_device

    def memory_stats(device=None):
        # torch/cuda/memory.py memory_stats_as_nested_dict: {} before CUDA is initialized.
        return {"torch": device} if torch._initialized else {}

    cuda.memory_stats = memory_stats
    memory = types.ModuleType("torch.cuda.memory")

    class CUDAPluggableAllocator:
        pass

    def change_current_allocator(allocator):
        # torch/cuda/memory.py change_current_allocator -> torch._C._cuda_changeCurrentAllocator
        # (allocator.allocator()) -> changeCurrentAllocator (CUDAPluggableAllocator.cpp).
        torch._C._cuda_changeCurrentAllocator(allocator.allocator())

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    memory.change_current_allocator = change_current_allocator

    class MemPool:
        # torch/cuda/memory.py MemPool.__init__ -> _MemPool's constructor
        # (torch/csrc/cuda/MemPool.cpp: device_lazy_init, then at::cuda::MemPool's constructor,
        # aten/src/ATen/cuda/MemPool.cpp) calls CUDACachingAllocator::createOrIncrefPool on the
        # *current* allocator; CUDAPluggableAllocator (torch/csrc/cuda/CUDAPluggableAllocator.h)
        # does not override it, so CUDAAllocator's default (c10/cuda/CUDACachingAllocator.h)
        # throws this, whatever allocator the MemPool itself is given.
        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            if allocator is not None and not isinstance(allocator, _CUDAAllocator):
                raise TypeError("incompatible constructor arguments: allocator must be a "
                                "torch._C._cuda_CUDAAllocator")
            torch._initialized = True
            if torch._pluggable_current:
                raise RuntimeError("pluggable does not yet support createOrIncrefPool. If you "
                                   "need it, please file an issue describing your use case.")
            self.allocator = allocator

    def change(allocator):
        if not isinstance(allocator, _CUDAAllocator):
            raise TypeError("incompatible function arguments: not a _cuda_CUDAAllocator")
        # changeCurrentAllocator: TORCH_CHECK on the allocator being replaced.
        if torch._initialized:
            raise RuntimeError("Can't swap an already initialized allocator")
        torch._current_allocator = allocator
        torch._pluggable_current = True

    cuda.MemPool = MemPool
    cuda.memory = memory
    torch.cuda = cuda
    torch._pluggable_current = False
    torch._C = types.SimpleNamespace(_cuda_customAllocator=_CUDAPluggableAllocator,
                                     _cuda_changeCurrentAllocator=change)
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


def _stand_in_torch_tree(fake, tmp_path, monkeypatch, guard=""):
    """Point the stand-in torch at a tree the shim can be built against: the test's stand-in
    Exception.h (after `guard`) and an empty libc10; the cache in tmp_path."""
    import os
    import shutil
    import subprocess
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    here = os.path.dirname(os.path.abspath(__file__))
    stand_in = os.path.join(here, "..", "torch_shim", "c10", "util", "Exception.h")
    tdir = tmp_path / "torch"
    (tdir / "include" / "c10" / "util").mkdir(parents=True)
    (tdir / "lib").mkdir()
    with open(stand_in) as f:
        header = f.read()
    (tdir / "include" / "c10" / "util" / "Exception.h").write_text(guard + header)
    subprocess.run([os.environ.get("CXX", "c++"), "-shared", "-fPIC", "-x", "c++", "/dev/null",
                    "-o", str(tdir / "lib" / "libc10.so")], check=True)
    fake.__file__ = str(tdir / "__init__.py")
    fake.__version__ = "2.99.0+test"
    fake._C._GLIBCXX_USE_CXX11_ABI = True
    monkeypatch.setenv("SYMPOOL_CACHE_DIR", str(tmp_path / "cache"))


def test_shim_builds_for_a_torch_whose_headers_need_cxx20(sptorch, tmp_path, monkeypatch):
    # PyTorch moved c10 and cpp_extension to C++20 (pytorch#177311, #176659), and extensions
    # built with C++17 against newer releases stop at an "#error C++20 or later" (as reported by
    # mamba#1000, flash-attention#2879): the shim is built with C++20 first. The stand-in torch
    # tree: the test's stand-in Exception.h behind such a guard, and an empty libc10.
    st, fake = sptorch
    _stand_in_torch_tree(fake, tmp_path, monkeypatch, guard=(
        "#if __cplusplus < 202002L\n#error C++20 or later compatible compiler is required to "
        "use PyTorch.\n#endif\n"))
    st._shim_lib = None
    shim = st._shim(fake)
    assert shim is not None and hasattr(shim, "sympool_shim_init")


def test_shim_build_interrupted_leaves_no_temporary(sptorch, tmp_path, monkeypatch):
    # Ctrl-C while the compiler runs (or any failure) removes the temporary the shim was being
    # built into: it stayed in the cache, a stray .so per interrupted run.
    import os
    st, fake = sptorch
    _stand_in_torch_tree(fake, tmp_path, monkeypatch)
    st._shim_lib = None

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    run = st.subprocess.run
    monkeypatch.setattr(st.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        st._shim(fake)
    assert os.listdir(tmp_path / "cache") == []
    monkeypatch.setattr(st.subprocess, "run", run)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="building it failed"):
        st._shim(fake)
    assert os.listdir(tmp_path / "cache") == []
    assert st._shim_lib is None


def test_enable_wires_each_hook_to_its_entry_point(sptorch, tmp_path, monkeypatch):
    # enable() against the stand-in's _CUDAPluggableAllocator, whose setters are exactly those
    # of torch/csrc/cuda/Module.cpp (registerCudaPluggableAllocator) and take only addresses:
    # each hook must get the sympool or shim function of its C signature, and the allocator
    # must reach changeCurrentAllocator before CUDA is initialized.
    import ctypes
    st, fake = sptorch
    fake._initialized = False
    _stand_in_torch_tree(fake, tmp_path, monkeypatch)
    monkeypatch.setattr(st, "_check_backend", lambda: None)  # the host backend here
    st._shim_lib = None
    st._allocator = None
    st.enable()
    assert st.is_enabled()
    alloc = fake._current_allocator
    assert isinstance(alloc, _CUDAPluggableAllocator)
    shim = st._shim_lib

    def addr(lib, name):
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

    lib = st._lib.lib()
    assert alloc.hooks == {
        "alloc": addr(shim, "sympool_shim_malloc"),  # void *(size_t, int, cudaStream_t)
        "free": addr(shim, "sympool_shim_free"),  # void (void *, size_t, int, cudaStream_t)
        "set_record_stream_fn": addr(shim, "sympool_shim_record_stream"),  # (void *, stream)
        "set_reset_fn": addr(lib, "sp_torch_empty_cache"),  # void ()
        "set_memory_fraction_fn": addr(lib, "sp_torch_set_memory_fraction"),  # (double, int)
        "set_begin_allocate_to_pool": addr(shim, "sympool_shim_begin_allocate_to_pool"),
        "set_end_allocate_to_pool_fn": addr(shim, "sympool_shim_end_allocate_to_pool"),
        "set_release_pool": addr(shim, "sympool_shim_release_pool"),
    }, alloc.hooks
    # torch.cuda.MemPool() is refused with the reason; enable() again changes nothing.
    with pytest.raises(RuntimeError, match="enable"):
        st.mem_pool()
    st.enable()
    assert fake._current_allocator is alloc


def test_enable_refused_by_torch_leaves_it_disabled(sptorch, tmp_path, monkeypatch):
    # torch.cuda.is_initialized() is False in a child forked after CUDA was initialized
    # (torch/cuda/__init__.py: "and not _is_in_bad_fork()"), while the caching allocator it
    # inherited is initialized: changeCurrentAllocator refuses, and enable() must not say yes.
    st, fake = sptorch
    fake._initialized = False
    _stand_in_torch_tree(fake, tmp_path, monkeypatch)
    monkeypatch.setattr(st, "_check_backend", lambda: None)
    st._shim_lib = None
    st._allocator = None
    fake.cuda.is_initialized = lambda: False
    fake._initialized = True
    with pytest.raises(RuntimeError, match="swap"):
        st.enable()
    assert not st.is_enabled()


def test_shim_build_failure_shows_the_cxx20_error(sptorch, tmp_path, monkeypatch):
    # When both standards fail, the C++17 retry's error is usually "#error C++20 or later
    # compatible compiler is required" (ATen.h and torch/all.h from PyTorch 2.14 on): shown
    # alone, it hides why the C++20 build failed. A stand-in compiler that fails differently
    # under each standard.
    st, fake = sptorch
    _stand_in_torch_tree(fake, tmp_path, monkeypatch)
    cxx = tmp_path / "fake-cxx"
    cxx.write_text("#!/bin/sh\ncase \"$*\" in\n*-std=c++20*) echo 'the real reason: "
                   "no such header' >&2 ;;\n*) echo '#error C++20 or later compatible compiler "
                   "is required' >&2 ;;\nesac\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    st._shim_lib = None
    with pytest.raises(RuntimeError) as e:
        st._shim(fake)
    msg = str(e.value)
    assert "the real reason: no such header" in msg and "-std=c++20" in msg, msg
    assert not list((tmp_path / "cache").glob("*.so")), "a failed build left a file behind"


def test_shim_build_without_a_compiler_says_so(sptorch, tmp_path, monkeypatch):
    st, fake = sptorch
    _stand_in_torch_tree(fake, tmp_path, monkeypatch)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    st._shim_lib = None
    with pytest.raises(RuntimeError, match="no-such-compiler"):
        st._shim(fake)
    assert not list((tmp_path / "cache").glob("*.so"))
