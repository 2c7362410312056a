#!/usr/bin/env bash
# gpu-check.sh: the one-command GPU validation of sympool (issue 11), on a machine with one NVIDIA
# GPU (H100/H200; CUDA 13 toolkit, PyTorch with its nvidia-nccl wheel, CuPy; no network, no Open
# MPI). From a fresh copy of the repository:
#
#     scripts/gpu-check.sh [--out DIR]          (default DIR: bench/results)
#
# It (each step under its own time limit; the whole run stays under 8 minutes):
#   1. builds sympool with CUDA and NCCL (NCCL from PyTorch's wheel: nvidia/nccl, libnccl.so.2),
#      with the tests, SYMPOOL_TEST_DEVICE=cuda;
#   2. runs the test suite on the cuda backend (MPI tests at one rank; what needs several ranks
#      runs on the host backend, what needs the host backend skips with its reason);
#   3. runs the one-rank NCCL window test (mpi.test_symmetric_gpu.np1) on its own;
#   4. runs the PyTorch examples (examples/python/pluggable_allocator.py, mempool.py);
#   5. trains a small transformer (forward, backward, AdamW) three times, each in its own process:
#      PyTorch's allocator, sympool for the whole process (change_current_allocator), sympool
#      behind torch.cuda.MemPool; the losses and parameters must match the native run;
#   6. replays the traces in tests/data through PyTorch's caching allocator and through
#      sympool's cuda backend, in separate processes: peak reserved and time per operation;
#   7. times a cached malloc+free pair: sympool, c10's raw_alloc/raw_delete, cudaMallocAsync with
#      a retaining pool (C++ loops in a small torch extension) and CuPy's MemoryPool;
#   8. writes DIR/gpu-check-<date>-<gpu>.json and .md (every figure, the GPU's name, driver,
#      CUDA, NCCL and torch versions) and exits non-zero if any step failed.
# Without a GPU it says so, checks that sympool builds and that its scripts parse, and exits 0.
#
# Open MPI and GoogleTest on the GPU machine: it has neither and cannot download. Prepare Debian
# packages here (a machine with apt and network), in the repository's ignored folder .debs/:
#
#     scripts/gpu-check.sh --prepare-deps        (apt-get download into .debs/, about 15 MiB)
#
# and carry .debs to the GPU machine with the checkout (the device tool: carry [".debs"]). This
# script unpacks them with dpkg -x into $SYMPOOL_DEPS_ROOT (default /tmp/sympool-deps) and sets
# PATH, LD_LIBRARY_PATH and OPAL_PREFIX so mpirun and the MPI headers come from there. Packages
# of an older distribution than the GPU machine's are fine (glibc is backward compatible).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=bench/results
DEBS=$ROOT/.debs
DEPS_ROOT=${SYMPOOL_DEPS_ROOT:-/tmp/sympool-deps}
JOBS=$(nproc 2>/dev/null || echo 4)

prepare_deps() {
    # The run-time closure of Open MPI, its headers and GoogleTest, minus what every Linux with
    # a compiler has (libc, the toolchain, perl, ...), which dpkg -x must not shadow.
    local pkgs="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libgtest-dev googletest"
    local skip='^(libc6|libc6-dev|libc-dev-bin|libgcc.*|gcc.*|g\+\+.*|cpp.*|libstdc\+\+.*|binutils.*|libbinutils|libctf.*|libgprofng0|perl.*|libperl.*|debconf|cdebconf|dpkg|tar|passwd|adduser|debianutils|libpam.*|libselinux1|libsemanage.*|libsepol2|libaudit.*|libcap-ng0|libacl1|install-info|readline-common|libreadline8|libtinfo6|zlib1g.*|liblzma5|libzstd1|libbz2-1.0|libssl3|libkrb.*|libk5crypto3|libgssapi-krb5-2|libcom-err2|libkeyutils1|libcrypt.*|libdb5.3|libgdbm.*|libffi8|libuuid1|libpcre2-8-0|libgmp10|libmpfr6|libmpc3|libisl23|libllvm.*|libclang.*|libmlir.*|libz3-4|flang.*|gfortran.*|libgfortran-.*-dev|libflang.*|libasan.*|liblsan0|libtsan.*|libubsan1|libitm1|libatomic1|libquadmath0|libgomp1|libcc1-0|linux-libc-dev|autoconf|automake|autotools-dev|m4|libltdl-dev|libnsl.*|libtirpc.*|rpcsvc-proto|libjs-.*|libedit2|libicu.*|libxml2|libnewt0.52|libslang2|libtextwrap1|libdebian-installer4|libfido2-1|libcbor.*|openssh-client|libevent-dev|libhwloc-dev|libibverbs-dev|libnl-3-dev|libnl-route-3-dev|libnuma-dev|libpmix-dev|libudev1|libjansson4|libevent-openssl.*|libevent-extra.*|libevent-2.1-7)$'
    local all
    all=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances $pkgs | grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$skip")
    mkdir -p "$DEBS"
    (cd "$DEBS" && apt-get download $all) || return 1
    echo "gpu-check: $(ls "$DEBS"/*.deb | wc -l) packages, $(du -sh "$DEBS" | cut -f1) in $DEBS"
    echo "gpu-check: carry .debs to the GPU machine with the checkout"
}

if [ "${1:-}" = --prepare-deps ]; then
    prepare_deps
    exit $?
fi
while [ $# -gt 0 ]; do
    case $1 in
    --out) OUTDIR=$2; shift 2 ;;
    *) echo "usage: scripts/gpu-check.sh [--out DIR] | --prepare-deps"; exit 2 ;;
    esac
done

WORK=$(mktemp -d /tmp/sympool-gpu-check.XXXXXX)
STEPS=$WORK/steps.tsv
: >"$STEPS"
FAILED=0
START=$(date +%s)

# step NAME LIMIT_SECONDS COMMAND...: runs it with a time limit, logs to $WORK/NAME.log, records
# PASS/FAIL with the tail of its log in steps.tsv.
step() {
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s) rc
    echo "== $name (limit ${limit}s)"
    # Through bash -c so that a shell function (exported with export -f) can be a step.
    timeout --kill-after=10 "$limit" bash -c '"$@"' bash "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    local secs=$(( $(date +%s) - t0 )) detail
    detail=$(tail -3 "$WORK/$name.log" | tr '\t\n|' '  /' | cut -c1-300)
    if [ $rc -eq 0 ]; then
        printf '%s\tPASS\t%s\t%s\n' "$name" "$secs" "$detail" >>"$STEPS"
        echo "   PASS (${secs}s)"
    else
        [ $rc -eq 124 ] && detail="timed out after ${limit}s; $detail"
        printf '%s\tFAIL\t%s\t%s\n' "$name" "$secs" "rc $rc: $detail" >>"$STEPS"
        echo "   FAIL (rc $rc, ${secs}s): see $WORK/$name.log"
        tail -20 "$WORK/$name.log" | sed 's/^/   | /'
        FAILED=1
    fi
    return $rc
}

check_scripts_parse() {
    bash -n scripts/*.sh || return 1
    python3 - <<'PY'
import ast, glob, sys
bad = 0
for f in glob.glob("bench/gpu/*.py") + glob.glob("examples/python/*.py"):
    try:
        ast.parse(open(f).read(), f)
    except SyntaxError as e:
        print(f"{f}: {e}"); bad += 1
print(f"python files parsed, {bad} with errors")
sys.exit(1 if bad else 0)
PY
}

export -f check_scripts_parse

have_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# ---- no GPU: what can be checked here -----------------------------------------------------
if ! have_gpu; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none): checking that sympool builds and"
    echo "gpu-check: that the check's scripts parse; the GPU steps are skipped."
    step scripts_parse 60 check_scripts_parse
    step build_no_gpu 900 bash -c "cmake -S . -B build-gpu-check -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DSYMPOOL_BUILD_TESTS=OFF -DSYMPOOL_BUILD_BENCH=OFF -DSYMPOOL_BUILD_EXAMPLES=OFF && \
        cmake --build build-gpu-check -j$JOBS"
    cat "$STEPS"
    echo "gpu-check: no GPU; nothing on CUDA was run (exit $FAILED)"
    exit $FAILED
fi

# ---- Open MPI and GoogleTest from .debs ----------------------------------------------------
CMAKE_DEPS=()
if ! command -v mpirun >/dev/null 2>&1 || [ ! -f /usr/include/gtest/gtest.h ]; then
    if ls "$DEBS"/*.deb >/dev/null 2>&1; then
        mkdir -p "$DEPS_ROOT"
        for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS_ROOT" || exit 1; done
        ompi=$DEPS_ROOT/usr/lib/x86_64-linux-gnu/openmpi
        export OPAL_PREFIX=$DEPS_ROOT/usr
        export PATH=$DEPS_ROOT/usr/bin:$PATH
        export LD_LIBRARY_PATH=$ompi/lib:$DEPS_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        # Debian's alternatives (mpirun -> mpirun.openmpi) are not made by dpkg -x.
        for b in mpirun mpiexec mpicc mpicxx; do
            [ -e "$DEPS_ROOT/usr/bin/$b" ] || ln -sf "$b.openmpi" "$DEPS_ROOT/usr/bin/$b" 2>/dev/null
        done
        CMAKE_DEPS+=(-DCMAKE_PREFIX_PATH="$DEPS_ROOT/usr"
            -DMPIEXEC_EXECUTABLE="$DEPS_ROOT/usr/bin/mpirun"
            -DMPI_C_COMPILER="$DEPS_ROOT/usr/bin/mpicc.openmpi"
            -DMPI_CXX_COMPILER="$DEPS_ROOT/usr/bin/mpicxx.openmpi")
        echo "gpu-check: Open MPI and GoogleTest unpacked from .debs into $DEPS_ROOT"
    else
        echo "gpu-check: no mpirun or GoogleTest here and no .debs folder: run"
        echo "gpu-check:   scripts/gpu-check.sh --prepare-deps"
        echo "gpu-check: on a machine with network and carry .debs here"
        exit 1
    fi
fi
. scripts/env.sh

# NCCL: PyTorch's wheel (nvidia/nccl/{include,lib}), unless SYMPOOL_NCCL_ROOT says otherwise.
NCCL_ROOT=${SYMPOOL_NCCL_ROOT:-$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
[ -n "$NCCL_ROOT" ] && export LD_LIBRARY_PATH=$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SYMPOOL_TEST_DEVICE=cuda
export SYMPOOL_LIBRARY=$ROOT/build-gpu-check/libsympool.so
export PYTHONUNBUFFERED=1
B=build-gpu-check

step scripts_parse 60 check_scripts_parse
step build 240 bash -c "cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPOOL_WITH_CUDA=ON \
    -DSYMPOOL_WITH_NCCL=ON -DSYMPOOL_NCCL_ROOT='$NCCL_ROOT' -DSYMPOOL_BUILD_BENCH=OFF ${CMAKE_DEPS[*]} && \
    cmake --build $B -j$JOBS" || { echo "gpu-check: the build failed; nothing else can run"; }
if [ -f "$SYMPOOL_LIBRARY" ]; then
    step suite_cuda 150 ctest --test-dir $B -j4 --timeout 60 --output-on-failure
    step nccl_window_np1 60 ctest --test-dir $B -R '^mpi\.test_symmetric_gpu\.np1$' --output-on-failure
    step example_pluggable 60 python3 examples/python/pluggable_allocator.py "$SYMPOOL_LIBRARY"
    step example_mempool 60 python3 examples/python/mempool.py "$SYMPOOL_LIBRARY"
    for mode in native pluggable mempool; do
        step train_$mode 90 python3 bench/gpu/train_check.py $mode --out "$WORK/train_$mode.json"
    done
    for t in tests/data/*.pickle; do
        n=$(basename "$t" .pickle | tr -c 'A-Za-z0-9_\n' '_')
        step replay_torch_$n 60 python3 bench/gpu/replay.py torch "$t" --out "$WORK/replay_torch_$n.json"
        step replay_sympool_$n 60 python3 bench/gpu/replay.py sympool "$t" --out "$WORK/replay_sympool_$n.json"
    done
    step hit_cost 150 python3 bench/gpu/hit_cost.py --out "$WORK/hit_cost.json"
fi

# ---- the report ----------------------------------------------------------------------------
mkdir -p "$OUTDIR"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-')
base=$OUTDIR/gpu-check-$(date +%Y-%m-%d)-${gpu%-}
python3 bench/gpu/report.py "$WORK" "$base" || FAILED=1
# The logs of failed steps travel with the report (a device run returns only what is in $OUT).
if [ $FAILED -ne 0 ]; then
    cut -f1,2 "$STEPS" | awk -F'\t' '$2 == "FAIL" {print $1}' | while read -r n; do
        [ -f "$WORK/$n.log" ] && tail -200 "$WORK/$n.log" >"$base.$n.log"
    done
fi
echo "gpu-check: $(( $(date +%s) - START ))s; results in $base.json and $base.md; logs in $WORK"
exit $FAILED
