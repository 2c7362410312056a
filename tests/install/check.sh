#!/usr/bin/env bash
# Install the built tree into a temporary prefix as README shows (cmake --install --prefix), then
# build and run consumers outside the source tree:
#   1. pkg-config, shared library, README's line (an rpath: runs with no LD_LIBRARY_PATH);
#   2. the same program compiled as C++ (world.h must not need MPI's C++ bindings);
#   3. the prefix moved elsewhere: pkg-config sympool-static (relocatable .pc, complete libs), and
#      the binary does not load libsympool.so;
#   4. CMake find_package(sympool) from the moved prefix, a C project and a C++-only project.
# usage: check.sh BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC CXX HAVE_MPI(0|1) [EXTRA_CFLAGS]
set -euo pipefail
build=$1 src=$2 work=$3 libdir=$4 cc=$5 cxx=$6 have_mpi=$7 extra=${8:-}
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
pc="$work/prefix/$libdir/pkgconfig/sympool.pc"
if grep -q "^prefix=/" "$pc"; then
  echo "FAIL: $pc has an absolute prefix:"; grep "^prefix=" "$pc"; exit 1
fi
defs=()
[ "$have_mpi" = 1 ] && defs=(-DSP_CONSUMER_MPI=1)
consumer=$src/tests/install/consumer/consumer.c
export SYMPOOL_DEVICE=host
unset LD_LIBRARY_PATH

echo "== pkg-config, shared, with README's rpath"
export PKG_CONFIG_PATH="$work/prefix/$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
"$cc" $extra "${defs[@]}" "$consumer" $(pkg-config --cflags --libs sympool) \
  -Wl,-rpath,"$(pkg-config --variable=libdir sympool)" -o "$work/c_shared"
"$work/c_shared"

echo "== pkg-config, C++"
# shellcheck disable=SC2046,SC2086
"$cxx" $extra "${defs[@]}" "$src/tests/install/consumer/consumer.cc" \
  $(pkg-config --cflags --libs sympool) -Wl,-rpath,"$(pkg-config --variable=libdir sympool)" \
  -o "$work/cxx_shared"
"$work/cxx_shared"

echo "== pkg-config sympool-static, prefix moved"
mv "$work/prefix" "$work/moved"
export PKG_CONFIG_PATH="$work/moved/$libdir/pkgconfig"
pkg-config --variable=includedir sympool | grep -q "$work/moved" ||
  { echo "FAIL: includedir does not follow the move"; exit 1; }
# shellcheck disable=SC2046,SC2086
"$cc" $extra "${defs[@]}" "$consumer" -o "$work/c_static" $(pkg-config --cflags --libs sympool-static)
if ldd "$work/c_static" | grep -q libsympool; then
  echo "FAIL: linked with sympool-static, the binary still loads libsympool.so:"; ldd "$work/c_static"; exit 1
fi
"$work/c_static"

echo "== find_package, C and C++-only projects"
rm -rf "$work/moved"
cmake --install "$build" --prefix "$work/moved" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$work/cm" -DCMAKE_PREFIX_PATH="$work/moved" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$extra" -DSYMPOOL_CONSUMER_MPI="$have_mpi" >/dev/null
cmake --build "$work/cm" >/dev/null
"$work/cm/consumer"
cmake -S "$src/tests/install/consumer_cxx" -B "$work/cmxx" -DCMAKE_PREFIX_PATH="$work/moved" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$extra" -DSYMPOOL_CONSUMER_MPI="$have_mpi" >/dev/null
cmake --build "$work/cmxx" >/dev/null
"$work/cmxx/consumer_cxx"
echo "install ok"
