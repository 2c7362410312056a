"""More misuse of the Python package (session 26's adversary pass): interrupts raised in a
segment allocator's free, read-only buffers given to the collectives, memory history turned on
and off in a loop, forks while other threads hold the package's locks or route a pool, torch's
keyword names, importlib.reload of the library module."""

import ctypes
import subprocess
import sys
import textwrap

import pytest

from _hostmem import host_segment
from sympool import _array


class HostSegments:
    """A Python segment allocator over ctypes buffers (the host backend's memory is host
    memory); free raises `interrupt` (once) after giving the segment back."""

    def __init__(self, interrupt=None):
        self.bufs, self.frees, self.interrupt = {}, 0, interrupt

    def alloc(self, size, device, stream):
        return host_segment(self.bufs, size)

    def free(self, ptr, size, device, stream):
        self.frees += 1
        self.bufs.pop(ptr)
        if self.interrupt is not None:
            exc, self.interrupt = self.interrupt, None
            raise exc()


# ---- an interrupt in a segment allocator's free reaches the caller --------------------------

@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("how", ["free_all_blocks", "destroy", "empty_cache"])
def test_interrupt_in_the_allocators_free_reaches_the_caller(sp, how, exc):
    # ctypes cannot carry an exception out of a callback: it printed "Exception ignored on
    # calling ctypes callback function" and dropped it, so a Ctrl-C during a release (a long
    # free_all_blocks, destroy or empty_cache over many segments) was swallowed and the program
    # went on. The exception is the caller's, raised once the library has returned.
    segs = HostSegments(interrupt=exc)
    pool = sp.MemPool(allocator=(segs.alloc, segs.free))
    p = pool.malloc(1000)
    if how == "empty_cache":
        pool.destroy()  # the block stays valid; once freed, empty_cache gives its segment back
        sp.free(p)
        assert segs.frees == 0
        with pytest.raises(exc):
            sp.empty_cache()
    else:
        sp.free(p)
        with pytest.raises(exc):
            pool.free_all_blocks() if how == "free_all_blocks" else pool.destroy()
    assert segs.frees == 1 and segs.bufs == {}
    # raised once: nothing is left for a later call to raise
    sp.empty_cache()
    sp.free(sp.malloc(100))
    if how == "free_all_blocks":
        pool.destroy()


# ---- read-only buffer objects: refused where a collective writes, taken where it reads ------

class CudaArray:
    def __init__(self, addr, readonly):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4",
                                         "data": (addr, readonly), "version": 3}


def test_read_only_cuda_array_interface_is_refused_as_recv():
    # The collective writes recv (and send in place): data marked read-only was written.
    with pytest.raises(ValueError, match="read-only"):
        _array.describe(CudaArray(4096, True), "recv")
    assert _array.describe(CudaArray(4096, False), "recv") == (4096, 4, "float32")


def test_read_only_buffer_is_taken_as_send():
    # A send buffer that is only read may be read-only (a memoryview.toreadonly(), bytes): it
    # was refused, and its address could not be read (ctypes' from_buffer wants a writable one).
    arr = (ctypes.c_float * 4)()
    view = memoryview(arr).toreadonly()
    assert _array.describe(view, "send", writable=False) == (ctypes.addressof(arr), 4,
                                                               "float32")
    with pytest.raises(ValueError, match="read-only"):
        _array.describe(view, "recv")


# ---- turning memory history on and off in a loop holds no more memory -------------------------

def test_recording_on_and_off_in_a_loop_does_not_grow(sp):
    # Each turning-on made a new hook object (FRAMES_FN) and each turning-off kept the old one
    # for good (another thread may still be inside it): about 200 bytes per cycle, without
    # bound, for a program that records a window of every step. The hooks are made once now.
    import tracemalloc

    from sympool import history

    def cycles(n):
        for _ in range(n):
            sp.record_memory_history()
            sp.record_memory_history(None)

    cycles(10)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        cycles(2000)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename")
                if d.traceback[0].filename == history.__file__)
    assert grown < 2000 * 16, f"{grown} bytes kept by history.py over 2000 on/off cycles"


# ---- a fork while another thread holds one of the package's locks ------------------------------

# (the lock another thread holds while the main thread forks, what the child then calls)
_FORK_CASES = {
    # empty_cache and destroy sweep the allocators' table under _keepalive_lock, calling the
    # library once per entry (the GIL let go): a fork then was likely with many entries kept
    "allocators_table": ("memory._keepalive_lock",
                         "sympool.MemPool(allocator=(segs.alloc, segs.free)).destroy()"),
    "default_pool": ("memory._default_lock", "sympool.get_default_memory_pool(0)"),
    "pool": ("pool._lock", "pool.destroy()"),  # held across sp_mempool_destroy
    "library_load": ("_lib._lock", "sympool.free(sympool.malloc(10))"),  # the first sympool call
    "annotations": ("history._annot_lock", "sympool.record_memory_history()"),
    "stream": ("stream._lock", "stream.destroy()"),  # held across sp_stream_destroy
}


@pytest.mark.parametrize("case", sorted(_FORK_CASES))
def test_fork_while_another_thread_holds_a_package_lock(case):
    # fork() copies only the calling thread: a threading lock another thread held stays held in
    # the child, which waited for ever on its next call that takes it (a thread can hold these
    # in a library call, where it lets go of the GIL, or be switched away from inside them).
    # The child's alarm ends a hung child: it must exit 0.
    lock, child_call = _FORK_CASES[case]
    code = textwrap.dedent(f"""
        import ctypes, os, signal, threading
        import sympool
        from sympool import _lib, history, memory

        class Segs:
            def __init__(self):
                self.bufs = {{}}

            def alloc(self, size, device, stream):
                b = ctypes.create_string_buffer(size + 4096)
                a = (ctypes.addressof(b) + 4095) & ~4095
                self.bufs[a] = b
                return a

            def free(self, ptr, size, device, stream):
                self.bufs.pop(ptr)

        segs = Segs()
        pool = sympool.MemPool(allocator=(segs.alloc, segs.free)) if {case != "library_load"} \
            else None
        stream = sympool.Stream() if {case == "stream"} else None
        held, done = threading.Event(), threading.Event()

        def holder():
            with {lock}:
                held.set()
                done.wait()

        t = threading.Thread(target=holder)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            {child_call}
            os._exit(0)
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"], f"the child hung on {lock}: {r.stdout} {r.stderr[-2000:]}"


# ---- torch's names take torch's keywords --------------------------------------------------------

def test_caching_allocator_calls_take_torchs_keywords(sp):
    # torch.cuda.caching_allocator_alloc(size, device=None, stream=None) and
    # caching_allocator_delete(mem_ptr): the delete was an alias of free(ptr), so code that
    # names torch's argument failed with a TypeError.
    import inspect
    assert list(inspect.signature(sp.caching_allocator_delete).parameters) == ["mem_ptr"]
    assert list(inspect.signature(sp.caching_allocator_alloc).parameters) == \
        ["size", "device", "stream"]
    before = sp.memory_allocated()
    p = sp.caching_allocator_alloc(size=1000, device=None, stream=None)
    assert sp.memory_allocated() == before + 1024
    sp.caching_allocator_delete(mem_ptr=p)
    assert sp.memory_allocated() == before
    with pytest.raises(sp.SympoolError):
        sp.caching_allocator_delete(p)  # a double free is refused, as free's


def test_fork_child_can_destroy_a_pool_another_thread_routes():
    # A thread inside use_mem_pool(pool) while the main thread forks: the child has no such
    # thread, and nothing there would ever end its routing, so the child's pool.destroy() was
    # refused for good ("still routed", use count 2) and the pool's segments stayed reserved.
    code = textwrap.dedent("""
        import os, signal, threading
        import sympool

        pool = sympool.MemPool(name="routed")
        routed, done = threading.Event(), threading.Event()

        def router():
            with sympool.use_mem_pool(pool):
                sympool.free(sympool.malloc(100))
                routed.set()
                done.wait()

        t = threading.Thread(target=router)
        t.start()
        routed.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            ok = pool.use_count() == 1
            pool.destroy()
            sympool.empty_cache()
            os._exit(0 if ok and sympool.memory_reserved() == 0 else 3)
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), pool.use_count())
        pool.destroy()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"], r.stdout + r.stderr[-2000:]


def test_fork_while_another_thread_is_inside_a_python_segment_allocator():
    # The allocator's thread let go of the GIL (os.read) inside the callback, under the device
    # lock; the fork handler waited for that lock while os.fork() held the GIL the callback
    # needed to return: the parent hung for good. Now the handler leaves the lock to the
    # callback: the parent goes on, and the child's allocator is off with a clear error.
    code = textwrap.dedent("""
        import ctypes, os, signal, threading
        import sympool

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        r, w = os.pipe()
        inside = threading.Event()

        def alloc(size, device, stream):
            inside.set()
            os.read(r, 1)  # the GIL let go; woken by the before-fork hook, needs it back
            return libc.malloc(size)

        def free(ptr, size, device, stream):
            libc.free(ctypes.c_void_p(ptr))

        pool = sympool.MemPool(allocator=(alloc, free))
        # Wakes the callback just before fork(), keeping the GIL (a PyDLL call does not let it
        # go, as os.write would: the callback could then finish before the fork).
        pywrite = ctypes.PyDLL(None).write
        os.register_at_fork(before=lambda: pywrite(w, b"x", 1))

        def work():
            with sympool.use_mem_pool(pool):
                sympool.free(sympool.malloc(1 << 20))

        t = threading.Thread(target=work)
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            try:
                sympool.malloc(4096)
                os._exit(3)
            except sympool.SympoolError as e:
                os._exit(0 if "segment allocator" in str(e) else 4)
        t.join()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        sympool.free(sympool.malloc(4096))  # the parent is unharmed
        pool.destroy()
    """)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the forking process hung")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"], r.stdout + r.stderr[-2000:]


def test_reload_of_the_library_module_keeps_the_error_classes():
    # importlib.reload(sympool._lib) made new error classes, which the package's names
    # (sympool.SympoolError, sympool.OutOfMemoryError) were not: `except sympool.SympoolError`
    # no longer caught a double free, and an OOM was no sympool.OutOfMemoryError.
    code = textwrap.dedent("""
        import importlib
        import sympool
        from sympool import _lib
        importlib.reload(_lib)
        p = sympool.malloc(100)
        sympool.free(p)
        try:
            sympool.free(p)
        except sympool.SympoolError as e:
            print("caught", e.status)
        try:
            sympool.malloc(1 << 62)
        except sympool.OutOfMemoryError:
            print("oom")
        try:
            sympool.malloc(-1)
        except sympool.InvalidArgumentError:
            print("invalid")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["caught", "SP_ERR_INVALID_USAGE", "oom", "invalid"], r.stdout
