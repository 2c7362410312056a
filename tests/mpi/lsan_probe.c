/* lsan_probe.c: the ASan+UBSan build's leak check still sees a leak of ours in a process that
 * runs Open MPI, and still hides Open MPI's own (tests/mpi/lsan_probe_check.sh runs it). Each
 * rank starts MPI and sympool, leaks exactly one 4096-byte block from lsan_probe_leak, ends
 * both, and exits: LeakSanitizer must report that block, named by this function, and nothing
 * else. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sympool/sympool.h>

static void *volatile g_sink;

/* Not inlined: the report names this frame. */
__attribute__((noinline)) static void lsan_probe_leak(void) {
    char *block = malloc(4096);
    if (block != NULL)
        memset(block, 0x5a, 4096);
    g_sink = block;
    g_sink = NULL; /* the last pointer to the block gone: a leak */
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (sp_init() != SP_SUCCESS) {
        fprintf(stderr, "lsan-probe: FAIL rank %d: sp_init: %s\n", rank, sp_last_error());
        return 1;
    }
    void *p = NULL;
    if (sp_malloc(1 << 20, 0, NULL, &p) != SP_SUCCESS || sp_free(p) != SP_SUCCESS) {
        fprintf(stderr, "lsan-probe: FAIL rank %d: %s\n", rank, sp_last_error());
        return 1;
    }
    lsan_probe_leak();
    (void)sp_shutdown();
    MPI_Finalize();
    printf("lsan-probe: leaked rank %d\n", rank);
    return 0;
}
