/*
 * symmetric_world_init.c: the path where sympool initializes MPI itself. Its main does NOT call
 * MPI_Init (unlike tests/mpi/mpi_main.cc): sp_world_init must initialize MPI (thread level
 * MULTIPLE if the library offers it), and sp_world_finalize must finalize it. It also runs one
 * symmetric allocation with peer pointers in that world, and, when SP_EXPECT_SYMPOOL_DEBUG is
 * set, checks that the launcher (sympoolrun) delivered SYMPOOL_DEBUG with that value.
 * Registered by tests/cmake/symmetric.cmake; prints "world-init-self: ok" on every rank.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#if defined(SP_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <sympool/symmetric.h>
#include <sympool/sympool.h>
#include <sympool/world.h>

/* For a run by hand, as tests/mpi/mpi_main.cc says: LeakSanitizer needs the slow unwinder to
 * match Open MPI's leaks by scripts/lsan.supp's frames; ctest's runs take the fast one and keep
 * Open MPI's components loaded instead (tests/CMakeLists.txt, shim/no_dlclose.c). */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "fast_unwind_on_malloc=0";
}
#endif

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "world-init-self: FAILED %s: ", #cond);                                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", sp_last_error());                                           \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* Device memory is not host memory: on the cuda backend a host dereference of a sympool pointer
 * faults (SIGSEGV on a GPU and under the CUDA double alike), so values go through cudaMemcpy. */
static void copy_int(int *dst, const int *src, bool to_device) {
#if defined(SP_HAVE_CUDA)
    if (strcmp(sp_backend_name(), "cuda") == 0) {
        cudaError_t e = cudaMemcpy(dst, src, sizeof *dst,
                                   to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
        CHECK(e == cudaSuccess, "cudaMemcpy: %s", cudaGetErrorString(e));
        return;
    }
#endif
    (void)to_device;
    *dst = *src;
}

int main(int argc, char **argv) {
    int flag = 1;
    MPI_Initialized(&flag);
    CHECK(flag == 0, "MPI initialized before sp_world_init");
    sp_world_t *w = NULL;
    sp_status_t s = sp_world_init(&argc, &argv, &w);
    CHECK(s == SP_SUCCESS, "sp_world_init -> %s", sp_status_name(s));
    if (s != SP_SUCCESS)
        return 1;
    MPI_Initialized(&flag);
    CHECK(flag == 1, "MPI not initialized by sp_world_init");
    int provided = -1, rank = sp_world_rank(w), size = sp_world_size(w);
    MPI_Query_thread(&provided);
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum == size, "world size %d, MPI_COMM_WORLD sum %d", size, sum);

    const char *want = getenv("SP_EXPECT_SYMPOOL_DEBUG");
    if (want) {
        const char *got = getenv("SYMPOOL_DEBUG");
        CHECK(got && strcmp(got, want) == 0, "SYMPOOL_DEBUG is '%s', expected '%s'",
              got ? got : "(unset)", want);
    }

    sp_mempool_t *pool = NULL;
    s = sp_symmetric_mempool_create(w, NULL, &pool);
    CHECK(s == SP_SUCCESS, "sp_symmetric_mempool_create -> %s", sp_status_name(s));
    int *buf = NULL;
    if (s == SP_SUCCESS) {
        s = sp_symmetric_malloc(pool, 256, NULL, (void **)&buf);
        CHECK(s == SP_SUCCESS, "sp_symmetric_malloc -> %s", sp_status_name(s));
    }
    if (buf) {
        int mine = 7 * rank, seen = -1;
        copy_int(buf, &mine, true);
        MPI_Barrier(MPI_COMM_WORLD);
        int *peer = NULL;
        int next = (rank + 1) % size;
        s = sp_symmetric_peer_ptr(buf, next, (void **)&peer);
        if (s == SP_SUCCESS && peer)
            copy_int(&seen, peer, false);
        /* A window registered with NCCL < 2.29 has no host-side peer pointers (API.md): refused
         * with SP_ERR_NOT_SUPPORTED for another rank, never a wrong address. */
        bool refused =
            s == SP_ERR_NOT_SUPPORTED && next != rank && strcmp(sp_backend_name(), "cuda") == 0;
        CHECK(refused || (s == SP_SUCCESS && peer && seen == 7 * next),
              "peer pointer to rank %d -> %s, reads %d", next, sp_status_name(s), seen);
        MPI_Barrier(MPI_COMM_WORLD);
        sp_free(buf);
    }
    if (pool) {
        s = sp_symmetric_mempool_destroy(pool);
        CHECK(s == SP_SUCCESS, "sp_symmetric_mempool_destroy -> %s", sp_status_name(s));
    }
    /* A second world from sp_world_init: MPI stays up until the last of them goes. */
    sp_world_t *w2 = NULL;
    s = sp_world_init(&argc, &argv, &w2);
    CHECK(s == SP_SUCCESS, "second sp_world_init -> %s", sp_status_name(s));
    s = sp_world_finalize(w);
    CHECK(s == SP_SUCCESS, "sp_world_finalize -> %s", sp_status_name(s));
    MPI_Finalized(&flag);
    CHECK(flag == 0, "MPI finalized while a second world was alive");
    if (w2) {
        MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(sum == size, "MPI unusable after the first world's finalize");
        s = sp_world_finalize(w2);
        CHECK(s == SP_SUCCESS, "second sp_world_finalize -> %s", sp_status_name(s));
    }
    MPI_Finalized(&flag);
    CHECK(flag == 1, "sp_world_finalize did not finalize the MPI it initialized");
    s = sp_shutdown();
    CHECK(s == SP_SUCCESS, "sp_shutdown -> %s", sp_status_name(s));
    if (failures == 0)
        printf("world-init-self: ok rank %d of %d (thread level %d)\n", rank, size, provided);
    return failures ? 1 : 0;
}
