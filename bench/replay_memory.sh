#!/bin/sh
# bench/replay_memory.sh: the memory a whole `sympool replay TRACE --json` process touches, read
# at its exit by a preloaded library's destructor (the CLI's heap is never trimmed, so what it
# touched is still there). Two runs per binary and trace, both deterministic (no time in them):
#   heap_touched_kB  the [heap] mapping's resident kB with transparent huge pages off for the
#                    process (prctl PR_SET_THP_DISABLE): the 4 KiB pages the load and the replay
#                    touched, whatever the huge pages make of them
#   anon_huge_kB     AnonHugePages of /proc/self/smaps_rollup in a plain run: the huge pages the
#                    heap took (each zeroed whole by the kernel on its first touch, the system time
#                    of a replay), with Anonymous beside it as anonymous_kB
# One JSON line per binary and trace, then one per binary with the sums.
# Usage: bench/replay_memory.sh "BIN [BIN2 ...]" TRACE...
set -eu
bins=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/at_exit.c" <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
/* SP_MEM_THP_OFF=1: no huge pages for this process. At exit: the [heap]'s Rss, and the
 * process's Anonymous and AnonHugePages, on stderr. */
__attribute__((constructor)) static void thp_off(void) {
    const char *v = getenv("SP_MEM_THP_OFF");
    if (v != NULL && strcmp(v, "1") == 0)
        (void)prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
}
__attribute__((destructor)) static void report(void) {
    char line[512];
    long heap = 0, anon = 0, huge = 0, v;
    unsigned long a, b;
    int in_heap = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            in_heap = strstr(line, "[heap]") != NULL;
        else if (in_heap && sscanf(line, "Rss: %ld", &v) == 1)
            heap += v;
    }
    if (f != NULL)
        fclose(f);
    f = fopen("/proc/self/smaps_rollup", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "Anonymous: %ld", &v) == 1)
            anon = v;
        else if (sscanf(line, "AnonHugePages: %ld", &v) == 1)
            huge = v;
    }
    if (f != NULL)
        fclose(f);
    fprintf(stderr, "sp_mem %ld %ld %ld\n", heap, anon, huge);
}
EOF
cc -O2 -shared -fPIC -o "$tmp/at_exit.so" "$tmp/at_exit.c"
mem() { # mem THP_OFF BIN TRACE: "heap anon huge" of one run
  SP_MEM_THP_OFF=$1 LD_PRELOAD="$tmp/at_exit.so" "$2" replay "$3" --json 2>&1 >/dev/null |
    sed -n 's/^sp_mem //p' | tail -n 1
}
for bin in $bins; do
  sh=0 sa=0 shp=0 n=0
  for trace in "$@"; do
    # shellcheck disable=SC2046 # three numbers
    set -- $(mem 1 "$bin" "$trace") $(mem 0 "$bin" "$trace") "$@"
    heap=$1 anon=$5 huge=$6
    shift 6
    printf '{"bench":"replay_memory","binary":"%s","trace":"%s","heap_touched_kB":%s,"anonymous_kB":%s,"anon_huge_kB":%s}\n' \
      "$bin" "$(basename "$trace")" "$heap" "$anon" "$huge"
    sh=$((sh + heap)) sa=$((sa + anon)) shp=$((shp + huge)) n=$((n + 1))
  done
  printf '{"bench":"replay_memory_total","binary":"%s","traces":%d,"heap_touched_kB":%d,"anonymous_kB":%d,"anon_huge_kB":%d}\n' \
    "$bin" "$n" "$sh" "$sa" "$shp"
done
