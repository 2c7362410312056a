"""memory: the per-device caching allocator, its statistics, and MemPools (torch.cuda's names).

Every function checks its Python arguments (TypeError / ValueError) before calling the library,
and turns a failing status into SympoolError (OutOfMemoryError for SP_ERR_OUT_OF_MEMORY).
"""

import collections
import contextlib
import ctypes
import math
import numbers
import os
import pickle
import shutil
import tempfile
import threading
import weakref

from . import _lib
from ._lib import as_device, as_ptr, as_size, as_stream, bad_value, c, check, lib
from ._lib import stats_keys  # noqa: F401  (sympool.stats_keys; world.py uses it too)
from .history import (  # noqa: F401 (torch's place)
    _record_annotation, _record_memory_history, record_function, record_memory_history)
from .world import World

_SIZE_MAX = _lib.SIZE_MAX

def _answered(value):
    """value, a getter's answer (an int, a name), unless it is the stand-in (0, "none", NULL)
    the library gives when it refuses to answer on this thread: inside a callback it runs (a
    segment allocator's alloc or free), where those getters set no status. The library's own
    refusal (sp_init's, SP_ERR_INVALID_USAGE) is raised then, rather than a 0 taken for an answer
    (no device, a pool with nothing in it, pool id (0, 0))."""
    if not value or value == b"none":
        status = c.sp_init()
        if status and _lib.status_name(status) == "SP_ERR_INVALID_USAGE":
            check(status)
    return value


def backend():
    """The device backend: "cuda" or "host" ("none" if it failed to start)."""
    return _answered(lib().sp_backend_name()).decode()


def device_count():
    return int(_answered(lib().sp_device_count()))


def init():
    """Start the backend now (optional: every call starts it lazily)."""
    check(lib().sp_init())


def get_memory_info(device=0):
    """(free, total) bytes of the device as the backend reports them (torch.cuda.mem_get_info)."""
    d = as_device(device)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(lib().sp_get_memory_info(d, ctypes.byref(free), ctypes.byref(total)))
    return int(free.value), int(total.value)


def device_usage(device=0):
    """The device's memory against sympool's: {"total", "used" (total - free, anyone),
    "reserved" (sympool's device segments), "untracked" (used - reserved: NCCL, other libraries
    and processes)} in bytes."""
    d = as_device(device)
    u = _lib.DeviceUsage()
    check(lib().sp_device_usage(d, ctypes.byref(u)))
    return {"total": int(u.total), "used": int(u.used), "reserved": int(u.reserved),
            "untracked": int(u.untracked)}


mem_get_info = get_memory_info  # torch.cuda's name


def empty_cache():
    """Release every fully free cached segment of every device (not symmetric pools')."""
    try:
        _destroy_orphans()  # collected pools whose destroy was refused then: their segments go
        check(lib().sp_empty_cache())
        if _keepalive:
            _release_allocators()  # a destroyed pool's last segments may have gone now
    finally:
        _raise_free_interrupt()  # not gated on _py_allocators: the sweep may have zeroed it


def set_per_process_memory_fraction(fraction, device=0):
    """Cap this process's reserved memory on device at fraction x total (torch.cuda's name).
    As in torch.cuda, fraction must be a float: an int (even 1) is a TypeError."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`, "
                        f"not {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise bad_value(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    check(lib().sp_set_memory_fraction(float(fraction), as_device(device)))


def get_per_process_memory_fraction(device=0):
    """The fraction set by set_per_process_memory_fraction on device, as given; 1.0 if none
    (torch.cuda's name)."""
    f = ctypes.c_double()
    check(lib().sp_get_memory_fraction(as_device(device), ctypes.byref(f)))
    return float(f.value)


def memory_stats(device=0):
    """torch.cuda.memory_stats: an OrderedDict of the 122 keys, in PyTorch's order."""
    d = device if type(device) is int and 0 <= device < 1 << 31 else as_device(device)
    keys = stats_keys()
    st = _lib.Stats()
    status = c.sp_memory_stats(d, ctypes.byref(st))
    if status:
        check(status)
    return collections.OrderedDict(zip(keys, st.value[:len(keys)]))


def memory_allocated(device=0):
    return int(lib().sp_memory_allocated(_known(device)))


def max_memory_allocated(device=0):
    return int(lib().sp_max_memory_allocated(_known(device)))


def memory_reserved(device=0):
    return int(lib().sp_memory_reserved(_known(device)))


def max_memory_reserved(device=0):
    return int(lib().sp_max_memory_reserved(_known(device)))


def _known(device):
    """A device the backend has: the size_t getters return 0 for others, which would hide a
    typo'd device; refuse it instead."""
    d = as_device(device)
    n = device_count()
    if d >= n:
        raise bad_value(f"device {d} does not exist ({n} device(s) on the {backend()} backend)")
    return d


def reset_peak_memory_stats(device=0):
    check(lib().sp_reset_peak_memory_stats(as_device(device)))


def reset_accumulated_memory_stats(device=0):
    check(lib().sp_reset_accumulated_memory_stats(as_device(device)))


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary: the library's table (sp_memory_summary). abbreviated=True
    leaves out the per-pool rows ("from large pool", "from small pool"), as PyTorch's does."""
    d = as_device(device)
    size = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(size)
        check(lib().sp_memory_summary(d, buf, size))
        text = buf.value
        if len(text) < size - 1 or size >= 1 << 24:
            break
        size *= 4  # possibly truncated: ask again with more room
    text = text.decode(errors="replace")
    if abbreviated:
        text = "".join(line for line in text.splitlines(keepends=True)
                       if "from large pool" not in line and "from small pool" not in line)
    return text


def malloc(size, device=0, stream=None):
    """Allocate size bytes on device, ordered on stream; returns the address (0 for size 0). The
    thread's innermost use_mem_pool pool on that device receives it."""
    # The common case (plain ints, default stream) skips the general conversions.
    if type(size) is not int or not 0 <= size <= _SIZE_MAX:
        size = as_size(size)
    if type(device) is not int or not 0 <= device < 1 << 31:
        device = as_device(device)
    if stream is not None:
        stream = as_stream(stream)
    p = ctypes.c_void_p()
    if _py_allocators:  # a routed pool may call a Python allocator
        status = _malloc_call(c.sp_malloc, size, device, stream, ctypes.byref(p))
    else:
        status = c.sp_malloc(size, device, stream, ctypes.byref(p))
    if status:
        _raise_alloc_failure(status)
    if _py_allocators:
        _after_alloc_success(p.value)
    return p.value or 0


caching_allocator_alloc = malloc


def free(ptr):
    """Return a block from malloc (or a pool) to its pool. 0 / None is a no-op."""
    if type(ptr) is not int or not 0 < ptr <= _SIZE_MAX:
        ptr = as_ptr(ptr)
    status = c.sp_free(ptr)
    if _py_allocators:  # a destroyed pool's last block gives its segment back here
        _raise_free_interrupt()
    if status:
        check(status)


def caching_allocator_delete(mem_ptr):
    """torch.cuda.caching_allocator_delete, with its argument's name (mem_ptr): free(mem_ptr).
    As an alias of free, caching_allocator_delete(mem_ptr=p) was a TypeError."""
    free(mem_ptr)


def record_stream(ptr, stream):
    """Mark the block at ptr as used on stream: freeing it waits for that stream's work. ptr 0
    (an empty tensor's storage) is a no-op, as in PyTorch's recordStream."""
    check(lib().sp_record_stream(as_ptr(ptr), as_stream(stream)))


class Stream(_lib.Handle):
    """A sympool stream on device (sp_stream_create): a cudaStream_t on cuda, a host stream on
    host. Pass it (or its .ptr) wherever a stream is taken. destroy() releases it (once, even
    when several threads call it); so does the object's collection. Not picklable nor
    copyable."""

    def __init__(self, device=0):
        d = as_device(device)
        self.ptr = self.cuda_stream = None
        self._lock = threading.RLock()  # destroy() runs once (RLock: see MemPool)
        _pools[id(self)] = self  # its lock too is made anew in a fork's child
        s = ctypes.c_void_p()
        check(lib().sp_stream_create(d, ctypes.byref(s)))
        self.ptr = self.cuda_stream = s.value
        self.device = d
        # The library's session (sp_x_session): after an sp_shutdown the host backend's streams
        # are gone and a later stream may get this handle, so a collection then leaves it be.
        self._session = lib().sp_x_session()
        # The newest Stream made at this handle: see _stream_owner.
        _stream_owner[(self._session, self.ptr)] = id(self)

    def _owns_handle(self):
        """Whether no Stream made after this one got its handle: else the stream this one made
        was destroyed by other means (sp_stream_destroy through ctypes) and the library made
        another at the same handle, which a destroy here would take from its Stream."""
        return _stream_owner.get((self._session, self.ptr)) == id(self)

    def _forget_handle(self):
        key = (self._session, self.ptr)
        if _stream_owner.get(key) == id(self):
            _stream_owner.pop(key, None)

    def __del__(self):
        # As MemPool.__del__: a collected Stream releases its stream (the host backend's struct,
        # a cudaStream_t), or every Stream never destroyed explicitly leaked one. No lock: an
        # object being collected is unreachable, so no destroy() can run on it. Never raises.
        # Blocks still live on the stream stay valid, as after destroy(): the library keeps their
        # segments (apart from the stream's cache) until they are freed.
        ptr = getattr(self, "ptr", None)
        if ptr is None:
            return
        try:
            # Not live: destroyed by other means (sp_stream_destroy through ctypes), its handle
            # not made again: the destroy would be refused, with a warning. -1 (inside a
            # callback): the destroy below is refused and queued, and the retry asks again.
            if c.sp_x_session() == self._session and self._owns_handle() and \
                    c.sp_x_stream_live(ptr) != 0:
                status = c.sp_stream_destroy(ptr)
                if status != 0 and _lib.status_name(status) in _STREAM_RETRY and \
                        not _stream_holds(ptr, self._session, but=self):
                    # Refused for now (inside a callback the library runs, during a graph
                    # capture): the next empty_cache or MemPool destroy tries again. Not when
                    # another Stream holds the handle: see _stream_holds.
                    _orphan_streams.append((ptr, self._session))
            self._forget_handle()
            self.ptr = self.cuda_stream = None
        except Exception:
            pass  # interpreter shutdown (module globals gone) or a refusal: nothing to raise to

    def synchronize(self):
        check(lib().sp_stream_synchronize(self._live()))

    def destroy(self):
        # Under the lock: two threads destroying one stream must not both reach
        # sp_stream_destroy (on cuda a destroyed handle is undefined behaviour).
        with self._lock:
            if self.ptr is not None:
                # A handle another Stream was made at since (this one's stream destroyed by
                # other means) is that Stream's, and one no longer live (destroyed by other
                # means, not made again) is no stream: this one's stream is gone already.
                if lib().sp_x_session() == self._session and self._owns_handle() and \
                        lib().sp_x_stream_live(self.ptr) != 0:
                    check(lib().sp_stream_destroy(self.ptr))
                self._forget_handle()
                self.ptr = self.cuda_stream = None

    def _live(self):
        if self.ptr is None:
            raise _lib.SympoolError("SP_ERR_INVALID_USAGE", "this Stream was destroyed")
        return self.ptr

    def __repr__(self):
        return f"<sympool.Stream {self.ptr:#x} device={self.device}>" if self.ptr else \
            "<sympool.Stream destroyed>"


# ---- MemPools -------------------------------------------------------------------------------

# Segment-allocator callbacks a pool may call after the Python MemPool object is gone (segments
# holding live blocks are handed back when those blocks are freed): kept, by pool handle, until
# the pool is destroyed and holds no segment (a destroyed pool takes no new one, so the library
# can never call them again); _release_allocators drops those. The C allocator calls them under
# its device lock, under which the pool is marked released after its last segment's free: a
# released answer from sp_x_mempool_released is after the last call returned. Each value: [the
# _lib.Allocator, destroyed?]. The allocator goes in only when the MemPool object lets go of it
# (destroy(), or its collection): while the object lives it holds the allocator itself, and a
# table entry made at creation kept alive, through the callbacks' closures, an allocator object
# that refers to its own pool (MemPool(self) in its __init__), so neither was ever collected, and
# the pool never destroyed.
# These and the other module state below outlive importlib.reload (Jupyter's autoreload runs
# this file again in the same namespace): a fresh {} here dropped the only reference to a
# destroyed pool's callbacks, and the library's next call into them ran freed memory.
_keepalive = globals().get("_keepalive", {})
_keepalive_lock = globals().get("_keepalive_lock") or threading.Lock()


# Handles of pools collected (MemPool.__del__) when the library refused to destroy them: the
# collection ran inside a callback it was running (a Python segment allocator allocates, and
# any allocation may start a collection), or while the pool was still routed (a suspended
# generator inside use_mem_pool, collected in the same cycle, closes after the pool goes). No
# Python object is left to destroy them later, and their cached segments stayed reserved until
# the process ended: the next empty_cache() or destroy() destroys them (_destroy_orphans).
_orphans = globals().get("_orphans", [])


# Streams Stream.__del__ could not destroy, as (handle, session): the library refused for now
# (a collection inside a callback it runs; a graph capture under way). _destroy_orphans retries.
_orphan_streams = globals().get("_orphan_streams", [])
# The newest live Stream made at each handle, as {(session, handle): id(Stream)}: one made at a
# handle that another Stream still holds means the library destroyed that one's stream by other
# means (sp_stream_destroy through ctypes) and reused its handle; the older Stream's collection
# or destroy() then destroyed the newer one's stream. Single dict operations (atomic under the
# GIL): a collection may run this anywhere, and takes no lock. A stream made at the handle
# outside this package cannot be seen here.
_stream_owner = globals().get("_stream_owner", {})
# The refusals that may pass: a callback's (the gate's SP_ERR_INVALID_USAGE) and a capture's.
_STREAM_RETRY = ("SP_ERR_INVALID_USAGE", "SP_ERR_BUSY")


def _stream_holds(ptr, session, but=None):
    """Whether a live Stream other than but holds handle ptr of this library session. Then the
    library made a stream at ptr again, so the stream a queued destroy of ptr meant is gone: its
    handle was destroyed by other means (sp_stream_destroy through ctypes) before the refused
    destroy, or since. The refusal itself cannot tell: the callback gate refuses before it looks
    at the handle. Retrying then destroyed the other Stream's stream. Only the queue asks (rare),
    so collections pay nothing; a stream made at ptr outside this package cannot be seen here."""
    for o in list(_pools.values()):
        if isinstance(o, Stream) and o is not but and o.ptr == ptr and \
                getattr(o, "_session", None) == session:
            return True
    return False


def _destroy_orphan_streams():
    """Destroy the streams Stream.__del__ could not. Called outside any callback (sp_init
    answered), so only a capture still under way (SP_ERR_BUSY) keeps one for later; one from
    before an sp_shutdown, one whose handle a live Stream holds now (_stream_holds), or one
    refused otherwise (destroyed meanwhile), is dropped."""
    later = []
    while True:
        try:
            ptr, session = _orphan_streams.pop()  # atomic: a collection may append meanwhile
        except IndexError:
            break
        if session == c.sp_x_session() and not _stream_holds(ptr, session) and \
                c.sp_x_stream_live(ptr) != 0:
            status = c.sp_stream_destroy(ptr)
            if status != 0 and _lib.status_name(status) == "SP_ERR_BUSY":
                later.append((ptr, session))
    _orphan_streams.extend(later)


def _destroy_orphans():
    """Destroy the pools MemPool.__del__ could not, where the library now lets us: not inside a
    callback (sp_init refuses there too, and the attempt waits for a later call). One still
    routed (its use count above the creator's 1) stays for a later call; one refused for another
    reason (destroyed meanwhile) is dropped. The streams Stream.__del__ could not destroy too."""
    if not (_orphans or _orphan_streams) or c.sp_init() != 0:
        return
    if _orphan_streams:
        _destroy_orphan_streams()
    if not _orphans:
        return
    later = []
    while True:
        try:
            h = _orphans.pop()  # atomic: a collection may append while we walk
        except IndexError:
            break
        if c.sp_mempool_destroy(h) == 0:
            entry = _keepalive.get(h)
            if entry is not None:
                entry[1] = True  # its allocator goes once its last segment has
        elif c.sp_mempool_use_count(h) > 1:
            later.append(h)
    _orphans.extend(later)
    if _keepalive:
        _release_allocators()


def _release_allocators():
    """Drop the callbacks of destroyed pools that hold no segment any more (after a destroy, an
    empty_cache: the calls that release a destroyed pool's last segments)."""
    global _py_allocators
    with _keepalive_lock:
        # Asked quietly: a query (total_bytes) of a released handle warned on stderr.
        dead = [h for h, (_, destroyed) in _keepalive.items()
                if destroyed and lib().sp_x_mempool_released(h) != 0]
        for h in dead:
            del _keepalive[h]
        _py_allocators -= len(dead)

# What a Python segment allocator's alloc raised (or returned that is not an address) on this
# thread, kept for the malloc that called it: an exception cannot cross the library's C frames,
# so the callback gives the library NULL (out of memory) and the malloc raises after the call,
# its OutOfMemoryError chained to the cause, or the cause itself for a KeyboardInterrupt or
# SystemExit. _py_allocators counts the pools with one, so that malloc looks only then.
# _callback.calls counts this thread's sympool mallocs in progress (_malloc_call): only under one
# does an interrupt stop the call's further allocations, since only then is it raised after.
_callback = globals().get("_callback") or threading.local()
_py_allocators = globals().get("_py_allocators", 0)


def _take_callback_error():
    err = getattr(_callback, "error", None)
    if err is not None:
        _callback.error = None
    return err


def _keep_interrupt(err):
    """Keep err (not an Exception) for this thread's sympool call to raise after the library
    returns; an interrupt already kept stays (the first one is the user's)."""
    pending = getattr(_callback, "error", None)
    if pending is None or isinstance(pending, Exception):
        _callback.error = err


def _raise_free_interrupt():
    """Raise the interrupt a Python segment allocator's free raised during the call that just
    returned (empty_cache, free_all_blocks, destroy, free), if any."""
    err = getattr(_callback, "error", None)
    if err is not None and not isinstance(err, Exception):
        _callback.error = None
        raise err


def _malloc_call(fn, *args):
    """fn(*args), a sympool malloc whose failure this module raises (_raise_alloc_failure)."""
    _take_callback_error()  # nothing from an earlier call may be blamed on this one
    _callback.calls = getattr(_callback, "calls", 0) + 1
    try:
        return fn(*args)
    finally:
        _callback.calls -= 1


def _raise_alloc_failure(status):
    """Raise for a failing malloc status, with what a Python segment allocator raised during
    the call as the cause."""
    err = _take_callback_error()
    if err is None:
        check(status)
    if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: the caller's to see
        raise err
    try:
        check(status)
    except _lib.SympoolError as e:
        raise e from err


def _after_alloc_success(ptr):
    """A malloc succeeded although a Python allocator raised during it (the library's retry
    found memory): an interrupt still reaches the caller, the block given back first."""
    err = _take_callback_error()
    if err is not None and not isinstance(err, Exception):
        if ptr:
            lib().sp_free(ptr)
        raise err


def _address_from_allocator(value):
    """What a Python segment allocator's alloc returned, as an address for the library (None:
    out of memory). Anything that is not an int in [0, SIZE_MAX] is refused here: ctypes would
    otherwise hand the library an undefined value, which it would take for a segment."""
    if value is None:
        return None
    v = _lib.as_int(value, "what a segment allocator's alloc returns (an address; 0 or None "
                    "for out of memory)")
    if not 0 <= v <= _SIZE_MAX:
        raise ValueError(f"a segment allocator's alloc returned {v:#x}, which is not an address")
    return v or None


def _segment_allocator(allocator):
    """An sp_allocator_t from a Python allocator: an object with alloc(size, device, stream) ->
    int and free(ptr, size, device, stream), or an (alloc, free) pair of callables."""
    if isinstance(allocator, _lib.Allocator):
        return allocator
    if isinstance(allocator, tuple) and len(allocator) == 2:
        alloc_fn, free_fn = allocator
    else:
        alloc_fn = getattr(allocator, "alloc", None) or getattr(allocator, "malloc", None)
        free_fn = getattr(allocator, "free", None)
    if not callable(alloc_fn) or not callable(free_fn):
        raise TypeError("allocator must have alloc(size, device, stream) -> int and "
                        "free(ptr, size, device, stream), or be an (alloc, free) pair")

    def c_alloc(size, device, stream, ctx):
        pending = getattr(_callback, "error", None)
        if pending is not None and not isinstance(pending, Exception):
            if getattr(_callback, "calls", 0):
                return None  # interrupted: no more allocations in this malloc (its retry included)
            # Interrupted under a C caller (PyTorch's allocator after sympool.torch.enable()),
            # which no sympool malloc raises it after: kept, it failed every later allocation
            # of this thread's routed pools without asking the allocator again.
            _callback.error = pending = None
        try:
            ptr = _address_from_allocator(alloc_fn(size, device, stream))
        except BaseException as e:  # the pool sees out of memory; malloc raises after the call
            _callback.error = e
            return None
        if pending is not None:
            _callback.error = None  # a retry succeeded: the earlier failure is no longer news
        return ptr

    def c_free(ptr, size, device, stream, ctx):
        try:
            free_fn(ptr, size, device, stream)
        except Exception:
            pass
        except BaseException as e:
            # A KeyboardInterrupt (Ctrl-C during a long release) or SystemExit: ctypes would
            # print it and drop it, and the program went on as if nobody had asked it to stop.
            # Kept instead for the sympool call that released the segment to raise once the
            # library has returned (_raise_free_interrupt; a malloc raises it as its own).
            _keep_interrupt(e)

    return _lib.Allocator(_lib.ALLOC_FN(c_alloc), _lib.FREE_FN(c_free), None)


class MemPool(_lib.Handle):
    """torch.cuda.MemPool(allocator, use_on_oom, no_split) with CuPy's queries. symmetric=True
    makes a symmetric pool on world's device (collective over world: every rank creates it, and
    every malloc is collective)."""

    def __init__(self, allocator=None, use_on_oom=False, no_split=False, *, symmetric=False,
                 name=None, device=0, world=None):
        self._handle = None
        self._lock = threading.RLock()  # destroy() runs once; RLock: its allocator may call it
        _pools[id(self)] = self  # its lock is made anew in a fork's child (_after_fork_in_child)
        self._symmetric = symmetric
        self._user_allocator = allocator
        self._world = world
        try:
            params = self._params(allocator, use_on_oom, no_split, symmetric, name, world)
        except Exception:
            # A symmetric create is collective: a rank whose own arguments are refused still
            # joins the call (refused there too), so that every rank fails instead of its peers
            # waiting in the agreement until the timeout.
            if symmetric and isinstance(world, World):
                world._join_refused_create()
            raise
        handle = ctypes.c_void_p()
        if symmetric:
            self._device = world.device
            handle.value = world.create_symmetric_pool(params, self)
        else:
            self._device = as_device(device)
            params.device = self._device
            if allocator is not None:
                # Inside a callback the library runs (a segment allocator's alloc or free) it
                # holds its device lock and refuses the create: refused here before the table's
                # lock is taken, since _release_allocators holds that lock while it calls into
                # the library (which takes the device lock): in the other order, this thread and
                # one releasing allocators would wait on each other for good.
                _answered(0)
                self._allocator = _segment_allocator(allocator)
                params.allocator = ctypes.pointer(self._allocator)
                global _py_allocators
                with _keepalive_lock:
                    _py_allocators += 1  # before the create: the pool may call it right away
            status = lib().sp_mempool_create(ctypes.byref(params), ctypes.byref(handle))
            if allocator is not None:
                with _keepalive_lock:
                    if status == 0:  # kept until the pool is destroyed and holds no segment
                        _keepalive[handle.value] = [None, False]
                    else:  # no pool: nothing will ever call it
                        _py_allocators -= 1
            check(status)
        self._handle = handle.value
        self._name = name
        # The library's session: an sp_shutdown (a C caller's, ctypes') releases every pool, so
        # a collection after one has nothing to destroy (see __del__).
        self._session = lib().sp_x_session()

    def _params(self, allocator, use_on_oom, no_split, symmetric, name, world):
        """The arguments checked (this rank alone) and made into an _lib.MemPoolParams."""
        for flag, what in ((use_on_oom, "use_on_oom"), (symmetric, "symmetric"),
                           (no_split, "no_split")):
            if not isinstance(flag, bool):
                raise TypeError(f"{what} must be a bool, not {type(flag).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if name is not None and "\0" in name:
            raise bad_value("name contains a NUL character")
        if symmetric and not isinstance(world, World):
            raise bad_value("MemPool(symmetric=True) needs world=sympool.World(...)")
        if symmetric and allocator is not None:
            raise bad_value("a symmetric pool takes its segments from sympool: no allocator")
        if not symmetric and world is not None:
            raise bad_value("world is only for symmetric=True")
        params = _lib.MemPoolParams()
        lib().sp_mempool_params_init(ctypes.byref(params))
        params.use_on_oom, params.no_split = use_on_oom, no_split
        self._name_bytes = name.encode(errors="surrogatepass") if name is not None else None
        params.name = self._name_bytes
        self._owned = True
        return params

    def _h(self):
        if self._handle is None:
            raise _lib.SympoolError("SP_ERR_INVALID_USAGE", "this MemPool was destroyed")
        return self._handle

    def _answer(self, value):
        """value, a query's answer, as _answered gives it, unless it is the library's stand-in
        for a stale handle: an sp_shutdown (a C caller's, one through ctypes) released the pool,
        and the library answers its handle's queries with 0 (id (0, 0), the default pool's).
        Raised then, as for a destroyed pool. Looked at only for a 0, so answers cost nothing
        more; the default pool's object follows the session itself (_DefaultMemPool)."""
        value = _answered(value)
        if not value and self._owned and self._session != c.sp_x_session():
            raise _lib.SympoolError(
                "SP_ERR_INVALID_USAGE", "this MemPool's pool was released by an sp_shutdown "
                "(its handle is stale); create the pool again")
        return value

    @property
    def id(self):
        pid = lib().sp_mempool_id(self._h())
        if self._owned:  # {0,0} is the default pool's, or the library's "cannot answer here"
            self._answer(pid.second)
        return (int(pid.first), int(pid.second))

    @property
    def allocator(self):
        """The segment allocator given at creation (None: the device backend), as torch's."""
        return self._user_allocator

    @property
    def is_symmetric(self):
        return bool(self._answer(lib().sp_mempool_is_symmetric(self._h())))

    @property
    def device(self):
        return self._device

    @property
    def name(self):
        return self._name

    def use_count(self):
        return int(self._answer(lib().sp_mempool_use_count(self._h())))

    def malloc(self, size, stream=None):
        """Allocate in this pool; collective over the world when the pool is symmetric."""
        h, p = self._h(), ctypes.c_void_p()
        if self._symmetric:
            try:
                n, s = as_size(size), as_stream(stream)
            except Exception:
                # Join the collective with a size every rank refuses (and no stream: this one's
                # may be what failed), so that the other ranks get an error instead of waiting
                # for this one; then raise the local reason. Any exception: a destroyed Stream
                # is a SympoolError.
                lib().sp_symmetric_malloc(h, _lib.SIZE_MAX, None, ctypes.byref(p))
                if p.value:
                    lib().sp_free(p)
                raise
            check(lib().sp_symmetric_malloc(h, n, s, ctypes.byref(p)))
        else:
            n, s = as_size(size), as_stream(stream)
            status = _malloc_call(lib().sp_mempool_malloc, h, n, s, ctypes.byref(p))
            if status:
                _raise_alloc_failure(status)
            if _py_allocators:
                _after_alloc_success(p.value)
        return p.value or 0

    def used_bytes(self):
        return int(self._answer(lib().sp_mempool_used_bytes(self._h())))

    def total_bytes(self):
        return int(self._answer(lib().sp_mempool_total_bytes(self._h())))

    def free_bytes(self):
        return int(self._answer(lib().sp_mempool_free_bytes(self._h())))

    def n_free_blocks(self):
        return int(self._answer(lib().sp_mempool_n_free_blocks(self._h())))

    def free_all_blocks(self, stream=None):
        """Release the pool's fully free segments (only stream's if given). Collective
        (sp_symmetric_empty_cache) for a symmetric pool, where stream must be None."""
        if self._symmetric:
            status = lib().sp_symmetric_empty_cache(self._h())  # joined even on a bad stream
            if stream is not None:  # ... so that no other rank waits for this one
                raise bad_value("a symmetric pool releases its segments on every stream at once: "
                                "pass stream=None")
            check(status)
            return
        try:
            check(lib().sp_mempool_free_all_blocks(self._h(), as_stream(stream)))
        finally:
            _raise_free_interrupt()

    def set_limit(self, size=None, fraction=None):
        """Cap the pool's total bytes (CuPy's set_limit): size in bytes, or fraction of the
        device's total memory; 0 or neither removes the limit. A request past it raises
        OutOfMemoryError. As CuPy's, size may be a float (set_limit(size=2e9)), truncated."""
        if size is not None and fraction is not None:
            raise bad_value("set_limit takes size or fraction, not both")
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
                raise TypeError(f"fraction must be a float, not {type(fraction).__name__}")
            if not 0.0 <= fraction <= 1.0:
                raise bad_value(f"fraction must be in [0, 1], got {fraction}")
            size = int(get_memory_info(self._device)[1] * fraction)
        elif isinstance(size, numbers.Real) and not isinstance(size, (bool, numbers.Integral)) \
                and not hasattr(type(size), "__index__"):
            # CuPy stores the size as a size_t, which takes a float (its own fraction path
            # passes one): 2e9 is 2000000000 there, so it is here.
            f = float(size)
            if not (math.isfinite(f) and f >= 0):
                raise bad_value(f"size must be a finite number >= 0, got {size!r}")
            size = int(f)
        check(lib().sp_mempool_set_limit(self._h(), 0 if size is None else as_size(size)))

    def get_limit(self):
        return int(self._answer(lib().sp_mempool_get_limit(self._h())))

    def snapshot(self, include_traces=True):
        """This pool's snapshot as a dict with PyTorch's structure (its segments, and the traces
        filtered to its events; include_traces=False leaves the traces empty)."""
        h = self._h()
        return _without_traces(_snapshot_via(lambda path: lib().sp_mempool_dump_snapshot(h, path)),
                               include_traces)

    def dump_snapshot(self, path):
        check(lib().sp_mempool_dump_snapshot(self._h(), _path_bytes(path)))

    def destroy(self):
        """Drop the pool now (collective for a symmetric pool). Blocks still live stay valid and
        return their segments when freed. A plain pool is also destroyed when collected. A
        second call (from any thread) does nothing."""
        if self._handle is None:
            return
        if not self._owned:
            raise bad_value("the default pool is never destroyed")
        try:
            self._destroy()
        finally:
            _raise_free_interrupt()  # the segments given back ran the allocator's free

    def _destroy(self):
        with self._lock:
            if self._handle is None:
                return
            if self._symmetric:
                self._world.destroy_symmetric_pool(self._handle, self)
            else:
                check(lib().sp_mempool_destroy(self._handle))
            h, self._handle = self._handle, None
            with _keepalive_lock:
                entry = _keepalive.get(h)
                if entry is not None:
                    entry[0], entry[1] = self._allocator, True
            if entry is not None:
                _release_allocators()
        _destroy_orphans()

    def __del__(self):
        # Symmetric pools are never destroyed here: collection order differs between ranks and
        # destroy is collective. World.finalize releases them.
        if getattr(self, "_handle", None) is not None and not self._symmetric and self._owned:
            # First of all (nothing below may fail before it): this object is going, so the
            # table keeps the callbacks the pool may still call.
            entry = _keepalive.get(self._handle)
            if entry is not None:
                entry[0] = self._allocator
            try:
                if getattr(self, "_session", None) not in (None, lib().sp_x_session()):
                    # Released by an sp_shutdown since: its destroy was refused (a stale
                    # handle, said on stderr), queued, and refused again at every empty_cache.
                    if entry is not None:
                        entry[1] = True
                elif lib().sp_mempool_destroy(self._handle) == 0:
                    # Marked only: the next destroy or empty_cache drops its allocator. No lock
                    # and no sweep here: a collection can run this inside either, on this thread.
                    if entry is not None:
                        entry[1] = True
                else:  # refused for now: the next empty_cache or destroy tries again
                    _orphans.append(self._handle)
                self._handle = None
            except Exception:
                pass

    def _released(self):
        """The world released this symmetric pool (World.finalize)."""
        self._handle = None

    def __repr__(self):
        if self._handle is None:
            return "<sympool.MemPool destroyed>"
        kind = "symmetric " if self._symmetric else ""
        try:
            figures = (f"id={self.id} name={self._name!r} device={self._device} "
                       f"used={self.used_bytes()} total={self.total_bytes()}")
        except _lib.SympoolError:  # inside a segment allocator: the library does not answer
            figures = f"name={self._name!r} device={self._device}"
        return f"<sympool.MemPool {kind}{figures}>"


# The pools this thread's use_mem_pool contexts routed, innermost last. The library ends only the
# innermost routing (sp_mempool_end); torch.cuda.use_mem_pool ends a pool's routing wherever it
# is (endAllocateToPool finds it by id), so contexts may close out of order: interleaved
# generators or asyncio tasks on one thread, an ExitStack popped by hand. Each entry is
# (handle, session): an sp_shutdown (a C caller's, one through ctypes) ends every routing in the
# library, so the entries of an earlier session are dropped on sight, as the library drops its
# own (route_depth); kept, they stayed for good, and a pool entered after them was ended and
# routed again around a handle the library refuses.
_routes = globals().get("_routes") or threading.local()  # kept across a reload, as _keepalive


def _route_stack():
    stack = getattr(_routes, "stack", None)
    if stack is None:
        stack = _routes.stack = []
    elif stack and stack[0][1] != c.sp_x_session():  # the oldest goes first: one look suffices
        session = c.sp_x_session()
        stack[:] = [e for e in stack if e[1] == session]
    return stack


def _end_routing(h, session):
    stack = _route_stack()
    if session != c.sp_x_session():
        raise _lib.SympoolError(
            "SP_ERR_INVALID_USAGE", "use_mem_pool: this pool's routing was ended by an "
            "sp_shutdown (its handle is stale); nothing is routed to it any more")
    if (h, session) not in stack:  # ended by other means: the library says what it knows
        check(lib().sp_mempool_end(h))
        return
    i = len(stack) - 1 - stack[::-1].index((h, session))
    above = stack[i + 1:]
    # Out of order: end the pools entered after this one, this one, then route them again in
    # the same order, so that the innermost stays innermost.
    for a, _ in reversed(above):
        check(lib().sp_mempool_end(a))
    del stack[i + 1:]
    check(lib().sp_mempool_end(h))
    del stack[i]
    for a, s in above:
        check(lib().sp_mempool_begin(a))
        stack.append((a, s))


class use_mem_pool(contextlib.ContextDecorator):  # noqa: N801 (torch's name)
    """Route this thread's allocations on the pool's device into pool (torch.cuda.use_mem_pool).
    Nested contexts stack (the innermost receives); as in torch, they may also close out of
    order (interleaved generators or asyncio tasks on one thread), each ending only its pool.
    Leaving the context on another thread than the one that entered it is refused (routing is
    per thread), and it stays open for that thread to leave. As torch's (a
    contextlib.contextmanager), it also decorates a function: each call a context of its own."""

    def __init__(self, pool, device=None):
        self._pool, self._device = pool, device
        self._handle = self._thread = None
        self._used = False

    def _recreate_cm(self):  # ContextDecorator: a fresh context for each decorated call
        return type(self)(self._pool, self._device)

    def __enter__(self):
        pool = self._pool
        if not isinstance(pool, MemPool):
            raise TypeError(f"use_mem_pool needs a sympool.MemPool, not {type(pool).__name__}")
        if self._device is not None and as_device(self._device) != pool.device:
            raise bad_value(f"pool is on device {pool.device}, not {as_device(self._device)}")
        if self._used:
            raise RuntimeError("this use_mem_pool context was already entered; make a new one")
        h = pool._h()
        check(lib().sp_mempool_begin(h))
        self._used = True
        self._session = lib().sp_x_session()
        _route_stack().append((h, self._session))
        self._handle, self._thread = h, threading.get_ident()
        return pool

    def __exit__(self, *exc):
        if self._handle is None:
            return False  # left already
        if threading.get_ident() != self._thread:
            raise _lib.SympoolError(
                "SP_ERR_INVALID_USAGE", "use_mem_pool: this context was entered on another "
                "thread; leave it on that thread (routing is per thread: that thread's "
                "allocations still go to the pool)")
        h, self._handle = self._handle, None
        _end_routing(h, self._session)
        return False


# ---- fork ------------------------------------------------------------------------------------

# os.fork() while another thread is inside a Python segment allocator (docs/API.md, Python): the
# callback runs under its device's lock and needs the GIL, which os.fork() holds through fork(),
# to return, so the library's fork handler leaves that lock to it, and the child's allocator is
# off (SympoolError, SP_ERR_DEVICE). No before-fork hook here takes the library's locks: os.fork()
# takes CPython's import lock after the hooks, and a thread importing a module that allocates
# would wait for the device lock such a hook held.

# The MemPool and Stream objects alive, for their locks (weak: one goes when nothing else holds
# it). A Stream's destroy() holds its lock across sp_stream_destroy too.
_pools = globals().get("_pools") or weakref.WeakValueDictionary()


def _after_fork_in_child():
    """A fork taken while another thread held one of this module's locks (sweeping the table of
    allocators in empty_cache or destroy, making the default pool, destroying a pool: each
    around a library call, during which that thread lets go of the GIL) gave the child a lock
    held by a thread the child does not have: its next MemPool(allocator=...), destroy() or
    empty_cache() waited for ever. The child, one thread now, starts with every lock free. What
    such a lock guarded is consistent in the child (the library's own fork handlers wait for
    its calls), or off in the safe direction (an allocator counted a sweep too late: malloc
    looks for a Python allocator's error when it need not)."""
    global _keepalive_lock, _default_lock
    _keepalive_lock = threading.Lock()
    _default_lock = threading.Lock()
    for pool in list(_pools.values()):
        pool._lock = threading.RLock()


if "_memory_forks_handled" not in globals():  # once, reloads included
    _memory_forks_handled = True
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- snapshots ------------------------------------------------------------------------------

def _path_bytes(path):
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, not {type(path).__name__}")
    p = os.fsencode(path)
    if not p or b"\0" in p:
        raise bad_value("path is empty or contains a NUL character")
    return p


def _snapshot_via(dump):
    """Run dump(path) into a private temporary file and load it. Our pickles hold only data
    opcodes (dicts, lists, strings, numbers), written by the library itself into a folder only
    this user can write, so loading them runs no code."""
    folder = tempfile.mkdtemp(prefix="sympool-snapshot-")
    try:
        path = os.path.join(folder, "snapshot.pickle")
        # The library expands %r, %p, %h and %% in a path (history.h): the folder is the
        # temporary directory's, which may hold a '%' of its own, so every '%' is written %%.
        check(dump(os.fsencode(path).replace(b"%", b"%%")))
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _without_traces(snap, include_traces):
    if not include_traces:
        snap["device_traces"] = [[] for _ in snap.get("device_traces", [])]
    return snap


def snapshot(device=None, include_traces=True):
    """The process's snapshot as a dict with PyTorch's structure (torch.cuda.memory._snapshot):
    "segments", "device_traces", "allocator_settings", "external_annotations". device is
    accepted for torch's signature (the snapshot covers every device)."""
    if device is not None:
        as_device(device)
    return _without_traces(_snapshot_via(lambda path: lib().sp_dump_snapshot(path)),
                           include_traces)


def _check_augment(augment_with_fx_traces):
    """Newer torch's augment_with_fx_traces: sympool records no FX traces to add to the frames,
    so the flag changes nothing; it is checked to be a bool, as torch uses it as one."""
    if not isinstance(augment_with_fx_traces, bool):
        raise TypeError("augment_with_fx_traces must be a bool, not "
                        f"{type(augment_with_fx_traces).__name__}")


def _snapshot(device=None, augment_with_fx_traces=False):
    """torch.cuda.memory._snapshot, with its signature: the second argument is torch's
    augment_with_fx_traces (_check_augment), not snapshot()'s include_traces, so that
    _snapshot(None, False) keeps the traces as torch's does."""
    _check_augment(augment_with_fx_traces)
    return snapshot(device)


def memory_snapshot(mempool_id=None, include_traces=True):
    """torch.cuda.memory_snapshot: the snapshot's segments (a list of dicts); with mempool_id
    (a MemPool's id tuple, or a MemPool) only that pool's segments. (0, 0) is no pool, as
    None is: torch passes None on as (0, 0), and its allocator's snapshot() filters by pool
    only for another id (CUDACachingAllocator.cpp), so both give every segment."""
    segments = snapshot(include_traces=include_traces)["segments"]
    if mempool_id is None:
        return segments
    if isinstance(mempool_id, MemPool):
        mempool_id = mempool_id.id
    if isinstance(mempool_id, (str, bytes)) or not hasattr(mempool_id, "__iter__"):
        raise TypeError("mempool_id must be a (int, int) pool id or a MemPool, not "
                        f"{type(mempool_id).__name__}")
    want = tuple(_lib.as_int(v, "mempool_id's item") for v in mempool_id)
    if len(want) != 2 or min(want) < 0:
        raise bad_value(f"mempool_id must be a (int, int) pool id, got {mempool_id!r}")
    if want == (0, 0):
        return segments
    return [s for s in segments if tuple(s.get("segment_pool_id", ())) == want]


def dump_snapshot(path="dump_snapshot.pickle"):
    """Write the snapshot: ".json" -> JSON, else a pickle PyTorch's memory viewer opens. %r, %p
    and %h in path become the rank, the pid and the host name, %% one '%'."""
    check(lib().sp_dump_snapshot(_path_bytes(path)))


def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
    """torch.cuda.memory._dump_snapshot's name, default file and signature (_check_augment)."""
    _check_augment(augment_with_fx_traces)
    dump_snapshot(filename)


# ---- the default pool (CuPy's get_default_memory_pool) ---------------------------------------

_default_pools = globals().get("_default_pools", {})  # kept across a reload, as _keepalive
_default_lock = globals().get("_default_lock") or threading.Lock()


class _DefaultMemPool(MemPool):
    """A device's default pool (get_default_memory_pool). An sp_shutdown (a C caller's, one
    through ctypes) releases every pool, the default ones too, and the library's next call
    makes them anew: the handle is looked up again then, so that the object (one per device,
    kept) never hands the released pool's handle to the library. It did: used_bytes() and the
    rest said 0, with a "stale handle" warning, while the new session's pool held blocks."""

    @property
    def _handle(self):
        h = self.__dict__.get("_default_handle")
        try:
            if h is not None and self.__dict__.get("_session") != c.sp_x_session():
                new = c.sp_default_mempool(self._device)
                if new:
                    self.__dict__["_default_handle"] = h = new
                    self.__dict__["_session"] = c.sp_x_session()
        except Exception:
            pass  # interpreter shutdown (module globals gone): the handle as it was
        return h

    @_handle.setter
    def _handle(self, value):
        self.__dict__["_default_handle"] = value


def get_default_memory_pool(device=0):
    """The device's default pool as a MemPool (CuPy's cupy.get_default_memory_pool()): the pool
    sympool.malloc uses outside use_mem_pool, with used_bytes(), total_bytes(), free_bytes(),
    n_free_blocks(), free_all_blocks(), set_limit() and get_limit(). Never destroyed."""
    d = as_device(device)
    with _default_lock:
        pool = _default_pools.get(d)
        if pool is None or pool._handle is None:
            session = lib().sp_x_session()
            handle = _answered(lib().sp_default_mempool(d))
            if not handle:
                raise bad_value(f"device {d} does not exist ({device_count()} device(s) on the "
                                f"{backend()} backend)")
            pool = _DefaultMemPool.__new__(_DefaultMemPool)
            pool._handle, pool._owned, pool._symmetric = handle, False, False
            pool._lock = threading.RLock()
            pool._user_allocator = pool._world = pool._name = None
            pool._device = d
            pool._session = session
            _default_pools[d] = pool
        return pool


# importlib.reload (Jupyter's autoreload) runs this file again: the classes would be made anew,
# and a MemPool or Stream made before it would fail every isinstance check after it ("use_mem_pool
# needs a sympool.MemPool, not MemPool"). The first import's classes stay, as _lib.py keeps its
# error classes; their methods read this module's (reloaded) functions and state.
_first_classes = globals().get("_first_classes") or (Stream, MemPool, use_mem_pool,
                                                      _DefaultMemPool)
Stream, MemPool, use_mem_pool, _DefaultMemPool = _first_classes
