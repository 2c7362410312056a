"""The library's own Python frames hook (sp_history_python_frames, pool/pyframes.c) against the
package's ctypes hook (history._frames) it replaced: the same frames, names, files and lines, the
same cut at the 256 frames a call here asks for, the package's own frames left out, and no stale
frame from its caches."""

import ctypes

import pytest

from sympool import _lib, history


def _native():
    if not _lib.lib().sp_history_python_frames_supported():
        pytest.skip("sp_history_python_frames cannot reach CPython's C API in this process")


def _arg():
    return _lib.PythonFramesArg(history._SKIP_PREFIX.encode(errors="surrogatepass"),
                                history._encoded)


def _read(frames, n):
    return [(frames[i].name, frames[i].filename, frames[i].line) for i in range(n)]


def _both_here():
    """Both hooks called from one line (so their innermost frames' lines agree)."""
    a, b = (_lib.HistoryFrame * 256)(), (_lib.HistoryFrame * 256)()
    arg = _arg()
    pa, pb = (ctypes.cast(x, ctypes.POINTER(_lib.HistoryFrame)) for x in (a, b))
    native, python = _lib.lib().sp_history_python_frames, history._frames
    where = ctypes.addressof(arg)
    na, nb = native(pa, 256, where), python(pb, 256, None)
    return _read(a, na), _read(b, nb)


def _nest(depth, fn):
    return fn() if depth == 0 else _nest(depth - 1, fn)


@pytest.mark.parametrize("depth", [0, 40, 300])
def test_native_hook_reads_the_frames_the_python_hook_read(sp, depth):
    _native()
    native, python = _nest(depth, _both_here)
    assert native == python
    assert native[0][0] == b"_both_here"
    assert [f[0] for f in native[1:depth + 1]] == [b"_nest"] * min(depth, 255)
    if depth == 300:
        assert len(native) == 256  # the library's bound (MAX_HOOK), innermost kept


def test_recording_installs_the_native_hook(sp):
    _native()
    sp.record_memory_history()
    want = ctypes.cast(_lib.lib().sp_history_python_frames, ctypes.c_void_p).value
    assert ctypes.cast(history._hook, ctypes.c_void_p).value == want


def _alloc_at(sp, n):
    return sp.malloc(n)  # the innermost frame the trace must name


def _frames_of(sp, size):
    ev = [e for e in sp.snapshot()["device_traces"][0]
          if e["action"] == "alloc" and e["size"] == size]
    assert ev, size
    return ev[-1]["frames"]


def _through_both_hooks(sp, alloc, size):
    """alloc(size) recorded with the native hook (recording installs it), then alloc(size + 1)
    with the ctypes hook installed by hand: the two allocs' frames (native, python)."""
    sp.record_memory_history()
    native_hook = history._hook
    old = _lib.FRAMES_FN(history._frames)
    history._lib_keep.append(old)
    ptrs = []
    try:
        for n in (size, size + 1):  # one call site: the frames must not differ by its line
            if n == size + 1:
                _lib.lib().sp_history_set_frames_hook(old, None)
            ptrs.append(alloc(n))
        return _frames_of(sp, size), _frames_of(sp, size + 1)
    finally:
        _lib.lib().sp_history_set_frames_hook(native_hook, ctypes.addressof(history._native_arg))
        for p in ptrs:
            sp.free(p)


@pytest.mark.parametrize("depth", [0, 300])
def test_recorded_frames_equal_through_both_hooks(sp, depth):
    # One call site, through both hooks: the snapshot's frames must be the same list.
    _native()
    native, python = _through_both_hooks(sp, lambda n: _nest(depth, lambda: _alloc_at(sp, n)),
                                         7301)
    assert native == python
    assert native[0]["name"] == "_alloc_at"
    assert native[0]["filename"].endswith("test_history_frames.py")
    # Every frame, as PyTorch keeps them: past the 256 a hook is first asked for too.
    assert sum(f["name"] == "_nest" for f in native) == depth + 1


def test_package_frames_left_out(sp):
    # MemPool.malloc calls memory.malloc: two frames of the package before the caller's.
    _native()
    sp.record_memory_history()
    pool = sp.MemPool()
    try:
        p = pool.malloc(7401)
        frames = _frames_of(sp, 7401)
        assert frames[0]["name"] == "test_package_frames_left_out", frames[:3]
        assert not any(f["filename"].startswith(history._PACKAGE_DIR) for f in frames)
        sp.free(p)
    finally:
        pool.destroy()


def test_a_lone_surrogate_through_the_native_hook(sp):
    _native()
    code = compile("def both():\n    return _both_here()\n", "odd\udcff\udc80.py", "exec")
    scope = {"_both_here": _both_here}
    exec(code, scope)
    native, python = scope["both"]()
    assert native == python
    assert native[1][1] == "odd\udcff\udc80.py".encode(errors="surrogatepass")


def test_a_nul_in_a_name_through_both_hooks(sp):
    # U+0000 in a function or file name: the native hook gave CPython's UTF-8 as a C string, cut
    # at the NUL ("ab"), and the ctypes hook bytes that ctypes cut the same way; both give
    # history.h's 0xC0 0x80 now, and a snapshot holds the str whole.
    _native()
    scope = {"_both_here": _both_here}
    exec("def both():\n    return _both_here()\n", scope)
    scope["both"].__code__ = scope["both"].__code__.replace(co_name="ab\x00cd",
                                                            co_filename="x\x00y.py")
    native, python = scope["both"]()
    assert native == python
    assert native[1][:2] == (b"ab\xc0\x80cd", b"x\xc0\x80y.py")
    sp.record_memory_history()
    scope["_both_here"] = lambda: sp.malloc(7702)
    p = scope["both"]()
    try:
        frames = _frames_of(sp, 7702)
        assert (frames[1]["name"], frames[1]["filename"]) == ("ab\x00cd", "x\x00y.py"), frames[:3]
    finally:
        sp.free(p)


def test_a_file_beside_the_package_is_the_users(sp):
    # The package's frames are those under its folder: a module beside it whose path merely
    # starts the same (sympool_helpers.py, a sympoolx/ package) lost its frames in both hooks.
    _native()
    beside = history._PACKAGE_DIR + "_helpers.py"
    inside = history._SKIP_PREFIX + "x.py"
    scope = {"_both_here": _both_here}
    exec(compile("def mine():\n    return _both_here()\n", beside, "exec"), scope)
    exec(compile("def ours():\n    return mine()\n", inside, "exec"), scope)
    native, python = scope["ours"]()
    assert native == python
    files = [f[1] for f in native]
    assert beside.encode() in files and inside.encode() not in files, files[:4]


def test_many_code_objects_keep_their_own_lines(sp):
    # More call sites than the hook's frame cache has slots (1024), each in a code object freed
    # right after its allocation: no frame may take the name or line of another that held its
    # address or slot before (the cache holds its code objects; a key is never given twice).
    _native()
    sp.record_memory_history()
    ptrs = []
    try:
        for k in range(1500):
            src = "\n" * (k % 37) + f"def f{k}(sp, n):\n    return sp.malloc(n)\n"
            scope = {}
            exec(compile(src, f"gen{k % 3}.py", "exec"), scope)
            ptrs.append(scope[f"f{k}"](sp, 20000 + k))
            del scope
        trace = sp.snapshot()["device_traces"][0]
        first = {e["size"]: e["frames"][0] for e in trace if e["action"] == "alloc"}
        for k in range(1500):
            want = {"name": f"f{k}", "filename": f"gen{k % 3}.py", "line": k % 37 + 2}
            assert {x: first[20000 + k][x] for x in want} == want, k
    finally:
        for p in ptrs:
            sp.free(p)


def test_same_call_site_gives_one_stack_again_and_again(sp):
    # The keyed path (pool/history.c) returns the context the texts found: every allocation
    # from one line reads the same frames, the first (texts hashed) as the later (keys).
    _native()
    sp.record_memory_history()
    ptrs = [_alloc_at(sp, 7500 + i) for i in range(50)]
    try:
        trace = sp.snapshot()["device_traces"][0]
        stacks = [e["frames"] for e in trace if e["action"] == "alloc" and e["size"] >= 7500]
        assert len(stacks) == 50 and all(s == stacks[0] for s in stacks)
        assert stacks[0][0]["name"] == "_alloc_at"
    finally:
        for p in ptrs:
            sp.free(p)


def test_threads_record_while_the_hook_comes_and_goes(sp):
    # Four threads allocate with stacks while the main thread turns recording (and with it the
    # hook) off and on: every stack recorded names the thread's own function first, none fails.
    import threading
    _native()
    stop = threading.Event()
    errors = []

    def worker(size):
        try:
            while not stop.is_set():
                sp.free(sp.malloc(size))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(7600 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(100):
            sp.record_memory_history(context="all" if i % 2 == 0 else None, max_entries=1000)
            if i % 2:
                sp.record_memory_history(enabled=None)
        sp.record_memory_history(max_entries=1000)
        # Until a worker records with frames (bounded: a hang fails, not waits). An alloc
        # without frames (see below) does not count: stopping on it could leave none framed.
        for _ in range(100_000):
            entries = sp.snapshot()["device_traces"][0]
            if any(e["action"] == "alloc" and "frames" in e for e in entries):
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    allocs = [e for e in sp.snapshot()["device_traces"][0] if e["action"] == "alloc"]
    framed = [e for e in allocs if "frames" in e]
    # A worker's allocation whose stack was to be taken while recording was still off, and which
    # was recorded just after it came on, has no frames (as in torch, which gathers the context
    # before it checks whether it records): one a worker at most.
    assert len(allocs) - len(framed) <= len(threads), allocs[:2]
    assert framed
    assert all(e["frames"][0]["name"] == "worker" for e in framed if e["size"] >= 7600), framed[:2]


def _lineless(fn_text, name, scope):
    """fn_text's function `name` with an empty line table: its frames' f_lineno is None."""
    exec(compile(fn_text, "lineless.py", "exec"), scope)
    fn = scope[name]
    fn.__code__ = fn.__code__.replace(co_linetable=b"")
    return fn


def test_a_frame_without_a_line_is_written_as_pytorch_writes_it(sp):
    # PyTorch writes the line table's answer (PyCode_Addr2Line) cast to its unsigned 64-bit line:
    # an instruction without a line (f_lineno None) is 2^64-1 in its snapshots. Both of our hooks
    # gave 0 there, the line of a C frame.
    _native()
    probe = _lineless("def probe():\n    import sys\n    return sys._getframe(0).f_lineno\n",
                      "probe", {})
    if probe() is not None:
        pytest.skip("this Python gives a line to a code object with an empty line table")
    caller = _lineless("def caller(sp, size):\n    return _alloc_at(sp, size)\n", "caller",
                       {"_alloc_at": _alloc_at})
    native, python = _through_both_hooks(sp, lambda n: caller(sp, n), 7501)
    for frames in (native, python):
        assert [f["name"] for f in frames[:2]] == ["_alloc_at", "caller"], frames[:3]
        assert frames[0]["line"] > 0
        assert frames[1]["line"] == 2**64 - 1, frames[1]
    assert native == python
