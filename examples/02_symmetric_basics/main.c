/*
 * 02_symmetric_basics: what a symmetric MemPool guarantees, shown on every rank.
 *
 *   mpirun -np 2 build/examples/02_symmetric_basics
 *
 *  1. Collective allocations: every rank asks for the same sizes in the same order and gets
 *     each buffer at the same segment and offset (sp_symmetric_window), printed per rank.
 *  2. Peer access: each rank writes into its own buffer; after a barrier it reads its right
 *     neighbour's copy directly through sp_symmetric_peer_ptr (MPI shared windows on the host
 *     backend; NCCL windows are not load/store reachable from the host, so that step is skipped
 *     on cuda).
 *  3. A collective on symmetric buffers: sp_allreduce of the buffers (NCCL's symmetric kernels
 *     on GPUs; MPI on host memory).
 *  4. Misuse caught, not hung: rank 0 asks for a different size; every rank gets SP_ERR_MISMATCH
 *     (one WARN line per rank says so) and the pool stays usable.
 *  5. Collective teardown: free, sp_symmetric_empty_cache, sp_symmetric_mempool_destroy.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/symmetric.h>
#include <sympool/sympool.h>
#include <sympool/world.h>

#include "../common/example_util.h"

/* Print one line per rank, in rank order (rank 0 gathers the lines). */
static void print_ordered(const char *line, int rank, int n) {
    char mine[256] = {0};
    snprintf(mine, sizeof mine, "%s", line);
    char all[64][256];
    if (n > 64)
        n = 64;
    MPI_Gather(mine, 256, MPI_CHAR, rank == 0 ? all : NULL, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0)
        for (int r = 0; r < n; r++)
            printf("  rank %d: %s\n", r, all[r]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    sp_world_t *w = example_world_init(&argc, &argv);
    if (!w)
        return 1;
    if (copy_init() != 0) {
        fprintf(stderr, "rank %d: cuda backend but no libcudart to copy with\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int rank = g_rank, n = sp_world_size(w);
    if (rank == 0)
        printf("02_symmetric_basics: %d ranks, backend %s\n", n, sp_backend_name());

    sp_mempool_params_t params;
    sp_mempool_params_init(&params);
    params.name = "basics";
    sp_mempool_t *pool = NULL;
    CHECK(sp_symmetric_mempool_create(w, &params, &pool));

    /* 1. Same sizes, same order -> same segment and offset everywhere. */
    const size_t sizes[3] = {1000, (size_t)3 << 20, 4096};
    void *buf[3];
    char line[256];
    for (int i = 0; i < 3; i++) {
        CHECK(sp_symmetric_malloc(pool, sizes[i], NULL, &buf[i]));
        sp_window_info_t win;
        CHECK(sp_symmetric_window(buf[i], &win));
        snprintf(line, sizeof line, "buffer %d (%zu bytes): segment %llu, offset %zu of %zu", i,
                 sizes[i], (unsigned long long)win.segment_seq, win.offset, win.segment_size);
        if (rank == 0)
            printf("1. sp_symmetric_malloc #%d\n", i);
        print_ordered(line, rank, n);
    }

    /* 2. Write our rank into buffer 2, read the right neighbour's through its peer pointer. */
    int32_t host[1024];
    for (int i = 0; i < 1024; i++)
        host[i] = rank * 1000 + i;
    copy(buf[2], host, sizeof host);
    MPI_Barrier(MPI_COMM_WORLD);
    int right = (rank + 1) % n;
    void *peer = NULL;
    sp_status_t st = sp_symmetric_peer_ptr(buf[2], right, &peer);
    if (rank == 0)
        printf("2. peer access through sp_symmetric_peer_ptr\n");
    if (st == SP_SUCCESS) {
        const int32_t *theirs = peer;
        int ok = theirs[0] == right * 1000 && theirs[1023] == right * 1000 + 1023;
        snprintf(line, sizeof line, "read rank %d's buffer directly: [0]=%d [1023]=%d %s", right,
                 theirs[0], theirs[1023], ok ? "(as written)" : "(WRONG)");
    } else {
        snprintf(line, sizeof line, "no load/store path to rank %d (%s)", right,
                 sp_status_name(st));
    }
    print_ordered(line, rank, n);
    MPI_Barrier(MPI_COMM_WORLD); /* nobody overwrites before the neighbour has read */

    /* 3. Allreduce over the symmetric buffer: every element becomes the sum over ranks. */
    for (int i = 0; i < 1024; i++)
        host[i] = rank + 1;
    copy(buf[2], host, sizeof host);
    CHECK(sp_allreduce(w, buf[2], buf[2], 1024, SP_INT32, SP_SUM, NULL));
    copy(host, buf[2], sizeof host);
    if (rank == 0)
        printf("3. sp_allreduce on the symmetric buffer: [0]=%d (expected %d)\n", host[0],
               n * (n + 1) / 2);

    /* 4. A size that differs on one rank: SP_ERR_MISMATCH everywhere, no hang. */
    if (rank == 0)
        printf("4. rank 0 asks for 8192 bytes, the others for 4096 (expect one WARN per rank):\n");
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    void *odd = NULL;
    st = sp_symmetric_malloc(pool, rank == 0 ? 8192 : 4096, NULL, &odd);
    snprintf(line, sizeof line, "%s", sp_status_name(st));
    print_ordered(line, rank, n);
    if (st == SP_SUCCESS)
        CHECK(sp_free(odd));
    void *again = NULL;
    CHECK(sp_symmetric_malloc(pool, 4096, NULL, &again)); /* the pool is still usable */
    if (rank == 0)
        printf("   next sp_symmetric_malloc with equal sizes: SP_SUCCESS\n");

    /* 5. Teardown, collectively. */
    CHECK(sp_free(again));
    for (int i = 0; i < 3; i++)
        CHECK(sp_free(buf[i]));
    CHECK(sp_symmetric_empty_cache(pool));
    CHECK(sp_symmetric_mempool_destroy(pool));
    CHECK(sp_world_finalize(w));
    if (g_rank == 0)
        printf("5. freed, cache emptied, pool destroyed: done\n");
    return 0;
}
