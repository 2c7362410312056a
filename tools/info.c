/*
 * info.c: `sympool info`: what sympool would use in this environment: the backend and its
 * devices with their capacity, every SYMPOOL_* option with its value and where it came from,
 * and the version. Read-only; initializes the library and shuts it down again.
 */
#include <stdio.h>
#include <string.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h" /* sp_x_options_print, sp_x_size_format */
#include "tools/cli.h"

#if defined(SP_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(SP_HAVE_NCCL)
#include <nccl.h>
#endif
#if defined(SP_HAVE_MPI)
#include <mpi.h>
#endif

static void human(size_t bytes, char *out, size_t cap) {
    sp_x_size_format((double)bytes, out, cap);
}

/* The versions of what this build links, each as built against and as loaded at run time;
 * "not linked" for what it was built without. None of these calls needs a GPU or MPI_Init. */
static void versions(void) {
    printf("versions:\n  sympool %d.%d.%d\n", SP_VERSION_MAJOR, SP_VERSION_MINOR, SP_VERSION_PATCH);
#if defined(SP_HAVE_CUDA)
    int rt = 0, drv = 0;
    bool have_rt = cudaRuntimeGetVersion(&rt) == cudaSuccess;
    bool have_drv = cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0;
    printf("  CUDA runtime %d.%d (built with %d.%d), driver ", have_rt ? rt / 1000 : 0,
           have_rt ? rt % 1000 / 10 : 0, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    if (have_drv)
        printf("supports CUDA %d.%d\n", drv / 1000, drv % 1000 / 10);
    else
        printf("none found\n");
#else
    printf("  CUDA not linked (host backend only)\n");
#endif
#if defined(SP_HAVE_NCCL)
    int nv = 0;
    if (ncclGetVersion(&nv) == ncclSuccess)
        printf("  NCCL %d.%d.%d (built with %d.%d.%d)\n", nv / 10000, nv / 100 % 100, nv % 100,
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    else
        printf("  NCCL version unavailable (built with %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR,
               NCCL_PATCH);
#else
    printf("  NCCL not linked\n");
#endif
#if defined(SP_HAVE_MPI)
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, major = 0, minor = 0;
    (void)MPI_Get_version(&major, &minor);
    if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
        lib[len < MPI_MAX_LIBRARY_VERSION_STRING ? len : MPI_MAX_LIBRARY_VERSION_STRING - 1] = '\0';
        char *nl = strchr(lib, '\n'); /* Open MPI adds its repository and release date */
        if (nl != NULL)
            *nl = '\0';
        char *comma = strchr(lib, ',');
        if (comma != NULL)
            *comma = '\0';
        printf("  MPI %d.%d standard, %s\n", major, minor, lib);
    } else {
        printf("  MPI %d.%d standard\n", major, minor);
    }
#else
    printf("  MPI not linked (no symmetric pools or collectives)\n");
#endif
}

int sp_cli_info(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = cli_getopt(argc, argv, "info", "h", opts)) != -1) {
        if (c == 'h') {
            printf("usage: sympool info [TRACE]\n"
                   "  The backend and its devices, every SYMPOOL_* option with its value and\n"
                   "  source, and the versions of sympool, CUDA, NCCL and MPI in this build.\n"
                   "  With TRACE (a PyTorch memory snapshot, .pickle or .json): its format,\n"
                   "  devices, streams, events by action, pools, starting state and settings.\n");
            return 0;
        }
        return 2;
    }
    if (optind + 1 == argc)
        return cli_trace_info(argv[optind]);
    if (optind < argc) {
        fprintf(stderr, "sympool info: unexpected argument '%s'\n", argv[optind + 1]);
        return 2;
    }
    printf("sympool %d.%d.%d\n", SP_VERSION_MAJOR, SP_VERSION_MINOR, SP_VERSION_PATCH);
    sp_status_t st = sp_init();
    if (st != SP_SUCCESS)
        printf("initialization failed: %s: %s\n", sp_status_name(st), sp_last_error());
    printf("backend: %s\n", sp_backend_name());
    int n = sp_device_count();
    printf("devices: %d\n", n);
    for (int d = 0; d < n; d++) {
        size_t freeb = 0, total = 0;
        char f[32], t[32];
        if (sp_get_memory_info(d, &freeb, &total) != SP_SUCCESS) {
            printf("  device %d: memory info unavailable (%s)\n", d, sp_last_error());
            continue;
        }
        human(freeb, f, sizeof(f));
        human(total, t, sizeof(t));
        printf("  device %d: capacity %s (%zu bytes), free %s\n", d, t, total, f);
    }
    versions();
    printf("options:\n");
    fflush(stdout);
    sp_x_options_print(stdout);
    fflush(stdout);
    (void)sp_shutdown();
    return st == SP_SUCCESS ? 0 : 1;
}
