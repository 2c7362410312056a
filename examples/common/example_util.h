/*
 * example_util.h: what every C example repeats around the public API, included by each
 * examples/NN_name/main.c as "../common/example_util.h" (CMake builds main.c alone, so the
 * shared code is static inline here): the rank for messages, CHECK (abort the MPI job on a
 * failed sympool call, naming the call and sp_last_error), the world set up from argc/argv, and
 * copies to and from sympool memory on either backend. Uses the public API and MPI only.
 * Single-threaded examples: the globals below are written once, in main, before any use.
 */
#ifndef SP_EXAMPLE_UTIL_H
#define SP_EXAMPLE_UTIL_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include <sympool/sympool.h>
#include <sympool/world.h>

static int g_rank; /* this process's rank in the world, for messages; set by example_world_init */

#define CHECK(call)                                                                                \
    do {                                                                                           \
        sp_status_t s_ = (call);                                                                   \
        if (s_ != SP_SUCCESS) {                                                                    \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, sp_status_name(s_),     \
                    sp_last_error());                                                              \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* The world over MPI_COMM_WORLD (sympool initializes MPI); sets g_rank. NULL after printing why
 * on failure: there is no MPI job to abort yet. */
static inline sp_world_t *example_world_init(int *argc, char ***argv) {
    sp_world_t *w = NULL;
    sp_status_t st = sp_world_init(argc, argv, &w);
    if (st != SP_SUCCESS) {
        fprintf(stderr, "sp_world_init: %s: %s\n", sp_status_name(st), sp_last_error());
        return NULL;
    }
    g_rank = sp_world_rank(w);
    return w;
}

/* ---- reaching sympool memory from the host ---------------------------------------------
 * On the host backend sympool memory is host memory. On cuda it is device memory: the examples
 * copy with cudaMemcpy, looked up at run time from the CUDA runtime (so they build without CUDA
 * headers). */
typedef int (*cuda_memcpy_t)(void *dst, const void *src, size_t bytes, int kind);
static cuda_memcpy_t g_cuda_memcpy; /* NULL on the host backend; set by copy_init */

/* Finds cudaMemcpy when the backend is cuda. 0, or -1 when cuda has no runtime to copy with. */
static inline int copy_init(void) {
    if (strcmp(sp_backend_name(), "cuda") != 0)
        return 0;
    const char *libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !g_cuda_memcpy; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL);
        if (h)
            *(void **)&g_cuda_memcpy = dlsym(h, "cudaMemcpy");
    }
    return g_cuda_memcpy ? 0 : -1;
}

/* dst/src: either may be sympool memory. cudaMemcpyDefault (4) infers the direction; on the
 * legacy default stream it also waits for the collectives enqueued there. */
static inline void copy(void *dst, const void *src, size_t bytes) {
    if (!g_cuda_memcpy) {
        memcpy(dst, src, bytes);
        return;
    }
    if (g_cuda_memcpy(dst, src, bytes, 4) != 0) {
        fprintf(stderr, "rank %d: cudaMemcpy failed\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

#endif /* SP_EXAMPLE_UTIL_H */
