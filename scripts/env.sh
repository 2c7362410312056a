# Sourced by the scripts: what mpirun needs in containers and as root. Open MPI refuses to run as
# root without the two ALLOW variables; oversubscription lets 8 ranks run on 2 cores; the
# single-copy mechanism (CMA) is often forbidden by container seccomp profiles.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
