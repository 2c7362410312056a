#!/usr/bin/env bash
# python_history_ir.sh: instructions a 512-byte pair from Python costs with history off, on
# without context and on with Python stacks (bench/python_history.py --only), counted by callgrind
# over the whole process: (run of PAIRS pairs - run of 0 pairs) / PAIRS. The machine's load does
# not move these counts (PYTHONHASHSEED=0 fixes the interpreter's hashing), so builds compare
# across runs. One JSON line per depth.
#
#   [PYTHON=python3] bench/python_history_ir.sh LABEL LIBRARY PYTHONPATH [PAIRS [DEPTHS]]
#   e.g. bench/python_history_ir.sh after build/libsympool.so python 20000 "0 30"
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,9p' "$0"; exit 2; }
label=$1 lib=$2 pypath=$3 pairs=${4:-20000} depths=${5:-0}
here=$(cd "$(dirname "$0")" && pwd)
# The interpreter itself: callgrind would count a wrapper script (pyenv's shims) instead.
python=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
ir() { # mode pairs depth -> instructions of the whole run
  SYMPOOL_DEVICE=host SYMPOOL_LIBRARY=$lib PYTHONPATH=$pypath PYTHONHASHSEED=0 \
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$python" "$here/python_history.py" \
    --only "$1" --pairs "$2" --depths "$3" 2>&1 | awk '/Collected/ {print $4}'
}
for depth in $depths; do
  line="{\"bench\":\"python_history_ir\",\"build\":\"$label\",\"date\":\"$(date +%F)\""
  line+=",\"pairs\":$pairs,\"depth\":$depth"
  for mode in off on_no_context on_python_stacks; do
    a=$(ir $mode "$pairs" "$depth")
    b=$(ir $mode 0 "$depth")
    eval "ir_$mode=$(( (a - b) / pairs ))"
    line+=",\"${mode}_ir\":$(( (a - b) / pairs ))"
  done
  ratio=$(awk -v s="$ir_on_python_stacks" -v n="$ir_on_no_context" 'BEGIN {printf "%.3f", s / n}')
  echo "$line,\"stacks_vs_no_context_ir\":$ratio}"
done
