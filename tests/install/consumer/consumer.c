/* A program outside the source tree that uses an installed sympool: it includes every public
 * header (world.h needs mpi.h from the MPI dependency the package declares), allocates and frees
 * on device 0 and prints its summary's first line. Built by tests/install/check.sh with
 * pkg-config (shared and static) and with CMake's find_package. */
#include <stdio.h>
#include <string.h>

#include <sympool/sympool.h>
#if defined(SP_CONSUMER_MPI)
#include <sympool/collectives.h>
#include <sympool/symmetric.h>
#include <sympool/world.h>
#endif

int main(void) {
    void *p = NULL;
    sp_status_t s = sp_malloc(1 << 20, 0, NULL, &p);
    if (s != SP_SUCCESS) {
        fprintf(stderr, "sp_malloc: %s: %s\n", sp_status_name(s), sp_last_error());
        return 1;
    }
    char text[SP_MEMORY_SUMMARY_MAX];
    s = sp_memory_summary(0, text, sizeof(text));
    (void)sp_free(p);
    if (s != SP_SUCCESS || strstr(text, "Allocated memory") == NULL) {
        fprintf(stderr, "sp_memory_summary: %s\n", sp_last_error());
        return 1;
    }
#if defined(SP_CONSUMER_MPI)
    /* Link-time proof that the MPI half of the API resolves. */
    sp_status_t (*finalize)(sp_world_t *) = sp_world_finalize;
    if (finalize == NULL)
        return 1;
#endif
    printf("consumer ok: %s backend, %d.%d.%d\n", sp_backend_name(), SP_VERSION_MAJOR,
           SP_VERSION_MINOR, SP_VERSION_PATCH);
    return sp_shutdown() == SP_SUCCESS ? 0 : 1;
}
