/*
 * unload_mpi_probe.c: the program unloads the library (dlclose) after using a world, then
 * finalizes MPI. The library asks MPI to tell it when MPI is finalized (an attribute on
 * MPI_COMM_SELF, whose delete callback MPI_Finalize calls first), so the callback must still be
 * there at MPI_Finalize: before, MPI_Finalize called it at an address no longer mapped (a
 * segfault in ompi_attr_delete_all). Prints "unload-mpi-probe: ok" once MPI_Finalize returned.
 *
 * Usage: mpiexec -n 1 unload_mpi_probe LIBSYMPOOL.so (SYMPOOL_DEVICE=host).
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>

typedef int (*from_comm_fn)(MPI_Comm, void **);
typedef int (*finalize_fn)(void *);

/* LeakSanitizer's builds: what the library keeps for the process's life is unreachable once it
 * is unloaded, and Open MPI's own allocations are not this test's business. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) {
    return 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc != 2)
        return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "unload-mpi-probe: FAIL: %s\n", dlerror());
        return 1;
    }
    from_comm_fn from_comm = (from_comm_fn)dlsym(lib, "sp_world_from_comm");
    finalize_fn finalize = (finalize_fn)dlsym(lib, "sp_world_finalize");
    void *world = NULL;
    if (!from_comm || !finalize || from_comm(MPI_COMM_WORLD, &world) != 0 || finalize(world) != 0) {
        fprintf(stderr, "unload-mpi-probe: FAIL: sp_world_from_comm/sp_world_finalize\n");
        return 1;
    }
    if (dlclose(lib) != 0)
        return 1;
    MPI_Finalize(); /* runs MPI_COMM_SELF's attribute callbacks */
    printf("unload-mpi-probe: ok\n");
    return 0;
}
