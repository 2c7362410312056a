"""setup.py: the CMake step of `pip install .` (pyproject.toml holds the metadata).

build_py configures and builds libsympool and the `sympool` command with CMake (Release, no
tests, examples or benchmarks) and puts them inside the package: sympool/libsympool.so (the
package finds its library there) and sympool/bin/sympool (what the `sympool` console script runs).

Environment:
  SYMPOOL_CMAKE_ARGS       extra configure arguments, e.g. "-DSYMPOOL_WITH_CUDA=OFF"
  SYMPOOL_CMAKE_BUILD_DIR  an already configured CMake build to take the library from (built
                           there if out of date) instead of configuring build-pip/cmake
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import setuptools
from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def need_wheel():
    """With --no-build-isolation the build uses this Python's own packages, and setuptools before
    70.1 makes wheels only with the `wheel` package: without it pip fails with "invalid command
    'bdist_wheel'", which does not say what is missing (a pyenv or conda python3 often lacks it
    where Debian's /usr/bin/python3 has python3-wheel)."""
    try:
        import wheel  # noqa: F401
        return
    except ImportError:
        pass
    parts = (setuptools.__version__.split(".") + ["0", "0"])[:2]
    try:
        if (int(parts[0]), int(parts[1])) >= (70, 1):
            return
    except ValueError:
        return
    sys.exit("sympool: this Python (%s) has setuptools %s but not the 'wheel' package, which an "
             "offline (--no-build-isolation) build needs: install it into this Python "
             "(Debian: apt-get install python3-wheel for /usr/bin/python3; else pip install "
             "wheel), or build with a python3 that has it" % (sys.executable, setuptools.__version__))


need_wheel()


def version():
    with open(os.path.join(HERE, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*sympool\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", f.read())
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(sympool VERSION x.y.z)")
    return m.group(1)


def run(cmd):
    print("sympool:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        build = os.environ.get("SYMPOOL_CMAKE_BUILD_DIR")
        if not build:
            build = os.path.join(HERE, "build-pip", "cmake")
            run(["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DSYMPOOL_BUILD_TESTS=OFF", "-DSYMPOOL_BUILD_EXAMPLES=OFF",
                 "-DSYMPOOL_BUILD_BENCH=OFF"] + shlex.split(os.environ.get("SYMPOOL_CMAKE_ARGS", "")))
        run(["cmake", "--build", build, "--target", "sympool", "sympool_cli",
             "-j", str(os.cpu_count() or 1)])
        package = os.path.join(self.build_lib, "sympool")
        # The real file (not the .so -> .so.0 -> .so.X.Y.Z links): a wheel holds no links.
        shutil.copyfile(os.path.realpath(os.path.join(build, "libsympool.so")),
                        os.path.join(package, "libsympool.so"))
        os.makedirs(os.path.join(package, "bin"), exist_ok=True)
        cli = os.path.join(package, "bin", "sympool")
        shutil.copyfile(os.path.join(build, "sympool"), cli)
        os.chmod(cli, 0o755)


class BinaryDistribution(Distribution):
    """The wheel holds a compiled library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(
    version=version(),
    cmdclass={"build_py": BuildPyWithLibrary},
    distclass=BinaryDistribution,
    # setuptools' own scratch space beside the CMake one, not inside a CMake build/ folder.
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")},
             "egg_info": {"egg_base": "build-pip"}},
)
