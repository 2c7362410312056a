"""The library's Python frames hook (pool/pyframes.c) and the package around it under use that
its first tests left out: the package reloaded while recording, ... Each case runs in its own
interpreter (a subprocess with a timeout) where it changes process-wide state."""

import subprocess
import sys
import textwrap


def _run(src):
    """Run src in a fresh interpreter; its stdout (a failure shows its stderr)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(src)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


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
