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
exec mpirun -np "${NP:-4}" build/examples/01_train_step "$@"
