#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build and test sympool: a compiler, CMake,
# Ninja, Open MPI, GoogleTest, and pytest, mpi4py, pip, setuptools, wheel and venv for the system
# python3, and clang with its runtimes (libFuzzer for the fuzz stage, the sanitizers' for the
# sanitized builds, which test.sh compiles with clang where it can). Does nothing when they are
# already there.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
# Ninja: the build tool scripts/env.sh picks for a new build folder (Make serves without it).
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -f /usr/include/gtest/gtest.h ] || need+=(googletest libgtest-dev)
command -v python3 >/dev/null || need+=(python3)
# The Python package's tests run with the system interpreter's pytest and mpi4py (Debian's).
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import mpi4py' 2>/dev/null || need+=(python3-mpi4py)
# `pip install --no-build-isolation --no-index .` (README, test python.pip_install) builds with the
# system's pip, setuptools and wheel, in a venv.
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import pip' 2>/dev/null || need+=(python3-pip)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import setuptools' 2>/dev/null || need+=(python3-setuptools)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import wheel' 2>/dev/null || need+=(python3-wheel)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
# The install and report tests build a consumer with pkg-config and read the JSON report with jq;
# without them those tests are not registered, so install them rather than test less.
command -v pkg-config >/dev/null || need+=(pkgconf)
command -v jq >/dev/null || need+=(jq)
# The multinode tests (tests/multinode/mn-run.sh) make network and UTS namespaces with ip(8)
# and unshare(1); without them they skip, so install them rather than test less.
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
# The locale tests (numbers under a program's decimal-comma locale) compile de_DE with localedef
# from the locales package's sources; without them they skip, so install them rather than test less.
{ command -v localedef >/dev/null && [ -f /usr/share/i18n/locales/de_DE ] &&
  compgen -G '/usr/share/i18n/charmaps/UTF-8*' >/dev/null; } || need+=(locales)
# `man sympool` is generated from the command's --help at build time (200 KB, perl).
command -v help2man >/dev/null || need+=(help2man)
# The fuzz stage (tests/fuzz/run.sh) needs clang and its libFuzzer runtime, the sanitized builds
# its ASan, UBSan and TSan runtimes (all in libclang-rt-dev).
command -v clang >/dev/null || need+=(clang)
compgen -G '/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a' >/dev/null ||
  need+=(libclang-rt-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "sympool: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
