#!/usr/bin/env bash
# gpu-check.sh: the one-command GPU validation of sympool, on a machine with one NVIDIA GPU
# (H100/H200; CUDA 13 toolkit, PyTorch with its nvidia-nccl wheel, CuPy; no network, no Open MPI),
# sized to fit one device call (10 minutes): every step has a budget, and one overall deadline
# (SYMPOOL_GPU_CHECK_DEADLINE seconds, default 530, at most 540) cuts whatever would run past it.
#
#     scripts/gpu-check.sh [--out DIR]          (default DIR: bench/results)
#     scripts/gpu-check.sh --plan               (the steps and their budgets; no GPU needed)
#     scripts/gpu-check.sh --steps REGEX        (only the steps whose names match, with the build;
#                                                 for a rerun of what broke, or the extra steps)
#     scripts/gpu-check.sh --prepare-deps       (see below)
#
# Steps (--plan prints them with their budgets): build with CUDA and NCCL (NCCL from PyTorch's
# wheel, nvidia/nccl with libnccl.so.2 only); the test suite on the cuda backend (MPI tests at
# one rank; what needs several ranks runs on host); the one-rank NCCL window test; the
# expandable-segment tests on the GPU; the PyTorch examples; a small transformer trained three
# times in processes of their own (PyTorch's allocator, sympool.torch.enable(),
# sympool.torch.mem_pool()), losses and parameters compared; the traces in tests/data replayed
# through PyTorch's allocator and sympool's (and once with expandable segments); the cached
# malloc+free pair timed against c10, cudaMallocAsync and CuPy; bench/gpu/probe.py (what only a
# GPU decides, and history's cost beside PyTorch's). Extra steps, run only when --steps names
# them: replay_real (bench/gpu/replay_traces.py over tests/data/real: PyTorch's allocator and
# sympool's on the GPU, its JSON lines in the logs folder as replay_real.jsonl).
#
# The report is DIR/gpu-check-<date>-<gpu>.json and .md (two files), rewritten after every step,
# so a run that is cut off still leaves a current one; each failed step's last log lines are
# inside it. Exit status: non-zero if any step failed or was cut by the deadline.
# Without a GPU it says so, checks that the scripts parse and that CMake configures, writes its
# report (DIR/gpu-check-<date>-no-gpu.*) and exits 0.
#
# Open MPI and GoogleTest on the GPU machine: it has neither and cannot download. Prepare Debian
# packages here (a machine with apt and network), in the repository's ignored folder .debs/:
#
#     scripts/gpu-check.sh --prepare-deps        (apt-get download into .debs/, about 15 MiB)
#
# and carry .debs to the GPU machine with the checkout (the device tool: carry [".debs"]). This
# script unpacks them with dpkg -x into $SYMPOOL_DEPS_ROOT (default /tmp/sympool-deps) and sets
# PATH, LD_LIBRARY_PATH, OPAL_PREFIX and PMIX_MCA_mca_base_component_path so mpirun, its PMIx
# components and the MPI headers come from there. Packages of an older distribution than the GPU
# machine's are fine (glibc is backward compatible).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=bench/results
DEBS=$ROOT/.debs
DEPS_ROOT=${SYMPOOL_DEPS_ROOT:-/tmp/sympool-deps}
JOBS=$(nproc 2>/dev/null || echo 4)
DEADLINE_S=${SYMPOOL_GPU_CHECK_DEADLINE:-540}
[ "$DEADLINE_S" -gt 540 ] 2>/dev/null && DEADLINE_S=540
# The build folder and extra CMake arguments for both configure steps (tests point these at a
# scratch folder and at a failing configure).
B=${SYMPOOL_GPU_CHECK_BUILD:-build-gpu-check}
export SYMPOOL_GPU_CHECK_CMAKE_ARGS=${SYMPOOL_GPU_CHECK_CMAKE_ARGS:-}

prepare_deps() {
    # The run-time closure of Open MPI, its headers and GoogleTest, minus what every Linux with
    # a compiler has (libc, the toolchain, perl, ...), which dpkg -x must not shadow. libudev1
    # stays in: hwloc (under Open MPI) needs libudev.so.1, which a minimal GPU image lacks.
    local pkgs="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libgtest-dev googletest"
    local skip='^(libc6|libc6-dev|libc-dev-bin|libgcc.*|gcc.*|g\+\+.*|cpp.*|libstdc\+\+.*|binutils.*|libbinutils|libctf.*|libgprofng0|perl.*|libperl.*|debconf|cdebconf|dpkg|tar|passwd|adduser|debianutils|libpam.*|libselinux1|libsemanage.*|libsepol2|libaudit.*|libcap-ng0|libacl1|install-info|readline-common|libreadline8|libtinfo6|zlib1g.*|liblzma5|libzstd1|libbz2-1.0|libssl3|libkrb.*|libk5crypto3|libgssapi-krb5-2|libcom-err2|libkeyutils1|libcrypt.*|libdb5.3|libgdbm.*|libffi8|libuuid1|libpcre2-8-0|libgmp10|libmpfr6|libmpc3|libisl23|libllvm.*|libclang.*|libmlir.*|libz3-4|flang.*|gfortran.*|libgfortran-.*-dev|libflang.*|libasan.*|liblsan0|libtsan.*|libubsan1|libitm1|libatomic1|libquadmath0|libgomp1|libcc1-0|linux-libc-dev|autoconf|automake|autotools-dev|m4|libltdl-dev|libnsl.*|libtirpc.*|rpcsvc-proto|libjs-.*|libedit2|libicu.*|libxml2|libnewt0.52|libslang2|libtextwrap1|libdebian-installer4|libfido2-1|libcbor.*|openssh-client|libevent-dev|libhwloc-dev|libibverbs-dev|libnl-3-dev|libnl-route-3-dev|libnuma-dev|libpmix-dev|libjansson4|libevent-openssl.*|libevent-extra.*|libevent-2.1-7)$'
    local all
    all=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances $pkgs | grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$skip")
    mkdir -p "$DEBS"
    (cd "$DEBS" && apt-get download $all) || return 1
    echo "gpu-check: $(ls "$DEBS"/*.deb | wc -l) packages, $(du -sh "$DEBS" | cut -f1) in $DEBS"
    echo "gpu-check: carry .debs to the GPU machine with the checkout"
}

MODE=run
STEPS_RE=
while [ $# -gt 0 ]; do
    case $1 in
    --out) OUTDIR=${2:?--out needs a folder}; shift 2 ;;
    --plan) MODE=plan; shift ;;
    --steps)
        STEPS_RE=${2:?--steps needs a regular expression}
        # A pattern grep cannot read matched no step, and the run built and passed.
        echo | grep -Eq -- "$STEPS_RE" 2>/dev/null
        [ $? -ne 2 ] || { echo "gpu-check: --steps '$STEPS_RE' is no extended regular expression" >&2; exit 2; }
        shift 2 ;;
    --prepare-deps) prepare_deps; exit $? ;;
    *) echo "usage: scripts/gpu-check.sh [--out DIR] [--steps REGEX] | --plan | --prepare-deps"; exit 2 ;;
    esac
done

have_gpu() {
    [ "${SYMPOOL_GPU_CHECK_NO_GPU:-0}" = 1 ] && return 1
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# ---- the plan: NAME BUDGET_SECONDS COMMAND (one shell line) ---------------------------------
# The budgets add up to the deadline; a step gets the smaller of its budget and the time left.
PLAN_NAMES=() PLAN_BUDGETS=() PLAN_CMDS=()
plan() { PLAN_NAMES+=("$1"); PLAN_BUDGETS+=("$2"); PLAN_CMDS+=("$3"); }
traces() { for t in tests/data/*.pickle; do basename "$t" .pickle; done; }
tname() { echo "$1" | tr -c 'A-Za-z0-9_\n' '_'; }

plan_gpu() {
    plan scripts_parse 5 check_scripts_parse
    plan build 100 "cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPOOL_WITH_CUDA=ON \
-DSYMPOOL_WITH_NCCL=ON -DSYMPOOL_NCCL_ROOT=\"\$NCCL_ROOT\" -DSYMPOOL_BUILD_TESTS=ON -DSYMPOOL_BUILD_BENCH=OFF \$CMAKE_DEPS_STR \
\$SYMPOOL_GPU_CHECK_CMAKE_ARGS \
&& cmake --build $B -j$JOBS"
    # The packaging tests (install.*, scripts.*, python.pip_install: builds and CMake runs of
    # their own, no GPU in them) are CI's; the window test has its own step. On an H100 the build
    # took 47 s and the suite 70 s without pip_install (2026-11-25).
    plan suite_cuda 110 "ctest --test-dir $B -j4 --timeout 40 --output-on-failure \
-E '^mpi\.test_symmetric_gpu|^install\.|^scripts\.|^python\.pip_install\$'"
    plan nccl_window_np1 20 "ctest --test-dir $B -R '^mpi\.test_symmetric_gpu\.np1\$' --output-on-failure"
    plan expandable_cuda 20 "SYMPOOL_ALLOC_CONF=expandable_segments:True ctest --test-dir $B \
-R 'Expandable|expandable' -j4 --timeout 30 --output-on-failure"
    plan example_pluggable 15 "python3 examples/python/pluggable_allocator.py \"\$SYMPOOL_LIBRARY\""
    plan example_mempool 15 "python3 examples/python/mempool.py \"\$SYMPOOL_LIBRARY\""
    plan train_native 25 "python3 bench/gpu/train_check.py native --out \"\$WORK/train_native.json\""
    # The first enable() builds sympool.torch's C++ shim against torch (cached afterwards).
    plan train_pluggable 25 "python3 bench/gpu/train_check.py pluggable --out \"\$WORK/train_pluggable.json\""
    plan train_mempool 25 "python3 bench/gpu/train_check.py mempool --out \"\$WORK/train_mempool.json\""
    # sympool.torch's checks only real torch on a GPU decides (the shim is built by now).
    plan torch_check 15 "python3 tests/torch_shim/gpu_torch_check.py"
    local t n first=
    for t in $(traces); do
        n=$(tname "$t")
        [ -n "$first" ] || first=$t
        plan "replay_torch_$n" 10 "python3 bench/gpu/replay.py torch tests/data/$t.pickle --out \"\$WORK/replay_torch_$n.json\""
        plan "replay_sympool_$n" 10 "python3 bench/gpu/replay.py sympool tests/data/$t.pickle --out \"\$WORK/replay_sympool_$n.json\""
    done
    if [ -n "$first" ]; then
        n=$(tname "$first")
        plan "replay_sympool_expandable_$n" 10 "SYMPOOL_ALLOC_CONF=expandable_segments:True python3 \
bench/gpu/replay.py sympool tests/data/$first.pickle --out \"\$WORK/replay_sympool_expandable_$n.json\""
    fi
    # Building its C++ extension takes most of it: 34 to 40 s in all on an H100.
    plan hit_cost 65 "python3 bench/gpu/hit_cost.py --out \"\$WORK/hit_cost.json\""
    # Facts only a GPU decides and history's cost beside PyTorch's: 25 s on an H200 (2026-11-29).
    plan probe 30 "python3 bench/gpu/probe.py --out \"\$WORK/probe.json\""
    # Extra (only when --steps names it): 5 processes a trace, torch's import in each.
    if [ -n "$STEPS_RE" ]; then
        plan replay_real 400 "python3 bench/gpu/replay_traces.py tests/data/real --out \"\$WORK/replay_real.jsonl\""
    fi
    select_steps
}

# --steps: keep the steps whose names match (scripts_parse and build always: every other step
# needs the build).
select_steps() {
    [ -n "$STEPS_RE" ] || return 0
    local i names=() budgets=() cmds=()
    for i in "${!PLAN_NAMES[@]}"; do
        case ${PLAN_NAMES[$i]} in scripts_parse | build) ;; *)
            echo "${PLAN_NAMES[$i]}" | grep -Eq -- "$STEPS_RE" || continue ;;
        esac
        names+=("${PLAN_NAMES[$i]}") budgets+=("${PLAN_BUDGETS[$i]}") cmds+=("${PLAN_CMDS[$i]}")
    done
    if [ "${#names[@]}" -le 2 ]; then
        echo "gpu-check: --steps '$STEPS_RE' names no step (--plan lists them)" >&2
        exit 2
    fi
    PLAN_NAMES=("${names[@]}") PLAN_BUDGETS=("${budgets[@]}") PLAN_CMDS=("${cmds[@]}")
}

plan_no_gpu() {
    plan scripts_parse 5 check_scripts_parse
    plan configure_no_gpu 60 "cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo \
-DSYMPOOL_BUILD_TESTS=OFF -DSYMPOOL_BUILD_BENCH=OFF -DSYMPOOL_BUILD_EXAMPLES=OFF \
\$SYMPOOL_GPU_CHECK_CMAKE_ARGS"
}

print_plan() {
    local i total=0
    printf '%-56s %8s\n' step budget_s
    for i in "${!PLAN_NAMES[@]}"; do
        printf '%-56s %8s\n' "${PLAN_NAMES[$i]}" "${PLAN_BUDGETS[$i]}"
        total=$((total + PLAN_BUDGETS[i]))
    done
    printf '%-56s %8s\n' "(sum of budgets)" "$total"
    printf '%-56s %8s\n' "(overall deadline)" "$DEADLINE_S"
}

if [ "$MODE" = plan ]; then
    echo "gpu-check plan, with a GPU:"
    plan_gpu
    print_plan
    PLAN_NAMES=() PLAN_BUDGETS=() PLAN_CMDS=()
    echo "gpu-check plan, without a GPU:"
    plan_no_gpu
    print_plan
    exit 0
fi

check_scripts_parse() {
    bash -n scripts/*.sh || return 1
    python3 - <<'PY'
import ast, glob, sys
bad = 0
for f in glob.glob("bench/gpu/*.py") + glob.glob("examples/python/*.py") + glob.glob("python/sympool/*.py"):
    try:
        ast.parse(open(f).read(), f)
    except SyntaxError as e:
        print(f"{f}: {e}"); bad += 1
print(f"python files parsed, {bad} with errors")
sys.exit(1 if bad else 0)
PY
}
export -f check_scripts_parse

START=$(date +%s)
END=$((START + DEADLINE_S))
# Its logs stay for the user to read (the last line names them): under $TMPDIR where set.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sympool-gpu-check.XXXXXX")
STEPS=$WORK/steps.tsv
: >"$STEPS"
FAILED=0
mkdir -p "$OUTDIR" || exit 1
if have_gpu; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-')
    gpu=${gpu%-}
    REPORT_FLAGS=()
else
    gpu=no-gpu
    REPORT_FLAGS=(--no-gpu)
fi
BASE=$OUTDIR/gpu-check-$(date +%Y-%m-%d)-$gpu
export WORK

report() { python3 bench/gpu/report.py "$WORK" "$BASE" "${REPORT_FLAGS[@]}" "$@"; }

# run_step I: runs plan entry I under the smaller of its budget and the time left before the
# deadline (keeping a few seconds for the report), logs to $WORK/NAME.log, records
# PASS/FAIL/SKIP in steps.tsv and rewrites the report.
run_step() {
    local i=$1 name=${PLAN_NAMES[$1]} budget=${PLAN_BUDGETS[$1]} cmd=${PLAN_CMDS[$1]}
    local now left limit t0 rc secs detail
    now=$(date +%s)
    left=$((END - now - 5))
    limit=$(( budget < left ? budget : left ))
    if [ "$limit" -lt 3 ]; then
        printf '%s\tFAIL\t0\tnot run: the overall deadline (%ss) was reached\n' "$name" "$DEADLINE_S" >>"$STEPS"
        echo "== $name: not run (deadline)"
        FAILED=1
        report >/dev/null
        return 1
    fi
    echo "== $name (limit ${limit}s of budget ${budget}s; $((END - now))s left)"
    t0=$(date +%s)
    # In a child bash: the commands name $WORK, $NCCL_ROOT, $CMAKE_DEPS_STR (an array does not
    # cross into it) and shell functions (exported with export -f) as they are when it runs.
    timeout --kill-after=5 "$limit" bash -c "$cmd" >"$WORK/$name.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    detail=$(tail -3 "$WORK/$name.log" | tr '\t\n|' '  /' | cut -c1-300)
    if [ $rc -eq 0 ]; then
        printf '%s\tPASS\t%s\t%s\n' "$name" "$secs" "$detail" >>"$STEPS"
        echo "   PASS (${secs}s)"
    else
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && detail="timed out after ${limit}s; $detail"
        printf '%s\tFAIL\t%s\t%s\n' "$name" "$secs" "rc $rc: $detail" >>"$STEPS"
        echo "   FAIL (rc $rc, ${secs}s)"
        tail -15 "$WORK/$name.log" | sed 's/^/   | /'
        FAILED=1
    fi
    report >/dev/null
    return $rc
}

# ---- no GPU: what can be checked here -----------------------------------------------------
if [ "$gpu" = no-gpu ]; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none): checking that the scripts parse"
    echo "gpu-check: and that CMake configures; the GPU steps are skipped."
    plan_no_gpu
    for i in "${!PLAN_NAMES[@]}"; do run_step "$i"; done
    report --final >/dev/null
    echo "gpu-check: no GPU; nothing on CUDA was run (exit $FAILED); report: $BASE.json, $BASE.md"
    exit $FAILED
fi

# ---- Open MPI and GoogleTest from .debs ----------------------------------------------------
CMAKE_DEPS=()
if ! command -v mpirun >/dev/null 2>&1 || [ ! -f /usr/include/gtest/gtest.h ]; then
    if ls "$DEBS"/*.deb >/dev/null 2>&1; then
        mkdir -p "$DEPS_ROOT"
        for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS_ROOT" || exit 1; done
        multi=$DEPS_ROOT/usr/lib/x86_64-linux-gnu
        export OPAL_PREFIX=$DEPS_ROOT/usr
        export PATH=$DEPS_ROOT/usr/bin:$PATH
        export LD_LIBRARY_PATH=$multi/openmpi/lib:$multi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        # PMIx looks for its components where it was built to be (/usr/lib/...); OPAL_PREFIX
        # does not move them, so name the unpacked folder.
        for d in "$multi"/pmix2/lib/pmix "$multi"/pmix/lib/pmix; do
            [ -d "$d" ] && export PMIX_MCA_mca_base_component_path=$d && break
        done
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

# NCCL: PyTorch's wheel (nvidia/nccl/{include,lib}), unless SYMPOOL_NCCL_ROOT says otherwise. The
# cu13 wheel's nvidia.nccl is a namespace package: its folder is __path__[0].
NCCL_ROOT=${SYMPOOL_NCCL_ROOT:-$(python3 -c 'import nvidia.nccl as m, os; f = getattr(m, "__file__", None); print(os.path.dirname(f) if f else list(m.__path__)[0])' 2>/dev/null)}
[ -n "$NCCL_ROOT" ] && export LD_LIBRARY_PATH=$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_ROOT
export CMAKE_DEPS_STR="${CMAKE_DEPS[*]}"
export SYMPOOL_TEST_DEVICE=cuda
export SYMPOOL_LIBRARY=$ROOT/$B/libsympool.so
export SYMPOOL_CACHE_DIR=$WORK/cache
export PYTHONUNBUFFERED=1

plan_gpu
for i in "${!PLAN_NAMES[@]}"; do
    if [ "${PLAN_NAMES[$i]}" != scripts_parse ] && [ "${PLAN_NAMES[$i]}" != build ] && [ ! -f "$SYMPOOL_LIBRARY" ]; then
        printf '%s\tFAIL\t0\tnot run: the build failed\n' "${PLAN_NAMES[$i]}" >>"$STEPS"
        FAILED=1
        continue
    fi
    run_step "$i"
done
report --final || FAILED=1
echo "gpu-check: $(( $(date +%s) - START ))s of ${DEADLINE_S}s; report: $BASE.json, $BASE.md; logs in $WORK"
exit $FAILED
