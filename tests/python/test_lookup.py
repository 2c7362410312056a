"""Finding the library ($SYMPOOL_LIBRARY, relative or not, next to the package, loader path) and
sympool.torch without torch."""

import os
import shutil
import subprocess
import sys

import pytest

PROBE = "import sympool; print(sympool.library_path()); print(sympool.backend())"


def run(code, env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, cwd="/")


def test_sympool_library_wins_and_is_exact(sp):
    env = dict(os.environ, SYMPOOL_LIBRARY=sp.library_path())
    out = run(PROBE, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == sp.library_path()
    env["SYMPOOL_LIBRARY"] = "/nonexistent/libsympool.so"
    out = run(PROBE, env)
    assert out.returncode != 0
    assert "SYMPOOL_LIBRARY" in out.stderr and "/nonexistent/libsympool.so" in out.stderr


def test_next_to_the_package(sp, tmp_path):
    import sympool
    pkg = tmp_path / "sympool"
    shutil.copytree(os.path.dirname(sympool.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "libsympool.so*"))
    os.symlink(os.path.realpath(sp.library_path()), pkg / "libsympool.so")
    env = {k: v for k, v in os.environ.items() if k != "SYMPOOL_LIBRARY"}
    env["PYTHONPATH"] = str(tmp_path)
    out = run(PROBE, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(pkg / "libsympool.so"), "host"]


def test_loader_path_then_a_clear_error(sp, tmp_path):
    import sympool
    pkg = tmp_path / "sympool"
    shutil.copytree(os.path.dirname(sympool.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "libsympool.so*"))
    env = {k: v for k, v in os.environ.items() if k != "SYMPOOL_LIBRARY"}
    env["PYTHONPATH"] = str(tmp_path)
    env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.realpath(sp.library_path()))
    out = run(PROBE, env)
    assert out.returncode == 0, out.stderr  # dlopen("libsympool.so") through LD_LIBRARY_PATH
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    out = run("import sympool\ntry:\n    sympool.backend()\nexcept ImportError as e:\n"
              "    print('ImportError', e)", env)
    if "ImportError" not in out.stdout:
        pytest.skip("a libsympool.so is installed system-wide: the loader finds it")
    assert "SYMPOOL_LIBRARY" in out.stdout and "cmake --install" in out.stdout


def test_a_library_that_is_not_sympool(sp):
    # SYMPOOL_LIBRARY naming another library (here the C library) loads, but has none of our
    # functions: that was ctypes' AttributeError ("undefined symbol: sp_status_name"), which
    # also made hasattr(sympool, "__version__") False instead of an error.
    env = dict(os.environ, SYMPOOL_LIBRARY="libc.so.6")
    out = run("import sympool\n"
              "for f in (sympool.backend, lambda: sympool.__version__):\n"
              "    try:\n"
              "        f()\n"
              "    except ImportError as e:\n"
              "        print('ImportError', e)\n", env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout + out.stderr
    for line in lines:
        assert line.startswith("ImportError sympool: libc.so.6 is not a sympool library"), line
        assert "sp_status_name" in line and "SYMPOOL_LIBRARY" in line


def test_world_without_mpi4py(sp):
    # World(comm) is over mpi4py: without it, the failure was the bare "No module named
    # 'mpi4py'" from inside World(); it now says what needs it and the way without it.
    if not sp._lib.has("sp_world_from_comm"):
        pytest.skip("this libsympool.so is built without MPI")
    out = run("import sys\nsys.modules['mpi4py'] = None  # as if not installed\n"
              "import sympool\ntry:\n    sympool.World()\nexcept ImportError as e:\n"
              "    print('ImportError', e)\n", dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ImportError sympool.World(comm) needs mpi4py"), out.stdout
    assert "World.init()" in out.stdout


def test_import_does_not_load_the_library():
    env = dict(os.environ, SYMPOOL_LIBRARY="/nonexistent/libsympool.so")
    out = run("import sympool, sympool.torch; print('imported')", env)
    assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr


def test_sympool_torch_without_torch(sp):
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here: sympool.torch is tested on the GPU machine")
    except ImportError:
        pass
    import sympool.torch
    for fn in (sympool.torch.enable, sympool.torch.mem_pool, sympool.torch.memory_stats):
        with pytest.raises(RuntimeError, match="needs PyTorch"):
            fn()
    assert "torch" not in sys.modules


def test_relative_sympool_library_is_made_absolute(sp, tmp_path):
    # python/README's command runs from the clone with SYMPOOL_LIBRARY=build/libsympool.so: the
    # path the package reports (and child processes inherit through it) must survive a chdir.
    lib = os.path.realpath(sp.library_path())
    rel = os.path.relpath(lib, str(tmp_path))
    env = dict(os.environ, SYMPOOL_LIBRARY=rel)
    out = subprocess.run([sys.executable, "-c", "import os, sympool; p = sympool.library_path(); "
                          "os.chdir('/'); print(p); print(sympool.backend())"],
                         capture_output=True, text=True, env=env, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [lib, "host"]
