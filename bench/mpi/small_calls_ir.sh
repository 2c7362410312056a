#!/bin/sh
# bench/mpi/small_calls_ir.sh: instructions per call of bench_small_calls' three calls at 2 ranks
# under callgrind, each without its wait for the peer (that part depends on timing, not on the
# code): collection is toggled on inside sp_allreduce, sp_symmetric_malloc and MPI_Allreduce and
# off inside sympool's agreement wait (wait_round) and Open MPI's request wait
# (ompi_request_default_wait); only the calls of the timed loop count (not the first symmetric
# malloc, which grows the pool). One JSON line per rank:
#   {"bench":"small_calls_ir","rank":0,"sp_allreduce_ir":..,"sym_hit_ir":..,"mpi_allreduce_ir":..}
# Usage: bench/mpi/small_calls_ir.sh BUILD_DIR   (needs valgrind, mpirun, python3; Open MPI)
set -eu
bin=$1/bench/bench_small_calls
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
SYMPOOL_DEVICE=host OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 2 valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%q{OMPI_COMM_WORLD_RANK}" \
  --toggle-collect=sp_allreduce --toggle-collect=sp_symmetric_malloc \
  --toggle-collect=PMPI_Allreduce --toggle-collect=wait_round \
  --toggle-collect=ompi_request_default_wait \
  "$bin" 200 3 >/dev/null 2>&1
for rank in 0 1; do
  callgrind_annotate --tree=caller --inclusive=yes "$dir/cg.$rank" >"$dir/tree.$rank" 2>/dev/null
  python3 - "$dir/tree.$rank" "$rank" <<'EOF'
import re, sys

lines = open(sys.argv[1]).read().split('\n')


def per_call(fn):
    """Ir per call of fn from the timed loop (its caller run(): the one growth, called from main,
    stays out), from the caller line above fn's own line."""
    for k, line in enumerate(lines):
        if '*  ' in line and re.search(r'[:?]' + re.escape(fn) + r'( |$)', line):
            j = k - 1
            while j >= 0 and '<' in lines[j]:
                m = re.search(r'^\s*([\d,]+) .*small_calls\.c:run \(([\d,]+)x\)', lines[j])
                if m:
                    return round(int(m.group(1).replace(',', '')) /
                                 int(m.group(2).replace(',', '')))
                j -= 1
    return None


print('{"bench":"small_calls_ir","rank":%s,"sp_allreduce_ir":%s,"sym_hit_ir":%s,'
      '"mpi_allreduce_ir":%s}' % (sys.argv[2], per_call('sp_allreduce'),
                                  per_call('sp_symmetric_malloc'), per_call('PMPI_Allreduce')))
EOF
done
