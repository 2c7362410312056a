"""The library's Python frames hook (pool/pyframes.c) and the package around it under use that
its first tests left out: the package reloaded while recording, a fork while another thread is
inside _install, a hook argument made where a freed one was, a collection the walk would start,
a Python error pending in the C code that calls it. Each case runs in its own interpreter (a subprocess with a timeout): each changes process-wide
state."""

import os
import subprocess
import sys
import textwrap


def _run(src):
    """Run src (with the child's part where it is named) in a fresh interpreter; its stdout (a
    failure shows its stderr)."""
    code = textwrap.dedent(_with_child(src))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


# The forked child's part in the two fork cases (in place of the line CHILD_RECORDS_ITS_FRAME, at
# its indentation): it records, and exits 0 when its allocation's innermost frame is its own
# function; its alarm ends a child that hangs.
_CHILD_RECORDS_ITS_FRAME = """\
signal.alarm(20)
sympool.record_memory_history()

def child_site():
    return sympool.malloc(5555)

sympool.free(child_site())
ev = [e for e in sympool.snapshot()["device_traces"][0]
      if e["action"] == "alloc" and e["size"] == 5555]
os._exit(0 if ev[-1].get("frames", [{}])[0].get("name") == "child_site" else 3)
"""


def _with_child(src):
    """src with the child's part (_CHILD_RECORDS_ITS_FRAME) in place of its marker line."""
    indent = " " * 12
    part = textwrap.indent(_CHILD_RECORDS_ITS_FRAME, indent)
    return src.replace(indent + "CHILD_RECORDS_ITS_FRAME\n", part)


def test_reload_keeps_the_installed_hook_argument():
    # importlib.reload runs history.py again in its own namespace: a fresh `_native_arg = None`
    # freed the argument the library still held, so the next capture read freed memory (here
    # taken by arguments that leave out every absolute file name: the allocation had no frames).
    out = _run("""
        import gc, importlib
        import sympool
        from sympool import _lib, history
        sympool.record_memory_history()
        importlib.reload(history)
        gc.collect()
        fill = [_lib.PythonFramesArg(b"/", None) for _ in range(20000)]
        scope = {"sympool": sympool}
        exec(compile("def fresh(n):\\n    return sympool.malloc(n)\\n", "/fresh.py", "exec"),
             scope)
        sympool.free(scope["fresh"](8192))
        ev = [e for e in sympool.snapshot()["device_traces"][0]
              if e["action"] == "alloc" and e["size"] == 8192]
        print(ev[-1].get("frames", [{}])[0].get("name"))
    """)
    assert out.split() == ["fresh"]


def test_a_fork_while_another_thread_installs_the_hook():
    # A thread inside _install (here: holding its lock) while another forks: the child's copy of
    # the lock stayed held by a thread the child does not have, and the child's first
    # record_memory_history waited on it for ever. The child's alarm ends a hung child.
    out = _run("""
        import os, signal, threading
        import sympool
        from sympool import history
        held, done = threading.Event(), threading.Event()

        def holder():
            with history._hook_lock:
                held.set()
                done.wait()

        t = threading.Thread(target=holder)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            CHILD_RECORDS_ITS_FRAME
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    assert out.split() == ["0"]


def test_an_argument_made_where_a_freed_one_was():
    # The frame cache (pool/pyframes.c) kept what it read of a code object by the argument's
    # address: an argument freed and a new one made at its address, with another skip prefix,
    # read the first one's choice (a frame of the package's directory kept).
    out = _run("""
        import ctypes
        from sympool import _lib, history
        native = _lib.lib().sp_history_python_frames
        if not _lib.lib().sp_history_python_frames_supported():
            raise SystemExit("unsupported")
        scope = {}
        exec(compile("def inside(call):\\n    return call()\\n",
                     history._PACKAGE_DIR + "/inside.py", "exec"), scope)

        def names(arg):
            frames = (_lib.HistoryFrame * 256)()
            call = lambda: native(frames, 256, ctypes.addressof(arg))  # noqa: E731
            n = scope["inside"](call)
            return [frames[i].name.decode() for i in range(n)][:3]

        first = _lib.PythonFramesArg(None, None)  # leaves no frame out
        print(*names(first))
        where = ctypes.addressof(first)
        del first
        prefix = history._PACKAGE_DIR.encode(errors="surrogatepass")
        made = [_lib.PythonFramesArg(prefix, history._encoded) for _ in range(1000)]
        again = [a for a in made if ctypes.addressof(a) == where] or made  # (pymalloc reuses it)
        print(*names(again[0]))
    """)
    first, again = out.splitlines()
    assert first.split()[:2] == ["<lambda>", "inside"]
    assert again.split()[:2] == ["<lambda>", "names"]


def test_a_collection_the_walk_would_start_runs_after_it():
    # The walk makes frame objects (PyFrame_GetBack), which can start a collection inside the
    # hook: a finalizer there that frees sympool memory was refused (a callback may not call
    # sympool) and the block leaked. Each threshold below puts that collection at another of
    # the allocations around the walk, one of them inside it.
    out = _run("""
        import gc
        import sympool
        if not sympool._lib.lib().sp_history_python_frames_supported():
            raise SystemExit("unsupported")
        sympool.record_memory_history()
        refused = []

        class Holder:
            def __init__(self):
                self.p = sympool.malloc(1000)
                self.me = self  # a cycle: only a collection frees it

            def __del__(self):
                try:
                    sympool.free(self.p)
                except sympool.SympoolError as e:
                    refused.append(e)

        def nest(k):
            return sympool.malloc(2000) if k == 0 else nest(k - 1)

        for t in range(1, 200):
            gc.collect()
            gc.disable()
            Holder()
            gc.set_threshold(t)
            gc.enable()
            sympool.free(nest(20))
            gc.set_threshold(700)
        gc.collect()
        print(len(refused), sympool.memory_allocated())
    """)
    assert out.split() == ["0", "0"]


def test_a_fork_inside_install_leaves_the_child_a_hook():
    # A fork while another thread was inside _install, between naming the hook (_hook) and
    # handing it to the library: the child's library had no hook, its _hook said installed, so
    # its recording (context on) recorded no frames. The thread is held there by a stand-in for
    # the library's sp_history_set_frames_hook; the child's alarm ends a hung child.
    out = _run("""
        import os, signal, threading
        import sympool
        from sympool import _lib
        L = _lib.lib()
        real = L.sp_history_set_frames_hook
        parent = os.getpid()
        inside, done = threading.Event(), threading.Event()

        def held(fn, arg):
            if os.getpid() == parent and fn:
                inside.set()
                done.wait()
            return real(fn, arg)

        L.sp_history_set_frames_hook = held
        t = threading.Thread(target=sympool.record_memory_history)
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            CHILD_RECORDS_ITS_FRAME
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    assert out.split() == ["0"]


_PENDING_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct { const char *name, *filename; int line; } frame_t;
typedef size_t (*hook_t)(frame_t *, size_t, void *);

/* call(hook, arg): the hook called as C code calls it with a Python error pending (a C++
 * extension's error path that frees a block); (frames, whether the error is still pending). */
static PyObject *call(PyObject *self, PyObject *args) {
    unsigned long long fn, arg;
    if (!PyArg_ParseTuple(args, "KK", &fn, &arg))
        return NULL;
    frame_t f[8];
    PyErr_SetString(PyExc_KeyError, "pending");
    size_t n = ((hook_t)(uintptr_t)fn)(f, 8, (void *)(uintptr_t)arg);
    int kept = PyErr_Occurred() != NULL && PyErr_ExceptionMatches(PyExc_KeyError);
    PyErr_Clear();
    return Py_BuildValue("ni", (Py_ssize_t)n, kept);
}

static PyMethodDef methods[] = {{"call", call, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "pending_err", NULL, -1, methods};
PyMODINIT_FUNC PyInit_pending_err(void) { return PyModule_Create(&mod); }
"""


def test_an_error_pending_in_the_caller_is_kept(tmp_path):
    # C code may free a block (the hook runs) while a Python error is set, on its way to return
    # NULL. A name CPython cannot give as UTF-8 (a lone surrogate) made the walk clear its own
    # UnicodeEncodeError, and with it the caller's error: the caller returned NULL with none set.
    import shutil
    import sysconfig
    import pytest
    inc = sysconfig.get_paths()["include"]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not os.path.exists(os.path.join(inc, "Python.h")):
        pytest.skip("no C compiler or Python.h to build the caller")
    (tmp_path / "pending_err.c").write_text(_PENDING_C)
    so = tmp_path / ("pending_err" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-I", inc, str(tmp_path / "pending_err.c"),
                    "-o", str(so)], check=True)
    out = _run(f"""
        import ctypes, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import pending_err
        from sympool import _lib
        L = _lib.lib()
        if not L.sp_history_python_frames_supported():
            print("unsupported"); sys.exit(0)
        fn = ctypes.cast(L.sp_history_python_frames, ctypes.c_void_p).value
        arg = _lib.PythonFramesArg(b"", {{}})

        def site():
            return pending_err.call(fn, ctypes.addressof(arg))

        plain = site()
        site.__code__ = site.__code__.replace(co_name="site\\udc80")
        print(plain[1], site()[1], site()[0] > 0)
    """)
    if out.split() == ["unsupported"]:
        pytest.skip("sp_history_python_frames cannot read frames here")
    assert out.split() == ["1", "1", "True"]
