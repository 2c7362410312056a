/*
 * info.c: `sympool info`: what sympool would use in this environment: the backend and its
 * devices with their capacity, every SYMPOOL_* option with its value and where it came from,
 * and the versions; with --json the same facts as one JSON object. Read-only; initializes the
 * library and shuts it down again.
 */
#include <stdio.h>
#include <string.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h" /* sp_x_options_print, sp_x_option_info, sp_x_size_format */
#include "tools/cli.h"

#if defined(SP_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(SP_HAVE_NCCL) || defined(SP_HAVE_MPI)
#include <dlfcn.h>
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

/* The versions of what this build links, each as built against and as loaded at run time. None
 * of these calls needs a GPU or MPI_Init. */
typedef struct versions {
    bool cuda;              /* linked */
    bool have_rt;           /* the runtime answered */
    int rt, built_rt;       /* runtime loaded, built against (1000*major + 10*minor) */
    bool have_drv;          /* a driver answered */
    int drv;                /* the CUDA version it supports */
    bool nccl;              /* linked */
    bool have_nccl;         /* ncclGetVersion answered */
    int nv, built_nv;       /* loaded, built against (10000*major + 100*minor + patch) */
    bool mpi;               /* linked */
    bool have_mpi;          /* the MPI library was loaded and answered MPI_Get_version */
    const char *mpi_soname; /* what it is loaded by */
    int major, minor;       /* the MPI standard */
    char lib[256];          /* the library's first words, "" when it did not say */
} versions_t;

#if defined(SP_HAVE_NCCL) || defined(SP_HAVE_MPI)
/* The function NAME of the library loaded by SONAME (loading it if need be, never unloading it:
 * NCCL and MPI are not made to be unloaded), or NULL. The CLI links neither (CMakeLists.txt says
 * why), so `info` finds them as the dynamic linker finds them for libsympool: by soname, along
 * the CLI's run path, LD_LIBRARY_PATH and the system's. A data pointer turned into a function
 * pointer is a cast ISO C leaves undefined: the caller copies the bytes (POSIX dlsym's advice). */
static void *library_symbol(const char *soname, const char *name) {
    void *lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    return lib != NULL ? dlsym(lib, name) : NULL;
}
#endif

#if defined(SP_HAVE_NCCL)
static void nccl_version_read(versions_t *v) {
    ncclResult_t (*get_version)(int *) = NULL;
    void *sym = library_symbol(SP_NCCL_SONAME, "ncclGetVersion");
    v->nccl = true;
    v->built_nv = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;
    if (sym == NULL)
        return;
    memcpy(&get_version, &sym, sizeof get_version);
    v->have_nccl = get_version(&v->nv) == ncclSuccess;
}
#endif

#if defined(SP_HAVE_MPI)
/* The library's first line up to its first comma: Open MPI adds its repository and release
 * date after them. */
static void mpi_version_read(versions_t *v) {
    int (*get_version)(int *, int *) = NULL;
    int (*get_library_version)(char *, int *) = NULL;
    void *sym = library_symbol(SP_MPI_SONAME, "MPI_Get_version");
    void *lib_sym = library_symbol(SP_MPI_SONAME, "MPI_Get_library_version");
    v->mpi = true;
    v->mpi_soname = SP_MPI_SONAME;
    if (sym == NULL)
        return;
    memcpy(&get_version, &sym, sizeof get_version);
    v->have_mpi = get_version(&v->major, &v->minor) == MPI_SUCCESS;
    if (!v->have_mpi || lib_sym == NULL)
        return;
    memcpy(&get_library_version, &lib_sym, sizeof get_library_version);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (get_library_version(lib, &len) != MPI_SUCCESS)
        return;
    lib[len >= 0 && len < MPI_MAX_LIBRARY_VERSION_STRING ? len
                                                         : MPI_MAX_LIBRARY_VERSION_STRING - 1] =
        '\0';
    lib[strcspn(lib, "\n,")] = '\0';
    snprintf(v->lib, sizeof v->lib, "%s", lib);
}
#endif

static void versions_read(versions_t *v) {
    memset(v, 0, sizeof *v);
#if defined(SP_HAVE_CUDA)
    v->cuda = true;
    v->have_rt = cudaRuntimeGetVersion(&v->rt) == cudaSuccess;
    v->have_drv = cudaDriverGetVersion(&v->drv) == cudaSuccess && v->drv > 0;
    v->built_rt = CUDART_VERSION;
#endif
#if defined(SP_HAVE_NCCL)
    nccl_version_read(v);
#endif
#if defined(SP_HAVE_MPI)
    mpi_version_read(v);
#endif
}

/* "13.0" from 13000 (CUDA) and "2.28.9" from 22809 (NCCL). */
static const char *cuda_ver(int x, char *buf, size_t cap) {
    snprintf(buf, cap, "%d.%d", x / 1000, x % 1000 / 10);
    return buf;
}

static const char *nccl_ver(int x, char *buf, size_t cap) {
    snprintf(buf, cap, "%d.%d.%d", x / 10000, x / 100 % 100, x % 100);
    return buf;
}

static void versions_text(const versions_t *v) {
    char a[32], b[32];
    printf("versions:\n  sympool %d.%d.%d\n", SP_VERSION_MAJOR, SP_VERSION_MINOR, SP_VERSION_PATCH);
    if (v->cuda) {
        printf("  CUDA runtime %s (built with %s), driver ",
               cuda_ver(v->have_rt ? v->rt : 0, a, 32), cuda_ver(v->built_rt, b, 32));
        if (v->have_drv)
            printf("supports CUDA %s\n", cuda_ver(v->drv, a, 32));
        else
            printf("none found\n");
    } else {
        printf("  CUDA not linked (host backend only)\n");
    }
    if (v->nccl && v->have_nccl)
        printf("  NCCL %s (built with %s)\n", nccl_ver(v->nv, a, 32), nccl_ver(v->built_nv, b, 32));
    else if (v->nccl)
        printf("  NCCL version unavailable (built with %s)\n", nccl_ver(v->built_nv, b, 32));
    else
        printf("  NCCL not linked\n");
    if (v->have_mpi && v->lib[0])
        printf("  MPI %d.%d standard, %s\n", v->major, v->minor, v->lib);
    else if (v->have_mpi)
        printf("  MPI %d.%d standard\n", v->major, v->minor);
    else if (v->mpi)
        printf("  MPI version unavailable (%s did not load or answer)\n", v->mpi_soname);
    else
        printf("  MPI not linked (no symmetric pools or collectives)\n");
}

/* What is not linked is null; what is linked but did not answer has a null version. */
static void versions_json(cli_json_t *j, const versions_t *v) {
    char a[32];
    cj_object(j, "versions");
    cj_str(j, "sympool", sp_version());
    if (v->cuda) {
        cj_object(j, "cuda");
        if (v->have_rt)
            cj_str(j, "runtime", cuda_ver(v->rt, a, 32));
        else
            cj_null(j, "runtime");
        cj_str(j, "runtime_built_with", cuda_ver(v->built_rt, a, 32));
        if (v->have_drv)
            cj_str(j, "driver_supports", cuda_ver(v->drv, a, 32));
        else
            cj_null(j, "driver_supports");
        cj_end(j, '}');
    } else {
        cj_null(j, "cuda");
    }
    if (v->nccl) {
        cj_object(j, "nccl");
        if (v->have_nccl)
            cj_str(j, "version", nccl_ver(v->nv, a, 32));
        else
            cj_null(j, "version");
        cj_str(j, "built_with", nccl_ver(v->built_nv, a, 32));
        cj_end(j, '}');
    } else {
        cj_null(j, "nccl");
    }
    if (v->mpi) {
        cj_object(j, "mpi");
        snprintf(a, sizeof a, "%d.%d", v->major, v->minor);
        if (v->have_mpi)
            cj_str(j, "standard", a);
        else
            cj_null(j, "standard");
        if (v->lib[0])
            cj_str(j, "library", v->lib);
        else
            cj_null(j, "library");
        cj_end(j, '}');
    } else {
        cj_null(j, "mpi");
    }
    cj_end(j, '}');
}

/* Each option as the table shows it, its value typed: booleans true/false, longs and sizes
 * (bytes) as integers, doubles as numbers (an infinite one as null), enums and strings as
 * strings. */
static void options_json(cli_json_t *j) {
    sp_x_option_info_t o;
    cj_object(j, "options");
    for (int i = 0; sp_x_option_info(i, &o); i++) {
        cj_object(j, o.name);
        const char *names[2] = {"value", "default"};
        const char *text[2] = {o.value, o.default_value};
        int64_t n[2] = {o.value_int, o.default_int};
        double x[2] = {o.value_double, o.default_double};
        for (int k = 0; k < 2; k++) {
            if (strcmp(o.kind, "bool") == 0)
                cj_bool(j, names[k], n[k] != 0);
            else if (strcmp(o.kind, "long") == 0 || strcmp(o.kind, "size") == 0)
                cj_int(j, names[k], n[k]);
            else if (strcmp(o.kind, "double") == 0)
                cj_num(j, names[k], x[k]);
            else
                cj_str(j, names[k], text[k]);
        }
        cj_str(j, "source", o.source);
        cj_str(j, "kind", o.kind);
        cj_str(j, "description", o.description);
        cj_end(j, '}');
    }
    cj_end(j, '}');
}

static int usage(FILE *out, int rc) {
    fprintf(out, "usage: sympool info [--json] [TRACE]\n"
                 "  The backend and its devices, every SYMPOOL_* option with its value and\n"
                 "  source, and the versions of sympool, CUDA, NCCL and MPI in this build.\n"
                 "  With TRACE (a PyTorch memory snapshot, .pickle or .json): its format,\n"
                 "  devices, streams, events by action, pools, starting state, requested bytes\n"
                 "  (live at the start, peak) and settings.\n"
                 "  --json      the same facts as one JSON object on stdout (sizes in bytes);\n"
                 "              on failure nothing on stdout, the reason on stderr, exit 1\n"
                 "  -h, --help  this text\n");
    return rc;
}

int sp_cli_info(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    bool json = false;
    int c;
    while ((c = cli_getopt(argc, argv, "info", "h", opts)) != -1) {
        if (c == 'h')
            return usage(stdout, 0);
        if (c == 'j') {
            json = true;
            continue;
        }
        return 2;
    }
    if (optind + 1 == argc)
        return cli_trace_info(cli_input(argv[optind]), json);
    if (optind < argc) {
        fprintf(stderr, "sympool info: unexpected argument '%s'\n", argv[optind + 1]);
        return 2;
    }
    if (!json)
        printf("sympool %d.%d.%d\n", SP_VERSION_MAJOR, SP_VERSION_MINOR, SP_VERSION_PATCH);
    sp_status_t st = sp_init();
    if (st != SP_SUCCESS) {
        if (json) { /* a document without the library's facts would read as a whole one */
            fprintf(stderr, "sympool info: initialization failed: %s: %s\n", sp_status_name(st),
                    sp_last_error());
            (void)sp_shutdown();
            return 1;
        }
        printf("initialization failed: %s: %s\n", sp_status_name(st), sp_last_error());
    }
    versions_t v;
    versions_read(&v);
    cli_json_t j;
    cj_init(&j, stdout);
    if (json) {
        cj_object(&j, NULL);
        cj_str(&j, "sympool", sp_version());
        cj_str(&j, "backend", sp_backend_name());
        cj_array(&j, "devices");
    } else {
        printf("backend: %s\n", sp_backend_name());
    }
    int n = sp_device_count();
    if (!json)
        printf("devices: %d\n", n);
    for (int d = 0; d < n; d++) {
        size_t freeb = 0, total = 0;
        char f[32], t[32];
        bool ok = sp_get_memory_info(d, &freeb, &total) == SP_SUCCESS;
        if (json) {
            cj_object(&j, NULL);
            cj_int(&j, "device", d);
            if (ok) {
                cj_uint(&j, "capacity_bytes", total);
                cj_uint(&j, "free_bytes", freeb);
            } else {
                cj_null(&j, "capacity_bytes");
                cj_null(&j, "free_bytes");
                cj_str(&j, "error", sp_last_error());
            }
            cj_end(&j, '}');
            continue;
        }
        if (!ok) {
            printf("  device %d: memory info unavailable (%s)\n", d, sp_last_error());
            continue;
        }
        human(freeb, f, sizeof(f));
        human(total, t, sizeof(t));
        printf("  device %d: capacity %s (%zu bytes), free %s\n", d, t, total, f);
    }
    if (json) {
        cj_end(&j, ']');
        versions_json(&j, &v);
        options_json(&j);
        cj_end(&j, '}');
    } else {
        versions_text(&v);
        printf("options:\n");
        fflush(stdout);
        sp_x_options_print(stdout);
    }
    fflush(stdout);
    (void)sp_shutdown();
    return st == SP_SUCCESS ? 0 : 1;
}
