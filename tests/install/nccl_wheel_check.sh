#!/usr/bin/env bash
# NCCL laid out as PyTorch's nvidia-nccl wheel ships it: <root>/include/nccl.h and
# <root>/lib/libnccl.so.2, with no unversioned libnccl.so. Fakes that layout from the NCCL this
# build found, builds the library and the CLI against it through -DSYMPOOL_NCCL_ROOT with the
# project's warnings (nccl.h then is no longer beside the CUDA headers, so it must come in as a
# system header), and runs check.sh's installed consumers (pkg-config shared and static, and
# find_package) against that build.
# usage: nccl_wheel_check.sh SOURCE_DIR WORK_DIR NCCL_INCLUDE_DIR NCCL_LIBRARY LIBDIR CC CXX HAVE_MPI
set -euo pipefail
src=$1 work=$2 inc=$3 lib=$4 libdir=$5 cc=$6 cxx=$7 have_mpi=$8
rm -rf "$work"
root=$work/site-packages/nvidia/nccl
mkdir -p "$root/include" "$root/lib"
cp "$inc/nccl.h" "$root/include/"
real=$(readlink -f "$lib")
# The wheel's one library file: the real shared object under its soname, nothing else.
ln -s "$real" "$root/lib/libnccl.so.2"
[ ! -e "$root/lib/libnccl.so" ] || { echo "FAIL: the fake wheel has libnccl.so"; exit 1; }

b=$work/build
# Debug (-O0): what this checks is where the headers and the library come from; the optimized
# build's warnings are the plain build's to see (-O2 took 57 s of this test, s38-ci).
cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Debug -DSYMPOOL_WITH_CUDA=ON \
  -DSYMPOOL_WITH_NCCL=ON -DSYMPOOL_NCCL_ROOT="$root" -DSYMPOOL_BUILD_TESTS=OFF \
  -DSYMPOOL_BUILD_BENCH=OFF -DSYMPOOL_BUILD_EXAMPLES=OFF -DSYMPOOL_SANITIZE= >"$work/configure.log"
grep -q "sympool: NCCL [0-9]*: $root/include, $root/lib/libnccl.so.2" "$work/configure.log" || {
  echo "FAIL: CMake did not take the wheel's NCCL:"; grep "sympool:" "$work/configure.log"; exit 1; }
if ! cmake --build "$b" -j2 >"$work/build.log" 2>&1; then
  grep -E "error|warning" "$work/build.log" | head -20
  echo "FAIL: the build against the wheel layout failed (log: $work/build.log)"
  exit 1
fi
grep -q -- "-l:libnccl.so.2" "$b"/sympool*.pc || {
  echo "FAIL: the .pc files do not name libnccl.so.2:"; grep Libs "$b"/sympool*.pc; exit 1; }
# The consumers link and load libnccl.so.2 from the fake wheel (libsympool.so needs it, and the
# static consumer names it): check.sh clears LD_LIBRARY_PATH, so an rpath that also serves
# libsympool.so's own dependency (DT_RPATH, not RUNPATH) points there.
bash "$(dirname "$0")/check.sh" "$b" "$src" "$work/consumers" "$libdir" "$cc" "$cxx" "$have_mpi" \
  "-Wl,-rpath-link,$root/lib -Wl,--disable-new-dtags,-rpath,$root/lib"
echo "wheel layout ok"
