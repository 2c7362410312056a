/*
 * info.c: `sympool info`: what sympool would use in this environment: the backend and its
 * devices with their capacity, every SYMPOOL_* option with its value and where it came from,
 * and the version. Read-only; initializes the library and shuts it down again.
 */
#include <stdio.h>
#include <string.h>

#include <sympool/sympool.h>

#include "sympool/experimental.h" /* sp_x_options_print: the option table with sources */
#include "tools/cli.h"

static void human(size_t bytes, char *out, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, cap, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
}

int sp_cli_info(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: sympool info\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "sympool info: unexpected argument '%s'\n", argv[1]);
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
    printf("options:\n");
    fflush(stdout);
    sp_x_options_print(stdout);
    fflush(stdout);
    (void)sp_shutdown();
    return st == SP_SUCCESS ? 0 : 1;
}
