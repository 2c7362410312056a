# Sourced by the scripts: what mpirun needs in containers and as root. Open MPI refuses to run as
# root without the two ALLOW variables; oversubscription lets 8 ranks run on 2 cores; the
# single-copy mechanism (CMA) is often forbidden by container seccomp profiles.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# A rank waiting in MPI gives its core away (sched_yield) instead of spinning: with more ranks
# than cores, the spinning ranks held the cores the rank they waited for needed (mpirun -np 8 of
# test_collectives on 2 busy cores: 320 s spinning, 20 s yielding; Open MPI 4.1 does not turn it
# on for --oversubscribe by itself). tests/CMakeLists.txt sets it for ctest runs too.
export OMPI_MCA_mpi_yield_when_idle=1
# Ninja builds a new build folder where it is installed (scripts/deps.sh installs it): the plain
# build took 142 s here against 167 s with Make's recursive makefiles, which start a process for
# each step beside the compilers (bench/results/README.md, s38-ci). A folder configured before
# keeps its generator (CMake reads it from the cache), and CMAKE_GENERATOR set by the caller wins.
if [ -z "${CMAKE_GENERATOR:-}" ] && command -v ninja >/dev/null 2>&1; then
  export CMAKE_GENERATOR=Ninja
fi
