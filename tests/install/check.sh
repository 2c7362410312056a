#!/usr/bin/env bash
# Install the built tree into a temporary prefix as README shows (cmake --install --prefix), then
# build and run a consumer outside the source tree three ways:
#   1. pkg-config, shared library;
#   2. the prefix moved elsewhere, libsympool.so removed: pkg-config --static (relocatable .pc,
#      complete Libs.private);
#   3. CMake find_package(sympool) from the moved prefix.
# usage: check.sh BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC HAVE_MPI(0|1) [EXTRA_CFLAGS]
set -euo pipefail
build=$1 src=$2 work=$3 libdir=$4 cc=$5 have_mpi=$6 extra=${7:-}
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

echo "== pkg-config, shared"
export PKG_CONFIG_PATH="$work/prefix/$libdir/pkgconfig"
# shellcheck disable=SC2046,SC2086
"$cc" $extra "${defs[@]}" "$consumer" -o "$work/c_shared" $(pkg-config --cflags --libs sympool)
LD_LIBRARY_PATH="$work/prefix/$libdir" "$work/c_shared"

echo "== pkg-config --static, prefix moved"
mv "$work/prefix" "$work/moved"
rm -f "$work/moved/$libdir"/libsympool.so*
export PKG_CONFIG_PATH="$work/moved/$libdir/pkgconfig"
pkg-config --variable=includedir sympool | grep -q "$work/moved" ||
  { echo "FAIL: includedir does not follow the move"; exit 1; }
# shellcheck disable=SC2046,SC2086
"$cc" $extra "${defs[@]}" "$consumer" -o "$work/c_static" $(pkg-config --static --cflags --libs sympool)
"$work/c_static"

echo "== find_package"
rm -rf "$work/moved"
cmake --install "$build" --prefix "$work/moved" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$work/cm" -DCMAKE_PREFIX_PATH="$work/moved" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$extra" -DSYMPOOL_CONSUMER_MPI="$have_mpi" >/dev/null
cmake --build "$work/cm" >/dev/null
"$work/cm/consumer"
echo "install ok"
