"""history: torch.cuda.memory._record_memory_history's meanings, with Python frames.

While recording asks for stacks, a frames hook (sp_history_set_frames_hook) gives the library the
allocating thread's Python frames, innermost first, skipping this package's own frames. The hook
runs on the allocating thread before the library takes any lock; on a thread with no Python
frames (a C++ thread of torch) it gives none.

The hook is the library's own sp_history_python_frames, which reads the frames through CPython's
C API, where the library can reach that API (sp_history_python_frames_supported: CPython 3.9+);
elsewhere it is _frames below, a ctypes callback that gives the same frames at over ten times
the cost (bench/python_history.py: the trampoline, two ctypes fields set a frame, f_lineno).
"""

import ctypes
import os
import sys
import threading

from . import _lib
from ._lib import as_int, bad_value, check, lib

_ENABLED = {None: 0, "state": 1, "all": 2}
_CONTEXT = {None: 0, "state": 1, "alloc": 2, "all": 3}
_STACKS = ("python", "all")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The package's own frames are those under its folder: a file beside it whose name merely starts
# the same (sympool_utils.py, a sympoolx/ package) is the user's, and its frames were dropped.
_SKIP_PREFIX = os.path.join(_PACKAGE_DIR, "")

# The state below outlives importlib.reload (which runs this file again in the same namespace):
# the library may hold the installed hook and its argument, which a fresh `= None` here freed
# (the next capture read freed memory). Each is made once, on first import.
_hook_lock = globals().get("_hook_lock") or threading.Lock()
# the installed FRAMES_FN (kept alive while installed, and after: see _install)
_hook = globals().get("_hook")
_hook_arg = globals().get("_hook_arg")  # its argument (the native hook's, else None)
# str -> bytes for names and file names (the library copies them per context); the native hook
# keeps here only the strs CPython cannot give as UTF-8 (a lone surrogate)
_encoded = globals().get("_encoded", {})


def _after_fork_in_child():
    """A fork taken while another thread was inside _install gave the child a _hook_lock held by
    a thread the child does not have (its first record_memory_history waited for ever), and
    maybe a library whose hook is not _hook (the fork fell between naming the hook and handing
    it over, or taking it back: the child's records had no frames). The child's library gets
    _hook again."""
    global _hook_lock, _annot_lock, _record_lock
    _hook_lock = threading.Lock()
    _annot_lock = threading.Lock()  # _annotations_follow's: the same, for the same reason
    _record_lock = threading.RLock()  # record_memory_history's: the same
    if _hook is not None:
        lib().sp_history_set_frames_hook(_hook, _hook_arg)


if "_forks_handled" not in globals():  # once, reloads included
    _forks_handled = True
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _c_text(s):
    """s as history.h's C string: UTF-8 with 'surrogatepass', U+0000 as 0xC0 0x80 (a name holding
    one was cut there), as pool/pyframes.c keeps it in _encoded."""
    return s.encode(errors="surrogatepass").replace(b"\0", b"\xc0\x80")


def _frames(frames, max_frames, arg):
    """sp_history_frames_fn: fill frames with this thread's Python stack, innermost first."""
    try:
        f = sys._getframe(1)
        keep = []  # the bytes must live until the library has copied them (until we return)
        n = 0
        while f is not None and n < max_frames:
            code = f.f_code
            filename = code.co_filename
            if not filename.startswith(_SKIP_PREFIX):
                # 'surrogatepass': a lone surrogate (a file name's undecodable byte, as Python
                # holds it) in the 3-byte form the library keeps as that str (history.h).
                name = _encoded.get(code.co_name)
                if name is None:
                    name = _encoded.setdefault(code.co_name, _c_text(code.co_name))
                fname = _encoded.get(filename)
                if fname is None:
                    fname = _encoded.setdefault(filename, _c_text(filename))
                keep.append((name, fname))
                frames[n].name = name
                frames[n].filename = fname
                line = f.f_lineno
                frames[n].line = -1 if line is None else line  # None: 2^64-1, as torch writes it
                n += 1
            f = f.f_back
        return n
    except Exception:  # an exception cannot cross the C frames: record no frames instead
        return 0


# sp_history_python_frames' argument: the library reads it on every capture, so it lives as long
# as the process (a hook being replaced may still be running on another thread), reloads included.
_native_arg = globals().get("_native_arg")


# The hook objects (FRAMES_FN), each made once and kept for the process, reloads included: the
# library may still be running one on another thread after it is replaced, so none is ever
# freed, and none is made again. One made per turning-on, each kept for good, grew the process
# by about 200 bytes for every record_memory_history on/off cycle, without bound.
_hooks_made = globals().get("_hooks_made", {})


def _made(key, make):
    hook = _hooks_made.get(key)
    if hook is None:
        hook = _hooks_made[key] = make()
    return hook


def _native_hook():
    """(hook, arg address) for sp_history_python_frames, or None where it cannot read frames."""
    global _native_arg
    L = lib()
    if not L.sp_history_python_frames_supported():
        return None
    if _native_arg is None:
        _native_arg = _lib.PythonFramesArg(_SKIP_PREFIX.encode(errors="surrogatepass"), _encoded)
    fn = ctypes.cast(L.sp_history_python_frames, ctypes.c_void_p).value
    return _made("native", lambda: _lib.FRAMES_FN(fn)), ctypes.addressof(_native_arg)


def _install(on):
    global _hook, _hook_arg
    with _hook_lock:
        if on and _hook is None:
            native = _native_hook()
            if native is not None:
                _hook, _hook_arg = native
            else:
                _hook, _hook_arg = _made("python", lambda: _lib.FRAMES_FN(_frames)), None
            lib().sp_history_set_frames_hook(_hook, _hook_arg)
        elif not on and _hook is not None:
            lib().sp_history_set_frames_hook(_made("none", _lib.FRAMES_FN), None)
            _hook = None  # still in _hooks_made: another thread may be inside it right now


# Other hook objects the library may hold (a hook installed by hand), never freed.
_lib_keep = globals().get("_lib_keep", [])


_record_lock = globals().get("_record_lock") or threading.RLock()


def record_memory_history(enabled="all", context="all", stacks="python", max_entries=sys.maxsize,
                          device=None, clear_history=False, skip_actions=None,
                          global_record_annotations=False):
    """Start, change or stop recording (torch.cuda.memory._record_memory_history).

    enabled: "all" keeps up to max_entries trace entries; "state" keeps what live blocks need and
    one trace entry (the last, as torch does); None stops and clears. context: which records carry stacks: None, "state" (live blocks),
    "alloc" (also trace entries), "all" (also a stack at each free). stacks: "python" (Python
    frames) or "all" (Python and C frames). device is accepted for torch's signature (recording
    covers every device). clear_history=True drops the trace entries recorded so far.
    skip_actions: action names ("alloc", "free_requested", "segment_free", ...) never stored.
    Each call clears the external annotations (torch's recordHistory does); while recording,
    record_function scopes are kept as annotations: every thread's with
    global_record_annotations=True, else only those of the thread that turned recording on.
    """
    if enabled is True:
        enabled = "all"  # torch's legacy boolean form
    elif enabled is False:
        enabled = None
    if not isinstance(enabled, (str, type(None))) or enabled not in _ENABLED:
        raise bad_value(f"enabled must be 'all', 'state' or None, got {enabled!r}")
    if not isinstance(context, (str, type(None))) or context not in _CONTEXT:
        raise bad_value(f"context must be 'all', 'alloc', 'state' or None, got {context!r}")
    if stacks not in _STACKS:
        raise bad_value(f"stacks must be 'python' or 'all', got {stacks!r}")
    n = as_int(max_entries, "max_entries")
    if n < 0:
        raise bad_value(f"max_entries must be >= 0, got {n}")
    # torch keeps at least one entry (c10's RingBuffer::setMaxEntries takes max(1, size)); the C
    # API's 0 means no bound, which max_entries=0 must not become here.
    n = min(max(n, 1), _lib.SIZE_MAX)
    p = _lib.HistoryParams()
    lib().sp_history_params_init(p)
    p.enabled, p.context = _ENABLED[enabled], _CONTEXT[context]
    p.max_entries, p.c_stacks = n, stacks == "all"
    if skip_actions is not None:
        if isinstance(skip_actions, (str, bytes)):
            raise TypeError("skip_actions must be a list of action names")
        # A list of our own: the checks below and the join each walk it, and an iterator (a
        # generator) walked by the first would leave the join nothing, every action recorded.
        try:
            skip_actions = list(skip_actions)
        except TypeError:
            raise TypeError("skip_actions must be a list of action names") from None
        if not all(isinstance(a, str) for a in skip_actions):
            raise TypeError("skip_actions must be a list of action names")
        if any(a == "" or "," in a or "\0" in a for a in skip_actions):
            raise bad_value(f"skip_actions holds a malformed name: {skip_actions!r}")
        skip = ",".join(skip_actions).encode()
        p.skip_actions = skip  # the library reads it during the call only
    _flag(clear_history, "clear_history")
    _flag(global_record_annotations, "global_record_annotations")
    if device is not None:
        _lib.as_device(device)
    # One call at a time from here: the frames hook, the library's recording and the
    # annotations change together (torch's recordHistory is one step). Interleaved, an "on"
    # and a None from two threads left recording on without the hook: entries with no frames.
    with _record_lock:
        _record_locked(p, enabled, context, clear_history, global_record_annotations)


def _flag(value, what):
    """A yes/no argument must be a bool, as torch binds its flags to C++ bools (pybind11 refuses
    a str or a list there): "no" was taken as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be a bool, not {type(value).__name__}")


def _record_locked(p, enabled, context, clear_history, global_record_annotations):
    want_hook = enabled is not None and context is not None
    if want_hook:
        _install(True)  # before recording starts, so the first records have frames
    # The library is the judge of what Python cannot check (skip_actions' names): the settings
    # go in first, so that a refused call has cleared nothing; only then does clear_history drop
    # the entries, recording going on (an OFF and ON instead lost other threads' records).
    check(lib().sp_record_memory_history(p))
    if clear_history and enabled is not None:
        check(lib().sp_x_history_clear())
    if not want_hook:
        _install(False)
    _annotations_follow(enabled, global_record_annotations)


# Which threads' record_function scopes are recorded (torch: a record_function callback added when
# history is turned on, global with global_record_annotations, else the turning-on thread's only,
# kept until history is turned off): None for every thread, else that thread's ident.
# Kept across importlib.reload, as the module's other state (a reload turned them off while
# history was still on).
_annot_lock = globals().get("_annot_lock") or threading.Lock()
_annot_on = globals().get("_annot_on", False)
_annot_thread = globals().get("_annot_thread")


def _annotations_follow(enabled, global_record_annotations):
    """torch's setRecordFunctionCallbacks: the first call that turns history on picks the scope
    (a later one, history still on, keeps it); turning it off drops it."""
    global _annot_on, _annot_thread
    with _annot_lock:
        if enabled is None:
            _annot_on, _annot_thread = False, None
        elif not _annot_on:
            _annot_on = True
            _annot_thread = None if global_record_annotations else threading.get_ident()


def _record_annotation(stage, name, device=None):
    """torch's recordAnnotation ({"name": name, "stage": stage}): kept in the snapshot's
    external_annotations with device and time_us while history is recorded (nothing while it is
    off). Any thread may call it; record_function calls it at a scope's start and end."""
    if not isinstance(stage, str) or not isinstance(name, str):
        raise TypeError("stage and name must be str")
    def enc(t):  # a C string: U+0000 as 0xC0 0x80, as _set_memory_metadata sends it
        return t.encode(errors="surrogatepass").replace(b"\0", b"\xc0\x80")
    check(lib().sp_history_record_annotation(_lib.as_device(device), enc(stage), enc(name)))


class record_function:
    """torch.profiler.record_function's user scope, for memory history without torch: entering
    records {"stage": "START", "name": name}, leaving {"stage": "END", "name": name} as external
    annotations of device (0 by default), when history is recorded and this thread's scopes are
    (all threads' when it was turned on with global_record_annotations=True, else only the thread
    that turned it on, as torch's thread-local callback). With torch, torch's record_function
    does not reach sympool: use this one. Usable as a decorator too."""

    def __init__(self, name, args=None, device=None):
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        self.name, self.args, self.device = name, args, device
        # One flag per enter not yet left (the object may be entered again before it is left):
        # whether that scope's START was recorded. A single flag recorded two STARTs and one END.
        # One list per thread: an object entered on two threads at once had one list, and a
        # thread's exit popped the other thread's flag (an END lost, or one recorded for a
        # thread whose scopes are not recorded).
        self._local = threading.local()

    @property
    def _recorded(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _wanted(self):
        return _annot_on and (_annot_thread is None or _annot_thread == threading.get_ident())

    def __enter__(self):
        recorded = self._wanted()
        if recorded:
            _record_annotation("START", self.name, self.device)
        self._recorded.append(recorded)
        return self

    def __exit__(self, *exc):
        # The END of the innermost scope left open, if its START was recorded (history may have
        # stopped in between: the library then keeps nothing, as torch's removed callback records
        # nothing). Entered twice, the object records two START/END pairs (torch ends each
        # scope it started too); left more often than entered, it records no unmatched END.
        if self._recorded and self._recorded.pop():
            _record_annotation("END", self.name, self.device)
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*a, **kw):
            with record_function(self.name, self.args, self.device):
                return fn(*a, **kw)
        return wrapped


def _record_memory_history(enabled="all", *args, **kwargs):
    """torch.cuda.memory._record_memory_history: as torch does, a bool `enabled` takes the legacy
    arguments (_record_memory_history_legacy), anything else the current ones."""
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(enabled="all", context="all", stacks="all",
                                max_entries=sys.maxsize, device=None, clear_history=False,
                                compile_context=False, global_record_annotations=False,
                                skip_actions=None):
    """torch.cuda.memory._record_memory_history_impl's positional order and defaults (stacks
    "all"). compile_context is accepted and has no effect; global_record_annotations says which
    threads' record_function scopes (sympool.history.record_function) are recorded: every
    thread's, or only this one's (the default, as torch's thread-local callback)."""
    _flag(compile_context, "compile_context")
    record_memory_history(enabled, context, stacks, max_entries, device, clear_history,
                          skip_actions, global_record_annotations)


def _record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                  trace_alloc_record_context=False, device=None,
                                  record_context_cpp=False, clear_history=False,
                                  compile_context=False, global_record_annotations=False,
                                  skip_actions=None):
    """torch.cuda.memory._record_memory_history_legacy (torch/csrc/cuda/memory_snapshot.cpp):
    on, it keeps trace_alloc_max_entries trace entries (1 by default, so _record_memory_history(
    True) is "state"), stacks on live blocks when record_context, also on trace entries when
    trace_alloc_record_context, C frames when record_context_cpp. It was taken as "all" with
    every trace entry, stacks on frees and C frames."""
    for value, what in ((enabled, "enabled"), (record_context, "record_context"),
                        (trace_alloc_record_context, "trace_alloc_record_context"),
                        (record_context_cpp, "record_context_cpp"),
                        (compile_context, "compile_context"),
                        (global_record_annotations, "global_record_annotations")):
        _flag(value, what)  # all of them, on or off: torch's binding takes them all either way
    if not enabled:
        record_memory_history(None, device=device, clear_history=clear_history)
        return
    context = "alloc" if trace_alloc_record_context else "state" if record_context else None
    record_memory_history("all", context, "all" if record_context_cpp else "python",
                          trace_alloc_max_entries, device, clear_history, skip_actions,
                          global_record_annotations)


def _set_memory_metadata(metadata, device=0):
    """torch.cuda.memory._set_memory_metadata: every later trace entry of device carries
    metadata as its "user_metadata" ("" for none)."""
    if not isinstance(metadata, str):
        raise TypeError(f"metadata must be a str, not {type(metadata).__name__}")
    # torch takes any str, NULs included (pybind11 passes its std::string whole, and its pickle
    # keeps them). The library's text is a C string: U+0000 goes in as 0xC0 0x80, the form
    # history.h says a snapshot shows as U+0000 (0xC0 is never a byte of UTF-8, so the pair
    # stands for nothing else).
    text = metadata.encode(errors="surrogatepass").replace(b"\0", b"\xc0\x80")
    check(lib().sp_history_set_user_metadata(_lib.as_device(device), text))


def _get_memory_metadata(device=0):
    """torch.cuda.memory._get_memory_metadata: the text _set_memory_metadata last set."""
    d = _lib.as_device(device)
    n = ctypes.c_size_t()
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        check(lib().sp_history_get_user_metadata(d, buf, size, ctypes.byref(n)))
        if n.value < size:
            return buf.raw[:n.value].replace(b"\xc0\x80", b"\0").decode(errors="surrogatepass")
        size = n.value + 1

