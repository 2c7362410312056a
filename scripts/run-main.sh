#!/usr/bin/env bash
# The main job: build sympool and run the data-parallel training-step example under mpirun on
# the default backend (cuda when a GPU answers, else the emulated host device).
#   NP=8 ./scripts/run-main.sh      # more ranks
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
. scripts/env.sh
# Every option this script relies on is given here: build/ may hold a cache from test.sh (or
# from an earlier run with other settings), and CMake would otherwise keep its values.
main_opts=(-DCMAKE_BUILD_TYPE=Release -DSYMPOOL_BUILD_EXAMPLES=ON -DSYMPOOL_BUILD_TESTS=OFF -DSYMPOOL_BUILD_BENCH=OFF -DSYMPOOL_SANITIZE=)
cmake -S . -B build "${main_opts[@]}" >/dev/null
cmake --build build -j"$(nproc)" --target 01_train_step >/dev/null
mkdir -p out
# On the cuda backend each rank needs a GPU of its own (NCCL refuses two ranks on one GPU, and
# sp_world_init says so). With fewer GPUs than the 4 default ranks and no NP given, run the
# host backend and say so, rather than fail.
np=${NP:-4}
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ -z "${NP:-}" ] && [ "${SYMPOOL_DEVICE:-auto}" != host ] && [ "$gpus" -gt 0 ] && [ "$gpus" -lt "$np" ]; then
  echo "run-main: $gpus GPU(s) here, $np ranks: running on the host backend (SYMPOOL_DEVICE=host)."
  echo "run-main: for the GPUs, run NP=$gpus $0"
  export SYMPOOL_DEVICE=host
fi
exec mpirun -np "$np" build/examples/01_train_step "$@"
