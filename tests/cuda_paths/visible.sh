#!/bin/sh
# visible.sh LIST0 LIST1 ... -- PROGRAM [ARGS]: run PROGRAM with CUDA_VISIBLE_DEVICES set to the
# list of this rank's node-local rank (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), as a launcher that
# gives each rank its own GPUs does (SLURM's --gpus-per-task).
i=0
v=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [ "$i" = "${OMPI_COMM_WORLD_LOCAL_RANK:-0}" ] && v=$1
    i=$((i + 1))
    shift
done
shift
CUDA_VISIBLE_DEVICES=$v exec "$@"
