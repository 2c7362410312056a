#!/usr/bin/env bash
# README's pip path, offline: a venv (with the system's site-packages, where Debian's setuptools,
# wheel and pip are), `pip install --no-build-isolation --no-index SOURCE`, then from outside the
# tree: import sympool (library found inside the package), importlib.metadata and `pip show` know
# the version the library reports, and the `sympool` command runs. The library is taken from
# BUILD_DIR (SYMPOOL_CMAKE_BUILD_DIR) so that the test does not compile it a second time.
# usage: pip_check.sh PYTHON SOURCE_DIR BUILD_DIR WORK_DIR [LD_PRELOAD for python]
set -euo pipefail
py=$1 src=$2 build=$3 work=$4 preload=${5:-}
rm -rf "$work"
mkdir -p "$work"
"$py" -m venv --system-site-packages --without-pip "$work/venv"
vpy=$work/venv/bin/python
"$vpy" -c 'import setuptools, wheel, pip' 2>/dev/null ||
  { echo "FAIL: $py lacks pip, setuptools or wheel (Debian: python3-pip python3-setuptools python3-wheel; scripts/deps.sh installs them)"; exit 1; }
unset PYTHONPATH SYMPOOL_LIBRARY
SYMPOOL_CMAKE_BUILD_DIR=$build "$vpy" -m pip install --no-build-isolation --no-index -q "$src"
cd "$work"
LD_PRELOAD=$preload "$vpy" - "$work/venv" <<'PY'
import importlib.metadata, os, sys
import sympool
lib = sympool.library_path()
assert lib.startswith(sys.argv[1]), f"library from {lib}, not the venv"
assert importlib.metadata.version("sympool") == sympool.__version__, \
    (importlib.metadata.version("sympool"), sympool.__version__)
p = sympool.malloc(1 << 20)
sympool.free(p)
print("pip: import ok", sympool.__version__, lib)
PY
version=$(LD_PRELOAD=$preload "$vpy" -c 'import sympool; print(sympool.__version__)')
# Whole outputs first: grep -q closing the pipe early would fail pip's write under pipefail.
show=$("$vpy" -m pip show sympool)
grep -qx "Version: $version" <<<"$show" || { echo "FAIL: pip show:"; echo "$show"; exit 1; }
cli=$("$work/venv/bin/sympool" --version)
grep -qx "sympool $version" <<<"$cli" || { echo "FAIL: the sympool command: $cli"; exit 1; }
rm -rf "$work"
echo "pip ok"
