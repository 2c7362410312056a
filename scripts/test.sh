#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what is missing, then build and test three times,
# each host-backend test once (the label plain_only, tests/CMakeLists.txt, says where):
#   1. plain (RelWithDebInfo): the cuda backend under the CUDA/NCCL test doubles (every suite
#      again), and what no sanitized build runs: the MPI suites at 8 ranks, the emulated nodes,
#      the Python torch ports, and the tests of the build and the scripts (label plain_only);
#   2. AddressSanitizer + UndefinedBehaviorSanitizer: every other unit, MPI (2 and 4 ranks), CLI,
#      Python and example test;
#   3. ThreadSanitizer: the unit tests (the threaded suites are named Threads*) and the CLI tests
#      that run its signal handlers; the MPI tests are left out (Open MPI is not instrumented, so
#      TSan cannot see its synchronization), and so are the CLI's others (label one_thread: the
#      CLI runs on one thread, where TSan has no race to find).
# The ASan build compiles the C sources (the library, the CLI, the C test programs) at -O1, as
# clang's AddressSanitizer documentation advises for speed, and the tests' C++ at -O0, not
# instrumented (tests/CMakeLists.txt says why): the heavy tests took 14% less CPU, where -O1
# everywhere cost more build time than it saved; the TSan build's tests gained nothing from it
# (bench/results/README.md, s36, s37 and s38).
# Between 1 and 2, libFuzzer runs on the snapshot readers for a bounded time (tests/fuzz/run.sh,
# 20 s of a core a fuzzer, all three at once); skipped with a message where clang's fuzzer runtime
# is missing. The TSan build builds only what the unit tests run (target sp_unit_tests), less the
# readers' tests that run on one thread with no lock (tests/CMakeLists.txt, SP_TSAN_SKIP_UNIT).
# Builds use Ninja where it is installed (scripts/env.sh); the two sanitized builds use clang
# where it is installed, the plain one the system's C compiler and clang++ for the tests' C++
# (below).
# Set SYMPOOL_TEST_DEVICE=cuda on a GPU machine to run the suites on the cuda backend: MPI tests
# then run at one rank (SYMPOOL_TEST_NP=1,2 to choose), and what needs the host backend skips
# with a reason. scripts/gpu-check.sh is the whole GPU validation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
. scripts/env.sh
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1

if command -v clang-format >/dev/null; then
  echo "== format check"
  git ls-files '*.c' '*.h' '*.cc' '*.hpp' | xargs clang-format --dry-run -Werror
fi

# The Python the tests run is Debian's, which deps.sh equips (pytest, mpi4py, pip, venv): named
# here, CMake's FindPython does not search PATH for it (1.6-2 s of each configure where PATH has
# pyenv's shims first), and the tests that run Python scripts do not go through a shim (0.36 s a
# start here). A configure without it (run-main.sh, a user's) still finds Python the usual way.
py_opt=()
[ ! -x /usr/bin/python3 ] || py_opt=(-DPython3_EXECUTABLE=/usr/bin/python3)

# CMake forgets every -D option when a folder's compiler changes (it deletes the cache, then
# configures with none of them: a sanitized folder comes out plain): such a folder starts afresh.
fresh_if_compiler_changed() { # dir, cmake args...
  local dir=$1; shift
  local cache=$dir/CMakeCache.txt spec lang env dflt want have
  [ -f "$cache" ] || return 0
  for spec in C:CC:cc CXX:CXX:c++; do
    IFS=: read -r lang env dflt <<<"$spec"
    want=$(printf '%s\n' "$@" | sed -n "s/^-DCMAKE_${lang}_COMPILER=//p")
    want=$(command -v "${want:-${!env:-$dflt}}") || return 0
    have=$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" "$cache")
    [ "$(readlink -f "$have")" = "$(readlink -f "$want")" ] || { rm -rf "$dir"; return 0; }
  done
}

# SP_TARGETS (else all): what run_build builds.
run_build() { # name, cmake args...
  local dir=$1; shift
  echo "== build $dir ($*)"
  fresh_if_compiler_changed "$dir" "$@"
  cmake -S . -B "$dir" "${py_opt[@]}" "$@" >/dev/null
  local san have_san
  san=$(printf '%s\n' "$@" | sed -n 's/^-DSYMPOOL_SANITIZE=//p')
  have_san=$(sed -n 's/^SYMPOOL_SANITIZE:[A-Z]*=//p' "$dir/CMakeCache.txt")
  [ "$have_san" = "$san" ] || { echo "build $dir: configured with SYMPOOL_SANITIZE='$have_san', not '$san'"; return 1; }
  local targets=()
  [ -z "${SP_TARGETS:-}" ] || targets=(--target $SP_TARGETS)
  if ! cmake --build "$dir" -j"$jobs" "${targets[@]}" >"$dir/build.log" 2>&1; then
    grep -v '^\[' "$dir/build.log" | tail -60
    echo "build $dir failed (full log: $dir/build.log)"
    return 1
  fi
}

# Each build states every option it needs: build/ may have been configured by run-main.sh (tests
# off), and CMake keeps cached values that a command line does not override.
# (tests/install/scripts_check.sh reads plain_opts: keep it on one line.)
all_on=(-DSYMPOOL_BUILD_TESTS=ON -DSYMPOOL_BUILD_EXAMPLES=ON)
plain_opts=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPOOL_BUILD_TESTS=ON -DSYMPOOL_BUILD_EXAMPLES=ON -DSYMPOOL_BUILD_BENCH=ON -DSYMPOOL_SANITIZE= -DSYMPOOL_CUDA_DOUBLE=ON)
# The plain build's C++ is the tests' own (GoogleTest suites, reference models): the library, the
# CLI, the examples and the benchmarks are C, compiled by the system's cc as run-main.sh compiles
# them. clang++ compiles that C++ where it is installed and CXX names no compiler, in about half
# g++'s time (bench/results/README.md, s39).
plain_cxx=()
if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then
  plain_cxx=(-DCMAKE_CXX_COMPILER=clang++)
fi
run_build build "${plain_cxx[@]}" "${plain_opts[@]}"
# The cuda backend under the CUDA runtime/driver and NCCL test doubles (tests/cuda_double): the
# same suites plus the doubles' own rules, built only where the toolkit's headers and NCCL are
# (CMake says so when they are not). One ctest run with the plain_only tests: neither waits with
# a core idle for the other's longest test.
if [ -d build/cuda-double ]; then
  echo "== tests: plain (plain_only) and the cuda backend under the CUDA/NCCL doubles"
else
  echo "== tests: plain (plain_only)"
fi
# --no-tests=error: a build that registered no tests is a failure, not a pass.
ctest --test-dir build -j"$jobs" --timeout 300 --no-tests=error -L 'plain_only|cuda_double'

echo "== fuzz: snapshot readers"
tests/fuzz/run.sh build "${SYMPOOL_FUZZ_SECONDS:-20}"

# Open MPI's own allocations are never freed before exit: keep LeakSanitizer on for our code only.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
# Open MPI frees some of its allocations never, and unloads its components at MPI_Finalize,
# before LeakSanitizer's report: the tests that start Open MPI (those not labelled unit) keep them
# loaded (tests/shim/no_dlclose.c, preloaded by tests/CMakeLists.txt), so that the suppressions
# above match by the frame that allocated, which the fast unwinder sees (the slow one cost 2.3
# times the CPU of those tests). mpi.lsan_probe.np2 checks that a leak of ours is still seen.
# intercept_tls_get_addr=0: GCC 12's LeakSanitizer sometimes takes a dynamic-TLS block of a
# dlopened library (Open MPI's mca_* components) for glibc 2.19's layout and scans a bogus range:
# its stop-the-world tracer then dies in ScanRangeForPointers at exit ("Tracer caught signal 11",
# "LeakSanitizer has encountered a fatal error") after every test passed. Seen in CI on
# mpi.test_collectives.np8, all eight ranks; google/sanitizers#1322 gives this cause and setting.
# What it costs: pointers held only in dynamic TLS of dlopened libraries are not roots, which can
# only add leak reports, never hide one.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0"
# The CUDA driver maps memory where ASan keeps its shadow gap: without this, cudaMalloc and
# context creation fail with "out of memory" under ASan.
if [ "${SYMPOOL_TEST_DEVICE:-host}" = cuda ]; then
  export ASAN_OPTIONS="$ASAN_OPTIONS:protect_shadow_gap=0"
fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# The sanitized builds are compiled by clang where it is installed (the fuzz stage needs it too)
# and CC and CXX do not name a compiler; the plain build's C by the system's (cc, as run-main.sh
# builds it). So CI compiles the library and the CLI with both, warnings errors under each, and
# clang's sanitizers are its own reference ones; clang compiles the tests' C++ in about half
# GCC's time (bench/results/README.md, s39). Each sanitized build's unit.sanitizer_probe.* tests
# check that its sanitizers report. clang without its sanitizer runtimes (libclang-rt-dev)
# cannot link those builds: GCC then.
clang_sanitizes() {
  local t ok=0
  command -v clang >/dev/null && command -v clang++ >/dev/null || return 1
  t=$(mktemp -d) || return 1
  echo 'int main(void) { return 0; }' >"$t/p.c"
  { clang -fsanitize=address,undefined "$t/p.c" -o "$t/a" && clang -fsanitize=thread "$t/p.c" -o "$t/t"; } \
    >/dev/null 2>&1 || ok=1
  rm -rf "$t"
  return $ok
}
san_cc=()
if [ -z "${CC:-}${CXX:-}" ] && clang_sanitizes; then
  san_cc=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
fi
run_build build-asan "${san_cc[@]}" -DCMAKE_BUILD_TYPE=Debug -DSYMPOOL_SANITIZE=address,undefined \
  "${all_on[@]}" -DSYMPOOL_BUILD_BENCH=OFF "-DCMAKE_C_FLAGS_DEBUG=-g -O1"
echo "== tests: AddressSanitizer + UndefinedBehaviorSanitizer"
ctest --test-dir build-asan -j"$jobs" --timeout 600 --no-tests=error -LE plain_only

export TSAN_OPTIONS="halt_on_error=1"
# Only what the unit tests run (sp_unit_tests): the MPI suites and programs are not run here.
SP_TARGETS=sp_unit_tests run_build build-tsan "${san_cc[@]}" -DCMAKE_BUILD_TYPE=Debug -DSYMPOOL_SANITIZE=thread -DSYMPOOL_BUILD_TESTS=ON \
  -DSYMPOOL_BUILD_BENCH=OFF -DSYMPOOL_BUILD_EXAMPLES=OFF
echo "== tests: ThreadSanitizer (unit tests, the CLI's signal handlers)"
ctest --test-dir build-tsan -j"$jobs" --timeout 600 -L unit -LE one_thread --no-tests=error
